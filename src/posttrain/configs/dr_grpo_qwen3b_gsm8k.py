"""Dr-GRPO on GSM8K: the GRPO base with mean-centred advantages and a fixed-length divisor.

Both changes are selections among existing behaviour, so this is a recipe, not a new objective:
``rl.advantage_estimator=dr_grpo`` drops the std division, and ``seq-mean-token-sum-fixed`` divides each
response's token-loss sum by ``rollout.max_tokens``. Its own ``job.algorithm`` and ``job.name``
keep outputs, provenance and resume apart from the base recipe.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.grpo_base import build_grpo_config


def build_config() -> PosttrainConfig:
    cfg = build_grpo_config()
    cfg.job.algorithm = "dr_grpo"
    cfg.job.name = "qwen3b_bf16_dr_grpo_seed42"
    cfg.rl.grpo_surrogate = "clipped"
    cfg.rl.advantage_estimator = "dr_grpo"
    cfg.rl.loss_type = "seq-mean-token-sum-fixed"
    return cfg
