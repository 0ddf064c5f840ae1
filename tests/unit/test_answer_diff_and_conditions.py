"""Answers compared (workbench.core.answer_diff), and the conditions a promotion must meet
(workbench.core.conditions)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.core.answer_diff import compare, output_summary
from workbench.core.conditions import ConditionError, check


def test_classes_agree_row_by_row_and_scores_by_their_argmax() -> None:
    primary = {
        "classes": np.array([1, 2, 3, 4]),
        "scores": np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.5, 0.5]]),
        "value": np.array([1.0, 2.0, 4.0, 8.0]),
        "names": np.array([b"a", b"b", b"c", b"d"], dtype=object),
    }
    shadow = {
        "classes": np.array([1, 2, 0, 4]),
        "scores": np.array([[0.8, 0.2], [0.7, 0.3], [0.6, 0.4], [0.5, 0.5]]),
        "value": np.array([1.0, 2.5, 4.0, 6.0]),
        "names": np.array([b"a", b"x", b"c", b"d"], dtype=object),
    }
    diffs = compare(primary, shadow)
    assert (diffs["classes"].rows, diffs["classes"].agreeing, diffs["classes"].mean_abs) == (4, 3, None)
    assert diffs["scores"].agreeing == 3 and diffs["scores"].max_abs == pytest.approx(0.5)
    assert diffs["value"].agreeing is None  # a regression has differences, not agreement
    assert diffs["value"].max_abs == pytest.approx(2.0)
    assert diffs["value"].mean_rel == pytest.approx((0.25 + 0.25) / 4)
    assert diffs["names"].agreeing == 3
    summary = output_summary(
        [diffs["classes"], compare({"classes": np.array([5])}, {"classes": np.array([5])})["classes"]]
    )
    assert summary["agreement"] == pytest.approx(4 / 5)


def test_shapes_that_differ_agree_on_nothing_and_outputs_one_side_lacks_are_left_out() -> None:
    diffs = compare({"y": np.zeros((2, 3)), "only": np.zeros(2)}, {"y": np.zeros((2, 4))})
    assert set(diffs) == {"y"}
    assert diffs["y"].agreeing == 0 and math.isinf(diffs["y"].max_abs or 0.0)


FIGURES = {"agreement": 0.97, "p99_ms": 12.5, "compared": 400, "max_abs_diff": None}


@pytest.mark.parametrize(
    ("condition", "met"),
    [
        ("agreement >= 0.95", True),
        ("agreement >= 0.99", False),
        ("agreement >= 0.95 and p99_ms <= 20", True),
        ("agreement >= 0.99 or p99_ms < 13", True),
        ("not (compared < 100)", True),
        ("0.9 < agreement <= 1", True),
        ("p99_ms > -1", True),
    ],
)
def test_conditions_compare_figures(condition: str, met: bool) -> None:
    assert check(condition, FIGURES) is met


@pytest.mark.parametrize(
    ("condition", "says"),
    [
        ("accuracy > 0.5", "no figure 'accuracy'"),
        ("max_abs_diff < 0.1", "no value yet"),
        ("__import__('os').system('true')", "compares figures"),
        ("agreement.real > 0", "a figure's name or a number"),
        ("agreement >=", "cannot read"),
        ("agreement in [1]", "only <, <="),
    ],
)
def test_conditions_refuse_what_is_not_a_comparison_of_figures(condition: str, says: str) -> None:
    with pytest.raises(ConditionError, match=says):
        check(condition, FIGURES)
