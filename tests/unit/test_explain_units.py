"""Explanations on fakes (workbench.explain): request parameters, which explainer a servable gets and the precise
refusals, KernelExplainer's time budget, integrated gradients' arithmetic, and the answer's JSON both ways.

A :class:`~fakes.FakeServable` answers ``y = x * factor + version``: linear, so its exact SHAP values are known
(``factor * (x - mean(background))``), and its ``delay`` makes each model call take at least that long.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeServable, X

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Composite
from workbench.core.signatures import PREDICT_METHOD, Signature, TensorSpec
from workbench.explain import shapley
from workbench.explain.background import BACKGROUND_FILE, read_background, write_background
from workbench.explain.explaining import explain
from workbench.explain.gradients import integrated_gradients
from workbench.protocol.attributions import Budget, Explanation, Parameters, pick_targets


def _code(call) -> tuple[Code, str]:
    with pytest.raises(ServingError) as caught:
        call()
    return caught.value.code, caught.value.message


# --------------------------------------------------------------------------------------------- parameters
def test_parameters_take_the_known_keys_and_name_a_bad_one():
    assert Parameters.of(None) == Parameters()
    assert Parameters.of({"explainer": "kernel", "target": 2, "nsamples": 64}) == Parameters(
        explainer="kernel", target=2, nsamples=64
    )
    for document, text in [
        ({"explainer": "deep"}, "explainer must be one of auto, tree, linear, kernel, integrated_gradients"),
        ({"target": -1}, "target must be an integer of at least 0; got -1"),
        ({"target": True}, "target must be an integer"),
        ({"steps": 0}, "steps must be an integer of at least 1 and at most 10000; got 0"),
        ({"baseline": "zeros"}, "baseline must be a number; got 'zeros'"),
        ({"nsample": 5}, "unknown explain parameter(s): nsample"),
        ([1], "parameters must be an object"),
    ]:
        code, message = _code(lambda d=document: Parameters.of(d))
        assert code == Code.INVALID_ARGUMENT and text in message, message


def test_targets_are_the_largest_column_unless_one_is_named():
    outputs = np.array([[0.1, 0.9], [0.7, 0.3]])
    assert pick_targets(outputs, None, "m").tolist() == [1, 0]
    assert pick_targets(outputs, 0, "m").tolist() == [0, 0]
    assert pick_targets(np.array([[3.0], [4.0]]), None, "m").tolist() == [0, 0]
    code, message = _code(lambda: pick_targets(outputs, 2, "Model m version 1"))
    assert (code, message) == (
        Code.INVALID_ARGUMENT,
        "Explain request: target 2 is out of range: Model m version 1 has 2 output column(s), 0..1",
    )


# --------------------------------------------------------------------------------------------- selection
def _feed(rows: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": rows.astype(np.float32)}


def test_kernel_shap_of_a_linear_model_is_its_slope_times_the_distance_from_the_background_mean(tmp_path: Path):
    servable = FakeServable(path=str(tmp_path), factor=3.0)
    background = np.linspace(-1.0, 1.0, 9).reshape(-1, 1) + 0.5
    write_background(tmp_path, background)
    rows = np.array([[2.0], [-1.0]])
    answer = explain(servable, servable.signatures["serving_default"], _feed(rows), Parameters(), Budget(30))
    e = answer.explanation
    assert (e.method, e.input_name, e.output_name, e.output_space) == ("KernelExplainer", "x", "y", "prediction")
    assert np.allclose(e.attributions[:, 0], 3.0 * (rows[:, 0] - background.mean()))
    assert np.allclose(e.base_values, 3.0 * background.mean() + 1)
    assert np.allclose(e.values, 3.0 * rows[:, 0] + 1)
    assert np.array_equal(answer.predictions["y"], 3.0 * rows.astype(np.float32) + 1)


def test_a_model_without_a_background_or_an_explainer_is_refused_naming_what_is_missing(tmp_path: Path):
    servable = FakeServable(path=str(tmp_path))
    signature = servable.signatures["serving_default"]
    code, message = _code(lambda: explain(servable, signature, _feed(np.ones((1, 1))), Parameters(), Budget(30)))
    assert code == Code.FAILED_PRECONDITION
    assert message.startswith("Model m version 1 has no background data set, which KernelExplainer needs")

    code, message = _code(
        lambda: explain(servable, signature, _feed(np.ones((1, 1))), Parameters(explainer="tree"), Budget(30))
    )
    assert code == Code.FAILED_PRECONDITION and "TreeExplainer does not apply to it" in message

    words = TensorSpec("words", "words", np.dtype(object), (-1,))
    text = Signature("serving_default", PREDICT_METHOD, {"words": words}, {"y": X})
    code, message = _code(
        lambda: explain(servable, text, {"words": np.array([b"a"], object)}, Parameters(), Budget(30))
    )
    assert code == Code.UNIMPLEMENTED
    assert "has no explainer for this input" in message and "input words is object [1]" in message

    two = Signature("serving_default", PREDICT_METHOD, {"a": X, "b": X}, {"y": X})
    feed = {"a": np.ones((1, 1), np.float32), "b": np.ones((1, 1), np.float32)}
    code, message = _code(lambda: explain(servable, two, feed, Parameters(), Budget(30)))
    assert (code, message) == (
        Code.UNIMPLEMENTED,
        "Model m version 1: explanations attribute one input; signature serving_default has 2 (a, b)",
    )


class _Pipeline(Composite):
    name, version, path = "p", 2, ""
    signatures = {"serving_default": Signature("serving_default", PREDICT_METHOD, {"x": X}, {"y": X})}

    async def run_with(self, members, signature, inputs, outputs):  # pragma: no cover - never run here
        raise AssertionError

    def run(self, signature, inputs, outputs):  # pragma: no cover - never run here
        raise AssertionError


def test_a_composite_has_no_explainer_of_its_own():
    pipeline = _Pipeline()
    code, message = _code(
        lambda: explain(
            pipeline, pipeline.signatures["serving_default"], _feed(np.ones((1, 1))), Parameters(), Budget(1)
        )
    )
    assert code == Code.UNIMPLEMENTED and message.startswith("Model p version 2 is a composite")


# --------------------------------------------------------------------------------------------- time budget
def test_kernel_explainer_refuses_at_once_what_its_budget_cannot_fit(tmp_path: Path):
    servable = FakeServable(path=str(tmp_path), delay=0.05)  # each model call takes at least 50 ms
    write_background(tmp_path, np.zeros((4, 1)))
    started = time.monotonic()
    code, message = _code(
        lambda: explain(
            servable, servable.signatures["serving_default"], _feed(np.ones((3, 1))), Parameters(), Budget(0.5)
        )
    )
    assert code == Code.DEADLINE_EXCEEDED
    assert f"KernelExplainer needs at least {shapley.MIN_KERNEL_SAMPLES} samples per row" in message
    assert "for each of 3 row(s)" in message
    assert time.monotonic() - started < 5  # one measuring call, not the sampling


def test_a_spent_budget_stops_between_steps():
    budget = Budget(0.0)
    code, message = _code(lambda: budget.check("row 2 of 5"))
    assert code == Code.DEADLINE_EXCEEDED and message.startswith("The explanation ran out of its 0 s before row 2 of 5")


# --------------------------------------------------------------------------------------------- integrated gradients
class _Quadratic:
    """F(x)[k] = sum(w[k] * x**2): integrated gradients from 0 are exactly w[k] * x**2 (the gradient is linear on
    the path, which the trapezoid rule integrates exactly)."""

    output_name = "y"

    def __init__(self) -> None:
        self.w = np.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0]])  # [k=2, features=3]
        self.calls = 0

    def outputs(self, rows: np.ndarray) -> np.ndarray:
        return (rows[:, np.newaxis, :] ** 2 * self.w).sum(axis=2)

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        self.calls += 1
        return 2 * rows * self.w[targets]


def test_integrated_gradients_are_exact_on_a_quadratic_and_complete():
    model = _Quadratic()
    rows = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    targets, attributions, base, values, deltas = integrated_gradients(model, rows, 0.0, 8, None, Budget(30), "m")
    assert targets.tolist() == np.argmax(model.outputs(rows), axis=1).tolist()
    assert np.allclose(attributions, model.w[targets] * rows**2)
    assert np.allclose(base, 0.0) and np.allclose(values, model.outputs(rows)[[0, 1], targets])
    assert np.allclose(deltas, 0.0)

    code, message = _code(lambda: integrated_gradients(model, rows.astype(np.int64), 0.0, 8, None, Budget(30), "m"))
    assert code == Code.FAILED_PRECONDITION and "need a floating-point input; m takes int64" in message
    code, _ = _code(lambda: integrated_gradients(model, rows, 0.0, 8, None, Budget(0.0), "m"))
    assert code == Code.DEADLINE_EXCEEDED


# --------------------------------------------------------------------------------------------- files and JSON
def test_background_round_trips_and_refuses_what_is_not_rows(tmp_path: Path):
    assert read_background(tmp_path) is None
    write_background(tmp_path, [[1, 2], [3, 4]])
    assert read_background(tmp_path).tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="background must be a non-empty numeric array of rows"):
        write_background(tmp_path, [1, 2])
    (tmp_path / BACKGROUND_FILE).write_bytes(b"not numpy")
    code, _ = _code(lambda: read_background(tmp_path))
    assert code == Code.DATA_LOSS


def test_an_explanation_reads_back_from_its_json():
    e = Explanation(
        method="TreeExplainer",
        input_name="x",
        output_name="raw_output",
        output_space="probability",
        targets=np.array([1, 0]),
        attributions=np.array([[0.1, 0.2], [-0.3, 0.0]]),
        base_values=np.array([0.5, 0.5]),
        values=np.array([0.8, 0.2]),
        feature_names=("a", "b"),
        details={"nsamples": 10},
    )
    document = {"predictions": [1, 0], **e.to_json()}
    back = Explanation.from_json(document)
    assert back.details == {"nsamples": 10} and back.predictions == [1, 0]
    assert back.feature_names == ("a", "b") and back.targets.tolist() == [1, 0]
    assert np.array_equal(back.attributions, e.attributions) and np.array_equal(back.values, e.values)
