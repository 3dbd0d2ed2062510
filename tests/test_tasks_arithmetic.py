"""Arithmetic generator and the cursor-based TaskSource."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.tasks import (
    TaskItem,
    TaskSource,
    arithmetic_problem,
    make_arithmetic_source,
    make_task_source,
)

_PROMPT = re.compile(r"(\d+)([+\-*])(\d+)=")


def _src(seed=0, digits=2, operators="+-*", train_size=200, val_size=50):
    return make_arithmetic_source(
        seed=seed, digits=digits, operators=operators, train_size=train_size, val_size=val_size
    )


def test_hand_examples():
    assert arithmetic_problem(12, "+", 7) == TaskItem(
        "12+7=", "19", {"id": "arithmetic/12+7=", "a": 12, "op": "+", "b": 7}
    )
    assert arithmetic_problem(3, "-", 7).answer == "-4"
    assert arithmetic_problem(0, "*", 9).answer == "0"
    assert arithmetic_problem(12, "*", 11).prompt == "12*11="


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    digits=st.integers(1, 3),
    ops=st.sampled_from(["+", "-", "*", "+-", "+-*"]),
)
def test_answers_are_right_and_splits_disjoint(seed, digits, ops):
    src = _src(seed=seed, digits=digits, operators=ops, train_size=30, val_size=10)
    train = [src.item_at(0, c) for c in range(len(src))]
    val = src.val_items()
    assert len(train) == 30 and len(val) == 10
    prompts = [it.prompt for it in train + val]
    assert len(set(prompts)) == 40  # distinct, hence no held-out prompt in train
    for it in train + val:
        a, op, b = _PROMPT.fullmatch(it.prompt).groups()
        assert op in ops and len(a) <= digits and len(b) <= digits
        assert int(it.answer) == {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](
            int(a), int(b)
        )


def test_deterministic_given_seed_and_seed_matters():
    a, b, c = _src(seed=5), _src(seed=5), _src(seed=6)
    assert a.val_items() == b.val_items()
    assert a.take(1, 0, 200)[0] == b.take(1, 0, 200)[0]
    assert a.val_items() != c.val_items()


def test_val_split_does_not_depend_on_train_size():
    assert _src(train_size=10).val_items() == _src(train_size=300).val_items()


def test_negative_results_appear_for_minus():
    src = _src(operators="-", train_size=100, val_size=0)
    answers = [int(src.item_at(0, c).answer) for c in range(100)]
    assert min(answers) < 0 < max(answers)


def test_whole_space_can_be_used():
    src = _src(digits=1, operators="+", train_size=90, val_size=10)
    every = {it.prompt for it in src.val_items()} | {src.item_at(0, c).prompt for c in range(90)}
    assert every == {f"{a}+{b}=" for a in range(10) for b in range(10)}


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"digits": 0}, "digits must be >= 1"),
        ({"operators": "+/"}, "unknown: '/'"),
        ({"operators": ""}, "non-empty"),
        ({"operators": "++"}, "repeats"),
        ({"train_size": 0}, "train_size must be >= 1"),
        ({"val_size": -1}, "val_size must be >= 0"),
        ({"digits": 1, "operators": "+", "train_size": 95, "val_size": 6}, "exceeds the 100"),
    ],
)
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        _src(**kwargs)


def test_factory_requires_what_the_task_reads():
    src = make_task_source("arithmetic", seed=1, digits=1, operators="*", train_size=5, val_size=2)
    assert len(src) == 5 and len(src.val_items()) == 2
    with pytest.raises(ValueError, match="needs operators"):
        make_task_source("arithmetic", seed=1, digits=1, train_size=5, val_size=2)
    with pytest.raises(ValueError, match="task must be one of"):
        make_task_source("gsm9k")


# --- TaskSource: cursor, epochs, resume ---------------------------------------------------


def _items(n):
    return [TaskItem(str(i), str(i), {"id": str(i)}) for i in range(n)]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    src = TaskSource("t", _items(20), [])
    e0 = [src.item_at(3, c).prompt for c in range(20)]
    e1 = [src.item_at(3, c).prompt for c in range(20, 40)]
    assert sorted(e0, key=int) == sorted(e1, key=int) == [str(i) for i in range(20)]
    assert e0 != e1


def test_cursor_resume_matches_an_uninterrupted_stream():
    src = TaskSource("t", _items(7), [])
    whole = [src.item_at(9, c) for c in range(30)]
    first, cur = src.take(9, 0, 11)
    resumed = TaskSource("t", _items(7), [])  # a fresh process after a restart
    rest, cur2 = resumed.take(9, cur, 19)
    assert first + rest == whole and cur2 == 30


def test_source_errors():
    with pytest.raises(ValueError, match="train split is empty"):
        TaskSource("t", [], _items(2))
    src = TaskSource("t", _items(3), [])
    with pytest.raises(ValueError, match="cursor must be >= 0"):
        src.item_at(0, -1)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        src.item_at(-2, 0)
