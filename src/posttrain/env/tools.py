"""The built-in ``tools`` environment: plain typed Python functions exposed to the policy as tools.

A tool is a module-level function with type hints and a Google-style docstring; its JSON schema
comes from transformers' ``get_json_schema`` (what ``apply_chat_template(tools=...)`` uses), so
the schema the model sees is the one a Hermes/Qwen chat template renders.

Tool calls are parsed from the assistant's text in the Hermes/Qwen format those templates teach::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123 + 456"}}
    </tool_call>

Several calls in one turn run in order. A turn without ``<tool_call>`` ends the episode (the
final answer goes to the reward stage). Every failure (text that is not JSON, an unknown tool,
wrong arguments, an exception, a timeout) is answered to the model as that call's tool output
``error: ...`` and counted: ``tool_calls`` (every attempted call), ``tool_errors`` (failed calls,
timeouts included) and ``tool_timeouts``, the environment's declared ``info_keys`` (published as
``env/<key>_mean``; a subclass that reports more extends them).

**The compact form** (``call_format="compact"``), for tiny models that cannot write JSON: with
exactly one tool taking one string argument, the call's body *is* that argument,
``<tool_call>123+456</tool_call>``. It is an explicit choice of the environment (the built-in
``calculator_compact``), never guessed from the text; an unclosed call is still a tool error.

**Templates without tools.** A chat template that ignores ``tools=`` and has no ``tool`` role
(e.g. the tiny models' own) gets ``native_tools=False``: the schemas and the call format are
written into a system message, and each result comes back as a ``user`` message
``<tool_response>...</tool_response>``. The call format is the same either way.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from posttrain.config.user_code import BuilderError, import_callable
from posttrain.env.base import EnvironmentSpecError, EnvStep, Message
from posttrain.env.calculator import calculator
from posttrain.env.runner import Outcome, ToolRunner, call_here

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)

#: Default per-call time limit (seconds).
DEFAULT_TIMEOUT_S = 5.0
#: Default most tool calls answered per turn; the rest are answered with an error.
DEFAULT_MAX_CALLS = 4


@dataclass(frozen=True)
class Tool:
    """A function and the JSON schema the chat template shows for it."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    #: Run in the caller's process rather than the time-limited worker: only for a tool that
    #: bounds its own work and keeps no state (the built-in calculator checks every operation's
    #: size before computing it), so neither the limit nor the isolation has anything to catch.
    in_process: bool = False


def make_tool(fn: Callable[..., Any], where: str | None = None) -> Tool:
    """A :class:`Tool` from a typed, documented function (one-line error if it has no schema)."""
    # Here, not at the top: the reward role's Ray actor imports this module, and transformers
    # (~0.2 s of CPU per actor start, benchmarks/role_start.py) only when an environment makes its tools.
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # transformers raises several types for undocumented/untyped args
        where = where or f"tool {getattr(fn, '__name__', repr(fn))!r}"
        raise EnvironmentSpecError(
            f"{where}: no JSON schema from its signature and docstring ({e}); give "
            "every argument a type hint and an 'Args:' line in a Google-style docstring"
        ) from None
    return Tool(name=schema["function"]["name"], fn=fn, schema=schema)


def load_tool(spec: str) -> Tool:
    """The tool named ``"module:function"`` (importable from the working directory)."""
    try:
        fn = import_callable(spec, "tool")
    except BuilderError as e:
        raise EnvironmentSpecError(str(e)) from None
    return make_tool(fn, f"tool {spec!r}")


