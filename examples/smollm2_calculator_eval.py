"""Held-out accuracy of a policy with and without the calculator, per kind of problem.

    python examples/smollm2_calculator_eval.py --out outputs/calc_eval/base
    python examples/smollm2_calculator_eval.py --model outputs/sft/smollm2_135m_calculator_sft/final_model \\
        --out outputs/calc_eval/sft
    python examples/smollm2_calculator_eval.py --run outputs/grpo/smollm2_135m_calculator \\
        --out outputs/calc_eval/after

Without ``--run`` the policy is the recipe's starting model (``--config``, default
``smollm2_calculator``, plus the overrides after ``--``), or with ``--model`` any Hugging Face
model folder (the base model, an SFT or GRPO run's ``final_model``) under that recipe; with
``--run`` it is that run's newest checkpoint under the run's own resolved config
(``RUN/config.yaml``). Both evaluations are
greedy, on the same held-out problems, through the training run's own roles (local placement):
*with the tool* is the run's multi-turn evaluation (``env.name``), *without* is one turn on the
same prompt minus the tool's part of the system message (``data.system_prompt``). Prints a
markdown table and writes ``summary.json`` and ``rows.jsonl`` (every trajectory, decoded) under
``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.config import load_config
from posttrain.config.build import objective_builder
from posttrain.control.data_checks import load_tasks
from posttrain.data.tasks.calculator_mix import KINDS, kind_of
from posttrain.model.loading import load_tokenizer
from posttrain.placement.local import place_local
from posttrain.rollout.multiturn import env_metrics, multiturn_rollout
from posttrain.run.online import ensure_model
from posttrain.run.records import encode_prompts


def _transcripts(rollout, tokenizer) -> list[str]:
    """Each row's response region decoded with its markers: turns, tool calls and results."""
    b, width = rollout.batch, rollout.batch.prompt_width
    out = []
    for i in range(b.batch_size):
        ids = b.input_ids[i, width:][b.attention_mask[i, width:].bool()]
        out.append(tokenizer.decode(ids.tolist(), skip_special_tokens=False))
    return out


def evaluate_policy(roles, config, tokenizer, items) -> tuple[list[dict[str, Any]], dict]:
    """Per-problem rows and the multi-turn metrics: greedy with the tool, then without."""
    tool = multiturn_rollout(roles, items, tokenizer, n=1, temperature=0.0, top_p=1.0, seed=0)
    # Step 0: the reward as before training (only correctness is read here).
    _, tool_scores = roles.reward.evaluate(tool.texts, items, 0)
    prompts = encode_prompts(items, config.data, tokenizer)
    plain = roles.rollout.generate(prompts, n=1, temperature=0.0, seed=0)
    _, plain_scores = roles.reward.evaluate(plain.texts, items, 0)
    cols = tool.batch.columns
    rows = []
    for i, (item, transcript) in enumerate(zip(items, _transcripts(tool, tokenizer), strict=True)):
        rows.append({
            "prompt": item.prompt, "answer": item.answer, "kind": kind_of(item.prompt),
            "tool_correct": bool(tool_scores.correct[i]), "tool_final": tool.texts[i],
            "tool_calls": int(cols["env_tool_calls"][i]),
            "tool_errors": int(cols["env_tool_errors"][i]), "turns": int(cols["env_turns"][i]),
            "tool_transcript": transcript,
            "plain_correct": bool(plain_scores.correct[i]), "plain_text": plain.texts[i],
        })  # fmt: skip
    return rows, env_metrics(tool.batch)


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with and without the tool (overall and per kind), tool-call and error rates."""

    def frac(sel, key):
        return sum(bool(r[key]) for r in sel) / len(sel) if sel else float("nan")

    calls = sum(r["tool_calls"] for r in rows)
    out: dict[str, Any] = {
        "problems": len(rows),
        "accuracy_tool": frac(rows, "tool_correct"),
        "accuracy_no_tool": frac(rows, "plain_correct"),
        "tool_call_rate": sum(r["tool_calls"] > 0 for r in rows) / len(rows),
        "tool_calls_mean": calls / len(rows),
        "tool_error_rate": sum(r["tool_errors"] for r in rows) / calls if calls else 0.0,
        "turns_mean": sum(r["turns"] for r in rows) / len(rows),
        "per_kind": {},
    }
    for kind in KINDS:
        sel = [r for r in rows if r["kind"] == kind]
        out["per_kind"][kind] = {
            "problems": len(sel),
            "accuracy_tool": frac(sel, "tool_correct"),
            "accuracy_no_tool": frac(sel, "plain_correct"),
            "tool_call_rate": sum(r["tool_calls"] > 0 for r in sel) / len(sel) if sel else 0.0,
        }
    return out


def table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table (one row per kind, then all)."""
    lines = ["| problems | n | accuracy with tool | without tool | tool-call rate |",
             "|---|---|---|---|---|"]  # fmt: skip
    for kind, s in summary["per_kind"].items():
        lines.append(f"| `{kind}` | {s['problems']} | {s['accuracy_tool']:.2f} | "
                     f"{s['accuracy_no_tool']:.2f} | {s['tool_call_rate']:.2f} |")  # fmt: skip
    s = summary
    lines.append(f"| all | {s['problems']} | {s['accuracy_tool']:.2f} | "
                 f"{s['accuracy_no_tool']:.2f} | {s['tool_call_rate']:.2f} |")  # fmt: skip
    lines.append(f"\ntool calls per problem {s['tool_calls_mean']:.2f}, tool-error rate "
                 f"{s['tool_error_rate']:.2f} (of calls), turns per problem {s['turns_mean']:.2f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="smollm2_calculator")
    parser.add_argument("--run", help="a training run directory: evaluate its newest checkpoint")
    parser.add_argument("--model", help="a model folder, under --config (model.name_or_path)")
    parser.add_argument("--out", required=True, help="where summary.json and rows.jsonl go")
    args = parser.parse_args(argv[:cut])
    if args.run and args.model:
        parser.error("--run evaluates the run's own checkpoint; give --run or --model")
    out = Path(args.out)
    overrides = argv[cut + 1 :]
    if args.run:
        config = load_config(Path(args.run) / "config.yaml", ["--", *overrides])
        config.rl.resume, run_dir = "must", Path(args.run)
    else:
        model = [f"model.name_or_path={args.model}"] if args.model else []
        config = load_config(args.config, ["--", *model, *overrides])
        config.rl.resume, run_dir = "off", out / "policy"
    items = load_tasks(config).val_items()
    ensure_model(config)
    roles = place_local(config, objective_builder(config), str(run_dir))
    try:
        state = roles.policy.resume()
        roles.sync_weights()
        tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.name_or_path)
        rows, metrics = evaluate_policy(roles, config, tokenizer, items)
    finally:
        roles.close()
    summary = {"step": state.step if state else 0, "model": config.model.name_or_path,
               **summarize(rows), "env_metrics": metrics}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{summary['model']} step {summary['step']}, {len(rows)} held-out problems, greedy")
    print(table(summary))
    return summary


if __name__ == "__main__":
    main()
