"""Answer extraction, the format check, and the exact / math / last-number verifiers."""

from __future__ import annotations

import pytest

from posttrain.data.tasks import TaskItem
from posttrain.reward import extract_answer, follows_format, get_verifier


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("19", "19"),
        (" 19 \n12+8=20", "19"),
        ("", ""),
        ("so \\boxed{7} no \\boxed{ 19 }.", "19"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("x <answer> 5 </answer> y <answer>6</answer>", "6"),
        ("work\n#### 42\nbye", "42"),
        ("\\boxed{3} and <answer>4</answer>", "3"),
        ("truncated \\boxed{1", "truncated \\boxed{1"),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


@pytest.mark.parametrize(
    ("completion", "ok"),
    [
        ("so the answer is \\boxed{19}.", True),
        ("\\boxed{\\frac{1}{2}}", True),
        ("19", False),
        ("\\boxed{}", False),
        ("\\boxed{ }", False),
        ("\\boxed{1} \\boxed{2}", False),
        ("\\boxed{1} then \\boxed{2", False),
        ("cut off \\boxed{19", False),
        ("#### 19", False),
    ],
)
def test_follows_format(completion, ok):
    assert follows_format(completion) is ok


def test_exact_verifier():
    v = get_verifier("exact")
    item = TaskItem("3-7=", "-4", {"id": "a"})
    assert v("-4", item) == 1.0
    assert v("-4\n5-1=4", item) == 1.0
    assert v("  -4  ", item) == 1.0
    assert v("-40", item) == 0.0
    assert v("4", item) == 0.0
    assert v("", item) == 0.0
    assert v("I think \\boxed{-4}", item) == 1.0


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("To calculate 4 - 7, subtract: 4 - 7 = -3.", 1.0),  # prose: the last number
        ("-3", 1.0),
        (
            "4 - 7 = -3, so the answer is 3.",
            0.0,
        ),  # the last number decides, not the first right one
        ("The final answer is 4 - 7 = 3.", 0.0),  # restating the question earns nothing
        ("The final answer is 4 - 7.", 0.0),
        ("4 - 7 = -3.0", 0.0),  # compared as written, like `exact`
        ("-3 first, then \\boxed{3}", 0.0),  # a marked answer wins over prose
        ("4 - 7 = \\boxed{-3}", 1.0),
        ("4-7=-3", 1.0),
        ("no numbers here", 0.0),
        ("", 0.0),
    ],
)
def test_last_number_verifier(completion, score):
    assert get_verifier("last_number")(completion, TaskItem("q", "-3", {"id": "a"})) == score


@pytest.mark.parametrize(
    ("completion", "gold", "score"),
    [
        ("The total is 1,234.", "1234", 1.0),  # thousands commas dropped
        ("The total is 1,234.", "234", 0.0),  # ... not read as the number after the comma
        ("Then 1, 2, 3", "3", 1.0),  # a list is not a thousands group
        ("half of 5 is 2.5.", "2.5", 1.0),  # decimals whole
        ("half of 5 is 2.5.", "5", 0.0),
    ],
)
def test_last_number_verifier_reads_whole_numbers(completion, gold, score):
    assert get_verifier("last_number")(completion, TaskItem("q", gold, {"id": "a"})) == score


def test_math_verifier_reads_a_restated_question_as_the_answer():
    """Why ``last_number`` exists: math-verify's "final answer is" anchor takes the expression."""
    pytest.importorskip("math_verify")
    item = TaskItem("Calculate 88 + 94.", "182", {"id": "a"})
    assert get_verifier("math")("So, the final answer is 88 + 94 = 172.", item) == 1.0
    assert get_verifier("last_number")("So, the final answer is 88 + 94 = 172.", item) == 0.0


def test_unknown_verifier():
    with pytest.raises(ValueError, match="verifier must be one of"):
        get_verifier("regex")


@pytest.mark.parametrize(
    ("completion", "gold", "score"),
    [
        ("The answer is \\boxed{19}.", "19", 1.0),
        ("12 + 7 = 19\n#### 19", "19", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{1,550}", "1550", 1.0),
        ("<answer>-5</answer>", "-5", 1.0),
        ("first 3, then \\boxed{4}", "3", 0.0),
        ("\\boxed{20}", "19", 0.0),
        ("no numbers here", "19", 0.0),
        ("", "19", 0.0),
    ],
)
def test_math_verifier(completion, gold, score):
    pytest.importorskip("math_verify")
    assert get_verifier("math")(completion, TaskItem("q", gold, {"id": "a"})) == score


def test_math_verifier_rejects_unparseable_gold():
    pytest.importorskip("math_verify")
    with pytest.raises(ValueError, match="gold answer ' ' of item z"):
        get_verifier("math")("\\boxed{1}", TaskItem("q", " ", {"id": "z"}))


def test_math_verifier_works_off_the_main_thread():
    """math-verify's signal-based timeout only works on the main thread; we switch it off there."""
    pytest.importorskip("math_verify")
    import threading

    out = []
    item = TaskItem("q", "7", {"id": "a"})
    t = threading.Thread(target=lambda: out.append(get_verifier("math")("\\boxed{7}", item)))
    t.start()
    t.join()
    assert out == [1.0]
