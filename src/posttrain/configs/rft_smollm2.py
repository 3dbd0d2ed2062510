"""Rejection sampling from SmolLM2-135M-Instruct on ``smollm2_reasoning_gym``'s problems.

``posttrain rft --config rft_smollm2 --prompts 64`` (docs/guides/rft.md, "SmolLM2") samples
``rollout.n=8`` answers (temperature 0.6, at most 64 tokens, the GRPO recipe's sampling) to the
first train problems of ``smollm2_reasoning_gym`` from the untrained model, scores them with its
``last_number`` verifier, writes ``outputs/rft/rft_smollm2/{sft,pairs}.jsonl`` for
``rft_smollm2_sft`` and ``rft_smollm2_lmdpo``, and evaluates the model greedily on
:data:`VAL_SIZE` held-out problems (GRPO's evaluation: the one yardstick for base, SFT and DPO).
Everything else is the GRPO recipe's; as a GRPO recipe it is that recipe on 200 held-out problems.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.smollm2_reasoning_gym import build_config as build_smollm2

#: Held-out problems (the GRPO recipe evaluates 100; 200 make one problem 0.005).
VAL_SIZE = 200


def build_config() -> PosttrainConfig:
    cfg = build_smollm2()
    cfg.job.name = "rft_smollm2"
    cfg.data.val_size = VAL_SIZE
    cfg.rollout.n = 8
    return cfg
