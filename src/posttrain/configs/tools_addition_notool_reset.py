"""``tools_addition_reset`` without the calculator: the baseline side of `make demo-tools`.

``tools_addition_notool`` (single-turn answers, ``digit_match`` shaping, the same model and
optimiser) for the same 2,000 steps with the same reference and optimizer reset every 600, so
the two sides of the demo differ only in the environment (and the credit: a single turn has one
state, so it keeps ``rl.credit=trajectory``).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition_notool import build_config as build_notool_config
from posttrain.configs.tools_addition_reset import DEMO_STEPS, RESET_EVERY


def build_config() -> PosttrainConfig:
    cfg = build_notool_config()
    cfg.job.name = "tools_addition_notool_reset"
    cfg.rl.max_steps = DEMO_STEPS
    cfg.rl.reference_reset_every = RESET_EVERY
    cfg.rl.reset_optimizer = True
    cfg.rl.save_every = RESET_EVERY
    return cfg
