"""Diffusion DPO on the built-in shapes domain: prefer red, centred shapes (``make demo-dpo``).

The base model and the pairs come from ``posttrain dpo pretrain`` and ``posttrain dpo
make-pairs`` (the paths below are where ``make demo-dpo`` writes them). ``dpo.loss=sft_chosen``
turns the same recipe into the fine-tune-on-winners baseline: same pairs, steps and lr schedule.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.name = "dpo_shapes"
    cfg.job.algorithm = "dpo"
    cfg.job.seed = 0
    cfg.model.name_or_path = "outputs/dpo/demo/base"

    cfg.dpo.loss = "dpo"
    cfg.dpo.pairs_path = "outputs/dpo/demo/pairs/pairs.jsonl"
    cfg.dpo.pairs_per_step = 16
    cfg.dpo.eval_samples_per_class = 64  # 192 samples: ~10 s per evaluation on one core
    cfg.dpo.target_color = "red"

    # Measured on this domain (docs/guides/dpo.md), β = 5 (β·T = 5000): lr 1e-5 and 3e-5 gain
    # less in 120 steps, 3e-4 costs 25 points of validity; β = 0.5 and 50 gain less at 1e-4.
    cfg.rl.lr = 1e-4
    cfg.rl.lr_schedule = "cosine"
    cfg.rl.warmup_steps = 10
    cfg.rl.max_steps = 120
    cfg.rl.eval_every = 40
    cfg.rl.save_every = 60
    cfg.rl.micro_batch_size = 16
    cfg.rl.grad_clip = 1.0
    return cfg
