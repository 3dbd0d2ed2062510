"""``tools_addition`` without the calculator: the baseline of `make demo-tools`.

The same model, task, rewards on the answer, optimiser and step count; no environment, so each
response is a single-turn answer to ``123+456=`` (``data.prompt_template=plain``).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.tools_addition import build_config as build_tools_config


def build_config() -> PosttrainConfig:
    cfg = build_tools_config()
    cfg.job.name = "tools_addition_notool"
    cfg.env.name = ""
    return cfg
