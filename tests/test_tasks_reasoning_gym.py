"""reasoning-gym as a task source (generated offline) and its scorer as a verifier."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from posttrain.data.tasks import TaskItem, make_task_source  # noqa: E402
from posttrain.reward.verifiers import get_verifier  # noqa: E402


def _src(name="basic_arithmetic", seed=3, train_size=20, val_size=5):
    return make_task_source(
        "reasoning_gym",
        reasoning_gym_dataset=name,
        seed=seed,
        train_size=train_size,
        val_size=val_size,
    )


def test_splits_are_deterministic_and_disjoint():
    a, b = _src(), _src()
    train = [a.item_at(0, c) for c in range(len(a))]
    assert len(train) == 20 and len(a.val_items()) == 5
    assert a.val_items() == b.val_items() and train == [b.item_at(0, c) for c in range(20)]
    assert not {it.prompt for it in train} & {it.prompt for it in a.val_items()}
    it = a.val_items()[0]
    assert it.meta["dataset"] == "basic_arithmetic" and it.item_id == "basic_arithmetic/0"
    assert _src(seed=4).val_items() != a.val_items()


def test_scorer_as_verifier_on_gsm_symbolic():
    src = _src("gsm_symbolic", train_size=2, val_size=2)
    verify = get_verifier("reasoning_gym")
    for item in src.val_items():
        assert verify(f"Thinking... \\boxed{{{item.answer}}}", item) == 1.0
        assert verify(f"<answer>{item.answer}</answer>", item) == 1.0
        assert verify(f"{item.answer}\nmore text", item) == 1.0  # first line
        wrong = str(int(float(item.answer)) + 1)
        assert verify(f"\\boxed{{{wrong}}}", item) < 1.0


def test_verifier_needs_reasoning_gym_items():
    with pytest.raises(ValueError, match="needs items from the reasoning_gym task source"):
        get_verifier("reasoning_gym")("1", TaskItem("q", "1", {"id": "a"}))


def test_errors():
    with pytest.raises(ValueError, match="cannot create dataset 'no_such_set'"):
        _src("no_such_set")
    with pytest.raises(ValueError, match="needs reasoning_gym_dataset"):
        make_task_source("reasoning_gym", seed=0, train_size=2, val_size=1)
