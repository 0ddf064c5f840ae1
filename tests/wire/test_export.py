"""``workbench.export``: real Keras 3, tf.Module and function models exported, then run exactly as the server runs
them (a TF1-style session over the SignatureDef), with warmup files, version numbering and failure cleanup."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2
from waiting import version_states, wait_until

from workbench.core import inference
from workbench.core.servable import Servable
from workbench.models import warmup_replay
from workbench.platforms.tensorflow import load_saved_model
from workbench.publishing import ExportError, ExportResult, export

RNG = np.random.default_rng(0)
PIXELS = RNG.random((5, 64))  # float64 on purpose: export casts it to the signature's float32
Loader = Callable[[ExportResult], Servable]


# ------------------------------------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def digits() -> keras.Model:
    """Digits-like functional model: 64 pixels → 10 probabilities (untrained: any weights do)."""
    pixels = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(16, activation="relu")(pixels)
    probabilities = keras.layers.Dense(10, activation="softmax", name="probabilities")(hidden)
    return keras.Model(pixels, probabilities, name="digits")


@pytest.fixture(scope="module")
def sequential() -> keras.Sequential:
    model = keras.Sequential(
        [
            keras.Input((3,), name="features"),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.BatchNormalization(),  # non-trainable variables must be exported too
            keras.layers.Dense(1, name="price"),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(RNG.random((8, 3)), RNG.random((8, 1)), epochs=1, verbose=0)  # moves the BatchNorm statistics
    return model


class Affine(tf.Module):
    """y = x @ w + b, with a second function for an extra signature."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.w = tf.Variable([[1.0 * scale], [2.0 * scale]])
        self.b = tf.Variable([0.5])

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": x @ self.w + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def doubled(self, x: tf.Tensor) -> tf.Tensor:
        return 2.0 * x


def run(servable: Servable, inputs: dict[str, np.ndarray], signature: str = "serving_default") -> dict[str, Any]:
    return inference.predict(servable, servable.signatures[signature], inputs)


@pytest.fixture
def load() -> Iterator[Loader]:
    """Load exports the way the server does; unload them all after the test."""
    loaded: list[Servable] = []

    def open_export(result: ExportResult) -> Servable:
        servable = load_saved_model(result.name, result.version, str(result.path))
        loaded.append(servable)
        return servable

    yield open_export
    for servable in loaded:
        servable.close()


