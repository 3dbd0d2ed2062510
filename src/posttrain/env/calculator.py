"""The built-in ``calculator`` tool: arithmetic evaluated from the AST, never with ``eval``.

A policy in RL writes whatever it likes into a tool call, so the evaluator accepts only numbers,
``+ - * / // % **``, unary ``+ -`` and parentheses, and bounds every step *before* computing it:
``9**9**9`` is refused from the exponent and the operand sizes, not after minutes of big-integer
work. Integers stay exact (``123456789 * 987654321`` is not rounded through a float).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping

#: Longest expression accepted (characters); also keeps the parser far from its nesting limit.
MAX_EXPRESSION_CHARS = 500
#: Largest exponent of ``**`` (absolute value).
MAX_EXPONENT = 1024
#: Largest integer (in bits) an operand or a result may have: ~1200 decimal digits.
MAX_INT_BITS = 4096


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message goes back to the model as tool output."""


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}
_SYMBOL |= {ast.Mod: "%", ast.Pow: "**"}


def _bits(x: float) -> int:
    """Size of an operand in bits (a float's integer part, for the same bounds)."""
    if isinstance(x, int):
        return x.bit_length()
    return 0 if not math.isfinite(x) or abs(x) < 1 else int(math.log2(abs(x))) + 1


def _check_binary(op: ast.operator, left: float, right: float) -> None:
    """Refuse an operation whose result would be too large before computing it.

    For integers, ``(bits(a) - 1) * n`` and ``bits(a) + bits(b) - 1`` are lower bounds on the
    bits of ``a**n`` and ``a*b``: anything over the bound is refused without being computed.
    """
    ints = isinstance(left, int) and isinstance(right, int)
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
    if isinstance(op, ast.Pow) and ints and right > 0 and (_bits(left) - 1) * right > MAX_INT_BITS:
        raise CalculatorError(f"result of {left}**{right} would be too large")
    if isinstance(op, ast.Mult) and ints and _bits(left) + _bits(right) - 1 > MAX_INT_BITS:
        raise CalculatorError("product would be too large")


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {value!r}")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise CalculatorError("number is too large")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_binary(node.op, left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError(f"division by zero in {_SYMBOL[type(node.op)]}") from None
        except OverflowError:
            raise CalculatorError("result is too large for a float") from None
        if isinstance(result, complex):
            raise CalculatorError("result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
            raise CalculatorError("result is too large")
        return result
    what = type(node.op).__name__ if hasattr(node, "op") else type(node).__name__
    raise CalculatorError(f"{what} is not allowed; use numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or :class:`CalculatorError` saying why not."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"cannot parse {expression!r} as arithmetic") from None
    return _evaluate(tree)


class _Bind(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, int]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            return ast.copy_location(ast.Constant(int(self.names[node.id])), node)
        return node


def bind_names(expression: str, names: Mapping[str, int]) -> str:
    """``expression`` with each name in ``names`` replaced by its integer value, through the AST
    (``A+U`` with ``{"A": 123, "U": 456}`` is ``123 + 456``); never evaluated here.

    An environment uses it to let a call refer to the problem's quantities by name. Other names
    are left for :func:`evaluate` to refuse, and text that does not parse comes back unchanged (the
    calculator then says why).
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return expression
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return expression
    return ast.unparse(_Bind(names).visit(tree))


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return its value.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, such as "123 + 456".
    """
    value = evaluate(expression)
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return str(value)
