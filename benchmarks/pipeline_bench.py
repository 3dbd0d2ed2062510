"""Steps per second with ``rl.off_policy_lag=1`` against the sequential loop.

Runs of one workload, each in its own process:

- ``ray k=0``: Ray placement, one torch thread per actor, the sequential loop;
- ``ray k=1``: the same placement with a lag of one (the rollout samples step s+1 while the
  policy trains step s; the KL reference, when the run has one, scores on the data side:
  ``placement.reference_on=auto``);
- ``ray k=1 ref@policy``: the lag with the reference inside the update, as before the
  data-side reference (only for a workload with a KL reference);
- ``local k=0``: in-process placement with 2 torch threads (what a user of a 2-core machine would
  otherwise run).

Workloads: ``small`` (default: the ``arithmetic_clipped`` recipe, KL anchor on, on the ``small``
preset, 8 prompts x 8 samples, 32 new tokens; ``--preset``, ``--prompts``, ``--n``,
``--max-tokens`` change it) and ``smollm2`` (the ``smollm2_reasoning_gym`` recipe as it is:
SmolLM2-135M-Instruct with LoRA, 8 x 8, 64 new tokens, no KL reference; the model folder is
``$POSTTRAIN_SMOLLM2``, default outputs/models/smollm2-135m-instruct).

Reports medians of the step time and its phases over the steps after ``--warmup`` (the first step
of a lagged run also collects the first batch), and steps/s relative to ``ray k=0``. ``reference``
is the data-side reference's seconds (inside ``train`` when it scores on the policy side);
``pipeline_wait`` is how long a lagged step waited for the collection after its update.

    python benchmarks/pipeline_bench.py                        # ~6 min on 2 cores
    python benchmarks/pipeline_bench.py --runs "ray k=1" "ray k=1 ref@policy"
    python benchmarks/pipeline_bench.py --workload smollm2 --steps 4 --warmup 1 --runs "ray k=0"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from posttrain.model.gguf_import import smollm2_dir

RAY = {"placement.backend": "ray", "placement.torch_threads_per_process": 1}
RUNS = {
    "ray k=0": {**RAY, "rl.off_policy_lag": 0},
    "ray k=1": {**RAY, "rl.off_policy_lag": 1},
    "ray k=1 ref@policy": {**RAY, "rl.off_policy_lag": 1, "placement.reference_on": "policy"},
    "local k=0": {"placement.backend": "local", "placement.torch_threads_per_process": 2},
}  # fmt: skip
PHASES = ("step", "rollout", "reward", "reference", "train", "sync", "pipeline_wait")
SMOLLM2_DIR = smollm2_dir()
#: Per workload: its recipe and the runs it has by default.
WORKLOADS = {
    "small": ("arithmetic_clipped", list(RUNS)),
    "smollm2": ("smollm2_reasoning_gym", ["ray k=0", "ray k=1", "local k=0"]),
}


def workload_opts(args, workdir: Path) -> dict:
    """The overrides that make the workload: a preset's shape, or the SmolLM2 recipe as it is."""
    common = {"job.output_root": workdir, "rl.max_steps": args.steps, "rl.save_every": 0,
              "rl.eval_every": 0, "rl.resume": "off", "logging.progress": "false"}  # fmt: skip
    if args.workload == "smollm2":
        return {**common, "model.name_or_path": SMOLLM2_DIR}
    return {
        **common, "model.name_or_path": workdir / args.preset, "model.init_preset": args.preset,
        "data.prompts_per_step": args.prompts, "rollout.n": args.n,
        "rollout.max_tokens": args.max_tokens, "rl.micro_batch_size": args.prompts * args.n,
    }  # fmt: skip


