"""Arithmetic a 135M model gets wrong unaided and a calculator makes a copy task.

Four kinds of problem, drawn in equal numbers, each ``Calculate <expression>.``:

* ``+``: a sum of four terms of two or three digits (``Calculate 345 + 78 + 912 + 56.``),
* ``-``: a difference of two three-digit numbers, often negative (``Calculate 105 - 738.``),
* ``*``: a three-digit number times a two- or three-digit one (``Calculate 347 * 86.``),
* ``mixed``: three terms of two or three digits joined by two different operators of ``+ - *``
  (``Calculate 23 * 45 + 678.``).

The gold answer is the expression's value under the usual precedence (``*`` before ``+ -``),
computed by the calculator tool itself, so a right tool call gives the gold answer. Not
reasoning-gym's ``basic_arithmetic``: it evaluates left to right, so its gold answer for
``50 + 83 * 6`` is 798, not 548.

The problems are written as two GSM8K-format JSON Lines files for ``data.task=jsonl`` (the
held-out file first, then the train file without any held-out question; ``--val`` and
``--train`` change the counts, the defaults write the shipped files)::

    python -m posttrain.data.tasks.calculator_mix examples/smollm2_calculator

The held-out problems are drawn one after another from one seed, so the first 100 of the 200
are the 100 of the files before the split grew. ``calculator_demos`` turns train problems into
tool-call demonstrations for SFT.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

from posttrain.env.calculator import calculator

#: Problem kinds, in the order each block of four draws them.
KINDS = ("+", "-", "*", "mixed")
#: Held-out and train problems of the shipped files (the first 100 held-out ones are those of
#: the files before the held-out split grew to 200: the draw is sequential).
VAL, TRAIN = 200, 2000


def _number(rng: random.Random, low_digits: int, high_digits: int) -> int:
    return rng.randint(10 ** (low_digits - 1), 10**high_digits - 1)


def expression(kind: str, rng: random.Random) -> str:
    """One expression of ``kind`` (see the module docstring)."""
    if kind == "+":
        return " + ".join(str(_number(rng, 2, 3)) for _ in range(4))
    if kind == "-":
        return f"{_number(rng, 3, 3)} - {_number(rng, 3, 3)}"
    if kind == "*":
        return f"{_number(rng, 3, 3)} * {_number(rng, 2, 3)}"
    if kind == "mixed":
        ops = rng.sample(["+", "-", "*"], 2)
        a, b, c = (_number(rng, 2, 3) for _ in range(3))
        return f"{a} {ops[0]} {b} {ops[1]} {c}"
    raise ValueError(f"problem kind must be one of {KINDS}, got {kind!r}")


def kind_of(prompt: str) -> str:
    """The kind of a problem from its text: its one operator, or ``mixed``."""
    body = prompt.removeprefix("Calculate ").removesuffix(".")
    ops = {tok for tok in body.split() if tok in ("+", "-", "*")}
    return ops.pop() if len(ops) == 1 else "mixed"


def problems(seed: int, count: int, exclude: set[str] = frozenset()) -> list[dict[str, str]]:
    """``count`` distinct problems (kinds in turn), none of whose question is in ``exclude``."""
    rng = random.Random(seed)
    seen, out = set(exclude), []
    while len(out) < count:
        kind = KINDS[len(out) % len(KINDS)]
        expr = expression(kind, rng)
        question = f"Calculate {expr}."
        if question in seen:
            continue
        seen.add(question)
        value = calculator(expr)
        out.append({"question": question, "answer": f"{expr} = {value}\n#### {value}"})
    return out


def write_splits(out_dir: Path, *, seed: int = 0, val: int = VAL, train: int = TRAIN) -> None:
    """``val.jsonl`` (held out) and ``train.jsonl`` (disjoint from it) under ``out_dir``."""
    held = problems(seed, val)
    rest = problems(seed + 1, train, exclude={p["question"] for p in held})
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("val.jsonl", held), ("train.jsonl", rest)):
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (out_dir / name).write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write val.jsonl and train.jsonl under OUT_DIR.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--val", type=int, default=VAL, help=f"held-out problems ({VAL})")
    parser.add_argument("--train", type=int, default=TRAIN, help=f"train problems ({TRAIN})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_splits(args.out_dir, seed=args.seed, val=args.val, train=args.train)


if __name__ == "__main__":
    main()
