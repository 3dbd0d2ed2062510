"""The arithmetic shaping rewards: near-miss credit, and half credit for a right answer in prose."""

from __future__ import annotations

import pytest

from posttrain.reward.shaping import numeric_closeness, unmarked_answer_credit


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("12", "12", 0.0),  # exact: the verifier's 1.0 decides
        ("11", "12", 0.1 + 0.2 * 0.9),
        ("2", "12", 0.1),  # 10 away: well-formed only
        ("40", "12", 0.1),
        ("-3", "-4", 0.1 + 0.2 * 0.9),
        ("1+", "12", 0.0),
        ("07", "7", 0.1 + 0.2),  # right value, wrong form: the verifier says 0, so near-miss credit
        ("+7", "7", 0.1 + 0.2),
        ("", "12", 0.0),
    ],
)
def test_numeric_closeness(completion, answer, expected):
    assert numeric_closeness("5+7=", completion, answer, {}) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("4 - 1 = 3.", "3", 0.5),  # right in prose: half credit
        ("So 5 - 33 = -28", "-28", 0.5),
        ("4 - 1 = 3, so the answer is 4.", "3", 0.0),  # the last number decides
        ("4 - 1 = \\boxed{3}", "3", 0.0),  # boxed: the verifier pays, not this
        ("4 - 1 = \\boxed{5}", "3", 0.0),  # boxed and wrong: nothing, box or not
        ("2 + 3 = \\boxed{5}", "3", 0.0),  # a copied example's box earns nothing
        ("3 is it. <answer>7</answer>", "3", 0.0),  # any marked answer is the answer
        ("3\nbecause 4 - 1 = 3", "3", 0.0),  # the first line is the answer: verifier scores it
        ("The difference is 3.5", "3", 0.0),
        ("no numbers here", "3", 0.0),
    ],
)
def test_unmarked_answer_credit(completion, answer, expected):
    assert unmarked_answer_credit("Calculate 4 - 1.", completion, answer, {}) == expected
