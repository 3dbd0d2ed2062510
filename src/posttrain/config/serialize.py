"""Serialise a resolved config to YAML/JSON and back, and hash it for provenance.

YAML here follows the 1.2 core schema for scalars (``1e-3`` is a float, ``yes`` is a string,
only ``true``/``false`` are booleans) in both directions, so a dumped config loads back equal and
an override such as ``rl.lr=1e-3`` means what it says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from posttrain.config.base import format_validation_error, unknown_key_error
from posttrain.config.errors import ConfigError
from posttrain.config.schema import PosttrainConfig, all_keys

_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_CORE = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


def _use_core_schema(cls: type) -> type:
    """Replace PyYAML's 1.1 bool/int/float resolvers on ``cls`` with 1.2 core ones."""
    cls.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _CORE]
        for first, resolvers in cls.yaml_implicit_resolvers.items()
    }
    # Order matters: the first matching resolver wins, so int precedes float.
    cls.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
    cls.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return cls


@_use_core_schema
class CoreLoader(yaml.SafeLoader):
    """Safe YAML loader with 1.2 core scalars."""


@_use_core_schema
class CoreDumper(yaml.SafeDumper):
    """Safe YAML dumper that quotes every string the core loader would read as non-string."""


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text)


CoreLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=CoreLoader)  # noqa: S506 - CoreLoader is a SafeLoader


def to_dict(config: PosttrainConfig) -> dict[str, Any]:
    """Plain JSON-compatible nested dict of every field, defaults included."""
    return config.model_dump(mode="json")


def check_keys(data: Mapping[str, Any]) -> None:
    """Raise the unknown/retired-key error for the first key ``data`` has that the schema lacks."""
    sections = PosttrainConfig.sections()
    for name, body in data.items():
        if name not in sections:
            raise unknown_key_error(str(name), [*sections, *all_keys()])
        if not isinstance(body, Mapping):
            raise ConfigError(f"config section '{name}' must be a mapping, got {body!r}")
        for field, value in body.items():
            if field not in sections[name].model_fields:
                raise unknown_key_error(f"{name}.{field}", all_keys(), value)


def from_dict(data: Mapping[str, Any]) -> PosttrainConfig:
    """Validate a nested dict (missing keys take their defaults) into a config."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(data).__name__}")
    check_keys(data)
    try:
        return PosttrainConfig.model_validate(dict(data))
    except ValidationError as e:
        raise format_validation_error(e, "", all_keys()) from None


def to_yaml(config: PosttrainConfig) -> str:
    # allow_unicode=False: PyYAML mis-emits line-break characters (U+0085, U+2028) in quoted
    # scalars when unicode is allowed; escaped output round-trips exactly.
    return yaml.dump(to_dict(config), Dumper=CoreDumper, sort_keys=False, allow_unicode=False)


def from_yaml(text: str) -> PosttrainConfig:
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config YAML does not parse: {' '.join(str(e).split())}") from None
    return from_dict(data or {})


def to_json(config: PosttrainConfig) -> str:
    return json.dumps(to_dict(config), indent=2)


def from_json(text: str) -> PosttrainConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config JSON does not parse: {e}") from None
    return from_dict(data)