def run_one(name: str, args, workdir: Path) -> dict:
    """Train ``args.steps`` steps of run ``name`` in this process; medians after warm-up."""
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    opts = [f"{k}={v}" for k, v in {**workload_opts(args, workdir), **RUNS[name]}.items()]
    recipe = WORKLOADS[args.workload][0]
    config = load_config(recipe, ["--", *opts])
    summary = grpo.run(config, recipe, opts, grpo.default_out_dir(config), build_objective)
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    rows = [r for r in map(json.loads, text.splitlines()) if r["step"] > args.warmup]
    out = {"run": name, "steps_measured": len(rows)}
    for phase in PHASES:
        values = [r[f"time/{phase}_s"] for r in rows if f"time/{phase}_s" in r]
        out[f"{phase}_s"] = statistics.median(values) if values else None
    out["steps_per_s"] = 1.0 / out["step_s"]
    out["each_step_s"] = [round(r["time/step_s"], 3) for r in rows]  # the spread behind a median
    return out


def _burn(kind: str, seconds: float) -> float:
    """One thread busy for about ``seconds``: ``matmul`` (1024 x 1024 float32 products,
    cache-resident: GFLOP/s) or ``stream`` (adds over 256 MiB tensors, memory-bound: GB/s)."""
    import time

    import torch

    torch.set_num_threads(1)
    n = 1024 if kind == "matmul" else 1 << 26
    a, b = (torch.randn(n, n), torch.randn(n, n)) if kind == "matmul" else (torch.ones(n),) * 2
    work = 2 * n**3 / 1e9 if kind == "matmul" else 3 * 4 * n / 1e9
    t0, done = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b if kind == "matmul" else torch.add(a, b)
        done += 1
    return work * done / (time.perf_counter() - t0)


def contention(seconds: float = 5.0) -> dict:
    """Each kind of work on one thread alone, then two processes of it at once: how much two
    busy actors on this machine's two cores slow each other (1.0: not at all)."""
    from concurrent.futures import ProcessPoolExecutor

    out = {}
    with ProcessPoolExecutor(2) as pool:
        for kind in ("matmul", "stream"):
            alone = pool.submit(_burn, kind, seconds).result()
            pair = [f.result() for f in [pool.submit(_burn, kind, seconds) for _ in range(2)]]
            out[kind] = {"alone": round(alone, 2), "pair": [round(p, 2) for p in pair],
                         "slowdown": round(alone / min(pair), 2)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="small", choices=list(WORKLOADS))
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    ap.add_argument("--runs", nargs="+", default=None, choices=list(RUNS))
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--contention", action="store_true",
                    help="only time two one-thread matmul processes against one")  # fmt: skip
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.contention:
        print(json.dumps(contention()))
        return
    if args._child:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(run_one(args._child, args, Path(tmp))))
        return
    if args.workload == "smollm2" and not SMOLLM2_DIR.is_dir():
        sys.exit(f"no model folder at {SMOLLM2_DIR}; see docs/guides/smollm2.md to create it")
    runs = args.runs or WORKLOADS[args.workload][1]
    results = []
    shape = ("workload", "preset", "prompts", "n", "max_tokens", "steps", "warmup")
    passed = [x for k in shape for x in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    for name in runs:
        cmd = [sys.executable, __file__, *passed, "--_child", name]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(lines[-1].removeprefix("RESULT ")))
        print(f"# {name}: {json.dumps(results[-1])}", flush=True)  # survives a later run's kill
    base = next((r["steps_per_s"] for r in results if r["run"] == "ray k=0"), None)
    recipe = WORKLOADS[args.workload][0]
    shape = (f"preset {args.preset}, {args.prompts}x{args.n}, {args.max_tokens} new tokens"
             if args.workload == "small" else "the recipe's shape")  # fmt: skip
    print(f"{recipe}, {shape}; medians of steps {args.warmup + 1}..{args.steps} (seconds); "
          f"load average before {os.getloadavg()[0]:.2f}")  # fmt: skip
    head = (
        f"{'run':<20}" + "".join(f"{p:>14}" for p in PHASES) + f"{'steps/s':>10}{'vs ray k=0':>12}"
    )
    print(head)
    for r in results:
        cells = "".join(f"{r[f'{p}_s']:>14.3f}" if r[f"{p}_s"] is not None else f"{'-':>14}"
                        for p in PHASES)  # fmt: skip
        ratio = f"{r['steps_per_s'] / base:>11.2f}x" if base else f"{'-':>12}"
        print(f"{r['run']:<20}{cells}{r['steps_per_s']:>10.3f}{ratio}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
