"""Can RL from random weights learn to copy a number it is shown, and what makes it hard?

    python benchmarks/copy_probe.py --context tool --model window [--steps 1200] [--out DIR]
        [--seed K] [--name SUFFIX -- OVERRIDES...]

The `make demo-tools` policy must copy the calculator's result into its answer. This probe
isolates that copy from the rest of the episode: a single-turn GRPO run (the
``tools_addition_notool`` recipe's model, optimiser and 8 x 16 samples) whose *prompt* is the
answer turn's context, and whose reward pays the share of the number's characters the answer
copies position by position (0.8) and stopping right after them (0.2); the exact verifier pays 1.
It prints the held-out accuracy (greedy, 100 problems) every 100 steps.

``--context``:
- ``short``: the number alone, `` 579=`` (6 tokens before the answer, 5 from a digit to its copy);
- ``response``: the tool response alone, ``<tool_response> 579</tool_response><eos>\\nA:`` (11
  tokens, a digit 9 tokens before its copy);
- ``tool``: the whole answer-turn context of the demo, problem, call and response (~34 tokens,
  9 from a digit to its copy).

``--model``: ``window`` is the ``arith_tools`` preset (Llama layers attending to the last 10
tokens, a Mistral); ``full`` the same layers with full attention (the preset before that
change), built here with the same seed. docs/guides/tools.md has the measured table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from posttrain.env.arithmetic import RESULT_WIDTH, answer_credit

CONTEXTS = {
    "short": "{r}=",
    "response": "<tool_response>{r}</tool_response><eos>\nA:",
    "tool": "U:{a}+{b}=<eos>\nA:<tool_call>A+U</tool_call><eos>\nU:<tool_response>{r}</tool_response>"
    "<eos>\nA:",
}


def prefix_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """The demo environment's answer credit (0.8 x the share of the right-aligned number's
    characters copied, 0.2 for its length); 0 for the exact answer (the verifier pays it)."""
    if completion.strip() == answer:
        return 0.0
    return answer_credit(completion, answer.rjust(RESULT_WIDTH))


def write_problems(context: str, out: Path, seed: int = 2) -> None:
    """``train.jsonl`` (20,000) and ``val.jsonl`` (100, none of them in train) of sums of two
    three-digit numbers, each prompt the context around the right-aligned sum."""
    rng, seen, rows = random.Random(seed), set(), {"val": [], "train": []}
    for split, size in (("val", 100), ("train", 20000)):
        while len(rows[split]) < size:
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            q = CONTEXTS[context].format(a=a, b=b, r=str(a + b).rjust(4))
            if split == "val" and q in seen:
                continue
            if split == "val":
                seen.add(q)
            elif q in seen:
                continue
            rows[split].append({"question": q, "answer": f"#### {a + b}"})
    out.mkdir(parents=True, exist_ok=True)
    for split, items in rows.items():
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))


def full_attention_model(out: Path) -> Path:
    """The ``arith_tools`` preset's layers without the window (seed 0), as a Llama."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.model.tiny import preset_tokenizer, tiny_config
    from posttrain.model.tokenizer import save_char_tokenizer

    config = tiny_config("arith_tools").to_dict()
    config.pop("sliding_window", None)
    config.pop("model_type", None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.save_pretrained(out)
    save_char_tokenizer(preset_tokenizer("arith_tools"), out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", choices=sorted(CONTEXTS), default="tool")
    ap.add_argument("--model", choices=("window", "full"), default="window")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/copy_probe")
    ap.add_argument("--name", default="", help="suffix of the run's name (for overrides)")
    ap.add_argument("overrides", nargs="*", help="config overrides after --, e.g. rl.lr=2e-3")
    args = ap.parse_args()
    out = Path(args.out)
    name = f"{args.context}_{args.model}_s{args.seed}{args.name}"
    write_problems(args.context, out / "data" / args.context)
    model = ["model.init_preset=arith_tools", f"model.name_or_path={out}/models/window"]
    if args.model == "full":
        path = out / "models" / "full"
        if not (path / "config.json").exists():
            full_attention_model(path)
        model = ["model.init_preset=null", f"model.name_or_path={path}"]
    data = out / "data" / args.context
    cmd = [
        sys.executable, "-m", "posttrain.entrypoints.cli", "grpo", "--config",
        "tools_addition_notool", "--", *model, "data.task=jsonl", f"data.train_path={data}/train.jsonl",
        f"data.val_path={data}/val.jsonl", "data.digits=@default", "data.train_size=@default",
        "data.val_size=@default", "data.exact_digits=@default", "data.operators=@default",
        "data.prompt_template=plain", "reward.functions=[benchmarks.copy_probe:prefix_reward]",
        f"rl.max_steps={args.steps}", f"job.seed={args.seed}", f"job.output_root={out}",
        f"job.name={name}", "logging.progress=false", *args.overrides,
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run(cmd, check=True, env=env)
    from posttrain.metrics.sinks import read_metrics

    for row in read_metrics(out / "grpo" / name / "metrics.jsonl"):
        if "val/accuracy" in row:
            print(f"{name} step {row['step']:5d} held-out accuracy {row['val/accuracy']:.2f}")


if __name__ == "__main__":
    main()
