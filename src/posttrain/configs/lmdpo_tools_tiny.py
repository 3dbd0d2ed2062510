"""LM DPO on calculator preferences: a tiny random model learns to prefer the tool call.

The preference counterpart of ``sft_tools_tiny`` (docs/guides/preference.md): the 135k-parameter
``arith_tools`` Mistral starts from random weights and is trained with DPO on pairs whose prompt
is a problem of ``posttrain.env.arithmetic`` (``123+456=``), whose chosen answer is the calculator
call ``<tool_call>A+U</tool_call>`` and whose rejected answer is a guessed (wrong) sum. The
reference is the random initial model. The pairs are
``examples/lmdpo_tools_tiny/{train,val}.jsonl``, written by :func:`write_pairs` (a test checks
the files are its output); the held-out reward accuracy (``val/rewards/accuracies``) rises.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from posttrain.config import PosttrainConfig

DATA = "examples/lmdpo_tools_tiny"
#: Pairs of each file (the validation problems are not among the training ones).
TRAIN_PAIRS, VAL_PAIRS = 128, 32


def pair(a: int, b: int, wrong: int) -> dict:
    """One pair: the problem, the call (chosen) and a wrong guess (rejected)."""
    return {"prompt": f"{a}+{b}=", "chosen": "<tool_call>A+U</tool_call>",
            "rejected": f"{wrong:>4}"}  # fmt: skip


def pairs(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The train and validation pairs: distinct three-digit problems, seeded; each guess is off
    by 1 to 99."""
    rng = random.Random(seed)
    problems: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(problems) < TRAIN_PAIRS + VAL_PAIRS:
        p = (rng.randint(100, 999), rng.randint(100, 999))
        if p not in seen:
            seen.add(p)
            problems.append(p)
    rows = [pair(a, b, a + b + rng.choice((-1, 1)) * rng.randint(1, 99)) for a, b in problems]
    return rows[:TRAIN_PAIRS], rows[TRAIN_PAIRS:]


def write_pairs(out: str | Path = DATA) -> None:
    """Write ``train.jsonl`` and ``val.jsonl`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in zip(("train", "val"), pairs(), strict=True):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.algorithm = "lmdpo"
    cfg.job.name = "lmdpo_tools_tiny"
    cfg.model.name_or_path = "outputs/models/lmdpo-tools-init"
    cfg.model.init_preset = "arith_tools"

    cfg.lmdpo.train_path = f"{DATA}/train.jsonl"
    cfg.lmdpo.val_path = f"{DATA}/val.jsonl"
    cfg.lmdpo.pairs_per_step = 8
    cfg.lmdpo.max_tokens = 64
    cfg.lmdpo.beta = 0.1

    cfg.rl.lr = 1e-3
    cfg.rl.max_steps = 40
    cfg.rl.eval_every = 10
    cfg.rl.save_every = 20
    return cfg


if __name__ == "__main__":
    write_pairs()
