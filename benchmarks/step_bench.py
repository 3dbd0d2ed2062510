"""Step-time breakdown of the GRPO entry on the tiny-model presets.

Runs the arithmetic recipe for a few steps per preset, each preset in its own process (so peak
memory is that preset's), and reports the mean time per phase (rollout, reward, train, sync),
rollout and training tokens/s and the peak resident memory, as a table and JSON. The first step
is excluded from the means (allocator and kernel warm-up).

    python benchmarks/step_bench.py                       # tiny and small presets
    python benchmarks/step_bench.py --presets tiny --steps 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PHASES = ("rollout", "reward", "train", "sync", "step")

# Batch shape per preset: the 25M preset gets fewer prompts so a step stays in seconds on a CPU.
SHAPES = {
    "tiny": {"data.prompts_per_step": 32, "rollout.n": 8, "rl.micro_batch_size": 256},
    "small": {"data.prompts_per_step": 8, "rollout.n": 8, "rl.micro_batch_size": 64},
}


def run_one(preset: str, steps: int, workdir: Path) -> dict:
    """Train ``steps`` steps in this process and summarise metrics.jsonl."""
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    opts = [
        f"job.output_root={workdir}",
        f"model.name_or_path={workdir / preset}",
        f"model.init_preset={preset}",
        f"rl.max_steps={steps}",
        "rl.save_every=0",
        "rl.eval_every=0",
        "rl.resume=off",
        "logging.progress=false",
        "rollout.max_tokens=8",
        *(f"{k}={v}" for k, v in SHAPES[preset].items()),
    ]
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    rows = [
        json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    rows = [r for r in rows if r["step"] >= 2]  # drop the warm-up step (and the step-0 eval)
    out = {"preset": preset, "steps_measured": len(rows)}
    for phase in PHASES:
        out[f"{phase}_s"] = statistics.mean(r[f"time/{phase}_s"] for r in rows)
    out["rollout_tokens_per_s"] = statistics.mean(r["perf/rollout_tokens_per_s"] for r in rows)
    out["train_tokens_per_s"] = statistics.mean(r["train/tokens_per_s"] for r in rows)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_one(args._child, args.steps, Path(tmp))))
        return
    results = []
    for preset in args.presets:
        cmd = [sys.executable, __file__, "--_child", preset, "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cols = [f"{p}_s" for p in PHASES] + [
        "rollout_tokens_per_s",
        "train_tokens_per_s",
        "peak_rss_mib",
    ]
    print(f"{'preset':<8}" + "".join(f"{c:>22}" for c in cols))
    for r in results:
        print(f"{r['preset']:<8}" + "".join(f"{r[c]:>22.3f}" for c in cols))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
