"""Which answers a trained arithmetic policy gives on *every* problem, train and held-out.

    python benchmarks/answer_table.py RUN_DIR [RUN_DIR ...] [--model final_model]

For each run: its ``config.yaml`` rebuilds the split, its policy (``RUN_DIR/final_model``, or
``--model`` under the run directory, e.g. ``checkpoints/step_00001000/model``) answers every
train and held-out problem greedily, through GRPO's own evaluation (the recipe's rollout engine
and reward stage, as ``val/accuracy`` is measured). Printed: each wrong answer (``prompt given
(right)``, held-out ones marked ``*``), and per right answer how many of its problems are wrong
of how many there are, train and held-out apart. A held-out miss whose answer is also missed on
every train problem is no failure to generalise: the policy never gives that answer at all.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from posttrain.config import load_config
from posttrain.control.data_checks import build_tasks
from posttrain.entrypoints.rft import place_sampler
from posttrain.model.loading import load_tokenizer
from posttrain.run.online import evaluate

Row = tuple[str, str, str, bool, bool]  # prompt, given, right answer, held out, verifier's verdict


def answers(run: Path, model: str, scratch: Path) -> list[Row]:
    """``(prompt, given, right, held_out, correct)`` for every problem of ``run``'s split, the
    verdict the run's verifier gives (as ``val/accuracy`` counts it)."""
    config = load_config(run / "config.yaml", ["--", f"model.name_or_path={run / model}"])
    source = build_tasks(config)
    train = [source.item_at(0, i) for i in range(len(source))]
    held = source.val_items()
    sampler = place_sampler(config)
    tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.name_or_path)
    rows = []
    for items, is_held in ((train, False), (held, True)):
        path = scratch / f"{run.name}_{'held' if is_held else 'train'}.jsonl"
        evaluate(config, sampler, tokenizer, items, scratch, 0, path)
        given = [line for line in path.read_text().splitlines() if line.strip()]
        for item, row in zip(items, map(json.loads, given), strict=True):
            rows.append((item.prompt, row["completion"].strip(), item.answer.strip(), is_held,
                         bool(row["correct"])))  # fmt: skip
    return rows


def table(rows: list[Row]) -> list[str]:
    """The report lines of one run."""
    wrong = [r for r in rows if not r[4]]
    lines = [
        f"  wrong: {sum(not r[3] for r in wrong)}/{sum(not r[3] for r in rows)} train, "
        f"{sum(r[3] for r in wrong)}/{sum(r[3] for r in rows)} held-out",
        "  " + (", ".join(f"{'*' if h else ''}{p}{g or '(empty)'} ({a})" for p, g, a, h, _ in wrong)
                or "-"),
    ]  # fmt: skip
    by_answer: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for _, _, right, held, correct in rows:
        count = by_answer[right]
        count[2 * held + 1] += 1
        count[2 * held] += not correct
    missed = sorted((a for a, c in by_answer.items() if c[0] or c[2]), key=_numbers_first)
    lines.append("  answer  wrong/train  wrong/held-out")
    for a in missed:
        c = by_answer[a]
        lines.append(f"  {a:>6}  {c[0]:>5}/{c[1]:<5}  {c[2]:>6}/{c[3]}")
    return lines


def _numbers_first(answer: str) -> tuple[bool, float, str]:
    """Integer answers in numeric order, then any others by their text."""
    try:
        return False, int(answer), answer
    except ValueError:
        return True, 0, answer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--model", default="final_model", help="the policy folder, under each run")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        for run in args.runs:
            print(f"{run} ({args.model}):")
            print("\n".join(table(answers(run, args.model, Path(scratch)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
