"""Conditions on a record's figures, as a person types them: ``agreement >= 0.99 and p99_ms <= 20``.

A promotion that must be earned (``%serve promote MODEL V --if "..."``, ``:promote {"if": "..."}``) is checked with
one. The text is parsed by Python's own parser and evaluated by walking its tree, accepting only comparisons of
figure names and numbers joined by ``and``, ``or`` and ``not`` (with parentheses): no calls, no attributes, nothing
else. A name the record does not have, or has no value for, is a mistake said in words, not a false.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

_COMPARISONS: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


class ConditionError(ValueError):
    """A condition that cannot be read or evaluated against the record (its message says why)."""


def check(condition: str, figures: Mapping[str, float | int | None]) -> bool:
    """Whether ``figures`` meet ``condition``; :class:`ConditionError` for a condition that cannot be evaluated."""
    try:
        tree = ast.parse(condition.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"cannot read the condition {condition!r}: {exc.msg}") from None
    return bool(_value(tree.body, figures, condition))


def _value(node: ast.AST, figures: Mapping[str, float | int | None], text: str) -> Any:
    if isinstance(node, ast.BoolOp):
        values = (_value(v, figures, text) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _value(node.operand, figures, text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_number(node.operand, figures, text)
    if isinstance(node, ast.Compare):
        left = _number(node.left, figures, text)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            compare = _COMPARISONS.get(type(op))
            if compare is None:
                raise ConditionError(f"{text!r}: only <, <=, >, >=, == and != compare figures")
            right = _number(right_node, figures, text)
            if not compare(left, right):
                return False
            left = right
        return True
    raise ConditionError(
        f"{text!r}: a condition compares figures with numbers, joined by and, or, not (e.g. agreement >= 0.99)"
    )


def _number(node: ast.AST, figures: Mapping[str, float | int | None], text: str) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_number(node.operand, figures, text)
    if isinstance(node, ast.Name):
        if node.id not in figures:
            known = ", ".join(sorted(name for name, value in figures.items() if value is not None))
            raise ConditionError(f"{text!r}: no figure {node.id!r} (there are: {known})")
        value = figures[node.id]
        if value is None:
            raise ConditionError(f"{text!r}: {node.id} has no value yet (nothing was compared)")
        return float(value)
    raise ConditionError(f"{text!r}: a side of a comparison is a figure's name or a number")
