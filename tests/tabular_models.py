"""What the scikit-learn, XGBoost and LightGBM platform tests share: data, a server on a repository, and clients.

The tests train real models on scikit-learn's digits (classification: 64 pixel features, 10 classes) and diabetes
(regression: 10 named features), serve them from a repository, and compare every answer with the model's own
in-process answer, over REST (requests) and gRPC (tensorflow-serving-api's stubs) and through workbench's Client.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import requests
import tensorflow as tf
from sklearn.base import BaseEstimator, TransformerMixin
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from waiting import wait_until

from workbench.config.options import ServerOptions
from workbench.server import ServerThread

DIABETES_FEATURES = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
# Eight single-row requests fill one batch of 8; the long timeout means a batch that is not full never runs, so
# the one batch the stats report can only have come from the eight requests together.
EIGHT_ROW_BATCHES = (
    "max_batch_size { value: 8 } batch_timeout_micros { value: 60000000 } num_batch_threads { value: 1 }"
)
# Batches of whatever arrives within 2 ms, for many concurrent clients.
SHORT_BATCHES = "max_batch_size { value: 64 } batch_timeout_micros { value: 2000 } max_enqueued_batches { value: 1000 }"


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x, y


@functools.cache
def diabetes() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    return x, y


def diabetes_frame() -> Any:
    import pandas as pd

    x, _ = diabetes()
    return pd.DataFrame(x, columns=list(DIABETES_FEATURES))


def as_float32_examples(x: np.ndarray) -> np.ndarray:
    """What a model sees of ``x`` through tf.Examples: float_list holds 32-bit floats."""
    return x.astype(np.float32).astype(x.dtype)


class Doubler(TransformerMixin, BaseEstimator):
    """A transformer of the tests' own: a type skops does not trust."""

    def fit(self, x: Any, y: Any = None) -> Doubler:
        self.n_features_in_ = np.asarray(x).shape[1]
        return self

    def transform(self, x: Any) -> np.ndarray:
        return np.asarray(x) * 2.0


# ------------------------------------------------------------------------------------------------ server
@contextlib.contextmanager
def serving(repository: Path, **options: Any) -> Iterator[ServerThread]:
    """A server on 127.0.0.1 (REST and gRPC on free ports) for every model folder of ``repository``."""
    fields: dict[str, Any] = {"rest_api_port": -1, "port": 0, "model_repository": str(repository)}
    with ServerThread(ServerOptions(**{**fields, **options})) as running:
        yield running


def version_status(server: ServerThread, model: str) -> dict[str, Any]:
    r = requests.get(f"{server.rest_url}/v1/models/{model}", timeout=30)
    statuses = r.json().get("model_version_status", []) if r.status_code == 200 else []
    return statuses[0] if statuses else {}


def available(server: ServerThread, model: str) -> None:
    wait_until(lambda: version_status(server, model).get("state") == "AVAILABLE", timeout=120, what=f"{model} up")


def load_error(server: ServerThread, model: str) -> dict[str, str]:
    """The status of the model's version once its load has failed (its error code and message)."""
    status = wait_until(
        lambda: (s := version_status(server, model)).get("state") == "END" and s,
        timeout=120,
        what=f"{model}'s load to fail",
    )
    return status["status"]  # type: ignore[no-any-return]


def mean_batch_size(server: ServerThread, model: str) -> float:
    stats = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json()["models"]
    return float(stats[model]["1"]["mean_batch_size"])


def rest(server: ServerThread, model: str, verb: str, body: Any) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{model}:{verb}", json=body, timeout=60)


def rest_answer(server: ServerThread, model: str, body: Any) -> Any:
    r = rest(server, model, "predict", body)
    assert r.status_code == 200, r.text
    return r.json()


