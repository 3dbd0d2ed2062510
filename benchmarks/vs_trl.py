"""posttrain vs TRL's GRPOTrainer on the CPU, interleaved A/B/A/B in one process.

    make bench-trl                                   # builds .venv-bench (TRL), runs both workloads
    .venv-bench/bin/python benchmarks/vs_trl.py --workloads small --steps 4

Both sides train the same model directory (a tiny preset built by ``posttrain model tiny``), see
the same prompts at each step, sample the same number of responses per prompt with the same
new-token budget, and use the same KL coefficient (k3 against the initial model), lr, AdamW,
gradient clip and one torch thread (``--bf16``: bf16 compute on both). Each TRL step is followed by one posttrain step. The first
``--warmup`` steps of each side are dropped; medians of the rest are printed with per-phase times:

- ``generate``: sampling; ``reference_fwd``: the frozen reference's forwards;
- ``pi_old_fwd``: no-grad policy forwards during the update (a separate π_old capture);
- ``policy_fwd``: grad-enabled policy forwards;
- ``loss_backward_optim``: the rest of the update (loss math, backward, optimizer, bookkeeping).

TRL lives only in the benchmark venv; it is never a dependency of posttrain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

WORKLOADS = {
    # The demo recipe's step: arith preset (34k params), 16 prompts x 16 samples, 3 new tokens.
    "arith": ("arith", 16, 16, 3, 0.1, 1e-3, 256),
    # The 25M-parameter preset: 8 prompts x 8 samples, 32 new tokens.
    "small": ("small", 8, 8, 32, 0.1, 1e-6, 64),
}
PHASES = ("generate", "pi_old_fwd", "reference_fwd", "policy_fwd", "loss_backward_optim", "step")


def measure(name: str, steps: int, warmup: int, workdir: Path, bf16: bool) -> dict:
    from bench_posttrain import PosttrainSide, Workload
    from bench_trl import Interleave, trl_trainer

    from posttrain.data.tasks import format_prompt
    from posttrain.model.tiny import build_tiny_model

    w = Workload(name, *WORKLOADS[name])
    model_dir = build_tiny_model(w.preset, workdir / f"model-{w.preset}", seed=0)
    extra = ("model.dtype=bfloat16", "rollout.dtype=bfloat16") if bf16 else ()
    ours = PosttrainSide(w, model_dir, workdir / "posttrain", steps, extra)
    items = [ours.prompts_for(s) for s in range(1, steps + 1)]
    rows = [
        {"prompt": format_prompt(it, "plain", ours.tokenizer), "answer": it.answer}
        for step_items in items
        for it in step_items
    ]
    posttrain_steps: list[dict[str, float]] = []

    def posttrain_step(step: int) -> None:
        posttrain_steps.append(ours.step(step, items[step - 1]))

    trainer = trl_trainer(w, model_dir, workdir / "trl", rows, steps, seed=0, bf16=bf16)
    callback = Interleave(trainer.clock, posttrain_step)
    trainer.add_callback(callback)
    trainer.train()
    out = {"workload": name, "bf16": bf16, "steps_measured": steps - warmup}
    for side, rows_ in (("trl", callback.steps), ("posttrain", posttrain_steps)):
        kept = rows_[warmup:]
        out[side] = {p: statistics.median(r.get(p, 0.0) for r in kept) for p in PHASES}
    out["speedup"] = out["trl"]["step"] / out["posttrain"]["step"]
    return out


def print_table(result: dict) -> None:
    precision = "bf16" if result["bf16"] else "fp32"
    print(f"\n{result['workload']} ({precision}): medians of {result['steps_measured']} steps (ms)")
    print(f"{'phase':<22}{'TRL':>12}{'posttrain':>12}")
    for p in PHASES:
        t, o = result["trl"][p] * 1e3, result["posttrain"][p] * 1e3
        print(f"{p:<22}{t:>12.1f}{o:>12.1f}")
    print(f"posttrain speed vs TRL: {result['speedup']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["arith", "small"], choices=list(WORKLOADS))
    ap.add_argument(
        "--steps", type=int, default=None, help="steps per side (default: per workload)"
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 compute on both sides: posttrain model.dtype=bfloat16 + rollout.dtype="
        "bfloat16 (bf16 sampling copy), TRL bf16=True",
    )
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    results = []
    for name in args.workloads:
        steps = args.steps or {"arith": 30, "small": 6}[name]
        if steps <= args.warmup:
            sys.exit(f"--steps={steps} must exceed --warmup={args.warmup}")
        with tempfile.TemporaryDirectory() as tmp:
            results.append(measure(name, steps, args.warmup, Path(tmp), args.bf16))
        print_table(results[-1])
    print(f"load average at the end: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
