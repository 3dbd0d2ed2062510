"""Arithmetic root recipe (plain policy gradient): the baseline the demo recipe builds on.

It pins ``rl.grpo_surrogate=legacy_pg`` (plain policy gradient, sampled at temperature 1.0), the
simplest objective; from random weights it collapses to one constant answer. ``make demo`` trains
``arithmetic_clipped``, which adds the clipped surrogate, a KL anchor and shaping on top of it.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.name = "arithmetic_tiny"
    cfg.job.algorithm = "grpo"
    cfg.job.seed = 0
    # The entry creates this tiny from-scratch model when the directory is missing.
    cfg.model.name_or_path = "outputs/models/tiny-arith"
    cfg.model.init_preset = "tiny"
    cfg.model.dtype = "float32"

    cfg.data.task = "arithmetic"
    cfg.data.digits = 1
    cfg.data.operators = "+"
    cfg.data.train_size = 80
    cfg.data.val_size = 20
    cfg.data.prompts_per_step = 32
    cfg.data.prompt_template = "plain"

    cfg.rollout.n = 8
    cfg.rollout.temperature = 1.0
    cfg.rollout.max_tokens = 4
    # Pinned: `auto` is bfloat16 on a CPU with AVX512-BF16 or AMX, which would sample other
    # tokens than the float32 runs the demos, their guides and the tests pin (and on a model
    # this small bf16 saves nothing). float32 samples with the policy module itself.
    cfg.rollout.dtype = "float32"

    cfg.reward.verifier = "exact"

    cfg.rl.grpo_surrogate = "legacy_pg"
    cfg.rl.lr = 1e-3
    cfg.rl.max_steps = 150
    cfg.rl.save_every = 50
    cfg.rl.eval_every = 25
    cfg.rl.micro_batch_size = 64
    cfg.rl.grad_clip = 1.0

    cfg.placement.torch_threads_per_process = 1
    return cfg
