"""Rejection sampling from a partly trained arithmetic policy: the sampler of the RFT demo.

``posttrain rft --config rft_arithmetic`` (docs/guides/rft.md) samples ``rollout.n=8`` answers to
each of the 80 train problems of ``arithmetic_clipped`` from that recipe's policy after
:data:`BASE_STEPS` GRPO steps (the run ``posttrain grpo --config arithmetic_clipped --
rl.max_steps=300 job.name=rft_base`` leaves in ``outputs/grpo/rft_base/final_model``), scores
them with its exact verifier, and writes ``outputs/rft/rft_arithmetic/{sft,pairs}.jsonl``, which
``rft_arithmetic_sft`` and ``rft_arithmetic_lmdpo`` train on. Everything else (prompts, sampling
temperature, reward) is ``arithmetic_clipped``'s; as a GRPO recipe it trains on from that policy
in a run of its own (its step count, and with it the shaping's fade, starts again).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.arithmetic_clipped import build_config as build_arithmetic_clipped
from posttrain.run.records import final_model_dir

#: The GRPO run the demo samples from, and its length (partly trained: some of its samples right).
BASE_RUN, BASE_STEPS = "rft_base", 300


def base_config() -> PosttrainConfig:
    """The base policy's run: ``arithmetic_clipped`` for :data:`BASE_STEPS` steps."""
    cfg = build_arithmetic_clipped()
    cfg.job.name = BASE_RUN
    cfg.rl.max_steps = BASE_STEPS
    return cfg


def base_model() -> str:
    """Where that run leaves its final policy (run it first)."""
    return str(final_model_dir(base_config()))


def build_config() -> PosttrainConfig:
    cfg = build_arithmetic_clipped()
    cfg.job.name = "rft_arithmetic"
    cfg.model.name_or_path = base_model()
    cfg.model.init_preset = None
    cfg.rollout.n = 8
    return cfg
