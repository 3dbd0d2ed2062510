"""``tools_addition_reset`` without the calculator: the baseline side of `make demo-tools`.

``tools_addition_notool`` (single-turn answers, ``digit_match`` shaping, the same model and
optimiser) for the same 1,200 steps with the same reference and optimizer reset at step 600,
so the two sides of the demo differ only in the environment.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import STAGE1_STEPS, STAGE2_STEPS
from posttrain.configs.tools_addition_notool import build_config as build_notool_config


def build_config() -> PosttrainConfig:
    cfg = build_notool_config()
    cfg.job.name = "tools_addition_notool_reset"
    cfg.rl.max_steps = STAGE1_STEPS + STAGE2_STEPS
    cfg.rl.reference_reset_every = STAGE1_STEPS
    cfg.rl.reset_optimizer = True
    cfg.rl.save_every = STAGE1_STEPS
    return cfg
