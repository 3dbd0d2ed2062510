"""Environments and tools for multi-turn rollouts (the environment role).

:mod:`~posttrain.env.base` is the interface (``reset``/``step``, named ``module:function``),
:mod:`~posttrain.env.tools` the built-in tools environment (:class:`ToolsEnv` over plain typed
functions or :func:`make_tool`'s tools) and ``calculator``,
:mod:`~posttrain.env.render` the token-in-token-out rendering rule and the policy mask,
:mod:`~posttrain.env.episode` the engine-agnostic multi-turn driver, and
:mod:`~posttrain.env.host` the reward role's side of a training rollout (``env.name``;
:mod:`posttrain.rollout.multiturn` drives it).
"""

from posttrain.env.base import (
    BUILTIN,
    Environment,
    EnvironmentFailedError,
    EnvironmentSpecError,
    EnvStep,
    check_environment,
    load_environment,
    make_environment,
)
from posttrain.env.episode import (
    Episode,
    EpisodeBatch,
    EpisodeLimits,
    TurnRequest,
    episode_metrics,
    run_episodes,
)
from posttrain.env.render import TemplateError, TokenTrajectory, check_template, observation_segment
from posttrain.env.tools import (
    Tool,
    ToolsEnv,
    calculator_environment,
    compact_calculator_environment,
    load_tool,
    make_tool,
)

__all__ = [
    "BUILTIN",
    "EnvStep",
    "Environment",
    "EnvironmentFailedError",
    "EnvironmentSpecError",
    "Episode",
    "EpisodeBatch",
    "EpisodeLimits",
    "TemplateError",
    "TokenTrajectory",
    "Tool",
    "ToolsEnv",
    "TurnRequest",
    "check_environment",
    "calculator_environment",
    "check_template",
    "compact_calculator_environment",
    "episode_metrics",
    "load_environment",
    "load_tool",
    "make_environment",
    "make_tool",
    "observation_segment",
    "run_episodes",
]
