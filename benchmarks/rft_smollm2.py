"""SmolLM2-135M-Instruct: base vs SFT on its correct samples vs DPO on its pairs (held-out).

    python benchmarks/rft_smollm2.py [--seeds 0] [--prompts 8] [--after-prompts A] [--steps 8]
        [--root outputs/rft_smollm2] [--tag NAME] [--entries lmdpo sft]
        [--sft-opts K=V ...] [--dpo-opts K=V ...]

Per seed ``s`` (each command one torch thread, in order, under ``--root``):

1. ``posttrain rft --config rft_smollm2 --prompts P``: 8 samples (temperature 0.6) to each of the
   first ``P`` train problems of ``smollm2_reasoning_gym``'s split for ``job.seed=s`` from the
   untrained model, ``sft.jsonl`` / ``pairs.jsonl``, and the base's greedy accuracy on the 200
   held-out problems;
2. ``posttrain sft --config rft_smollm2_sft`` and ``posttrain lmdpo --config rft_smollm2_lmdpo``
   from the base on those files, ``--steps`` steps each (LoRA r16; ``--entries`` picks which: a
   DPO variant need not train SFT again);
3. ``posttrain rft`` from each fine-tuned model on the first ``A`` of those prompts (default
   ``P``; sampling 64 prompts costs about as much as the evaluation): its greedy held-out
   accuracy (GRPO's evaluation, the same 200 problems) and its train-sample correct rate.

The seed changes the split (reasoning-gym entry ``i`` is built from ``seed + i``) and the
samples. Each command takes ~5-10 minutes on a
shared 2-core machine; the table format is ``rft_measure.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rft_measure import held_out, posttrain, table  # noqa: E402


def one_seed(seed: int, root: Path, prompts: tuple[int, int], steps: int, tag: str,
             extra: dict) -> dict:  # fmt: skip
    """One seed's chain; ``extra`` maps each entry to run to its overrides."""
    common = (
        f"job.output_root={root}",
        f"job.seed={seed}",
        "placement.torch_threads_per_process=1",
    )
    data = root / "rft" / f"base_s{seed}"
    if not (data / "summary.json").exists():
        posttrain("rft", "--config", "rft_smollm2", "--prompts", str(prompts[0]), "--out", str(data),
                  "--", *common)  # fmt: skip
    row = {"seed": seed, "base": held_out(data)}
    for entry, key, file in (("lmdpo", "lmdpo.train_path", "pairs.jsonl"),
                             ("sft", "sft.train_path", "sft.jsonl")):  # fmt: skip
        if entry not in extra:
            continue
        name = f"{entry}_{tag}_s{seed}"
        model = root / entry / name / "final_model"
        if not model.exists():  # a finished step is reused: the chain resumes where it stopped
            posttrain(entry, "--config", f"rft_smollm2_{entry}", "--", *common, f"job.name={name}",
                      f"{key}={data / file}", f"rl.max_steps={steps}", f"rl.save_every={steps}",
                      "logging.progress=false", *extra[entry])  # fmt: skip
        after = root / "rft" / f"after_{name}"
        if not (after / "summary.json").exists():
            posttrain("rft", "--config", "rft_smollm2", "--prompts", str(prompts[1]), "--out",
                      str(after), "--", *common, f"model.name_or_path={model}")  # fmt: skip
        row[entry] = held_out(after)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--prompts", type=int, default=8, help="train prompts sampled (x8)")
    p.add_argument("--after-prompts", type=int, help="train prompts sampled after (default P)")
    p.add_argument("--steps", type=int, default=8, help="SFT and DPO steps")
    p.add_argument("--root", default="outputs/rft_smollm2")
    p.add_argument("--tag", default="default", help="names this variant's SFT and DPO runs")
    p.add_argument("--entries", nargs="+", choices=("lmdpo", "sft"), default=["lmdpo", "sft"])
    p.add_argument("--sft-opts", nargs="*", default=[], metavar="K=V")
    p.add_argument("--dpo-opts", nargs="*", default=[], metavar="K=V")
    args = p.parse_args()
    root = Path(args.root)
    extra = {e: {"sft": args.sft_opts, "lmdpo": args.dpo_opts}[e] for e in args.entries}
    rows = []
    for seed in args.seeds:
        prompts = (args.prompts, args.after_prompts or args.prompts)
        rows.append(one_seed(seed, root, prompts, args.steps, args.tag, extra))
        (root / f"table_{args.tag}.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
