"""`make demo-tools` with the calculator as one run: ``tools_addition`` for 1,200 steps with a
reference reset at step 600 (``rl.reference_reset_every``), no hand-chained stages.

The two-stage chain (``tools_addition`` then ``tools_addition_stage2`` from its final model)
moves the KL anchor from the random init to the stage-1 policy and starts stage 2 with a fresh
optimizer; here the reset does both at step 600 (``rl.reset_optimizer=true``; set it to false to
tell the anchor's effect from the optimizer's). One difference stays: stage 2 draws stage 1's
prompts again from the start, this run goes on through the training set. Not measured yet: the
demo's numbers (docs/guides/tools.md) are the chain's.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import STAGE1_STEPS, STAGE2_STEPS
from posttrain.configs.tools_addition import build_config as build_tools_config


def build_config() -> PosttrainConfig:
    cfg = build_tools_config()
    cfg.job.name = "tools_addition_reset"
    cfg.rl.max_steps = STAGE1_STEPS + STAGE2_STEPS
    cfg.rl.reference_reset_every = STAGE1_STEPS
    cfg.rl.reset_optimizer = True
    cfg.rl.save_every = STAGE1_STEPS
    return cfg