@contextlib.contextmanager
def stub_for(server: ServerThread) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def grpc_predict(stub: Any, model: str, inputs: Mapping[str, np.ndarray], signature: str = "") -> dict[str, np.ndarray]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    response = stub.Predict(request, timeout=60)
    return {alias: tf.make_ndarray(tensor) for alias, tensor in response.outputs.items()}


def _fill_examples(target: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    for row in rows:
        example = target.examples.add()
        for name, value in row.items():
            example.features.feature[name].float_list.value.extend(np.atleast_1d(value).tolist())


def grpc_classify(stub: Any, model: str, rows: Sequence[Mapping[str, Any]]) -> list[list[tuple[str, float]]]:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "classify"
    _fill_examples(request.input.example_list, rows)
    response = stub.Classify(request, timeout=60)
    return [[(c.label, c.score) for c in row.classes] for row in response.result.classifications]


def grpc_regress(stub: Any, model: str, rows: Sequence[Mapping[str, Any]]) -> list[float]:
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "regress"
    _fill_examples(request.input.example_list, rows)
    response = stub.Regress(request, timeout=60)
    return [r.value for r in response.result.regressions]


def grpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    try:
        call()
    except grpc.RpcError as error:
        return error
    raise AssertionError("the call succeeded")


def row_examples(x: np.ndarray) -> list[dict[str, list[float]]]:
    """Examples for a model without feature names: the whole row in the feature ``x``."""
    return [{"x": row.tolist()} for row in x]


def named_examples(x: np.ndarray, names: Sequence[str]) -> list[dict[str, float]]:
    return [dict(zip(names, row.tolist(), strict=True)) for row in x]


def expected_classes(labels: Sequence[Any], probabilities: np.ndarray) -> list[list[tuple[str, np.float32]]]:
    """What classify answers: every class's label as a string with its probability as float32."""
    scores = probabilities.astype(np.float32)
    return [[(str(label), s) for label, s in zip(labels, row, strict=True)] for row in scores]


def as_float32(classes: Sequence[Sequence[tuple[str, float]]]) -> list[list[tuple[str, np.float32]]]:
    """Classify results with their scores as the float32 they are (REST prints a float32's shortest digits)."""
    return [[(label, np.float32(score)) for label, score in row] for row in classes]


# ------------------------------------------------------------------------------------------------ metadata
def rest_signatures(server: ServerThread, model: str) -> dict[str, Any]:
    r = requests.get(f"{server.rest_url}/v1/models/{model}/metadata", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["metadata"]["signature_def"]["signature_def"]  # type: ignore[no-any-return]


def grpc_signatures(stub: Any, model: str) -> Any:
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = model
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    return signatures.signature_def


def described(signature: Mapping[str, Any]) -> dict[str, Any]:
    """A REST SignatureDef as {"inputs"/"outputs": {alias: (dtype, dims)}} for comparisons."""

    def tensors(infos: Mapping[str, Any]) -> dict[str, tuple[str, list[int]]]:
        return {
            alias: (info["dtype"], [int(d["size"]) for d in info["tensor_shape"].get("dim", [])])
            for alias, info in infos.items()
        }

    return {
        "method": signature["method_name"],
        "inputs": tensors(signature["inputs"]),
        "outputs": tensors(signature["outputs"]),
    }


def grpc_described(signature: Any) -> dict[str, Any]:
    from tensorflow.core.framework import types_pb2

    def tensors(infos: Any) -> dict[str, tuple[str, list[int]]]:
        return {
            alias: (types_pb2.DataType.Name(info.dtype), [d.size for d in info.tensor_shape.dim])
            for alias, info in infos.items()
        }

    return {"method": signature.method_name, "inputs": tensors(signature.inputs), "outputs": tensors(signature.outputs)}


# ------------------------------------------------------------------------------------------------ load
def in_threads(fn: Callable[[int], Any], count: int, workers: int) -> list[Any]:
    """``fn(0..count-1)`` on ``workers`` threads at once; results in order, the first exception raised."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, range(count)))


def write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document))