def warmup_logs(result: ExportResult) -> list[prediction_log_pb2.PredictionLog]:
    path = result.path / "assets.extra" / "tf_serving_warmup_requests"
    return [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ------------------------------------------------------------------------------------------- model kinds
def test_keras_functional_model_serves_with_its_names_and_warmup(
    tmp_path: Path, digits: keras.Model, load: Loader
) -> None:
    examples = [{"pixels": PIXELS[:2]}, {"pixels": PIXELS[2:5].tolist()}]  # float64 array and nested lists
    result = export(digits, "digits", repo=tmp_path, examples=examples)

    assert (result.name, result.version, result.path, result.warmup_records) == ("digits", 1, tmp_path / "digits/1", 2)
    assert result.signatures == {"serving_default": "(pixels: float32[?, 64]) -> (probabilities: float32[?, 10])"}
    assert repr(result).startswith(f"ExportResult(name='digits', version=1, path='{tmp_path / 'digits' / '1'}'")
    assert listing(tmp_path / "digits") == ["1"]  # no temporary folder left over

    servable = load(result)
    got = run(servable, {"pixels": PIXELS.astype(np.float32)})
    np.testing.assert_allclose(got["probabilities"], digits(PIXELS.astype(np.float32)).numpy(), rtol=1e-5, atol=1e-6)

    logs = warmup_logs(result)
    assert len(logs) == 2
    for log, rows in zip(logs, (2, 3), strict=True):
        request = log.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == ("digits", "serving_default")
        assert list(request.inputs) == ["pixels"]
        assert request.inputs["pixels"].dtype == tf.float32.as_datatype_enum
        assert tf.make_ndarray(request.inputs["pixels"]).shape == (rows, 64)
    warmup_replay.warm_up(servable)


def test_keras_sequential_model_with_a_bare_array_example(
    tmp_path: Path, sequential: keras.Sequential, load: Loader
) -> None:
    x = RNG.random((4, 3)).astype(np.float32)
    result = export(sequential, "prices", repo=tmp_path, examples=x.astype(np.float64))

    assert result.signatures == {"serving_default": "(features: float32[?, 3]) -> (price: float32[?, 1])"}
    assert result.warmup_records == 1
    got = run(load(result), {"features": x})
    np.testing.assert_allclose(got["price"], sequential(x, training=False).numpy(), rtol=1e-5, atol=1e-6)


def test_keras_model_with_dict_inputs_and_outputs_casts_examples(tmp_path: Path, load: Loader) -> None:
    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b", dtype="int32")
    joined = keras.layers.Concatenate()([a, keras.ops.cast(b, "float32")])
    model = keras.Model({"a": a, "b": b}, {"score": keras.layers.Dense(2)(joined), "total": keras.ops.sum(b, axis=1)})

    result = export(model, "two", repo=tmp_path, examples={"a": [[0.1, 0.2, 0.3]], "b": [[1, 2]]})  # int64 → int32
    assert result.signatures == {
        "serving_default": "(a: float32[?, 3], b: int32[?, 2]) -> (score: float32[?, 2], total: int32[?])"
    }
    (log,) = warmup_logs(result)
    assert log.predict_log.request.inputs["b"].dtype == tf.int32.as_datatype_enum

    inputs = {"a": RNG.random((2, 3)).astype(np.float32), "b": np.array([[1, 2], [3, 4]], np.int32)}
    got = run(load(result), inputs)
    want = model({k: tf.constant(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got["score"], want["score"].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["total"], [3, 7])


def test_tf_module_with_an_extra_signature(tmp_path: Path, load: Loader) -> None:
    module = Affine()
    result = export(module, "affine", repo=tmp_path, signatures={"doubled": module.doubled}, examples={"x": [[1, 1]]})

    assert result.signatures == {
        "doubled": "(x: float32[?, 2]) -> (output_0: float32[?, 2])",
        "serving_default": "(x: float32[?, 2]) -> (y: float32[?, 1])",
    }
    servable = load(result)
    x = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    np.testing.assert_allclose(run(servable, {"x": x})["y"], [[5.5], [1.5]])
    np.testing.assert_allclose(run(servable, {"x": x}, "doubled")["output_0"], 2 * x)
    warmup_replay.warm_up(servable)


def test_tf_module_holding_a_keras_model(tmp_path: Path, digits: keras.Model, load: Loader) -> None:
    """The naive Keras 3 export (a module attribute holding the model) breaks session loading; export's does not."""

    class Holder(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = digits

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="pixels")])
        def __call__(self, pixels: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"classes": tf.argmax(self.model(pixels), axis=1)}

    result = export(Holder(), "held", repo=tmp_path)
    x = PIXELS.astype(np.float32)
    got = run(load(result), {"pixels": x})
    np.testing.assert_array_equal(got["classes"], np.argmax(digits(x).numpy(), axis=1))


def test_concrete_function_and_tf_function(tmp_path: Path, load: Loader) -> None:
    scale = tf.Variable(3.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="v")])
    def triple(v: tf.Tensor) -> tf.Tensor:
        return v * scale

    v = np.array([1.0, -2.0], np.float32)
    for name, model in (("concrete", triple.get_concrete_function()), ("function", triple)):
        result = export(model, name, repo=tmp_path)
        assert result.signatures == {"serving_default": "(v: float32[?]) -> (output_0: float32[?])"}
        assert result.warmup_records == 0
        assert not (result.path / "assets.extra").exists()
        np.testing.assert_allclose(run(load(result), {"v": v})["output_0"], [3.0, -6.0])


