"""Held-out accuracy before and after training, with the calculator and without it.

    python examples/tools_demo_summary.py --with RUN_DIR [STAGE2_DIR ...] \\
        --without RUN_DIR [STAGE2_DIR ...] [--joined DIR]

``make demo-tools`` trains each side as one run (``tools_addition_reset`` and
``tools_addition_notool_reset``) from the same random ``arith_tools`` model, seed and step count;
a side may also be a chain of stages, each starting from the previous one's final model (the
two-stage recipes ``tools_addition`` then ``tools_addition_stage2``). Prints each side's held-out
accuracy (greedy) at its first run's first evaluation and its last run's last one, the tool
calls per held-out problem, the steps and the training time of all its runs, then whether the
demo's target holds: >= 0.9 with the tool, <= 0.3 without. ``--joined DIR`` writes each side's
runs as one (``DIR/with_calculator/metrics.jsonl`` and ``DIR/without/metrics.jsonl``, a later
stage's steps counted on from the earlier ones'), for ``posttrain plot``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posttrain.fileio import atomic_write_text
from posttrain.metrics.plot import read_metrics

WITH_TOOL, WITHOUT_TOOL = 0.9, 0.3


def joined(stage_dirs: list[str]) -> list[dict]:
    """The stages' records as one run: each stage's steps after the previous stages' last; a
    later stage's step-0 evaluation (the previous stage's final model again) is left out."""
    rows, offset = [], 0
    for i, run_dir in enumerate(stage_dirs):
        path = Path(run_dir) / "metrics.jsonl"
        records = read_metrics(path) if path.is_file() else []
        steps = [r for r in records if "time/step_s" in r]
        if not steps or not any("val/accuracy" in r and r["step"] > 0 for r in records):
            raise SystemExit(f"{run_dir}: no steps or no evaluation after training in "
                             "metrics.jsonl; train it first")  # fmt: skip
        rows += [{**r, "step": r["step"] + offset} for r in records if i == 0 or r["step"] > 0]
        offset += int(steps[-1]["step"])
    return rows


def summary(rows: list[dict]) -> dict[str, float]:
    evals = [r for r in rows if "val/accuracy" in r]
    steps = [r for r in rows if "time/step_s" in r]
    return {
        "before": float(evals[0]["val/accuracy"]),
        "after": float(evals[-1]["val/accuracy"]),
        "calls": float(evals[-1].get("val/env/tool_calls_mean", 0.0)),
        "steps": int(steps[-1]["step"]),
        "train_s": sum(float(r["time/step_s"]) for r in steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with", dest="tools", nargs="+", required=True, metavar="RUN_DIR")
    ap.add_argument("--without", dest="plain", nargs="+", required=True, metavar="RUN_DIR")
    ap.add_argument("--joined", metavar="DIR")
    args = ap.parse_args()
    sides = {"with_calculator": joined(args.tools), "without": joined(args.plain)}
    tools, plain = summary(sides["with_calculator"]), summary(sides["without"])
    print(f"{'run':<24} {'steps':>6} {'train s':>8} {'before':>7} {'after':>6} {'calls':>6}")
    for name, s in (("with the calculator", tools), ("without it", plain)):
        print(f"{name:<24} {s['steps']:>6} {s['train_s']:>8.0f} {s['before']:>7.2f} "
              f"{s['after']:>6.2f} {s['calls']:>6.2f}")  # fmt: skip
    held = tools["after"] >= WITH_TOOL and plain["after"] <= WITHOUT_TOOL
    print(f"target (>= {WITH_TOOL} with the tool, <= {WITHOUT_TOOL} without): "
          f"{'met' if held else 'missed'}")  # fmt: skip
    if args.joined:
        for name, rows in sides.items():
            out = Path(args.joined) / name
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
