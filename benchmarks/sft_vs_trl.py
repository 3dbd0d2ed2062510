"""posttrain's SFT step vs TRL's SFTTrainer on the same rows, each side in its own process.

    make bench-sft-trl                                   # builds .venv-bench (TRL) and the rows
    .venv-bench/bin/python benchmarks/sft_vs_trl.py --steps 6 --warmup 1 [--bf16]

The workload is ``sft_smollm2_calculator``: SmolLM2-135M-Instruct with LoRA r16 on every linear
layer, 8 tool-call demonstrations a step (350-390 tokens each, the two assistant turns trained),
lr 5e-4 constant, AdamW, gradient clip 1.0, the whole step one micro-batch, two torch threads.
Both sides train on the same token ids with the same loss mask: the rows are rendered once by
posttrain's SFT reader (``data/sft.py``, the model's chat template) and TRL receives them
pretokenized (``input_ids`` + ``completion_mask``, its completion-only loss), in the order
posttrain's steps draw them, unshuffled. Step 1's loss is the same on both sides (LoRA's B
starts at zero, so both start at the base model): the script checks that, so the two measure
the same work.

Each side is a child process run alone (nothing else timed at once): peak resident memory is
the child's ``ru_maxrss``. The first ``--warmup`` steps are dropped; the medians of the rest are
printed as seconds a step and row tokens (every token of the rows, padding excluded) per
second. posttrain encodes the rows' common prefix (the system prompt with the tool description
and the worked example: 268 of a row's ~370 tokens) once for all rows and runs the head at the
trained tokens only; ``posttrain_unshared`` (``--sides``) turns the first off. TRL runs twice: ``trl`` (no gradient checkpointing: posttrain's setting) and ``trl_gc``
(gradient checkpointing on, TRL's memory-best setting). TRL lives only in the benchmark venv.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = "sft_smollm2_calculator"
SIDES = ("posttrain", "posttrain_unshared", "trl", "trl_gc")
#: Run when ``--sides`` is not given; ``posttrain_unshared`` (``rl.shared_prefix=off``: every row
#: encodes its own copy of the common prefix) shows what the shared prefix alone is worth.
DEFAULT_SIDES = ("posttrain", "trl", "trl_gc")
#: Step 1's loss may differ between the sides by this much (float32 sums in another order;
#: bf16 compute rounds each matmul to 8 mantissa bits).
LOSS_TOLERANCE = {False: 1e-4, True: 2e-2}


def resolved_config(steps: int, out_root: Path, bf16: bool, shared_prefix: bool = True):
    from posttrain.config import load_config
    from posttrain.model.gguf_import import smollm2_dir

    opts = [f"model.name_or_path={smollm2_dir()}", f"rl.max_steps={steps}",
            f"job.output_root={out_root}", "sft.val_path=null",
            "placement.torch_threads_per_process=2", "rl.save_every=0"]  # fmt: skip
    if bf16:
        opts.append("model.dtype=bfloat16")
    if not shared_prefix:
        opts.append("rl.shared_prefix=off")
    return load_config(RECIPE, ["--", *opts])


def step_rows(config) -> list[list]:
    """The rendered rows of steps 1..max_steps, as posttrain's SFT steps draw them."""
    from posttrain.data.order import step_indices
    from posttrain.entrypoints.sft import load_data

    train, _ = load_data(config)
    c = config
    return [
        [train.rows[i] for i in step_indices(len(train.rows), c.job.seed, s, c.sft.rows_per_step)]
        for s in range(1, c.rl.max_steps + 1)
    ]


def run_posttrain(config, steps: list[list]) -> list[dict]:
    from posttrain.algorithm.sft import make_objective
    from posttrain.data.sft import collate
    from posttrain.entrypoints.sft import SFTPolicyRole
    from posttrain.placement.policy_only import place_policy_only

    run_dir = Path(config.job.output_root) / "posttrain"
    run_dir.mkdir(parents=True, exist_ok=True)
    builder = {"build_objective_fn": make_objective}
    policy = place_policy_only(config, RECIPE, (), SFTPolicyRole, builder, str(run_dir)).policy
    out = []
    for rows in steps:
        t0 = time.perf_counter()
        metrics = policy.train(collate(rows, 0))
        out.append({"step_s": time.perf_counter() - t0, "loss": float(metrics["train/loss"])})
    return out


