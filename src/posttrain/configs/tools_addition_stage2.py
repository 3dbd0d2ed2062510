"""Stage 2 of the two-stage chain `make demo-tools` ran until 2026-12-06: ``tools_addition`` from
its final model.

Stage 1 (``tools_addition``, 600 steps) learns the call; this stage, 600 steps from that run's
``final_model`` (``outputs/grpo/tools_addition/final_model``: run stage 1 first), learns the
copy. Nothing else changes: the environment, the rewards and the optimiser are stage 1's. The
KL anchor is the initial model, so here it is the stage-1 policy, not the random init (see
:func:`posttrain.configs.tools_addition.stage2`).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import build_config as build_stage1_config
from posttrain.configs.tools_addition import stage2


def build_config() -> PosttrainConfig:
    return stage2(build_stage1_config())
