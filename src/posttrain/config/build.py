"""Config -> objective: the default module-level builder and the context it receives.

The builder is a plain module-level function so that it pickles by reference into Ray workers;
``functools.partial`` over plain values is fine too.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from torch import nn

from posttrain.algorithm.grpo import make_objective
from posttrain.algorithm.primitives.objective import Objective
from posttrain.config.schema import PosttrainConfig


def objective_context(config: PosttrainConfig, reference_model: nn.Module | None = None) -> Any:
    """What a builder may know beyond ``rl``: the policy identity and the rollout bound.

    ``rollout.max_tokens`` stays the single owner of the response bound; builders read it here.
    """
    return SimpleNamespace(
        name_or_path=config.model.name_or_path,
        max_response_length=config.rollout.max_tokens,
        reference_model=reference_model,
        teacher_top_k=config.teacher.top_k if config.rl.distillation_mode == "direct" else None,
    )


def build_objective(rl: Any, context: Any) -> Objective:
    """The GRPO-family objective selected by ``rl.grpo_surrogate``."""
    return make_objective(rl, context)
