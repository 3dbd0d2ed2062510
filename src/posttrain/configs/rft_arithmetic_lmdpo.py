"""DPO on a policy's own correct-vs-incorrect answers: the partly trained arithmetic policy of
``rft_arithmetic`` trained on the pairs ``posttrain rft --config rft_arithmetic`` wrote.

The preference counterpart of ``rft_arithmetic_sft`` (docs/guides/rft.md): the same model,
against itself as the frozen reference, on ``outputs/rft/rft_arithmetic/pairs.jsonl`` (a correct
sample of a train problem chosen over an incorrect one of the same problem).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.rft_arithmetic import base_model
from posttrain.configs.rft_arithmetic import build_config as build_sampler
from posttrain.entrypoints.rft import out_dir


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.algorithm = "lmdpo"
    cfg.job.name = "rft_arithmetic_lmdpo"
    cfg.model.name_or_path = base_model()

    cfg.lmdpo.train_path = str(out_dir(build_sampler()) / "pairs.jsonl")
    cfg.lmdpo.pairs_per_step = 16
    cfg.lmdpo.max_tokens = 16
    cfg.lmdpo.beta = 0.1

    cfg.rl.lr = 1e-3
    cfg.rl.max_steps = 100
    cfg.rl.eval_every = 0
    cfg.rl.save_every = 100
    cfg.placement.torch_threads_per_process = 1
    return cfg
