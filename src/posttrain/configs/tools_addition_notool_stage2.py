"""Stage 2 of the chain's no-tool baseline (`make demo-tools` until 2026-12-06):
``tools_addition_notool`` continued.

From that run's final model (``outputs/grpo/tools_addition_notool/final_model``: run stage 1
first), with the same steps and anchor reset as ``tools_addition_stage2``, so both sides train
as long.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import stage2
from posttrain.configs.tools_addition_notool import build_config as build_stage1_config


def build_config() -> PosttrainConfig:
    return stage2(build_stage1_config())
