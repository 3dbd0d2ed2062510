"""User code named by an import path, ``"module:function"``: found, checked and sent by name.

A name is what travels to a Ray worker and what a resumed run imports again, so user code
(objective builders, reward functions) is never a live object handed around: it is a module-level
function, or a ``functools.partial`` of one over plain values. The working directory is
importable, as with ``python -m``, so ``my_loss.py`` beside the recipe is ``my_loss:build``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from posttrain.config.errors import ConfigError


class BuilderError(ConfigError):
    """User code cannot travel to workers (a lambda, a nested function, not callable)."""


def import_from_cwd(module_name: str) -> ModuleType:
    """Import ``module_name`` with the working directory searched first, as ``python -m`` does.

    The directory is on ``sys.path`` only for this import: a package found there keeps its
    absolute ``__path__``, so its later submodule imports still resolve.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def split_spec(spec: Any, fail: Callable[[str], Exception]) -> tuple[str, str]:
    """``"package.module:function"`` -> (module, function), or ``fail``'s error."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise fail("expected 'module:function' (one colon)")
    module_name, attr = (part.strip() for part in spec.split(":"))
    if not module_name or not attr.isidentifier():
        raise fail(
            "expected 'module:function' with a module path and a plain function name "
            "(module-level only, no dotted attribute)"
        )
    return module_name, attr


def import_user_module(module_name: str, fail: Callable[[str], Exception]) -> ModuleType:
    """The user's module, or ``fail``'s one-line error saying what to do."""
    try:
        return import_from_cwd(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise fail(
                f"cannot import module {module_name!r} (no {e.name!r} in {os.getcwd()} or on "
                "sys.path); run from the directory that holds it or add that directory to "
                "PYTHONPATH"
            ) from None
        raise fail(f"importing module {module_name!r} failed: {e}; install {e.name!r}") from None
    except Exception as e:  # the user's module raised while importing
        raise fail(
            f"importing module {module_name!r} failed: {type(e).__name__}: {e}; fix the module"
        ) from None


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable ``spec`` names (``"package.module:function"``); one-line errors say ``what``."""

    def fail(reason: str) -> BuilderError:
        return BuilderError(f"{what} {spec!r}: {reason}")

    module_name, attr = split_spec(spec, fail)
    module = import_user_module(module_name, fail)
    if not hasattr(module, attr):
        where = getattr(module, "__file__", None) or module_name
        raise fail(f"module {module_name!r} ({where}) has no attribute {attr!r}")
    fn = getattr(module, attr)
    check_travels(fn, f"{what} {spec!r}")
    return fn


def check_travels(fn: Any, what: str) -> None:
    """Refuse callables that would not reach a worker process intact by their name."""
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    if not callable(inner) or inspect.isclass(inner):
        raise BuilderError(f"{what} must be a function, got {type(inner).__name__}")
    if not inspect.isfunction(inner):
        raise BuilderError(
            f"{what} must be a module-level function (optionally a functools.partial of one), "
            f"got {type(inner).__name__}"
        )
    qual = inner.__qualname__
    if "<lambda>" in qual or "<locals>" in qual:
        raise BuilderError(
            f"{what}: {inner.__module__}.{qual} is a lambda or nested function; workers "
            "import it by name, so define it with 'def' at module scope"
        )


def check_builder(fn: Callable[..., Any]) -> None:
    """An objective builder: travels by name and takes ``(rl, context)``."""
    check_travels(fn, "the objective builder")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError as e:
        raise BuilderError(
            f"the objective builder {getattr(fn, '__name__', fn)!r} cannot be called as "
            f"build(rl, context) ({e})"
        ) from None
    except ValueError:
        pass  # no introspectable signature; the first call will tell
