"""DPO on SmolLM2-135M-Instruct's own correct-vs-incorrect answers: the base model of
``rft_smollm2`` trained with LoRA on the pairs ``posttrain rft --config rft_smollm2`` wrote.

The preference counterpart of ``rft_smollm2_sft`` (docs/guides/rft.md): the same model and LoRA
(rank 16 on every linear layer), the reference the frozen base (the policy with its adapters
off), on ``outputs/rft/rft_smollm2/pairs.jsonl`` (a correct sample of a train problem chosen over
an incorrect one of the same problem). beta 0.1 (the usual DPO value) with RPO's NLL term on the
chosen answers (``lmdpo.rpo_alpha=1``): plain DPO lowered the chosen answers' likelihood with the
rejected ones and missed its target (held out -0.02 / +0.06 on seeds 0-1), with the term it
gained +0.15 / +0.17 / +0.10 on seeds 0-2. lr 2e-4 constant, the GRPO recipe's LoRA rate, 30
steps of 8 pairs. What it measured: docs/guides/rft.md.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.rft_smollm2 import build_config as build_sampler
from posttrain.entrypoints.rft import out_dir


def build_config() -> PosttrainConfig:
    sampler = build_sampler()
    cfg = PosttrainConfig()
    cfg.job.algorithm = "lmdpo"
    cfg.job.name = "rft_smollm2_lmdpo"
    cfg.job.seed = 0
    cfg.model = sampler.model.model_copy(deep=True)

    cfg.lmdpo.train_path = str(out_dir(sampler) / "pairs.jsonl")
    cfg.lmdpo.pairs_per_step = 8
    cfg.lmdpo.max_tokens = 192  # a ~60-token chat prompt and an answer of at most 64
    cfg.lmdpo.beta = 0.1
    cfg.lmdpo.rpo_alpha = 1.0

    cfg.rl.lr = 2e-4
    cfg.rl.lr_schedule = "constant"
    cfg.rl.max_steps = 30
    cfg.rl.eval_every = 0
    cfg.rl.save_every = 30
    cfg.rl.micro_batch_size = 8
    cfg.rl.grad_clip = 1.0
    return cfg
