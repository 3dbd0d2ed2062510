"""The ``env`` section: a multi-turn environment the policy talks to (off when ``name`` is empty)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from posttrain.config.base import Section

_FUNCTION_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
#: Built-in environment names (``posttrain.env.base.BUILTIN`` plus ``tools``).
BUILTIN_NAMES = ("calculator", "calculator_compact", "tools")


class EnvConfig(Section):
    """Multi-turn rollouts: after each policy turn an environment answers (tool results, a user
    turn) until it is done or a bound is hit. Empty ``name``: single-turn rollouts."""

    section_name = "env"

    name: str = Field(
        "",
        description="The environment: `calculator` (the built-in tools environment with the "
        "calculator), `calculator_compact` (the same, called as `<tool_call>123+456</tool_call>`, "
        "for tiny models), `tools` (the functions listed in `env.tools`), or a `module:function` "
        "returning an environment (importable from the working directory). Empty: no "
        "environment, single-turn rollouts. Runs in the reward role's process.",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Tool functions as `module:function` references, for `env.name=tools` only.",
    )
    max_turns: int = Field(
        4,
        ge=1,
        description="Most policy turns per trajectory; a trajectory cut here is marked "
        "truncated (`max_turns`). Each turn samples at most `rollout.max_tokens` tokens.",
    )
    max_context: int = Field(
        1024,
        ge=2,
        description="Most tokens of a whole trajectory (prompt, policy turns and environment "
        "observations); the last turn's budget shrinks to what is left, and a trajectory cut "
        "here is marked truncated (`context`).",
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if value and value not in BUILTIN_NAMES and not _FUNCTION_REF.match(value):
            raise ValueError(
                f"{value!r} is neither a built-in environment ({', '.join(BUILTIN_NAMES)}) nor "
                "a 'module:function' reference"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[str]) -> list[str]:
        for ref in value:
            if not _FUNCTION_REF.match(ref):
                raise ValueError(f"{ref!r} is not a 'module:function' reference")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.name)
