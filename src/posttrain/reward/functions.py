"""User reward functions named by ``"module:function"`` strings (``reward.functions``).

A reward function is ``fn(prompt: str, completion: str, answer: str, meta: dict) -> float``
(``prompt`` is the task item's prompt before templating, ``answer`` its gold answer). Only
module-level callables are accepted: a name is what travels to other processes and what a
resumed run re-imports, and a lambda or a function defined inside another cannot be found again
by name.

The module is imported as ``python -m`` would find it: the current working directory is searched
first, so ``reward.functions=[my_rewards:length_bonus]`` works with ``my_rewards.py`` next to
where the command runs. Preflight loads every entry (``posttrain config show`` reports a bad one
before any model is built); the message is one line naming the entry and what to do.
"""

from __future__ import annotations

import functools
import inspect
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass

from posttrain.config.errors import ConfigError
from posttrain.config.user_code import import_user_module, split_spec
from posttrain.placement.errors import RoleCallTimeout
from posttrain.run.signals import RunInterrupted
from posttrain.textsafe import exception_text

RewardFn = Callable[[str, str, str, dict], float]

#: The call every reward function must accept.
SIGNATURE = "fn(prompt, completion, answer, meta) -> float"


#: The largest reward magnitude accepted, per component and in total. Rewards and advantages go
#: into the batch as float32 (largest finite value 3.4e38), and the group statistics square
#: differences of rewards in float64; at 1e30 neither can overflow (with a factor of 10^8 to
#: spare), so a huge but finite reward is refused by name instead of ending the step in inf.
MAX_ABS_REWARD = 1e30


class RewardError(RuntimeError):
    """A reward component failed or gave a non-finite value on a named sample."""


class RewardFunctionSpecError(ConfigError):
    """A ``reward.functions`` entry cannot be loaded as a reward function."""


@dataclass(frozen=True)
class RewardFunction:
    """A loaded reward function and the spec it was loaded from (its name in errors/metrics)."""

    spec: str
    fn: RewardFn

    def __call__(self, prompt: str, completion: str, answer: str, meta: dict) -> float:
        return self.fn(prompt, completion, answer, meta)


def load_reward_function(spec: str) -> RewardFunction:
    """Import ``spec`` (``"package.module:function"``) and check it can be called as a reward."""

    def fail(reason: str) -> RewardFunctionSpecError:
        return RewardFunctionSpecError(f"reward.functions entry {spec!r}: {reason}")

    module_name, attr = split_spec(spec, fail)
    module = import_user_module(module_name, fail)
    where = getattr(module, "__file__", None) or module_name
    if not hasattr(module, attr):
        raise fail(
            f"module {module_name!r} ({where}) has no attribute {attr!r}; define {SIGNATURE} there"
        )
    fn = getattr(module, attr)
    if not callable(fn) or inspect.isclass(fn):
        raise fail(f"{attr!r} is a {type(fn).__name__}, not a function; name a {SIGNATURE}")
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    qualname = getattr(inner, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise fail(
            f"{attr!r} wraps {qualname!r}, a lambda or nested function; define it with 'def' at "
            "module level"
        )
    try:
        inspect.signature(fn).bind("", "", "", {})
    except TypeError as e:
        raise fail(
            f"cannot be called as {SIGNATURE} ({e}); give it those four parameters"
        ) from None
    except ValueError:
        pass  # no introspectable signature (some builtins); the first call will tell
    return RewardFunction(spec=spec, fn=fn)


def checked_reward(call: Callable[[], object], what: str, where: str) -> float:
    """``call()`` (one reward component on one row) as a float, or a :class:`RewardError`
    naming ``what`` and ``where`` for anything it raises or returns that is not a usable reward.

    Any exception counts, ``BaseException`` subclasses included (``GeneratorExit``,
    ``SystemExit``): they come from the function, not from the run. Two pass through: a signal
    posttrain's own handlers turned into :class:`RunInterrupted` (or the in-process role-call
    deadline, :class:`RoleCallTimeout`), and ``KeyboardInterrupt`` while
    Python's default SIGINT handler is in place (then it may be a real Ctrl-C). Under posttrain's
    handlers a Ctrl-C never arrives as ``KeyboardInterrupt``, so one then is the function's own.
    """
    try:
        value = call()
    except (RunInterrupted, RoleCallTimeout):
        raise
    except KeyboardInterrupt as e:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            raise
        raise RewardError(
            f"{what} raised {exception_text(e)} on {where} (the function raised it itself; no "
            "Ctrl-C reached posttrain)"
        ) from e
    except SystemExit as e:
        raise RewardError(
            f"{what} called sys.exit({e.code!r}) on {where}; raise an exception to fail a run"
        ) from e
    except BaseException as e:  # noqa: BLE001 - see the docstring
        raise RewardError(f"{what} raised {exception_text(e)} on {where}") from e
    if isinstance(value, str | bytes):
        raise RewardError(f"{what} returned a string, not a number, on {where}")
    try:
        x = float(value)
    except OverflowError:
        size = (
            f"an int of about 10**{int(value.bit_length() * math.log10(2))}"
            if isinstance(value, int)
            else f"a {type(value).__name__}"
        )
        raise RewardError(
            f"{what} returned {size}, too large to be a reward (|reward| <= {MAX_ABS_REWARD:g}), "
            f"on {where}"
        ) from None
    except Exception:
        raise RewardError(
            f"{what} returned {type(value).__name__}, not a number, on {where}"
        ) from None
    if not math.isfinite(x):
        raise RewardError(f"{what} returned {x} on {where}: rewards must be finite")
    if abs(x) > MAX_ABS_REWARD:
        raise RewardError(
            f"{what} returned {x:g} on {where}: rewards must satisfy |reward| <= "
            f"{MAX_ABS_REWARD:g} (larger ones overflow the group statistics); scale it down"
        )
    return x


def functions_weight(anneal_steps: int, step: int) -> float:
    """The weight of the reward functions' sum at ``step`` (``reward.functions_anneal_steps``):
    1 throughout when ``anneal_steps`` is 0, else ``1 - (step - 1) / anneal_steps`` clamped to
    [0, 1] (full at step 1 and before it, at step 0's evaluation; none from ``anneal_steps + 1``).
    A pure function of the step, so a resumed or lagged run scores each step as a straight one."""
    if anneal_steps == 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - (step - 1) / anneal_steps))
