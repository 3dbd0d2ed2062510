"""Roofline report: each phase of a recipe's GRPO step as a fraction of this machine's matmul peak.

    python benchmarks/roofline.py --config smollm2_reasoning_gym --steps 3 -- \\
        model.name_or_path=outputs/models/smollm2-135m-instruct model.dtype=bfloat16 \\
        rollout.dtype=bfloat16
    python benchmarks/roofline.py --smoke            # tiny recipe and matmul, seconds (CI)

First the peak: a ``--shape M K N`` matmul (default 2048 576 1536, a SmolLM2 MLP projection of
2048 tokens) in float32 and in bfloat16, repeated for ``--seconds``, on the run's thread count
(``placement.torch_threads_per_process``). Then ``--steps`` steps of the recipe in this process;
the first is dropped as warm-up when there are more. Per phase, from its metrics:

- rollout: 2 * P * (generated tokens + unique prompt tokens prefilled once per group), over
  ``time/rollout_s``, against the peak of the rollout's dtype;
- update: (6 * P, or 4 * P with LoRA: no base weight gradients) * T, plus 2 * P * T for a frozen
  reference forward (``rl.kl_beta`` > 0) and for a separate π_old forward (several mini-batches
  per collected batch), over ``time/train_s``, against the peak of ``model.dtype``;

with P the parameters the matmuls multiply per token (decoder linears and the head, from
``control/memory.py``'s model shape; the embedding lookup is no matmul) and T the tokens of the
update's rows (``train/tokens``). Attention's score and value products are not counted, so the
fractions are lower bounds. Prints a table; ``--json PATH`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16")
SMOKE_OPTS = ["rl.max_steps=2", "data.prompts_per_step=2", "rollout.n=2", "rollout.max_tokens=3",
              "data.train_size=20", "data.val_size=4", "rl.micro_batch_size=4"]  # fmt: skip


def matmul_peak(dtype: str, shape: tuple[int, int, int], seconds: float) -> float:
    """FLOP/s of an ``M x K @ K x N`` matmul in ``dtype`` on the current torch threads."""
    import torch

    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(getattr(torch, dtype))
    b = torch.randn(k, n, generator=g).to(getattr(torch, dtype))
    out = a @ b  # warm-up: oneDNN primitive creation, first-touch of the output
    reps, t0 = 0, time.perf_counter()
    while True:
        torch.matmul(a, b, out=out)
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds and reps >= 3:
            return 2.0 * m * k * n * reps / elapsed


def matmul_params(config) -> int:
    """Parameters multiplied per token: every decoder linear and the head."""
    from posttrain.control.memory import model_shape

    shape = model_shape(config)
    if shape is None:
        raise SystemExit(f"no config.json in {config.model.name_or_path} and no init_preset")
    per_layer = sum(i * o for i, o in shape.linears().values())
    return shape.layers * per_layer + shape.vocab * shape.hidden


def phase_flops(config, params: int, row: dict[str, float]) -> dict[str, float]:
    """FLOPs of the rollout and the update of one step's metrics ``row`` (see the module doc)."""
    from posttrain.config.build import needs_reference

    generated = row["perf/rollout_tokens_per_s"] * row["time/rollout_s"]
    tokens = row["train/tokens"]
    prefill = max(tokens - generated, 0.0) / config.rollout.n  # each prompt prefilled once
    backward = 4 if config.model.lora_rank else 6
    forwards = int(needs_reference(config)) + int(config.rl.mini_batch_per_replica > 1)
    return {
        "rollout": 2.0 * params * (generated + prefill),
        "update": (backward + 2 * forwards) * params * tokens,
    }


def run_steps(recipe: str, overrides: list[str], steps: int, out: Path):
    """Train ``steps`` steps in this process; the resolved config and the measured rows."""
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    opts = [f"job.output_root={out}", f"rl.max_steps={steps}", "rl.save_every=0",
            "rl.eval_every=0", "rl.resume=off", "logging.progress=false", *overrides]  # fmt: skip
    config = load_config(recipe, ["--", *opts])
    summary = grpo.run(config, recipe, opts, grpo.default_out_dir(config), build_objective)
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    rows = [r for r in map(json.loads, text.splitlines()) if "time/train_s" in r]
    return config, rows[1:] if len(rows) > 1 else rows


def report(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    import torch

    from posttrain.config import load_config
    from posttrain.placement.device import resolve_device, rollout_dtype

    threads = load_config(args.config, ["--", *overrides]).placement.torch_threads_per_process
    torch.set_num_threads(threads)
    peaks = {d: matmul_peak(d, args.shape, args.seconds) for d in DTYPES}
    with tempfile.TemporaryDirectory(prefix="roofline_") as out:
        config, rows = run_steps(args.config, overrides, args.steps, Path(out))
    params = matmul_params(config)
    device = resolve_device(config.placement.device)
    dtypes = {"rollout": rollout_dtype(config.rollout.dtype, device), "update": config.model.dtype}
    times = {"rollout": "time/rollout_s", "update": "time/train_s"}
    phases = {}
    for name, key in times.items():
        flops = statistics.mean(phase_flops(config, params, r)[name] for r in rows)
        seconds = statistics.mean(r[key] for r in rows)
        achieved = flops / max(seconds, 1e-12)
        phases[name] = {"dtype": dtypes[name], "seconds": seconds, "flops": flops,
                        "flop_per_s": achieved, "of_peak": achieved / peaks[dtypes[name]]}  # fmt: skip
    return {"config": args.config, "overrides": overrides, "threads": threads,
            "shape": list(args.shape), "peak_flop_per_s": peaks, "matmul_params": params,
            "steps_measured": len(rows), "step_s": statistics.mean(r["time/step_s"] for r in rows),
            "phases": phases}  # fmt: skip


def table(r: dict[str, Any]) -> str:
    g = lambda x: f"{x / 1e9:,.4g}"  # noqa: E731
    peaks = r["peak_flop_per_s"]
    lines = [
        f"matmul peak ({' x '.join(map(str, r['shape']))}, {r['threads']} thread(s)): "
        f"float32 {g(peaks['float32'])} GFLOP/s, bfloat16 {g(peaks['bfloat16'])} GFLOP/s "
        f"({peaks['bfloat16'] / peaks['float32']:.1f}x)",
        f"{r['config']} {' '.join(r['overrides'])}: {r['matmul_params']:,} matmul parameters, "
        f"{r['steps_measured']} step(s) measured, {r['step_s']:.2f} s per step",
        "",
        "| phase | dtype | s | GFLOP | GFLOP/s | of peak |",
        "|---|---|---|---|---|---|",
    ]
    for name, p in r["phases"].items():
        lines.append(f"| {name} | {p['dtype']} | {p['seconds']:.3f} | {g(p['flops'])} | "
                     f"{g(p['flop_per_s'])} | {p['of_peak']:.1%} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="smollm2_reasoning_gym")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--shape", type=int, nargs=3, default=(2048, 576, 1536), metavar=("M", "K", "N")
    )
    ap.add_argument("--seconds", type=float, default=2.0, help="per matmul peak")
    ap.add_argument("--smoke", action="store_true", help="tiny recipe and matmul (CI)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(own)
    if args.smoke:
        args.config, args.steps, args.shape, args.seconds = "arithmetic", 2, (64, 64, 64), 0.05
        overrides = [*SMOKE_OPTS, *overrides]
    result = report(args, overrides)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
