"""SFT on SmolLM2-135M-Instruct's own correct answers (RFT): the base model of ``rft_smollm2``
fine-tuned with LoRA on the rows ``posttrain rft --config rft_smollm2`` wrote.

The model and LoRA (rank 16, alpha 32, every linear layer) are the GRPO recipe's; the rows are
each distinct correct sample of a train problem (``outputs/rft/rft_smollm2/sft.jsonl``). lr 2e-4
constant, GRPO's: a LoRA rate for a 135M model, 30 steps of 8 rows (a few passes over ~100-200
rows). What it measured (held-out accuracy against the base and DPO): docs/guides/rft.md.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.rft_smollm2 import build_config as build_sampler
from posttrain.entrypoints.rft import out_dir


def build_config() -> PosttrainConfig:
    sampler = build_sampler()
    cfg = PosttrainConfig()
    cfg.job.algorithm = "sft"
    cfg.job.name = "rft_smollm2_sft"
    cfg.job.seed = 0
    cfg.model = sampler.model.model_copy(deep=True)

    cfg.sft.train_path = str(out_dir(sampler) / "sft.jsonl")
    cfg.sft.rows_per_step = 8
    # The chat prompt (system message + question) is ~60 tokens, an answer at most 64.
    cfg.sft.max_tokens = 192

    cfg.rl.lr = 2e-4
    cfg.rl.lr_schedule = "constant"
    cfg.rl.max_steps = 30
    cfg.rl.eval_every = 0
    cfg.rl.save_every = 30
    cfg.rl.micro_batch_size = 8
    cfg.rl.grad_clip = 1.0
    return cfg
