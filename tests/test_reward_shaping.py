"""The arithmetic shaping reward: credit for near misses, none for exact or malformed answers."""

from __future__ import annotations

import pytest

from posttrain.reward.shaping import numeric_closeness


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
