"""``tools_addition`` without the calculator: the baseline of the two-stage chain (the demo's
is ``tools_addition_notool_reset``).

The same model, task, optimiser and step count; no environment, so each response is a
single-turn answer to ``123+456=``, and ``digit_match`` pays for partly right digits in place of
the environment's shaping (a little for a well-formed number, more for each digit in place).
This is stage 1; ``tools_addition_notool_stage2`` continues it from its final model, as
``tools_addition_stage2`` continues ``tools_addition``.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import build_config as build_tools_config


def build_config() -> PosttrainConfig:
    cfg = build_tools_config()
    cfg.job.name = "tools_addition_notool"
    cfg.env.name = ""
    cfg.reward.functions = ["posttrain.reward.shaping:digit_match"]
    return cfg
