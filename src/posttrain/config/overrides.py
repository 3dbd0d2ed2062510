"""Dotlist overrides: ``section.key=value`` strings applied in order to a config.

Values are read as YAML 1.2 scalars or flow lists and validated against the field's type; a
``str`` field takes the text verbatim (so ``data.operators=+-`` and ``job.name=007`` stay
strings) unless it is quoted, or is ``null`` on a field that allows it.

``section.key=@default`` (:data:`RESET`) puts a key back to its schema default, e.g. to switch a
recipe's generated task to a JSONL file: ``data.task=jsonl data.train_size=@default``. The token
needs no quoting in bash, zsh or fish (``!`` triggers history expansion, a leading ``~`` a
home-directory lookup).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

from posttrain.config.base import unknown_key_error
from posttrain.config.errors import ConfigError, ConfigValueError
from posttrain.config.schema import PosttrainConfig, all_keys
from posttrain.config.serialize import parse_yaml


def split_dashdash(argv: Sequence[str]) -> list[str]:
    """The override list of ``["--", *opts]``; a list without ``--`` is taken as overrides."""
    argv = list(argv)
    return argv[argv.index("--") + 1 :] if "--" in argv else argv


def _members(annotation: Any) -> tuple[Any, ...]:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


_NULLS = ("null", "Null", "NULL", "~")

#: Override value that resets a key to its schema default: ``data.digits=@default``.
RESET = "@default"


def parse_value(raw: str, annotation: Any, key: str = "value") -> Any:
    """Read override text ``raw`` for the field ``key`` typed ``annotation``.

    A ``str`` field takes ``raw`` verbatim unless it is quoted (then YAML unquotes it) or, on a
    nullable field, a YAML null. Every other field reads ``raw`` as a YAML 1.2 value.
    """
    members = _members(annotation)
    text = raw.strip()
    if str in members and not text.startswith(("'", '"')):
        return None if type(None) in members and text in _NULLS else raw
    try:
        return parse_yaml(raw) if text else None
    except yaml.YAMLError:
        raise ConfigValueError(f"invalid config value {key}: cannot parse {raw!r}") from None


def split_override(opt: str) -> tuple[str, str]:
    key, sep, raw = opt.partition("=")
    key = key.strip()
    if key.startswith("~"):
        raise ConfigError(
            f"override {opt!r}: '~' (delete) is not supported, every key exists; write "
            f"{key[1:]}={RESET} to reset it to its default"
        )
    if key.startswith("+"):
        raise ConfigError(
            f"override {opt!r}: '+' (add) is not supported, every key already exists; write "
            f"{key[1:]}={raw or 'VALUE'}"
        )
    if not sep or not key:
        raise ConfigError(
            f"override {opt!r} is not of the form section.key=value (or section.key={RESET})"
        )
    return key, raw


def apply_override(config: PosttrainConfig, opt: str) -> None:
    """Apply one ``section.key=value`` to ``config`` in place (validated on assignment);
    ``section.key=@default`` restores the key's schema default."""
    key, raw = split_override(opt)
    sections = PosttrainConfig.sections()
    section, dot, field = key.partition(".")
    if section in sections and not dot:
        raise ConfigError(f"override {opt!r} names a whole section; set {section}.KEY=VALUE")
    if section not in sections or field not in sections[section].model_fields:
        raise unknown_key_error(key, all_keys(), raw.strip())
    if raw.strip() == RESET:
        value = sections[section].default_of(field)
    else:
        value = parse_value(raw, sections[section].model_fields[field].annotation, key)
    setattr(getattr(config, section), field, value)


def apply_overrides(config: PosttrainConfig, opts: Sequence[str]) -> PosttrainConfig:
    """Apply ``opts`` in order (later ones win) and return ``config``, its cross-section
    defaults settled again (``PosttrainConfig.resolved``)."""
    for opt in opts:
        apply_override(config, opt)
    return config.resolved()