def run_trl(config, steps: list[list], gc: bool, bf16: bool, workdir: Path) -> list[dict]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from posttrain.model.loading import load_tokenizer

    m, rl = config.model, config.rl
    rows = [r for step in steps for r in step]
    data = Dataset.from_dict({"input_ids": [r.ids for r in rows],
                              "completion_mask": [[int(x) for x in r.mask] for r in rows]})  # fmt: skip
    times: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append({"step_s": time.perf_counter() - self.t0})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and len(times) >= 1 and "loss" not in times[-1]:
                times[-1]["loss"] = float(logs["loss"])

    args = SFTConfig(
        output_dir=str(workdir / ("trl_gc" if gc else "trl")),
        per_device_train_batch_size=config.sft.rows_per_step,
        gradient_accumulation_steps=1,
        learning_rate=rl.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=rl.grad_clip,
        max_steps=len(steps),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=bf16,
        gradient_checkpointing=gc,
        max_length=config.sft.max_tokens,
        completion_only_loss=True,
        dataloader_num_workers=0,
        train_sampling_strategy="sequential",  # the rows are laid out step by step already
        seed=config.job.seed,
    )
    tokenizer = load_tokenizer(m.name_or_path)
    model = AutoModelForCausalLM.from_pretrained(m.name_or_path, dtype=torch.float32)
    lora = LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha, lora_dropout=0.0,
                      target_modules=list(m.lora_target_modules), task_type="CAUSAL_LM")  # fmt: skip

    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                      peft_config=lora, callbacks=[Clock()])  # fmt: skip
    trainer.train()
    return times


def child(args) -> None:
    import torch

    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(2)
    workdir = Path(args.workdir)
    shared = args.child != "posttrain_unshared"
    config = resolved_config(args.steps, workdir / args.child, args.bf16, shared)
    steps = step_rows(config)
    if args.child.startswith("posttrain"):
        times = run_posttrain(config, steps)
    else:
        times = run_trl(config, steps, args.child == "trl_gc", args.bf16, workdir)
    tokens = [sum(len(r.ids) for r in rows) for rows in steps]
    for t, n in zip(times, tokens, strict=True):
        t["tokens"] = n
    print("RESULT " + json.dumps(times), flush=True)


def measure(side: str, steps: int, bf16: bool, workdir: Path) -> dict:
    log = workdir / f"{side}.log"
    argv = [sys.executable, __file__, "--child", side, "--steps", str(steps),
            "--workdir", str(workdir), *(["--bf16"] if bf16 else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    text = log.read_text()
    if os.waitstatus_to_exitcode(status) != 0 or "RESULT " not in text:
        tail = "\n    ".join(text.strip().splitlines()[-15:])
        sys.exit(f"{side} failed; end of {log}:\n    {tail}")
    times = json.loads(text.rsplit("RESULT ", 1)[1].splitlines()[0])
    return {"steps": times, "peak_rss_gib": usage.ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--bf16", action="store_true", help="bf16 compute on both sides")
    ap.add_argument("--sides", nargs="+", default=list(DEFAULT_SIDES), choices=SIDES)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.steps <= args.warmup:
        sys.exit(f"--steps={args.steps} must exceed --warmup={args.warmup}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.sides:
            results[side] = measure(side, args.steps, args.bf16, Path(tmp))
            kept = results[side]["steps"][args.warmup :]
            results[side]["step_s"] = statistics.median(t["step_s"] for t in kept)
            results[side]["tokens_per_s"] = statistics.median(
                t["tokens"] / t["step_s"] for t in kept
            )
            r = results[side]
            print(f"{side}: {r['step_s']:.2f} s/step, {r['tokens_per_s']:.0f} tokens/s, peak RSS "
                  f"{r['peak_rss_gib']:.2f} GiB, step-1 loss {r['steps'][0].get('loss')}", flush=True)  # fmt: skip
    precision = "bf16" if args.bf16 else "fp32"
    print(f"\n{RECIPE} ({precision}, LoRA r16, 8 rows a step): medians of "
          f"{args.steps - args.warmup} steps")  # fmt: skip
    print(f"{'side':<20}{'s/step':>10}{'tokens/s':>12}{'peak RSS GiB':>14}{'posttrain x':>13}")
    ours = results.get("posttrain")
    for side, r in results.items():
        ratio = f"{r['step_s'] / ours['step_s']:.2f}" if ours and side != "posttrain" else ""
        print(f"{side:<20}{r['step_s']:>10.2f}{r['tokens_per_s']:>12.0f}"
              f"{r['peak_rss_gib']:>14.2f}{ratio:>13}")  # fmt: skip
    print(f"load average: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if ours:
        tol = LOSS_TOLERANCE[args.bf16]
        for side, r in results.items():
            gap = abs(r["steps"][0].get("loss", float("nan")) - ours["steps"][0]["loss"])
            if not gap <= tol:
                sys.exit(f"step-1 loss of {side} differs from posttrain's by {gap} (> {tol}): "
                         "the sides did not train the same rows")  # fmt: skip


if __name__ == "__main__":
    main()
