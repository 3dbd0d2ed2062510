"""Base vs SFT on its correct samples vs DPO on its pairs, held-out accuracy over seeds.

    python benchmarks/rft_measure.py [--seeds 0 1 2] [--base-steps 300] [--steps 100]
        [--root outputs/rft_measure] [--tag NAME] [--sft-opts K=V ...] [--dpo-opts K=V ...]

Per seed ``s`` (each command one torch thread, in order, under ``--root``):

1. ``posttrain grpo --config arithmetic_clipped -- rl.max_steps=BASE job.seed=s``: a partly
   trained policy (its own seeded initial model);
2. ``posttrain rft --config rft_arithmetic``, from that policy: 8 samples per train problem,
   ``sft.jsonl`` and ``pairs.jsonl``, and the base's greedy held-out accuracy;
3. ``posttrain sft --config rft_arithmetic_sft`` and ``posttrain lmdpo --config
   rft_arithmetic_lmdpo`` from the base on those files, ``--steps`` steps each;
4. ``posttrain rft`` from each fine-tuned model: its greedy held-out accuracy (the same
   evaluation GRPO runs, on the same 20 held-out problems).

``--sft-opts`` / ``--dpo-opts`` are overrides appended to the SFT / DPO commands (a variant:
``--tag`` names its runs, so variants share the base runs). Prints a markdown table (one row per
seed, then the mean) and writes ``ROOT/table_TAG.json``. A finished base run is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def posttrain(*argv: str) -> None:
    """One command in its own process (one torch thread); its output on failure."""
    env_cmd = [sys.executable, "-m", "posttrain.entrypoints.cli", *argv]
    done = subprocess.run(env_cmd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def held_out(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {"accuracy": summary["val"]["accuracy"], "correct_rate": summary["correct_rate"],
            "sft_rows": summary["sft_rows"], "pairs": summary["pairs"]}  # fmt: skip


def one_seed(seed: int, root: Path, base_steps: int, steps: int, tag: str, extra: dict) -> dict:
    outputs = f"job.output_root={root}"
    base = f"base{base_steps}_s{seed}"
    posttrain("grpo", "--config", "arithmetic_clipped", "--", outputs, f"job.seed={seed}",
              f"job.name={base}", f"rl.max_steps={base_steps}", f"rl.save_every={base_steps}",
              f"rl.eval_every={base_steps}", "logging.progress=false",
              f"model.name_or_path={root}/models/arith-init_s{seed}")  # fmt: skip
    model = f"model.name_or_path={root}/grpo/{base}/final_model"
    data = root / "rft" / f"{base}"
    posttrain("rft", "--config", "rft_arithmetic", "--out", str(data), "--", outputs, model,
              f"job.seed={seed}")  # fmt: skip
    row = {"seed": seed, "base": held_out(data)}
    for entry, recipe, key, file in (("sft", "rft_arithmetic_sft", "sft.train_path", "sft.jsonl"),
                                     ("lmdpo", "rft_arithmetic_lmdpo", "lmdpo.train_path",
                                      "pairs.jsonl")):  # fmt: skip
        name = f"{entry}_{tag}_{base}"
        posttrain(entry, "--config", recipe, "--", outputs, model, f"job.seed={seed}",
                  f"job.name={name}", f"{key}={data / file}", f"rl.max_steps={steps}",
                  f"rl.save_every={steps}", "logging.progress=false", *extra[entry])  # fmt: skip
        after = root / "rft" / f"after_{name}"
        posttrain("rft", "--config", "rft_arithmetic", "--out", str(after), "--", outputs,
                  f"model.name_or_path={root}/{entry}/{name}/final_model", f"job.seed={seed}")  # fmt: skip
        row[entry] = held_out(after)
    return row


def table(rows: list[dict]) -> str:
    """Held-out greedy accuracy, then the correct rate of the 8 samples per train problem."""
    keys = ("base", "sft", "lmdpo")
    lines = ["| seed | rows / pairs | held-out: base | SFT | DPO | train samples: base | SFT | DPO |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def cells(r: dict) -> str:  # "-": a fine-tuning the variant did not run
        acc = " | ".join(f"{r[k]['accuracy']:.2f}" if k in r else "-" for k in keys)
        return acc + " | " + " | ".join(f"{r[k]['correct_rate']:.3f}" if k in r else "-"
                                        for k in keys)  # fmt: skip

    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['base']['sft_rows']} / {r['base']['pairs']} | {cells(r)} |"
        )
    mean = {k: {m: statistics.mean(r[k][m] for r in rows) for m in ("accuracy", "correct_rate")}
            for k in keys if all(k in r for r in rows)}  # fmt: skip
    lines.append(f"| mean | | {cells(mean)} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--base-steps", type=int, default=300)
    p.add_argument("--steps", type=int, default=100, help="SFT and DPO steps")
    p.add_argument("--root", default="outputs/rft_measure")
    p.add_argument("--tag", default="default", help="names this variant's SFT and DPO runs")
    p.add_argument("--sft-opts", nargs="*", default=[], metavar="K=V")
    p.add_argument("--dpo-opts", nargs="*", default=[], metavar="K=V")
    args = p.parse_args()
    root = Path(args.root)
    extra = {"sft": args.sft_opts, "lmdpo": args.dpo_opts}
    rows = []
    for seed in args.seeds:  # the table so far after each seed (a long sweep shows progress)
        rows.append(one_seed(seed, root, args.base_steps, args.steps, args.tag, extra))
        (root / f"table_{args.tag}.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
