"""The base of every config section: strict pydantic, one-line errors, retired-key migration.

Sections forbid unknown fields and validate on assignment, so a recipe that writes
``cfg.rl.epsilon_lo = 0.1`` or ``cfg.rollout.max_tokens = 0`` fails at that line with the same
one-line message an override would get.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from posttrain.config.aliases import peer_key
from posttrain.config.errors import ConfigError, ConfigValueError, UnknownKeyError
from posttrain.config.migration import retired_error


def suggest(key: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to ``key`` by edit similarity, or None when nothing is close."""
    found = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_key_error(key: str, candidates: Iterable[str], value: Any = None) -> ConfigError:
    """Retired-key migration when ``key`` is retired, else an unknown-key error with a hint:
    the posttrain key a TRL/verl name means (:mod:`posttrain.config.aliases`), else the nearest
    candidate."""
    retired = retired_error(key, value)
    if retired is not None:
        return retired
    candidates = list(candidates)
    peer = peer_key(key)
    if peer is not None:
        return UnknownKeyError(f"unknown config key '{key}': did you mean {peer[0]}? ({peer[1]})")
    near = suggest(key, candidates)
    if near is not None:
        return UnknownKeyError(f"unknown config key '{key}': did you mean {near}?")
    return UnknownKeyError(
        f"unknown config key '{key}'; see `posttrain config show` or docs/reference/config.md "
        "for the valid keys"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(
    error: ValidationError, prefix: str, candidates: Iterable[str] = ()
) -> ConfigError:
    """Turn pydantic's multi-line report into one line that names each failing key."""
    parts: list[str] = []
    for item in error.errors():
        key = ".".join([p for p in (prefix,) if p] + [str(x) for x in item["loc"]])
        if item["type"] == "extra_forbidden":
            return unknown_key_error(key, candidates, item.get("input"))
        msg = item["msg"].removeprefix("Value error, ")
        parts.append(f"{key}: {msg} (got {_short(item.get('input'))})")
    return ConfigValueError("invalid config value " + "; ".join(parts))


class Section(BaseModel):
    """A typed config section: unknown fields forbidden, types strict, assignment validated."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, validate_default=True
    )

    #: Dotted prefix of this section in the full config ("rl"); empty for the root.
    section_name: ClassVar[str] = ""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise format_validation_error(e, self.section_name, self._dotted_fields()) from None

    # This __init__ only rewords errors, so nested validation may bypass it as it bypasses
    # BaseModel's (pydantic calls a custom __init__ for nested models, which would wrap the
    # one-line error once per level); RootModel uses the same marker.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def _dotted_fields(cls) -> list[str]:
        return [".".join(p for p in (cls.section_name, f) if p) for f in cls.model_fields]

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            super().__setattr__(name, value)
            return
        if name not in type(self).model_fields:
            key = ".".join(p for p in (self.section_name, name) if p)
            raise unknown_key_error(key, self._dotted_fields(), value)
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise format_validation_error(e, self.section_name, self._dotted_fields()) from None

    @classmethod
    def default_of(cls, name: str) -> Any:
        """The declared default of field ``name`` (the value preflight calls "unset")."""
        return cls.model_fields[name].get_default(call_default_factory=True)

    def is_default(self, name: str) -> bool:
        return getattr(self, name) == self.default_of(name)