# ------------------------------------------------------------------------------------------------ versions
def test_version_numbering(tmp_path: Path) -> None:
    module = Affine()
    repo = tmp_path / "deep" / "repo"  # created as needed
    assert export(module, "m", repo=repo).version == 1
    assert export(module, "m", model_repository=repo).version == 2
    assert export(module, "m", repo=repo, version=5).version == 5
    assert export(module, "m", repo=repo).version == 6
    assert listing(repo / "m") == ["1", "2", "5", "6"]

    with pytest.raises(ExportError) as caught:
        export(module, "m", repo=repo, version=2)
    assert str(caught.value) == f"Version 2 of model 'm' already exists in {repo / 'm'}"
    assert listing(repo / "m") == ["1", "2", "5", "6"]


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up", "sp ace", "naïve"])
def test_bad_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ExportError, match="Invalid model name"):
        export(Affine(), name, repo=tmp_path)
    assert listing(tmp_path) == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: object(), "Cannot export a builtins.object"),
        (lambda: keras.Sequential([keras.layers.Dense(2)]), "is not built"),
        (lambda: tf.Module(), "has no tf.function with an input_signature"),
        (lambda: tf.function(lambda x: x), "without an input_signature"),
    ],
    ids=["object", "unbuilt-keras", "module-without-signature", "function-without-signature"],
)
def test_bad_model(tmp_path: Path, make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ExportError, match=message):
        export(make(), "m", repo=tmp_path)
    assert listing(tmp_path) == []  # not even an empty model folder


@pytest.mark.parametrize(
    ("examples", "message"),
    [
        ({"pixels": np.ones((2, 63))}, r"input 'pixels' has shape \[2, 63\], but serving_default takes \[\?, 64\]"),
        ({"pixels": np.ones((2, 64), np.complex64)}, "input 'pixels' has type complex64"),
        ({"image": np.ones((2, 64))}, "has input 'image', which serving_default does not take"),
        ([{"pixels": np.ones((1, 64))}] * 1001, "at most 1000"),
    ],
    ids=["shape", "dtype", "alias", "too-many"],
)
def test_bad_examples_leave_nothing_behind(tmp_path: Path, digits: keras.Model, examples: Any, message: str) -> None:
    export(digits, "digits", repo=tmp_path)
    with pytest.raises(ExportError, match=message):
        export(digits, "digits", repo=tmp_path, examples=examples)
    assert listing(tmp_path / "digits") == ["1"]  # neither version 2 nor a temporary folder


def test_examples_the_model_rejects_at_run_time(tmp_path: Path) -> None:
    rows_of_three = tf.function(
        lambda x: {"rows": tf.reshape(x, [-1, 3])}, input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")]
    )
    with pytest.raises(ExportError, match="failed its check: Warmup request 1 failed: Input to reshape") as caught:
        export(rows_of_three, "rows", repo=tmp_path, examples=[{"x": np.ones((1, 3))}, {"x": np.ones((2, 4))}])
    assert "\n" not in str(caught.value)
    assert caught.value.__cause__ is not None
    assert listing(tmp_path) == []  # not even the model folder the failed export made
    # Without examples, a made-up zero batch the model rejects does not fail the export.
    assert export(rows_of_three, "rows", repo=tmp_path).version == 1


# ---------------------------------------------------------------------------------------- a live server
def test_a_running_server_picks_up_a_new_export(
    tmp_path: Path, serve: Callable[..., Any], http: requests.Session
) -> None:
    export(Affine(scale=1.0), "m", repo=tmp_path)
    server = serve(model_name="m", model_base_path=str(tmp_path / "m"), file_system_poll_wait_seconds=0.2)
    wait_until(lambda: version_states(server.rest_url, "m").get("1") == "AVAILABLE", timeout=60, what="version 1")

    result = export(Affine(scale=10.0), "m", repo=tmp_path, examples={"x": [[0.0, 0.0]]})
    assert result.version == 2
    wait_until(lambda: version_states(server.rest_url, "m").get("2") == "AVAILABLE", timeout=60, what="version 2")

    r = http.post(f"{server.rest_url}/v1/models/m:predict", json={"instances": [[1.0, 1.0]]}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [[30.5]]}  # 1*10 + 1*20 + 0.5: version 2's weights
