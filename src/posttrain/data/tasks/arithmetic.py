"""Seeded integer arithmetic problems: prompt ``"12+7="``, answer ``"19"``.

Each operand is drawn uniformly from ``0 .. 10**digits - 1`` (so "2 digits" means up to two
digits), or from ``10**(digits - 1) .. 10**digits - 1`` with ``exact_digits`` (exactly two). Operators come from ``"+-*"``; ``-`` may give a negative answer (``"3-7="`` ->
``"-4"``), written with a leading minus and no plus sign for positive results. ``a+b`` and
``b+a`` are different problems.

Problems are drawn without replacement from the space of all ``(operator, a, b)`` triples:
first the held-out ones, then the train ones among the rest, so no held-out prompt appears in
train, and the held-out split for a seed does not change when ``train_size`` changes.
"""

from __future__ import annotations

import random

from posttrain.data.tasks.base import TaskItem, TaskSource

OPERATORS = "+-*"
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_problem(a: int, op: str, b: int) -> TaskItem:
    """The task item for ``a op b``."""
    prompt = f"{a}{op}{b}="
    return TaskItem(
        prompt=prompt,
        answer=str(_APPLY[op](a, b)),
        meta={"id": f"arithmetic/{prompt}", "a": a, "op": op, "b": b},
    )


def _operands(digits: int, exact: bool) -> tuple[int, int]:
    """The smallest operand and how many there are."""
    low = 10 ** (digits - 1) if exact and digits > 1 else 0
    return low, 10**digits - low


def arithmetic_space(digits: int, operators: str, exact_digits: bool = False) -> int:
    """How many distinct problems the generator can draw (the bound on train + held-out)."""
    return len(_check_operators(operators)) * _operands(digits, exact_digits)[1] ** 2


def make_arithmetic_source(
    *,
    seed: int,
    digits: int,
    operators: str,
    train_size: int,
    val_size: int,
    exact_digits: bool = False,
) -> TaskSource:
    """A source of ``train_size`` train and ``val_size`` held-out distinct problems."""
    if digits < 1:
        raise ValueError(f"arithmetic task: digits must be >= 1, got {digits}")
    ops = _check_operators(operators)
    if train_size < 1:
        raise ValueError(f"arithmetic task: train_size must be >= 1, got {train_size}")
    if val_size < 0:
        raise ValueError(f"arithmetic task: val_size must be >= 0, got {val_size}")
    low, n = _operands(digits, exact_digits)
    space = arithmetic_space(digits, operators, exact_digits)
    if train_size + val_size > space:
        raise ValueError(
            f"arithmetic task: train_size + val_size = {train_size + val_size} exceeds the "
            f"{space} distinct problems with digits={digits}, operators={operators!r}; "
            "lower the sizes or raise digits"
        )
    rng = random.Random(seed)
    seen: set[int] = set()

    def draw(count: int) -> list[TaskItem]:
        out = []
        while len(out) < count:
            k = rng.randrange(space)
            if k in seen:
                continue
            seen.add(k)
            op_i, rest = divmod(k, n * n)
            a, b = divmod(rest, n)
            out.append(arithmetic_problem(low + a, ops[op_i], low + b))
        return out

    val = draw(val_size)
    train = draw(train_size)
    exact = ",exact_digits" if exact_digits else ""
    return TaskSource(f"arithmetic(digits={digits}{exact},operators={''.join(ops)})", train, val)


def _check_operators(operators: str) -> list[str]:
    ops = list(operators)
    bad = sorted(set(ops) - set(OPERATORS))
    if not ops or bad:
        raise ValueError(
            f"arithmetic task: operators must be a non-empty string of {OPERATORS!r}, "
            f"got {operators!r}" + (f" (unknown: {''.join(bad)!r})" if bad else "")
        )
    if len(set(ops)) != len(ops):
        raise ValueError(f"arithmetic task: operators {operators!r} repeats an operator")
    return ops
