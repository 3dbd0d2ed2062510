"""Retired keys and their one-way replacements.

A retired key is never aliased: a stale recipe or override fails with the exact replacement to
write instead, so an old config can never silently select a different objective.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.config.errors import RetiredKeyError


@dataclass(frozen=True)
class Retired:
    """``key`` was replaced by ``replacement``; ``values`` maps each old value to its new one."""

    key: str
    replacement: str
    values: dict[str, str] = field(default_factory=dict)


RETIRED: dict[str, Retired] = {
    r.key: r
    for r in (
        Retired(
            "rl.objective",
            "rl.grpo_surrogate",
            {"degenerate": "legacy_pg", "clipped": "clipped"},
        ),
        Retired(
            "rl.objective_mode",
            "rl.distillation_mode",
            {"direct": "direct", "advantage": "advantage"},
        ),
        Retired(
            "rl.unbiased_advantage",
            "rl.advantage_estimator",
            {"true": "dr_grpo", "false": "grpo"},
        ),
    )
}


def migration_lines() -> list[str]:
    """Every ``old=value -> new=value`` pair, for docs and error messages."""
    return [
        f"{r.key}={old} -> {r.replacement}={new}"
        for r in RETIRED.values()
        for old, new in r.values.items()
    ]


def retired_error(key: str, value: Any = None) -> RetiredKeyError | None:
    """The error for setting retired ``key`` (to ``value`` when known), or None if not retired."""
    r = RETIRED.get(key)
    if r is None:
        return None
    # A recipe assigns a bool; an override brings its text. Both name the same old value.
    old = str(value).lower() if isinstance(value, bool) else value
    old = old if isinstance(old, str) else None
    if old is not None and old in r.values:
        return RetiredKeyError(
            f"config key '{key}' is retired: write {r.replacement}={r.values[old]} "
            f"instead of {key}={old}"
        )
    choices = "; ".join(f"{key}={k} -> {r.replacement}={v}" for k, v in r.values.items())
    return RetiredKeyError(
        f"config key '{key}' is retired and replaced by {r.replacement} ({choices})"
    )
