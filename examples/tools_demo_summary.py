"""Held-out accuracy before and after training, with the calculator and without it.

    python examples/tools_demo_summary.py TOOLS_RUN_DIR NO_TOOL_RUN_DIR

``make demo-tools`` trains both from the same random ``arith_tools`` model, seed and step count.
Prints each run's held-out accuracy (greedy) at its first and last evaluation, the tool calls per
held-out problem of the tools run, the steps and the training time, then whether the demo's
target holds: >= 0.9 with the tool, <= 0.3 without.
"""

from __future__ import annotations

import sys
from pathlib import Path

from posttrain.metrics.plot import read_metrics

WITH_TOOL, WITHOUT_TOOL = 0.9, 0.3


def summary(run_dir: str) -> dict[str, float]:
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    evals = [r for r in rows if "val/accuracy" in r]
    steps = [r for r in rows if "time/step_s" in r]
    if not evals or not steps:
        raise SystemExit(f"{run_dir}: no evaluations or steps in metrics.jsonl; train it first")
    return {
        "before": float(evals[0]["val/accuracy"]),
        "after": float(evals[-1]["val/accuracy"]),
        "calls": float(evals[-1].get("val/env/tool_calls_mean", 0.0)),
        "steps": int(steps[-1]["step"]),
        "train_s": sum(float(r["time/step_s"]) for r in steps),
    }


def main(tools_dir: str, plain_dir: str) -> None:
    tools, plain = summary(tools_dir), summary(plain_dir)
    print(f"{'run':<24} {'steps':>6} {'train s':>8} {'before':>7} {'after':>6} {'calls':>6}")
    for name, s in (("with the calculator", tools), ("without it", plain)):
        print(f"{name:<24} {s['steps']:>6} {s['train_s']:>8.0f} {s['before']:>7.2f} "
              f"{s['after']:>6.2f} {s['calls']:>6.2f}")  # fmt: skip
    held = tools["after"] >= WITH_TOOL and plain["after"] <= WITHOUT_TOOL
    print(f"target (>= {WITH_TOOL} with the tool, <= {WITHOUT_TOOL} without): "
          f"{'met' if held else 'missed'}")  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:3])
