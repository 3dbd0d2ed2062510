"""Typed configuration: schema, recipes, dotlist overrides, serialisation, identity.

Public API::

    load_config(config_path, ["--", *opts]) -> PosttrainConfig
    to_yaml / from_yaml, to_json / from_json, to_dict / from_dict
    ConfigError (one-line message; every user error in a config is one)

Preflight (cross-field rules) lives in :mod:`posttrain.control`.
"""

from posttrain.config.dpo import DPOConfig
from posttrain.config.errors import (
    ConfigError,
    ConfigValueError,
    RecipeError,
    RetiredKeyError,
    UnknownKeyError,
)
from posttrain.config.loader import RECIPE_BUILDER, builtin_recipes, load_config
from posttrain.config.migration import RETIRED, migration_lines
from posttrain.config.overrides import apply_override, apply_overrides, parse_value
from posttrain.config.rl import LossType, RLConfig
from posttrain.config.runtime import CheckpointConfig, LoggingConfig, PlacementConfig
from posttrain.config.schema import PosttrainConfig, all_keys
from posttrain.config.sections import (
    DataConfig,
    JobConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
)
from posttrain.config.serialize import (
    from_dict,
    from_json,
    from_yaml,
    to_dict,
    to_json,
    to_yaml,
)
from posttrain.config.teacher import TeacherConfig

__all__ = [
    "RECIPE_BUILDER",
    "RETIRED",
    "CheckpointConfig",
    "ConfigError",
    "ConfigValueError",
    "DPOConfig",
    "DataConfig",
    "JobConfig",
    "LoggingConfig",
    "LossType",
    "ModelConfig",
    "PlacementConfig",
    "PosttrainConfig",
    "RLConfig",
    "RecipeError",
    "RetiredKeyError",
    "RewardConfig",
    "RolloutConfig",
    "TeacherConfig",
    "UnknownKeyError",
    "all_keys",
    "apply_override",
    "apply_overrides",
    "builtin_recipes",
    "from_dict",
    "from_json",
    "from_yaml",
    "load_config",
    "migration_lines",
    "parse_value",
    "to_dict",
    "to_json",
    "to_yaml",
]
