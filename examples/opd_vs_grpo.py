"""Held-out accuracy of an OPD student next to GRPO from scratch, step by step.

    python examples/opd_vs_grpo.py OPD_RUN_DIR GRPO_RUN_DIR

Both runs start from the same random ``arith`` model and seed (``make demo-opd`` arranges it).
For each evaluation of the OPD run the table shows GRPO's latest evaluation at or before that
step (the demo's GRPO run evaluates every 250 steps), then the first step each run reaches 0.9.
"""

from __future__ import annotations

import sys
from pathlib import Path

from posttrain.metrics.plot import read_metrics

TARGET = 0.9


def evaluations(run_dir: str) -> list[tuple[int, float]]:
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    return [(int(r["step"]), float(r["val/accuracy"])) for r in rows if "val/accuracy" in r]


def first_reaching(evals: list[tuple[int, float]], target: float) -> str:
    return next((str(step) for step, acc in evals if acc >= target), "not reached")


def main(opd_dir: str, grpo_dir: str) -> None:
    opd, grpo = evaluations(opd_dir), evaluations(grpo_dir)
    print(f"{'step':>6} {'OPD student':>12} {'GRPO':>6} {'(GRPO eval step)':>17}")
    for step, acc in opd:
        before = [(s, a) for s, a in grpo if s <= step]
        g_step, g_acc = before[-1] if before else (None, None)
        g = "-" if g_acc is None else f"{g_acc:.2f}"
        print(f"{step:>6} {acc:>12.2f} {g:>6} {'' if g_step is None else g_step:>17}")
    print(f"first step at held-out accuracy >= {TARGET}: OPD {first_reaching(opd, TARGET)}, "
          f"GRPO {first_reaching(grpo, TARGET)} (GRPO evaluated every {_spacing(grpo)} steps)")  # fmt: skip


def _spacing(evals: list[tuple[int, float]]) -> int:
    return evals[1][0] - evals[0][0] if len(evals) > 1 else 0


if __name__ == "__main__":
    main(*sys.argv[1:3])
