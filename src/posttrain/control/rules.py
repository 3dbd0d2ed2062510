"""The preflight rule type: one small check function plus what it reads and how severe it is."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from posttrain.config.errors import ConfigError
from posttrain.config.overrides import RESET
from posttrain.config.schema import PosttrainConfig, objective_family

Severity = Literal["error", "warning"]
Check = Callable[[PosttrainConfig], "str | None"]

__all__ = ["PreflightError", "Rule", "are", "changed", "error", "objective_family", "reset_hint"]


class PreflightError(ConfigError):
    """The config violates at least one preflight rule; ``violations`` lists each message."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        super().__init__("preflight: " + "; ".join(self.violations))

    def __reduce__(self):  # pickles (e.g. to and from Ray workers) with its violations
        return (type(self), (self.violations,))


@dataclass(frozen=True)
class Rule:
    """A named check. ``check`` returns None when satisfied, else a message naming the knob."""

    check: Check
    severity: Severity
    reads: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def doc(self) -> str:
        """The check's docstring, on one line: why the rule exists."""
        return " ".join((inspect.getdoc(self.check) or "").split())


def error(*reads: str) -> Callable[[Check], Rule]:
    """Decorator: ``check`` rejects the config (violations raise :class:`PreflightError`)."""
    return lambda check: Rule(check, "error", reads)


def warning(*reads: str) -> Callable[[Check], Rule]:
    """Decorator: ``check`` warns (the setting is honoured but has no effect or is hazardous)."""
    return lambda check: Rule(check, "warning", reads)


def changed(section: object, *names: str) -> list[str]:
    """``section.name=value`` for each of ``names`` that differs from its default."""
    prefix = section.section_name  # type: ignore[attr-defined]
    return [
        f"{prefix}.{n}={getattr(section, n)}"
        for n in names
        if not section.is_default(n)  # type: ignore[attr-defined]
    ]


def are(knobs: list[str]) -> str:
    """``"a=1 is"`` or ``"a=1, b=2 are"``: the subject of a "never read" message."""
    return f"{', '.join(knobs)} {'is' if len(knobs) == 1 else 'are'}"


def reset_hint(section: object, *names: str) -> str:
    """How to reset the changed ``names`` from the command line, with the values they return to:
    ``"reset with data.digits=@default (-> 2)"``."""
    prefix = section.section_name  # type: ignore[attr-defined]
    parts = [
        f"{prefix}.{n}={RESET} (-> {section.default_of(n)!r})"  # type: ignore[attr-defined]
        for n in names
        if not section.is_default(n)  # type: ignore[attr-defined]
    ]
    return "reset with " + ", ".join(parts)
