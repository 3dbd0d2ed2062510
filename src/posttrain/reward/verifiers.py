"""Verifiers: ``fn(completion, item) -> score`` in ``[0, 1]``; a score of 1 means correct.

- ``exact``: the extracted answer (:func:`~posttrain.reward.extract.extract_answer`) equals the
  gold answer, both stripped. Made for the arithmetic task.
- ``math``: gold and prediction parsed and compared by the ``math-verify`` package, so ``0.5``,
  ``\\frac{1}{2}`` and ``1,234`` / ``1234`` are judged by value. The prediction is the last
  ``\\boxed{}`` / ``<answer>`` / ``#### N`` answer when the completion has one, else the whole
  completion (math-verify then finds the answer itself).
- ``last_number``: the marked answer when there is one, else the last number the completion
  writes, equal to the gold answer as a string (lm-eval's "flexible extract" for GSM8K). For
  a policy that states its answer in prose: ``math`` reads prose through math-verify's anchors,
  and a policy trained on it learnt to end with ``The final answer is 88 + 94 = 172.``, which
  math-verify reads as the expression ``88 + 94`` and so scores right.
- ``reasoning_gym``: the dataset's own ``score_answer`` on the extracted answer (it may give
  partial credit below 1); needs items from the reasoning_gym task source.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from typing import Any, Literal

from posttrain.data.tasks.base import TaskItem
from posttrain.data.tasks.reasoning_gym import import_reasoning_gym
from posttrain.reward.extract import extract_answer, last_number, marked_answer

VerifierName = Literal["exact", "math", "last_number", "reasoning_gym"]
VerifierFn = Callable[[str, TaskItem], float]

# math-verify bounds its sympy work with signal.alarm, which only the main thread may use.
_MATH_TIMEOUT_S = 5


def exact_match(completion: str, item: TaskItem) -> float:
    return 1.0 if extract_answer(completion) == item.answer.strip() else 0.0


def last_number_match(completion: str, item: TaskItem) -> float:
    marked = marked_answer(completion)
    pred = marked if marked is not None else last_number(completion)
    return 1.0 if pred == item.answer.strip() else 0.0


def math_match(completion: str, item: TaskItem) -> float:
    mv = _math_verify()
    gold = _parse_gold(item.answer)
    if not gold:
        raise ValueError(
            f"gold answer {item.answer!r} of item {item.item_id} is not parseable by math-verify"
        )
    marked = marked_answer(completion)
    text = completion if marked is None else marked
    pred = _parse_math(text, wrap=marked is not None)
    if not pred:
        return 0.0
    return 1.0 if mv.verify(gold, pred, timeout_seconds=_timeout()) else 0.0


def reasoning_gym_score(completion: str, item: TaskItem) -> float:
    dataset = item.meta.get("dataset")
    if not isinstance(dataset, str) or "entry_metadata" not in item.meta:
        raise ValueError(
            f"verifier 'reasoning_gym' needs items from the reasoning_gym task source "
            f"(item {item.item_id} has no meta['dataset'] / meta['entry_metadata'])"
        )
    entry = {
        "question": item.prompt,
        "answer": item.answer,
        "metadata": item.meta["entry_metadata"],
    }
    return float(_rg_scorer(dataset)(extract_answer(completion), entry))


VERIFIERS: dict[str, VerifierFn] = {
    "exact": exact_match,
    "math": math_match,
    "last_number": last_number_match,
    "reasoning_gym": reasoning_gym_score,
}


def get_verifier(name: VerifierName) -> VerifierFn:
    """The verifier called ``name``; fails early when its package is not installed."""
    if name not in VERIFIERS:
        raise ValueError(f"verifier must be one of {tuple(VERIFIERS)}, got {name!r}")
    if name == "math":
        _math_verify()
    elif name == "reasoning_gym":
        import_reasoning_gym()
    return VERIFIERS[name]


def _math_verify() -> Any:
    try:
        return importlib.import_module("math_verify")
    except ImportError as e:
        raise ImportError(
            "verifier 'math' needs the 'math-verify' package: pip install 'posttrain[math]'"
        ) from e


def _timeout() -> int | None:
    return _MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse_math(text: str, *, wrap: bool) -> list:
    mv = _math_verify()
    parsed = mv.parse(text, parsing_timeout=_timeout())
    if not parsed and wrap and text.strip():
        parsed = mv.parse(f"${text.strip()}$", parsing_timeout=_timeout())
    return parsed


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    return _parse_math(answer, wrap=True)


@functools.lru_cache(maxsize=64)
def _rg_scorer(dataset: str) -> Callable[[str, dict], float]:
    return import_reasoning_gym().get_score_answer_fn(dataset)
