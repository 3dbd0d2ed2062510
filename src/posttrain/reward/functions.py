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
from collections.abc import Callable
from dataclasses import dataclass

from posttrain.config.errors import ConfigError
from posttrain.config.user_code import import_user_module, split_spec

RewardFn = Callable[[str, str, str, dict], float]

#: The call every reward function must accept.
SIGNATURE = "fn(prompt, completion, answer, meta) -> float"


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
