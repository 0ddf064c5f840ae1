"""MLServer's own examples (its ``docs/examples``), served unchanged by ``workbench mlserver start``, asked what their
READMEs ask, and compared with the answers MLServer gives.

    python benchmarks/mlserver_examples.py /path/to/MLServer/docs/examples [--only sklearn,mms]

writes ``benchmarks/results/mlserver_examples.json``: each example's pass / fail / not-run, and why. The examples
are the 16 with a README notebook. Each folder is copied as it is; an example whose README trains its artefact at
serving time (mlflow: ``src/train.py``) is prepared as the README prepares it, offline (the wine CSV the script
downloads is replaced by a table of the same columns). The README's notebooks store few outputs, so the answers
expected are MLServer's: its runtimes' semantics on the same model files (``predict`` through the same library,
MLServer's codecs' shapes, datatypes and content types), the outputs the streaming notebook stores, and the
repository extension's index as MLServer's handler writes it.

A dev tool, not a test: it needs the examples folder (MLServer's repository), and starts real servers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "mlserver_examples.json"
START_SECONDS = 120

# What an example needs that this harness cannot give it, as its README needs it (checked before it starts).
NEEDS = {
    "catboost": ("module", "catboost"),
    "custom": ("module", "numpyro"),
    "tempo": ("module", "tempo"),
    "alibi-detect": ("module", "alibi_detect"),
    "huggingface": ("module", "transformers"),
}
EXAMPLES = (
    "sklearn",
    "xgboost",
    "lightgbm",
    "catboost",
    "mlflow",
    "custom",
    "custom-json",
    "content-type",
    "mms",
    "model-repository",
    "streaming",
    "conda",
    "kafka",
    "tempo",
    "alibi-detect",
    "huggingface",
)


class Failed(Exception):
    """A check that did not hold; its message says how."""


# ------------------------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``workbench mlserver start FOLDER`` on free ports, until its models are ready."""

    def __init__(self, folder: Path, log: Path) -> None:
        self.folder = folder
        self.http = free_port()
        self.grpc = free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def start(self, models: list[str]) -> None:
        command = [
            sys.executable,
            "-m",
            "workbench",
            "mlserver",
            "start",
            str(self.folder),
            f"--rest_api_port={self.http}",
            f"--port={self.grpc}",
            "--file_system_poll_wait_seconds=1",
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_SECONDS
        waiting = list(models)
        while waiting:
            if self.process.poll() is not None:
                raise Failed(f"the server exited ({self.process.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise Failed(f"models {waiting} not ready in {START_SECONDS}s: {self.tail()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/v2/models/{waiting[0]}/ready", timeout=2).status_code == 200:
                    waiting.pop(0)
                    continue
            time.sleep(0.3)

    def tail(self, lines: int = 6) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def serving(folder: Path, models: list[str], log: Path) -> Iterator[Server]:
    server = Server(folder, log)
    try:
        server.start(models)
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------- checks
def post(server: Server, path: str, body: Any = None) -> requests.Response:
    return requests.post(f"{server.url}{path}", json=body, timeout=60)


def answer(response: requests.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise Failed(f"{response.request.method} {response.request.path_url}: {response.status_code} {response.text}")
    body: dict[str, Any] = response.json()
    return body


def same(label: str, got: Any, expected: Any) -> None:
    if not close(got, expected):
        raise Failed(f"{label}: got {json.dumps(got)[:400]}, MLServer answers {json.dumps(expected)[:400]}")


def close(got: Any, expected: Any) -> bool:
    if isinstance(expected, float) or isinstance(got, float):
        return (
            isinstance(got, (int, float))
            and isinstance(expected, (int, float))
            and math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-6)
        )
    if isinstance(expected, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(expected) and all(map(close, got, expected))
    if isinstance(expected, dict):
        return isinstance(got, dict) and set(got) == set(expected) and all(close(got[k], expected[k]) for k in expected)
    return bool(got == expected)


def numpy_output(name: str, values: np.ndarray, datatype: str) -> dict[str, Any]:
    """MLServer's NumpyCodec.encode_output: a 1-d array gains a dimension ([N] → [N, 1])."""
    shape = list(values.shape) if values.ndim > 1 else [*values.shape, 1]
    return {
        "name": name,
        "shape": shape,
        "datatype": datatype,
        "parameters": {"content_type": "np"},
        "data": values.reshape(-1).tolist(),
    }


def check_v2(body: dict[str, Any], model: str, version: str | None, outputs: list[dict[str, Any]]) -> None:
    same("model_name", body.get("model_name"), model)
    same("model_version", body.get("model_version"), version)
    got = [{k: o.get(k) for k in ("name", "shape", "datatype", "parameters", "data")} for o in body["outputs"]]
    same("outputs", got, outputs)


def one_row(name: str, x: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}]}


def digits_test() -> np.ndarray:
    from sklearn import datasets

    digits = datasets.load_digits()
    data = digits.images.reshape((len(digits.images), -1))
    return np.asarray(data[len(data) // 2 :])


def agaricus_test(folder: Path) -> np.ndarray:
    from sklearn.datasets import load_svmlight_file

    x, _ = load_svmlight_file(str(folder / "agaricus.txt.test"))
    return np.asarray(x.toarray())


def sklearn_answer(model_file: Path, x: np.ndarray) -> dict[str, Any]:
    import joblib

    predicted = np.asarray(joblib.load(model_file).predict(x.astype(np.float32)))
    return numpy_output("predict", predicted, "INT64")


def xgboost_answer(model_file: Path, x: np.ndarray) -> dict[str, Any]:
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(str(model_file))
    # MLServer loads a booster file as an XGBRegressor: predict answers the booster's values (probabilities here).
    return numpy_output("predict", booster.predict(xgb.DMatrix(x.astype(np.float32))), "FP32")


# ------------------------------------------------------------------------------------------- examples
def sklearn(folder: Path, log: Path) -> list[str]:
    x = digits_test()[0:1]
    with serving(folder, ["mnist-svm"], log) as server:
        body = answer(post(server, "/v2/models/mnist-svm/versions/v0.1.0/infer", one_row("predict", x)))
    check_v2(body, "mnist-svm", "v0.1.0", [sklearn_answer(folder / "mnist-svm.joblib", x)])
    return ["REST infer on /versions/v0.1.0/: the SVC's class, as MLServer's SKLearnModel answers it"]


def xgboost(folder: Path, log: Path) -> list[str]:
    x = agaricus_test(folder)[0:1]
    with serving(folder, ["mushroom-xgboost"], log) as server:
        body = answer(post(server, "/v2/models/mushroom-xgboost/versions/v0.1.0/infer", one_row("predict", x)))
    check_v2(body, "mushroom-xgboost", "v0.1.0", [xgboost_answer(folder / "mushroom-xgboost.json", x)])
    return ["REST infer: the booster's probability, as MLServer's XGBoostModel answers it"]


def lightgbm(folder: Path, log: Path) -> list[str]:
    import lightgbm as lgb
    from sklearn.datasets import load_iris

    x = load_iris()["data"][0:1]
    with serving(folder, ["iris-lgb"], log) as server:
        body = answer(post(server, "/v2/models/iris-lgb/versions/v0.1.0/infer", one_row("predict-prob", x)))
    booster = lgb.Booster(model_file=str(folder / "iris-lightgbm.bst"))
    expected = numpy_output("predict", np.asarray(booster.predict(x.astype(np.float32))), "FP64")
    check_v2(body, "iris-lgb", "v0.1.0", [expected])
    return ["REST infer: the booster's three class probabilities"]


def catboost(folder: Path, log: Path) -> list[str]:
    from catboost import CatBoostClassifier

    x = np.random.default_rng(0).integers(0, 100, size=(1, 10))
    with serving(folder, ["catboost"], log) as server:
        body = answer(post(server, "/v2/models/catboost/versions/v0.1.0/infer", one_row("predict-prob", x)))
    model = CatBoostClassifier()
    model.load_model(str(folder / "model.cbm"))
    check_v2(body, "catboost", "v0.1.0", [numpy_output("predict", np.asarray(model.predict(x)), "INT64")])
    return ["REST infer: the classifier's class"]


WINE_COLUMNS = [
    "fixed acidity",
    "volatile acidity",
    "citric acid",
    "residual sugar",
    "chlorides",
    "free sulfur dioxide",
    "total sulfur dioxide",
    "density",
    "pH",
    "sulphates",
    "alcohol",
]
# src/train.py reads the wine-quality CSV from archive.ics.uci.edu; offline, read_csv of that URL answers a table of
# the same columns instead (the script itself runs unchanged).
_OFFLINE_TRAIN = """
import runpy, sys
import numpy as np, pandas as pd
columns = {columns!r}
rng = np.random.default_rng(40)
table = pd.DataFrame(rng.uniform(0.0, 10.0, size=(400, len(columns))), columns=columns)
table["quality"] = (table[columns[-1]] * 0.5 + table[columns[1]] * 0.2).round().astype(int)
real_read_csv = pd.read_csv
pd.read_csv = lambda source, *a, **k: table.copy() if "wine-quality" in str(source) else real_read_csv(source, *a, **k)
sys.argv = ["src/train.py"]
runpy.run_path("src/train.py", run_name="__main__")
"""


def prepare_mlflow(folder: Path) -> Path:
    """The README's steps: ``python src/train.py``, then model-settings.json names the newest run's model."""
    script = _OFFLINE_TRAIN.format(columns=WINE_COLUMNS)
    # MLflow's own default store (mlflow.db, artifacts under ./mlruns), as the README's `python src/train.py` gets.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    subprocess.run([sys.executable, "-c", script], cwd=folder, env=env, check=True, capture_output=True, timeout=600)
    models = sorted((folder / "mlruns").rglob("MLmodel"), key=lambda p: p.stat().st_mtime)
    if not models:
        raise Failed("src/train.py logged no model under mlruns/")
    model_path = models[-1].parent
    settings = {
        "name": "wine-classifier",
        "implementation": "mlserver_mlflow.MLflowRuntime",
        "parameters": {"uri": str(model_path)},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings, indent=4))
    return model_path


def mlflow(folder: Path, log: Path) -> list[str]:
    import mlflow.pyfunc
    import pandas as pd

    model_path = prepare_mlflow(folder)
    values = [7.4, 0.7, 0, 1.9, 0.076, 11, 34, 0.9978, 3.51, 0.56, 9.4]
    v2 = {
        "inputs": [
            {"name": n, "shape": [1], "datatype": "FP32", "data": [v]}
            for n, v in zip(WINE_COLUMNS, values, strict=True)
        ]
    }
    split_columns = sorted(WINE_COLUMNS, key=str.lower)  # the README's dataframe_split lists them so
    split = {"dataframe_split": {"columns": split_columns, "data": [values]}}
    with serving(folder, ["wine-classifier"], log) as server:
        body = answer(post(server, "/v2/models/wine-classifier/infer", v2))
        scored = post(server, "/invocations", split)
        metadata = answer(requests.get(f"{server.url}/v2/models/wine-classifier", timeout=30))
    model = mlflow.pyfunc.load_model(str(model_path))
    row = pd.DataFrame([dict(zip(WINE_COLUMNS, np.float32(values).tolist(), strict=True))])
    expected = np.asarray(model.predict(row), dtype=np.float64)
    check_v2(body, "wine-classifier", None, [numpy_output("output-1", expected, "FP64")])
    # MLflow's scoring server (which MLServer mounts) parses dataframe_split with the signature's column types.
    frame = pd.DataFrame([values], columns=split_columns).astype(np.float64)
    same("/invocations predictions", answer(scored).get("predictions"), np.asarray(model.predict(frame)).tolist())
    same("metadata inputs", [i["name"] for i in metadata.get("inputs", [])], WINE_COLUMNS)
    return ["v2 infer (11 FP32 columns)", "/invocations dataframe_split", "metadata from the signature"]


def custom(folder: Path, log: Path) -> list[str]:
    with serving(folder, ["numpyro-divorce"], log) as server:
        body = {"inputs": [{"name": "marriage", "shape": [1], "datatype": "FP64", "data": [28.0]}]}
        response = answer(post(server, "/v2/models/numpyro-divorce/infer", body))
    output = response["outputs"][0]
    same("output shape", output["shape"], [1])  # np.asarray(obs.mean()) is 0-d: MLServer answers [1]
    if not isinstance(output["data"][0], float):
        raise Failed(f"the posterior mean is not a number: {output}")
    return ["REST infer with NumpyCodec.encode_input: the posterior mean"]


def custom_json(folder: Path, log: Path) -> list[str]:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    rest_inputs = {"name": "Foo Bar", "message": "Hello from Client (REST)!"}
    text = json.dumps(rest_inputs)
    body = {"inputs": [{"name": "echo_request", "shape": [len(text)], "datatype": "BYTES", "data": [text]}]}
    grpc_inputs = {"name": "Foo Bar", "message": "Hello from Client (gRPC)!"}
    raw = json.dumps(grpc_inputs).encode()
    with serving(folder, ["json-hello-world"], log) as server:
        rest = answer(post(server, "/v2/models/json-hello-world/infer", body))
        request = service_pb2.ModelInferRequest(model_name="json-hello-world")
        tensor = request.inputs.add(name="echo_request", datatype="BYTES", shape=[len(raw)])
        tensor.parameters["content_type"].string_param = "str"
        tensor.contents.bytes_contents.append(raw)
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc}") as channel:
            reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    served = "Got your request. Hello from the server."
    output = rest["outputs"][0]
    same("REST output", {k: output[k] for k in ("name", "datatype", "parameters")}, _str_output())
    same(
        "REST data",
        json.loads(output["data"][0]),
        {"request": {"echo_request": rest_inputs}, "server_response": served},
    )
    grpc_output = reply.outputs[0]
    got = json.loads(grpc_output.contents.bytes_contents[0] if grpc_output.contents.bytes_contents else b"null")
    if not got and reply.raw_output_contents:
        got = json.loads(reply.raw_output_contents[0][4:])
    same("gRPC data", got, {"request": {"echo_request": grpc_inputs}, "server_response": served})
    return ["REST echo (JSON in a BYTES input)", "gRPC ModelInfer echo"]


def _str_output() -> dict[str, Any]:
    return {"name": "echo_response", "datatype": "BYTES", "parameters": {"content_type": "str"}}


# The content-type README's steps: each writes runtime.py and model-settings.json, restarts, and sends its request.
_ECHO = """import json

from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver.codecs import DecodedParameterName

_to_exclude = {
    "parameters": {DecodedParameterName, "headers"},
    'inputs': {"__all__": {"parameters": {DecodedParameterName, "headers"}}}
}

class EchoRuntime(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for request_input in payload.inputs:
            decoded_input = self.decode(request_input)
            print(f"------ Encoded Input ({request_input.name}) ------")
            as_dict = request_input.dict(exclude=_to_exclude)  # type: ignore
            print(json.dumps(as_dict, indent=2))
            print(f"------ Decoded input ({request_input.name}) ------")
            print(decoded_input)

            outputs.append(
                ResponseOutput(
                    name=request_input.name,
                    datatype=request_input.datatype,
                    shape=request_input.shape,
                    data=request_input.data
                )
            )

        return InferenceResponse(model_name=self.name, outputs=outputs)
"""
_ECHO_REQUEST = """import json

from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver.codecs import DecodedParameterName

_to_exclude = {
    "parameters": {DecodedParameterName},
    'inputs': {"__all__": {"parameters": {DecodedParameterName}}}
}

class EchoRuntime(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        print("------ Encoded Input (request) ------")
        as_dict = payload.dict(exclude=_to_exclude)  # type: ignore
        print(json.dumps(as_dict, indent=2))
        print("------ Decoded input (request) ------")
        decoded_request = None
        if payload.parameters:
            decoded_request = getattr(payload.parameters, DecodedParameterName)
        print(decoded_request)

        outputs = []
        for request_input in payload.inputs:
            outputs.append(
                ResponseOutput(
                    name=request_input.name,
                    datatype=request_input.datatype,
                    shape=request_input.shape,
                    data=request_input.data
                )
            )

        return InferenceResponse(model_name=self.name, outputs=outputs)
"""


def content_type(folder: Path, log: Path) -> list[str]:
    plain = {"name": "content-type-example", "implementation": "runtime.EchoRuntime"}
    metadata = json.loads((folder / "model-settings.json").read_text())  # the folder's own: declared inputs
    np_input = {"name": "parameters-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}
    str_input = {"name": "parameters-str", "datatype": "BYTES", "shape": [1], "data": "hello world 😁"}
    steps: list[tuple[str, str, dict[str, Any], dict[str, Any], Callable[[requests.Response], None]]] = [
        (
            "parameters.content_type per input (np, str)",
            _ECHO,
            plain,
            {
                "inputs": [
                    {**np_input, "parameters": {"content_type": "np"}},
                    {**str_input, "parameters": {"content_type": "str"}},
                ]
            },
            lambda response: same("echo", _names(response), ["parameters-np", "parameters-str"]),
        ),
        (
            "NumpyCodec / StringCodec(use_bytes=False) encoded, decoded back",
            _ECHO,
            plain,
            {
                "inputs": [
                    {**np_input, "parameters": {"content_type": "np"}},
                    {**str_input, "data": ["hello world 😁"], "parameters": {"content_type": "str"}},
                ]
            },
            _decoded_back,
        ),
        (
            "content types declared in model-settings.json's inputs",
            _ECHO,
            metadata,
            {
                "inputs": [
                    {"name": "metadata-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
                    {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "data": "hello world 😁"},
                ]
            },
            lambda response: same("echo", _names(response), ["metadata-np", "metadata-str"]),
        ),
        (
            "a request-level pd content type: the README runtime's AttributeError (500), as MLServer answers",
            _ECHO_REQUEST,
            plain,
            {
                "inputs": [
                    {**np_input, "parameters": {"content_type": "np"}},
                    {
                        "name": "parameters-str",
                        "datatype": "BYTES",
                        "shape": [2, 11],
                        "data": ["hello world 😁", "bye bye 😁"],
                        "parameters": {"content_type": "str"},
                    },
                ],
                "parameters": {"content_type": "pd"},
            },
            _not_decoded,
        ),
    ]
    done = []
    for label, runtime, settings, request, check in steps:
        (folder / "runtime.py").write_text(runtime)
        (folder / "model-settings.json").write_text(json.dumps(settings, indent=4))
        with serving(folder, ["content-type-example"], log) as server:
            response = post(server, "/v2/models/content-type-example/infer", request)
        try:
            check(response)
        except Failed as exc:
            raise Failed(f"{label}: {exc}") from None
        done.append(label)
    return done


def _names(response: requests.Response) -> list[str]:
    return [o["name"] for o in answer(response)["outputs"]]


def _not_decoded(response: requests.Response) -> None:
    """The README's last runtime reads ``payload.parameters._decoded_payload``, which MLServer's dataplane never sets
    (only ``self.decode_request`` does): MLServer's answer is the runtime's AttributeError, a 500."""
    same("status", response.status_code, 500)
    if "_decoded_payload" not in response.text:
        raise Failed(f"the 500 does not name the runtime's AttributeError: {response.text}")


def _decoded_back(response: requests.Response) -> None:
    first, second = answer(response)["outputs"]
    same("NumpyCodec.decode_output", np.asarray(first["data"]).reshape(first["shape"]).tolist(), [[1, 2], [3, 4]])
    data = second["data"] if isinstance(second["data"], list) else [second["data"]]
    same("StringCodec.decode_output", data, ["hello world 😁"])


def mms(folder: Path, log: Path) -> list[str]:
    x_digits = digits_test()[0:1]
    x_agaricus = agaricus_test(folder)[0:1]
    with serving(folder, ["mnist-svm", "mushroom-xgboost"], log) as server:
        svm = answer(post(server, "/v2/models/mnist-svm/versions/v0.1.0/infer", one_row("predict", x_digits)))
        xgb = answer(post(server, "/v2/models/mushroom-xgboost/versions/v0.1.0/infer", one_row("predict", x_agaricus)))
    models = folder / "models"
    check_v2(svm, "mnist-svm", "v0.1.0", [sklearn_answer(models / "mnist-svm" / "model.joblib", x_digits)])
    check_v2(
        xgb, "mushroom-xgboost", "v0.1.0", [xgboost_answer(models / "mushroom-xgboost" / "model.json", x_agaricus)]
    )
    return ["both models of models/ on one server, each as its runtime answers"]


def model_repository(folder: Path, log: Path) -> list[str]:
    def index(server: Server) -> list[dict[str, Any]]:
        entries = answer(post(server, "/v2/repository/index", {}))
        return sorted(entries, key=lambda e: e["name"])  # type: ignore[arg-type]

    def expected(xgboost_state: str) -> list[dict[str, Any]]:
        return [
            {"name": "mnist-svm", "version": "v0.1.0", "state": "READY", "reason": ""},
            {"name": "mushroom-xgboost", "version": "v0.1.0", "state": xgboost_state, "reason": ""},
        ]

    with serving(folder, ["mnist-svm", "mushroom-xgboost"], log) as server:
        same("index", index(server), expected("READY"))
        unloaded = requests.post(f"{server.url}/v2/repository/models/mushroom-xgboost/unload", timeout=60)
        same("unload with no body", unloaded.status_code, 200)
        same("index after unload", index(server), expected("UNAVAILABLE"))
        loaded = requests.post(f"{server.url}/v2/repository/models/mushroom-xgboost/load", timeout=60)
        same("load with no body", loaded.status_code, 200)
        same("index after load", index(server), expected("READY"))
    return ["index", "unload (no body)", "index", "load (no body)", "index"]


def streaming(folder: Path, log: Path) -> list[str]:
    import grpc
    from tritonclient.grpc import service_pb2

    words = ["What", " is", " the", " capital", " of", " France?"]
    request = json.loads((folder / "generate-request.json").read_text())
    with serving(folder, ["text-model"], log) as server:
        got = []
        url = f"{server.url}/v2/models/text-model/generate_stream"
        with requests.post(url, json=request, stream=True, timeout=60) as response:
            if response.status_code != 200:
                raise Failed(f"generate_stream: {response.status_code} {response.text}")
            for line in response.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[len("data:") :])
                    got.extend(_strings(event["outputs"][0]["data"]))
        same("generate_stream (SSE)", got, words)
        message = service_pb2.ModelInferRequest(model_name="text-model")
        tensor = message.inputs.add(name="prompt", datatype="BYTES", shape=[1])
        tensor.parameters["content_type"].string_param = "str"
        tensor.contents.bytes_contents.append(b"What is the capital of France?")
        message.outputs.add(name="output")
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc}") as channel:
            # MLServer's ModelStreamInfer answers ModelInferResponse messages (Triton's wraps them).
            call = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )
            streamed = []
            for reply in call(iter([message]), timeout=60):
                contents = reply.outputs[0].contents.bytes_contents
                streamed.extend(b.decode() for b in contents)
        same("ModelStreamInfer", streamed, words)
    return ["REST generate_stream (SSE), the words the notebook stores", "gRPC ModelStreamInfer, the same"]


def _strings(data: Any) -> list[str]:
    items = data if isinstance(data, list) else [data]
    return [item if isinstance(item, str) else str(item) for item in items]


def conda(folder: Path, log: Path) -> list[str]:
    # The README serves the folder in MLServer's image with MLSERVER_ENV_TARBALL (a conda-pack of sklearn 0.24);
    # the requests are the same with or without it: workbench serves the folder in its own environment.
    x = digits_test()[0:1]
    with serving(folder, ["mnist-svm"], log) as server:
        body = answer(post(server, "/v2/models/mnist-svm/infer", one_row("predict", x)))
    check_v2(body, "mnist-svm", None, [sklearn_answer(folder / "model.joblib", x)])
    return ["REST infer (no version): the SVC's class; the conda tarball is not used"]


def kafka(folder: Path, log: Path) -> list[str]:
    x = digits_test()[0:1]
    with serving(folder, ["mnist-svm"], log) as server:
        body = answer(post(server, "/v2/models/mnist-svm/versions/v0.1.0/infer", one_row("predict", x)))
    check_v2(body, "mnist-svm", "v0.1.0", [sklearn_answer(folder / "mnist-svm.joblib", x)])
    return ["REST infer with kafka_enabled in settings.json; the Kafka topics need a broker (not run)"]


# The README's first model-settings.json, written by its %%writefile cell.
HUGGINGFACE_SETTINGS = {
    "name": "transformer",
    "implementation": "mlserver_huggingface.HuggingFaceRuntime",
    "parameters": {"extra": {"task": "text-generation", "pretrained_model": "distilgpt2"}},
}


def prepare_distilgpt2(folder: Path) -> Path:
    """``distilgpt2`` as the Hub would give it, offline: a folder of that name beside the settings (transformers,
    MLServer's runtime and workbench's all take an existing folder for a model's name) holding a GPT-2 with random
    weights, two layers as distilgpt2 has six, and a byte-level BPE tokenizer trained on a few sentences."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    sentences = ["this is a test of a small model", "models serve text from a notebook", "a testnet of nodes"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet, show_progress=False
    )
    bpe.train_from_iterator(sentences * 10, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    end = tokenizer.eos_token_id
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=len(tokenizer), n_positions=1024, bos_token_id=end, eos_token_id=end
    )
    target = folder / "distilgpt2"
    model = GPT2LMHeadModel(config)
    # distilgpt2 generates at most 50 tokens, as its config says; greedy here, so that the answer can be compared.
    model.generation_config = GenerationConfig(max_length=50, do_sample=False, bos_token_id=end, eos_token_id=end)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def huggingface(folder: Path, log: Path) -> list[str]:
    from transformers import pipeline

    (folder / "model-settings.json").write_text(json.dumps(HUGGINGFACE_SETTINGS, indent=4))
    model = prepare_distilgpt2(folder)
    request = {"inputs": [{"name": "args", "shape": [1], "datatype": "BYTES", "data": ["this is a test"]}]}
    with serving(folder, ["transformer"], log) as server:
        body = answer(post(server, "/v2/models/transformer/infer", request))
    # MLServer's runtime: the pipeline's answer to the request's args, each item JSON in one BYTES element.
    expected = pipeline("text-generation", model=str(model))("this is a test")
    (output,) = body.get("outputs", [None])
    same("output", {k: output.get(k) for k in ("name", "shape", "datatype", "parameters")}, {
        "name": "output", "shape": [1, 1], "datatype": "BYTES", "parameters": {"content_type": "hg_jsonlist"}
    })  # fmt: skip
    same("generated text", [json.loads(item) for item in output["data"]], expected)
    return ["REST infer of the README's request: the pipeline's generated_text as hg_jsonlist (distilgpt2 offline)"]


def not_offline(what: str) -> Callable[[Path, Path], list[str]]:
    def run(folder: Path, log: Path) -> list[str]:
        raise NotRun(what)

    return run


class NotRun(Exception):
    """An example this harness cannot run here, and why."""


RUNS: dict[str, Callable[[Path, Path], list[str]]] = {
    "sklearn": sklearn,
    "xgboost": xgboost,
    "lightgbm": lightgbm,
    "catboost": catboost,
    "mlflow": mlflow,
    "custom": custom,
    "custom-json": custom_json,
    "content-type": content_type,
    "mms": mms,
    "model-repository": model_repository,
    "streaming": streaming,
    "conda": conda,
    "kafka": kafka,
    "tempo": not_offline("tempo pipelines: the tempo package (unmaintained, pins mlserver<1) and gs:// models"),
    "alibi-detect": not_offline("the alibi-detect runtime, and the detector is trained on a downloaded data set"),
    "huggingface": huggingface,
}


def run_example(name: str, examples: Path, work: Path) -> dict[str, Any]:
    need = NEEDS.get(name)
    if need is not None:
        import importlib.util

        if importlib.util.find_spec(need[1]) is None:
            return {"example": name, "result": "not run", "why": f"needs the {need[1]} package, not installed here"}
    folder = work / name
    shutil.copytree(examples / name, folder)
    log = work / f"{name}.log"
    started = time.monotonic()
    try:
        checks = RUNS[name](folder, log)
    except NotRun as exc:
        return {"example": name, "result": "not run", "why": str(exc)}
    except Failed as exc:
        return {"example": name, "result": "fail", "why": str(exc), "log": _tail(log)}
    except Exception as exc:  # noqa: BLE001 - the harness reports every example, whatever one of them raises
        return {"example": name, "result": "fail", "why": f"{type(exc).__name__}: {exc}", "log": _tail(log)}
    return {"example": name, "result": "pass", "checks": checks, "seconds": round(time.monotonic() - started, 1)}


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="MLServer's docs/examples folder")
    parser.add_argument(
        "--only", default="", help="comma-separated example names (default: all 16), their rows updated in --output"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(EXAMPLES)
    results = []
    with tempfile.TemporaryDirectory(prefix="mlserver-examples-") as work:
        for name in names:
            result = run_example(name, args.examples.resolve(), Path(work))
            results.append(result)
            print(f"{name:18} {result['result']:8} {result.get('why', '; '.join(result.get('checks', [])))}")
    if args.only and args.output.is_file():  # a rerun of some examples updates their rows, keeping the others'
        earlier = json.loads(args.output.read_text())["results"]
        fresh = {r["example"]: r for r in results}
        results = [fresh.pop(r["example"], r) for r in earlier] + list(fresh.values())
    passed = sum(r["result"] == "pass" for r in results)
    summary = {"examples": len(results), "pass": passed, "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    print(f"{passed} of {len(results)} pass; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
