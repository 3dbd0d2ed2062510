"""Which held-out problems runs get wrong, and which no run gets right: a split's ceiling.

    python benchmarks/heldout_errors.py RUN_DIR [RUN_DIR ...] [--from-step 1500]

Reads each run's greedy held-out answers (``samples/step_*.jsonl``, one file per evaluation) and
its ``config.yaml``, from which the split is rebuilt to count how many train problems share each
held-out answer. Per run: the problems wrong at its last evaluation (``prompt given (right)``).
Then, per held-out set (runs with the same ``job.seed`` share one), every problem that was wrong
at some evaluation from ``--from-step`` on: in how many runs it was wrong at *every* such
evaluation, and its answer's count among the train problems. A problem wrong in every run at
every late evaluation bounds what any run of the recipe reaches on that split: ``ceiling``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from posttrain.config import PosttrainConfig, load_config
from posttrain.control.data_checks import build_tasks


def evaluations(run: Path) -> dict[int, list[dict]]:
    """Each evaluation step's held-out rows (those with a verdict)."""
    out = {}
    for path in sorted((run / "samples").glob("step_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "correct" in r and "prompt" in r]
        if rows:
            out[int(path.stem.removeprefix("step_"))] = rows
    return out


def train_answer_counts(config: PosttrainConfig) -> Counter:
    """How many train problems have each answer (the split rebuilt from the run's config)."""
    source = build_tasks(config)
    return Counter(source.item_at(0, i).answer.strip() for i in range(len(source)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--from-step", type=int, default=1500, help="first evaluation counted late")
    args = ap.parse_args(argv)
    by_split: dict[int, list[dict[int, list[dict]]]] = defaultdict(list)
    counts: dict[int, Counter] = {}
    for run in args.runs:
        evals = evaluations(run)
        if not evals:
            print(f"{run}: no held-out samples")
            continue
        config = load_config(run / "config.yaml")
        seed = config.job.seed
        if seed not in counts:
            counts[seed] = train_answer_counts(config)
        last = evals[max(evals)]
        wrong = [
            f"{r['prompt']}{r['completion']} ({r['answer']})" for r in last if not r["correct"]
        ]
        print(f"{run.name}: step {max(evals)}: {len(last) - len(wrong)}/{len(last)} right; wrong: "
              f"{', '.join(wrong) or '-'}")  # fmt: skip
        by_split[seed].append(evals)
    for seed, runs in sorted(by_split.items()):
        always: Counter = Counter()
        ever: set[str] = set()
        size = 0
        for evals in runs:
            late = [rows for step, rows in evals.items() if step >= args.from_step]
            if not late:
                continue
            size = len(late[0])
            wrong_sets = [{r["prompt"]: r for r in rows if not r["correct"]} for rows in late]
            ever |= set().union(*wrong_sets)
            for prompt in set.intersection(*(set(w) for w in wrong_sets)):
                always[prompt] += 1
        answers = {r["prompt"]: r["answer"] for ev in runs for rows in ev.values() for r in rows}
        print(f"\nheld-out set of seed {seed} ({len(runs)} runs, evaluations from step "
              f"{args.from_step}):")  # fmt: skip
        print(
            f"  {'problem':<12}{'answer':>7}{'train problems with it':>24}{'runs always wrong':>19}"
        )
        for prompt in sorted(ever, key=lambda p: (-always[p], p)):
            answer = answers[prompt].strip()
            print(
                f"  {prompt:<12}{answer:>7}{counts[seed][answer]:>24}{always[prompt]:>14} of {len(runs)}"
            )
        never_right = [p for p in ever if always[p] == len(runs)]
        if size:
            print(f"  ceiling: {size - len(never_right)}/{size} = {(size - len(never_right)) / size:.2f}"
                  f" ({len(never_right)} problem(s) wrong in every run at every late evaluation)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
