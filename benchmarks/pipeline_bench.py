"""Steps per second with ``rl.off_policy_lag=1`` against the sequential loop.

Three runs of one workload (default: the ``arithmetic_clipped`` recipe on the ``small`` preset,
8 prompts x 8 samples, 32 new tokens), each in its own process:

- ``ray k=0``: Ray placement, one torch thread per actor, the sequential loop;
- ``ray k=1``: the same placement with a lag of one (the rollout samples step s+1 while the
  policy trains step s);
- ``local k=0``: in-process placement with 2 torch threads (what a user of a 2-core machine would
  otherwise run).

Reports medians of the step time and its phases over the steps after ``--warmup`` (the first step
of a lagged run also collects the first batch), and steps/s relative to ``ray k=0``.

    python benchmarks/pipeline_bench.py                        # ~5 min on 2 cores
    python benchmarks/pipeline_bench.py --steps 5 --preset tiny --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = {
    "ray k=0": {"placement.backend": "ray", "placement.torch_threads_per_process": 1,
                "rl.off_policy_lag": 0},
    "ray k=1": {"placement.backend": "ray", "placement.torch_threads_per_process": 1,
                "rl.off_policy_lag": 1},
    "local k=0": {"placement.backend": "local", "placement.torch_threads_per_process": 2},
}  # fmt: skip
PHASES = ("step", "rollout", "reward", "train", "sync", "pipeline_wait")


def run_one(name: str, args, workdir: Path) -> dict:
    """Train ``args.steps`` steps of run ``name`` in this process; medians after warm-up."""
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    opts = {
        "job.output_root": workdir, "model.name_or_path": workdir / args.preset,
        "model.init_preset": args.preset, "rl.max_steps": args.steps, "rl.save_every": 0,
        "rl.eval_every": 0, "rl.resume": "off", "logging.progress": "false",
        "data.prompts_per_step": args.prompts, "rollout.n": args.n,
        "rollout.max_tokens": args.max_tokens, "rl.micro_batch_size": args.prompts * args.n,
        **RUNS[name],
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config(args.recipe, ["--", *opts])
    summary = grpo.run(config, args.recipe, opts, grpo.default_out_dir(config), build_objective)
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    rows = [r for r in map(json.loads, text.splitlines()) if r["step"] > args.warmup]
    out = {"run": name, "steps_measured": len(rows)}
    for phase in PHASES:
        values = [r[f"time/{phase}_s"] for r in rows if f"time/{phase}_s" in r]
        out[f"{phase}_s"] = statistics.median(values) if values else None
    out["steps_per_s"] = 1.0 / out["step_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="arithmetic_clipped")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run_one(args._child, args, Path(tmp))))
        return
    results = []
    shape = ("recipe", "preset", "prompts", "n", "max_tokens", "steps", "warmup")
    passed = [x for k in shape for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    for name in args.runs:
        cmd = [sys.executable, __file__, *passed, "--_child", name]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(lines[-1].removeprefix("RESULT ")))
    base = next((r["steps_per_s"] for r in results if r["run"] == "ray k=0"), None)
    print(f"{args.recipe}, preset {args.preset}, {args.prompts}x{args.n}, {args.max_tokens} new "
          f"tokens; medians of steps {args.warmup + 1}..{args.steps} (seconds)")  # fmt: skip
    head = (
        f"{'run':<10}" + "".join(f"{p:>15}" for p in PHASES) + f"{'steps/s':>10}{'vs ray k=0':>12}"
    )
    print(head)
    for r in results:
        cells = "".join(f"{r[f'{p}_s']:>15.3f}" if r[f"{p}_s"] is not None else f"{'-':>15}"
                        for p in PHASES)  # fmt: skip
        ratio = f"{r['steps_per_s'] / base:>11.2f}x" if base else f"{'-':>12}"
        print(f"{r['run']:<10}{cells}{r['steps_per_s']:>10.3f}{ratio}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
