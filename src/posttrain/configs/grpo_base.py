"""GRPO base recipe: Qwen2.5-3B on GSM8K-format JSONL with the clipped surrogate.

``build_grpo_config()`` is the base other GSM8K recipes start from (Dr-GRPO, GSPO). Paths are
local: point ``model.name_or_path`` and ``data.*_path`` at your copies, e.g.
``-- model.name_or_path=/models/Qwen2.5-3B data.train_path=/data/gsm8k/train.jsonl``.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig


def build_grpo_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.name = "qwen3b_bf16_grpo_seed42"
    cfg.job.algorithm = "grpo"
    cfg.job.seed = 42

    cfg.model.name_or_path = "models/Qwen2.5-3B"
    cfg.model.dtype = "bfloat16"
    cfg.model.gradient_checkpointing = True

    cfg.data.task = "jsonl"
    cfg.data.train_path = "data/gsm8k/train.jsonl"
    cfg.data.val_path = "data/gsm8k/test.jsonl"
    cfg.data.prompts_per_step = 64
    cfg.data.prompt_template = "chat"

    cfg.rollout.n = 8
    cfg.rollout.temperature = 1.0
    cfg.rollout.max_tokens = 1024

    cfg.reward.verifier = "math"

    cfg.rl.grpo_surrogate = "clipped"
    cfg.rl.temperature = 1.0
    cfg.rl.lr = 1e-6
    cfg.rl.max_steps = 500
    cfg.rl.save_every = 50
    cfg.rl.eval_every = 25
    cfg.rl.micro_batch_size = 4
    cfg.rl.grad_clip = 1.0
    return cfg


def build_config() -> PosttrainConfig:
    return build_grpo_config()
