"""The calculator tool: exact arithmetic from the AST, bounded before computing, no eval."""

from __future__ import annotations

import time

import pytest

from posttrain.env.calculator import MAX_EXPRESSION_CHARS, CalculatorError, calculator, evaluate


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("123 + 456", "579"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-3 ** 2", "-9"),
        ("+7 - -2", "9"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("7 / 2", "3.5"),
        ("2 ** -1", "0.5"),
        ("1.5 * 2", "3.0"),
        ("2 ** 10", "1024"),
        ("123456789 * 987654321", "121932631112635269"),  # exact, not via a float
        ("((((1))))", "1"),
    ],
)
def test_calculator_values(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


def test_calculator_exact_big_integer() -> None:
    assert calculator("3 ** 500 - 3 ** 499") == str(3**500 - 3**499)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9**9**9", "exponent"),
        ("2 ** 100000", "exponent"),
        ("10 ** 1000 * 10 ** 1000", "too large"),
        ("99999 ** 1000", "too large"),
        ("10 ** 900 + 10 ** 900 * 10 ** 400", "too large"),
        ("10.0 ** 400", "too large for a float"),
        ("1e308 * 10", "not a finite"),
        ("10 ** 1000 / 3", "too large for a float"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("__import__('os').system('true')", "not allowed"),
        ("x + 1", "not allowed"),
        ("'ab' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 2", "only numbers"),
        ("[1, 2]", "not allowed"),
        ("1 if 1 else 2", "not allowed"),
        ("1 << 5", "not allowed"),
        ("1 +", "cannot parse"),
        ("1" * (MAX_EXPRESSION_CHARS + 1), "longer than"),
    ],
)
def test_calculator_refuses_quickly(expression: str, reason: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match=reason):
        calculator(expression)
    assert time.perf_counter() - start < 0.5  # bounded before computing, not after


def test_calculator_rejects_non_string() -> None:
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(12)  # type: ignore[arg-type]


def test_calculator_has_no_eval() -> None:
    import ast
    import inspect

    import posttrain.env.calculator as mod

    names = {n.id for n in ast.walk(ast.parse(inspect.getsource(mod))) if isinstance(n, ast.Name)}
    assert not names & {"eval", "exec", "compile", "__import__"}
