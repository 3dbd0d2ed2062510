"""The environment interface of multi-turn rollouts, and how an environment is named and loaded.

An environment is the producer of everything in a trajectory that the policy did not sample: the
opening messages and, after each policy turn, the observation (tool results or a user turn).
Messages are OpenAI-style chat dicts (``{"role": ..., "content": ...}``), so environments never
see token ids; :mod:`posttrain.env.render` turns their messages into ids for that segment only.

Environments are named like reward functions, ``"module:function"`` importable from the working
directory, where ``function()`` returns a fresh environment. The episode driver calls it once per
trajectory, so an environment may keep per-episode state; ``step`` also receives the whole
conversation, so a stateless one is just as easy. A name (not a live object) is what travels to
the process that runs environments and what a resumed run imports again.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from posttrain.config.errors import ConfigError
from posttrain.config.user_code import BuilderError, import_callable

Message = dict[str, Any]
"""One OpenAI-style chat message: ``role`` and ``content`` (plus ``name`` for tool results)."""


@dataclass(frozen=True)
class EnvStep:
    """What an environment answers to a policy turn.

    ``messages`` are appended to the conversation (ignored when ``done``); ``reward`` is this
    step's reward, ``None`` when the environment leaves scoring to the reward stage; ``info`` holds
    finite numbers summed over the episode's steps, each key one the environment declares in its
    ``info_keys`` (``tool_calls``, ``tool_errors``, ...): each is published as
    ``env/<key>_mean`` (per trajectory).
    """

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    info: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """``reset(item)`` opens an episode; ``step(messages)`` answers the latest assistant turn.

    ``item`` is the task row (a dict with at least ``prompt``). ``messages`` is the conversation so
    far, its last entry the assistant turn just sampled. ``tools`` (optional attribute) are the
    JSON schemas handed to the chat template, ``[]`` when the environment has none.
    """

    def reset(self, item: dict[str, Any]) -> list[Message]: ...

    def step(self, messages: list[Message]) -> EnvStep: ...


class EnvironmentSpecError(ConfigError):
    """An environment name that cannot be loaded, or a factory that returns no environment."""


class EnvironmentFailedError(RuntimeError):
    """An environment raised or answered malformed data on a named item and turn."""


#: Short names of the built-in environments -> their factories.
BUILTIN: dict[str, str] = {
    "calculator": "posttrain.env.tools:calculator_environment",
    "calculator_compact": "posttrain.env.tools:compact_calculator_environment",
}

EnvFactory = Callable[[], Environment]

#: Info keys an environment cannot declare: the episode's own counts (``turns``,
#: ``policy_tokens``, ``env_tokens``, ``dropped_observations``) and the names whose ``env_<key>`` column the multi-turn
#: batch already holds (``env_reward``, ``env_truncation``).
RESERVED_INFO_KEYS = frozenset(
    {"turns", "policy_tokens", "env_tokens", "dropped_observations", "reward", "truncation"}
)
_INFO_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def environment_tools(env: Environment) -> list[dict[str, Any]]:
    """The tool schemas an environment hands to the chat template (``[]`` for none)."""
    return list(getattr(env, "tools", None) or [])


def environment_info_keys(env: Environment, where: str) -> tuple[str, ...]:
    """The info keys ``env`` declares (its ``info_keys``, ``()`` without one), validated: each a
    name (it becomes the column ``env_<key>`` and the metric ``env/<key>_mean``), none reserved,
    none twice. ``where`` names the environment in the one-line error."""
    keys = getattr(env, "info_keys", ())
    if isinstance(keys, str) or not isinstance(keys, Collection):
        raise EnvironmentSpecError(
            f"{where}: info_keys = {keys!r} is not a list of names; declare "
            "info_keys = ('my_count', ...)"
        )
    keys = tuple(keys)
    for key in keys:
        if not isinstance(key, str) or not _INFO_KEY.fullmatch(key):
            raise EnvironmentSpecError(
                f"{where}: info key {key!r} is not a name; use letters, digits and '_', "
                "starting with a letter"
            )
        if key in RESERVED_INFO_KEYS:
            raise EnvironmentSpecError(
                f"{where}: info key {key!r} is reserved (the driver's own "
                f"{', '.join(sorted(RESERVED_INFO_KEYS))}); rename it"
            )
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise EnvironmentSpecError(f"{where}: info_keys lists {twice} twice; list each once")
    return keys


def load_environment(spec: str, tools: Sequence[str] = ()) -> EnvFactory:
    """The factory ``spec`` names: a built-in name, ``"tools"`` over ``tools``, or ``module:fn``.

    ``"tools"`` exposes the functions named in ``tools`` (each ``"module:function"``) through the
    built-in tools environment. Every error is one line naming the spec and what to do.
    """

    def fail(reason: str) -> EnvironmentSpecError:
        return EnvironmentSpecError(f"environment {spec!r}: {reason}")

    if spec == "tools":
        if not tools:
            raise fail("names no tools; list the tool functions as 'module:function' entries")
        from posttrain.env.tools import ToolsEnv, load_tool  # tools imports this module

        loaded = tuple(load_tool(t) for t in tools)
        return functools.partial(ToolsEnv, loaded)
    if tools:
        raise fail("tools are given but only the 'tools' environment takes them")
    target = BUILTIN.get(spec, spec)
    try:
        factory = import_callable(target, "environment")
    except BuilderError as e:
        known = ", ".join(sorted([*BUILTIN, "tools"]))
        hint = f" (or a built-in name: {known})" if ":" not in spec else ""
        raise EnvironmentSpecError(f"{e}{hint}") from None
    return factory


def make_environment(factory: EnvFactory, spec: str) -> Environment:
    """Call the factory and check that it returned an environment, in one line if not.

    A factory that raises is the user's code failing: one line naming it and its exception,
    as a reward function that fails to import is (the traceback is for ``--debug``).
    """
    try:
        inspect.signature(factory).bind()
    except TypeError as e:
        raise EnvironmentSpecError(
            f"environment {spec!r}: cannot be called with no arguments ({e}); make it a "
            "function of no arguments (or a functools.partial) that returns an environment"
        ) from None
    except ValueError:
        pass  # no introspectable signature: the call below tells
    try:
        env = factory()
    except Exception as e:  # the user's factory failed
        raise EnvironmentSpecError(
            f"environment {spec!r}: the factory raised {type(e).__name__}: {e}; fix the factory "
            "(it is called with no arguments, once per trajectory)"
        ) from e
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing:
        raise EnvironmentSpecError(
            f"environment {spec!r}: returned a {type(env).__name__} without "
            f"{' and '.join(missing)}; return an object with reset(item) and step(messages)"
        )
    return env


def check_environment(spec: str, tools: Sequence[str] = ()) -> None:
    """Preflight: the environment loads, its factory returns an environment (builds one) and
    its ``info_keys`` are valid."""
    env = make_environment(load_environment(spec, tools), spec)
    environment_info_keys(env, f"environment {spec!r}")


def check_messages(messages: Any, where: str) -> list[Message]:
    """An environment's messages, validated: a list of dicts with a string role and content."""
    if not isinstance(messages, list):
        raise EnvironmentFailedError(
            f"{where}: returned {type(messages).__name__}, not a list of messages"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise EnvironmentFailedError(
                f"{where}: message {i} is not a dict with a 'role' string; return "
                "{'role': ..., 'content': ...} dicts"
            )
        if not isinstance(m.get("content"), str):
            raise EnvironmentFailedError(f"{where}: message {i} has no 'content' string")
        try:  # a lone surrogate (surrogateescape-decoded bytes) reaches no tokenizer
            m["content"].encode("utf-8")
        except UnicodeEncodeError as e:
            raise EnvironmentFailedError(
                f"{where}: message {i}'s content is not valid text (character {e.start}); "
                "decode bytes with errors='replace'"
            ) from None
    return messages


def check_step(result: Any, where: str, info_keys: Collection[str]) -> EnvStep:
    """An environment's step answer, validated: an :class:`EnvStep` with a finite reward and
    finite numbers in ``info`` under declared keys only (an undeclared one would vanish)."""
    if not isinstance(result, EnvStep):
        raise EnvironmentFailedError(f"{where}: returned {type(result).__name__}, not an EnvStep")
    if not result.done:
        check_messages(result.messages, where)
    if result.reward is not None and not (
        isinstance(result.reward, int | float) and math.isfinite(result.reward)
    ):
        raise EnvironmentFailedError(f"{where}: reward {result.reward!r} is not a finite number")
    if not isinstance(result.info, dict):
        raise EnvironmentFailedError(
            f"{where}: info is a {type(result.info).__name__}, not a dict of numbers"
        )
    for key, value in result.info.items():
        if key not in info_keys:
            declared = ", ".join(map(repr, info_keys)) or "none"
            raise EnvironmentFailedError(
                f"{where}: info key {key!r} is not declared (info_keys: {declared}); add it to "
                f"the environment's info_keys to publish it as env/{key}_mean"
            )
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise EnvironmentFailedError(
                f"{where}: info[{key!r}] = {value!r} is not a finite number; report an int or "
                "a float (int(flag) for a yes/no)"
            )
    return result
