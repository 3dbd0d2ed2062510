"""Base vs Diffusion-DPO vs fine-tune-on-winners, from the demo's two runs (``make demo-dpo``).

Every figure is an evaluation on the same fixed-seed fresh samples: the base model is the DPO
run's step-0 evaluation (before any update), the others are each run's last evaluation. Writes
``DEMO/summary.json`` and copies each sample grid to ``DEMO/<name>.png``.

    python examples/dpo_demo_summary.py outputs/dpo outputs/dpo/demo
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def evaluations(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {
        r["step"]: {k[4:]: r[k] for k in ("val/scorer_mean", "val/validity")}
        for r in rows
        if "val/scorer_mean" in r
    }


def main(runs: Path, demo: Path) -> None:
    dpo_evals, sft_evals = evaluations(runs / "demo_dpo"), evaluations(runs / "demo_sft_winners")
    last = max(dpo_evals)
    summary = {
        "base": dpo_evals[0],
        "dpo": dpo_evals[last],
        "sft_winners": sft_evals[max(sft_evals)],
    }
    for name, run, step in (("base", "demo_dpo", 0), ("dpo", "demo_dpo", last),
                            ("sft_winners", "demo_sft_winners", max(sft_evals))):  # fmt: skip
        shutil.copyfile(runs / run / "samples" / f"step_{step:06d}.png", demo / f"{name}.png")
    (demo / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{'':12} scorer_mean  validity   (fresh samples, fixed seeds; {last} steps)")
    for name, m in summary.items():
        print(f"{name:12} {m['scorer_mean']:11.4f} {m['validity']:9.3f}")
    print(f"written: {demo / 'summary.json'} and {', '.join(f'{n}.png' for n in summary)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
