"""``bind_names``: a call's names replaced by the problem's values through the AST, never eval'd."""

from __future__ import annotations

import pytest

from posttrain.env.calculator import MAX_EXPRESSION_CHARS, CalculatorError, bind_names, calculator

NAMES = {"A": 123, "U": 456}


@pytest.mark.parametrize(
    ("expression", "bound", "value"),
    [
        ("A+U", "123 + 456", "579"),
        ("U-A", "456 - 123", "333"),
        ("(A)*U", "123 * 456", "56088"),
        ("A", "123", "123"),
        ("7+8", "7 + 8", "15"),
    ],
)
def test_names_are_bound_then_evaluated(expression, bound, value) -> None:
    assert bind_names(expression, NAMES) == bound
    assert calculator(bind_names(expression, NAMES)) == value


@pytest.mark.parametrize("expression", ["AU", "A1", "x+A", "A.real", "__import__('os')"])
def test_other_names_are_left_for_the_calculator_to_refuse(expression) -> None:
    with pytest.raises(CalculatorError):
        calculator(bind_names(expression, NAMES))


def test_unparsable_or_long_text_comes_back_unchanged() -> None:
    assert bind_names("A+", NAMES) == "A+"
    long = "A+" * MAX_EXPRESSION_CHARS + "U"
    assert bind_names(long, NAMES) == long
    with pytest.raises(CalculatorError, match="longer than"):
        calculator(bind_names(long, NAMES))