@dataclass(frozen=True)
class ToolCall:
    """A parsed call; ``error`` is set (and name/arguments may be empty) when it is malformed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def _loads(body: str) -> tuple[Any, str | None]:
    """``json.loads(body)`` and None, or None and why not. Whatever the policy writes is data:
    nesting past the parser's recursion limit and integers past Python's digit limit are
    reasons the call fails (the model reads them), never exceptions out of the step."""
    try:
        return json.loads(body), None
    except json.JSONDecodeError as e:
        return None, f"{e.msg} at {e.pos}"
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as e:  # e.g. an integer of more digits than int() converts
        return None, str(e).split(";")[0]


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` in ``text``; malformed ones carry their error.

    An opening tag never closed (a turn cut by its token limit) is one malformed call.
    """
    calls: list[ToolCall] = []
    for body in _CALL.findall(text):
        data, error = _loads(body)
        if error is not None:
            calls.append(ToolCall("", {}, f"the call is not valid JSON ({error})"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall("", {}, 'the call must be {"name": ..., "arguments": {...}}'))
            continue
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
            arguments, _ = _loads(arguments)
        if not isinstance(arguments, dict):
            calls.append(ToolCall(data["name"], {}, "'arguments' must be a JSON object"))
            continue
        calls.append(ToolCall(data["name"], arguments))
    if text.count(CALL_OPEN) > len(calls):
        calls.append(ToolCall("", {}, f"{CALL_OPEN} without {CALL_CLOSE}"))
    return calls


def parse_compact_calls(text: str, tool: Tool, argument: str) -> list[ToolCall]:
    """Every ``<tool_call>BODY</tool_call>`` in ``text`` as a call of ``tool`` with
    ``{argument: BODY}`` (the compact form); an unclosed opening tag is one malformed call."""
    calls = [ToolCall(tool.name, {argument: body}) for body in _CALL.findall(text)]
    if text.count(CALL_OPEN) > len(calls):
        calls.append(ToolCall("", {}, f"{CALL_OPEN} without {CALL_CLOSE}"))
    return calls


CallFormat = Literal["json", "compact"]


def compact_argument(tools: Sequence[Tool]) -> str:
    """The one string argument the compact form fills, or a one-line error why it cannot."""
    if len(tools) != 1:
        raise EnvironmentSpecError(
            f"tools environment: call_format='compact' needs exactly one tool, got "
            f"{[t.name for t in tools]}; use call_format='json' for several"
        )
    params = tools[0].schema["function"].get("parameters", {})
    props = params.get("properties", {})
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    if len(props) != 1 or len(strings) != 1:
        raise EnvironmentSpecError(
            f"tools environment: call_format='compact' needs a tool with one string argument; "
            f"{tools[0].name!r} takes {sorted(props)}; use call_format='json'"
        )
    return strings[0]


def fallback_system_prompt(tools: Sequence[Tool], call_format: CallFormat = "json") -> str:
    """The system message that teaches tools to a template without ``tools`` support."""
    if call_format == "compact":
        how = f"To call it, write {CALL_OPEN}<{compact_argument(tools)}>{CALL_CLOSE}"
    else:
        how = f'To call one, write {CALL_OPEN}{{"name": <tool name>, "arguments": {{...}}}}{CALL_CLOSE}'
    lines = [
        "You may call these tools:",
        *(json.dumps(t.schema["function"]) for t in tools),
        how,
        f"Results come back as {RESPONSE_OPEN}...{RESPONSE_CLOSE}.",
    ]
    return "\n".join(lines)


_RUNNERS: dict[tuple[tuple[Callable[..., Any], ...], float], ToolRunner] = {}


def shared_runner(tools: tuple[Tool, ...], timeout_s: float) -> ToolRunner:
    """One worker per tool set and limit, shared by the environments of all trajectories."""
    key = (tuple(t.fn for t in tools), float(timeout_s))
    if key not in _RUNNERS:
        _RUNNERS[key] = ToolRunner(key[0], timeout_s)
    return _RUNNERS[key]


def close_runners() -> None:
    """Stop every shared worker and what its tools started (the end of a run's roles; the next
    call in this process starts a fresh worker)."""
    for runner in _RUNNERS.values():
        runner.close()


class ToolsEnv:
    """Answers each assistant turn's tool calls with their results; no call ends the episode.

    ``tools`` are :class:`Tool` objects or plain typed functions with a Google-style docstring
    (wrapped with :func:`make_tool`; one that has no schema is refused in one line).
    """

    #: What :meth:`step` reports in ``EnvStep.info`` (see :class:`posttrain.env.base.Environment`).
    info_keys: tuple[str, ...] = ("tool_calls", "tool_errors", "tool_timeouts")

    def __init__(
        self,
        tools: Sequence[Tool | Callable[..., Any]],
        *,
        native_tools: bool = True,
        system: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_calls_per_turn: int = DEFAULT_MAX_CALLS,
        call_format: CallFormat = "json",
    ) -> None:
        # a plain typed, documented function is a tool (its schema from make_tool)
        self.tool_list = tuple(t if isinstance(t, Tool) else make_tool(t) for t in tools)
        if call_format not in ("json", "compact"):
            raise EnvironmentSpecError(
                f"tools environment: call_format must be 'json' or 'compact', got {call_format!r}"
            )
        self.call_format = call_format
        self._argument = compact_argument(self.tool_list) if call_format == "compact" else None
        names = [t.name for t in self.tool_list]
        if len(set(names)) != len(names):
            raise EnvironmentSpecError(f"tools environment: two tools share a name in {names}")
        self._index = {t.name: i for i, t in enumerate(self.tool_list)}
        self.native_tools = native_tools
        self.system = system
        self.max_calls_per_turn = max_calls_per_turn
        self.runner = shared_runner(self.tool_list, timeout_s)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Schemas for ``apply_chat_template(tools=...)``; ``[]`` in the fallback."""
        return [t.schema for t in self.tool_list] if self.native_tools else []

    def reset(self, item: dict[str, Any]) -> list[Message]:
        system = self.system
        if not self.native_tools:
            fallback = fallback_system_prompt(self.tool_list, self.call_format)
            system = f"{system}\n{fallback}" if system else fallback
        opening = [{"role": "system", "content": system}] if system else []
        return [*opening, {"role": "user", "content": str(item["prompt"])}]

    def _run(self, call: ToolCall, index: int) -> Outcome:
        if call.error is not None:
            return Outcome(False, call.error)
        if index >= self.max_calls_per_turn:
            return Outcome(False, f"more than {self.max_calls_per_turn} tool calls in one turn")
        if call.name not in self._index:
            return Outcome(False, f"unknown tool {call.name!r}; tools: {sorted(self._index)}")
        i = self._index[call.name]
        if self.tool_list[i].in_process:
            return call_here(self.tool_list[i].fn, call.arguments)
        return self.runner.call(i, call.arguments)

    def _response(self, name: str, outcome: Outcome) -> Message:
        text = outcome.text if outcome.ok else f"error: {outcome.text}"
        if self.native_tools:
            return {"role": "tool", "name": name, "content": text}
        return {"role": "user", "content": f"{RESPONSE_OPEN}{text}{RESPONSE_CLOSE}"}

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in an assistant turn, in this environment's call format."""
        if self._argument is not None:
            return parse_compact_calls(text, self.tool_list[0], self._argument)
        return parse_tool_calls(text)

    def step(self, messages: list[Message]) -> EnvStep:
        calls = self.parse(str(messages[-1].get("content", "")))
        if not calls:
            return EnvStep(done=True, info={"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0})
        outcomes = [self._run(call, i) for i, call in enumerate(calls)]
        # the name is the policy's text (JSON may spell a lone surrogate): escaped to text
        replies = [
            self._response(c.name.encode("utf-8", "backslashreplace").decode("utf-8"), o)
            for c, o in zip(calls, outcomes, strict=True)
        ]
        info = {
            "tool_calls": len(calls),
            "tool_errors": sum(not o.ok for o in outcomes),
            "tool_timeouts": sum(o.timed_out for o in outcomes),
        }
        return EnvStep(messages=replies, done=False, info=info)


@functools.cache
def _calculator_tool() -> Tool:
    return replace(make_tool(calculator), in_process=True)


def __getattr__(name: str) -> Tool:
    """``CALCULATOR``, the built-in calculator called in the caller's process (it bounds every
    operation itself), made on first use: its schema comes from transformers, which the
    reward role's actor would otherwise import at every start."""
    if name == "CALCULATOR":
        return _calculator_tool()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def calculator_environment(native_tools: bool = True, call_format: CallFormat = "json") -> ToolsEnv:
    """The built-in ``calculator`` environment (``functools.partial`` it to change the mode)."""
    return ToolsEnv([_calculator_tool()], native_tools=native_tools, call_format=call_format)


def compact_calculator_environment() -> ToolsEnv:
    """The built-in ``calculator_compact``: the calculator called as
    ``<tool_call>123+456</tool_call>`` (the compact form, for tiny models)."""
    return calculator_environment(call_format="compact")
