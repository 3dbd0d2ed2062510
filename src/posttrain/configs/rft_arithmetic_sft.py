"""SFT on a policy's own correct answers (RFT): the partly trained arithmetic policy of
``rft_arithmetic`` fine-tuned on the rows ``posttrain rft --config rft_arithmetic`` wrote.

Rejection-sampling fine-tuning (docs/guides/rft.md): the model is the one the rows were sampled
from (``outputs/grpo/rft_base/final_model``), the rows its correct samples
(``outputs/rft/rft_arithmetic/sft.jsonl``: each distinct correct answer of a train problem).
Held-out accuracy is measured by sampling from the result (``posttrain rft`` reports it).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.rft_arithmetic import base_model
from posttrain.configs.rft_arithmetic import build_config as build_sampler
from posttrain.entrypoints.rft import out_dir


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.algorithm = "sft"
    cfg.job.name = "rft_arithmetic_sft"
    cfg.model.name_or_path = base_model()

    cfg.sft.train_path = str(out_dir(build_sampler()) / "sft.jsonl")
    cfg.sft.rows_per_step = 16
    cfg.sft.max_tokens = 16

    cfg.rl.lr = 1e-3
    cfg.rl.max_steps = 100
    cfg.rl.eval_every = 0
    cfg.rl.save_every = 100
    cfg.placement.torch_threads_per_process = 1
    return cfg
