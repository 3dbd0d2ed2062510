"""User reward functions named by ``"module:function"`` strings.

A reward function is ``fn(prompt: str, completion: str, answer: str, meta: dict) -> float``
(``prompt`` is the task item's prompt before templating, ``answer`` its gold answer). Only
module-level callables are accepted: a name is what travels to other processes and what a
resumed run re-imports, and a lambda or a function defined inside another cannot be found again
by name.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

RewardFn = Callable[[str, str, str, dict], float]


class RewardFunctionSpecError(ValueError):
    """A ``"module:function"`` spec cannot be loaded as a reward function."""


@dataclass(frozen=True)
class RewardFunction:
    """A loaded reward function and the spec it was loaded from (its name in errors/metrics)."""

    spec: str
    fn: RewardFn

    def __call__(self, prompt: str, completion: str, answer: str, meta: dict) -> float:
        return self.fn(prompt, completion, answer, meta)


def load_reward_function(spec: str) -> RewardFunction:
    """Import ``spec`` (``"package.module:function"``) and check it can be called as a reward."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: expected 'module:function' (one colon)"
        )
    module_name, attr = (part.strip() for part in spec.split(":"))
    if not module_name or not attr.isidentifier():
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: expected 'module:function' with a module path and a "
            "plain function name (module-level only, no dotted attribute)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: cannot import module {module_name!r} ({e})"
        ) from e
    if not hasattr(module, attr):
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: module {module_name!r} has no attribute {attr!r}"
        )
    fn = getattr(module, attr)
    if not callable(fn) or inspect.isclass(fn):
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not a function"
        )
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    qualname = getattr(inner, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: {attr!r} wraps {qualname!r}, a lambda or nested function; "
            "define it with 'def' at module level"
        )
    try:
        inspect.signature(fn).bind("", "", "", {})
    except TypeError as e:
        raise RewardFunctionSpecError(
            f"reward function {spec!r}: cannot be called as fn(prompt, completion, answer, meta) "
            f"({e})"
        ) from None
    except ValueError:
        pass  # no introspectable signature (some builtins); the first call will tell
    return RewardFunction(spec=spec, fn=fn)
