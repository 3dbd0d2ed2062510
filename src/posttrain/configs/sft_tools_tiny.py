"""SFT on calculator demonstrations: a tiny random model learns the tool call and the copy.

The cold start tool-use RL needs (docs/guides/sft.md): a 135k-parameter Mistral (preset
``arith_tools``, the model of ``make demo-tools``) starts from random weights and is fine-tuned
on demonstrations of the calculator turn of ``posttrain.env.arithmetic``: the problem
(``123+456=``), the call ``<tool_call>A+U</tool_call>``, the tool's right-aligned result, and the
answer copied from it. Only the two assistant turns carry loss; the problem and the tool's turn
are context. The rows are ``examples/sft_tools_tiny/{train,val}.jsonl``, written by
:func:`write_demonstrations` (a test checks the files are its output).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from posttrain.config import PosttrainConfig

DATA = "examples/sft_tools_tiny"
#: Rows of each file (the validation problems are not among the training ones).
TRAIN_ROWS, VAL_ROWS = 256, 32


def demonstration(a: int, b: int) -> dict:
    """One row: the problem, the right call, the tool's result, the copied answer."""
    result = f"{a + b:>4}"
    return {"messages": [
        {"role": "user", "content": f"{a}+{b}="},
        {"role": "assistant", "content": "<tool_call>A+U</tool_call>"},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": result},
    ]}  # fmt: skip


def demonstrations(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """The train and validation rows: distinct three-digit problems, seeded."""
    rng = random.Random(seed)
    problems: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(problems) < TRAIN_ROWS + VAL_ROWS:
        p = (rng.randint(100, 999), rng.randint(100, 999))
        if p not in seen:
            seen.add(p)
            problems.append(p)
    rows = [demonstration(a, b) for a, b in problems]
    return rows[:TRAIN_ROWS], rows[TRAIN_ROWS:]


def write_demonstrations(out: str | Path = DATA) -> None:
    """Write ``train.jsonl`` and ``val.jsonl`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in zip(("train", "val"), demonstrations(), strict=True):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.algorithm = "sft"
    cfg.job.name = "sft_tools_tiny"
    cfg.model.name_or_path = "outputs/models/sft-tools-init"
    cfg.model.init_preset = "arith_tools"

    cfg.sft.train_path = f"{DATA}/train.jsonl"
    cfg.sft.val_path = f"{DATA}/val.jsonl"
    cfg.sft.rows_per_step = 16
    cfg.sft.max_tokens = 64

    cfg.rl.lr = 3e-3
    cfg.rl.max_steps = 300
    cfg.rl.eval_every = 50
    cfg.rl.save_every = 100
    return cfg


if __name__ == "__main__":
    write_demonstrations()
