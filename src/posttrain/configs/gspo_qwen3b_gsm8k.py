"""GSPO on GSM8K: the GRPO base with a sequence-level importance ratio.

:func:`apply_gspo_knobs` is the one place that turns a clipped ``rl`` section into GSPO. The
recipe keeps bf16, so preflight warns that bf16 logprob rounding is comparable to GSPO's clip
range; override ``model.dtype=float32`` where memory allows.
"""

from __future__ import annotations

from posttrain.config import ModelConfig, PosttrainConfig, RLConfig
from posttrain.configs.grpo_base import build_grpo_config


def apply_gspo_knobs(
    rl: RLConfig, *, mini_batch_per_replica: int, model: ModelConfig | None = None
) -> RLConfig:
    """Set the GSPO objective on ``rl`` (and the capability it relies on, on ``model``).

    Clipped surrogate at sequence level, no dual clip, epsilons 3e-4/4e-4, mean of per-response
    token means, and ``mini_batch_per_replica`` updates per batch (with one the ratio is always
    1). ``model``, when given, is marked ``certified_deterministic_forward``: with clip ranges
    this small, batch-dependent forward noise would otherwise decide the clip.
    """
    rl.grpo_surrogate = "clipped"
    rl.importance_sampling_level = "sequence"
    rl.lower_bound_ratio = 0.0
    rl.epsilon_low = 3e-4
    rl.epsilon_high = 4e-4
    rl.loss_type = "seq-mean-token-mean"
    rl.mini_batch_per_replica = mini_batch_per_replica
    if model is not None:
        model.certified_deterministic_forward = True
    return rl


def build_config() -> PosttrainConfig:
    cfg = build_grpo_config()
    cfg.job.algorithm = "gspo"
    cfg.job.name = "qwen3b_bf16_gspo_seed42"
    apply_gspo_knobs(cfg.rl, mini_batch_per_replica=32, model=cfg.model)
    return cfg
