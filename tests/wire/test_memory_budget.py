"""Many models in bounded memory, on a real server: 30 ONNX versions under a ``--memory_budget`` that holds 5,
``--load_on_demand``, ``--pin``, over TF Serving's REST and gRPC APIs and v2's.

Each version answers ``y = x + offset`` with its own offset (so an answer says which version gave it), from a
2 MiB weight. Beside it, each version folder holds a sparse 32 MiB file: a version is charged at least its files'
size (docs/memory-budget.md), so every version counts exactly 32 MiB whatever the allocator does with the 2 to 8 MiB
a load really adds, and "a budget that holds 5" is exact: 5.5 x 32 MiB. The server runs in the test's process
(ServerThread), so a state listener on its manager sees every transition: the budget is checked at each one, and the
evictions are recorded in order, to compare with a least-recently-used model of the same requests.

A Python model whose calls wait while a gate file exists holds a request inside a version while loads press on the
budget: that version is never evicted under it.
"""

from __future__ import annotations

import json
import random
import textwrap
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
import requests
import tensorflow as tf
import tritonclient.grpc as triton_grpc
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc
from waiting import wait_until

from workbench.config.options import ServerOptions
from workbench.models.manager import VersionState
from workbench.runtime.memory import resident_bytes
from workbench.server import ServerThread

MiB = 2**20
CHARGE = 32 * MiB  # every version's files: what each is charged at least
BUDGET = int(5.5 * CHARGE)  # holds 5
MODELS, VERSIONS = 10, 3  # 30 versions
PINNED = ("m0", 1)
METRICS_PATH = "/monitoring/prometheus/metrics"


def offset(model: int, version: int) -> float:
    return float(100 * model + version)


def onnx_model(value: float) -> onnx.ModelProto:
    """``x`` float [batch, 1] → ``y`` = x + value, ``value`` summed out of a 2 MiB weight."""
    weight = np.zeros(2 * MiB // 4, np.float32)
    weight[0] = value
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0), helper.make_node("Add", ["x", "s"], ["y"])],
        "offset",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def pad(folder: Path, size: int = CHARGE) -> None:
    """A sparse file that makes ``folder`` ``size`` bytes (no disk blocks written)."""
    with open(folder / "padding.bin", "wb") as padding:
        padding.truncate(size - sum(f.stat().st_size for f in folder.iterdir() if f.is_file()))


GATED_MODEL = """
import os, pathlib, time
import workbench

GATE, HELD = {gate!r}, {held!r}


class Gated(workbench.PythonModel):
    inputs = {{"x": ("float32", [-1, 1])}}
    outputs = {{"y": ("float32", [-1, 1])}}

    def predict(self, inputs):
        pathlib.Path(HELD).touch()  # the test knows a call is inside
        while os.path.exists(GATE):  # the test decides when it ends
            time.sleep(0.01)
        return {{"y": inputs["x"] * 2.0}}
"""


class Transitions:
    """Every version's state changes, in order, and the budget checked at each one."""

    def __init__(self, server: ServerThread) -> None:
        self.manager = server.server.manager
        self.events: list[tuple[str, int, VersionState]] = []
        self.overdrawn: list[int] = []
        self.lock = threading.Lock()
        self.manager.add_listener(self)

    def __call__(self, model: str, version: int, state: VersionState) -> None:
        summary = self.manager.served.memory_summary()  # under the manager's lock
        if summary is not None and summary["charged_bytes"] > summary["budget_bytes"]:
            self.overdrawn.append(summary["charged_bytes"])
        with self.lock:
            self.events.append((model, version, state))

    def mark(self) -> int:
        with self.lock:
            return len(self.events)

    def evicted(self, since: int = 0) -> list[tuple[str, int]]:
        with self.lock:
            return [(m, v) for m, v, s in self.events[since:] if s == VersionState.UNLOADING]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget")
    entries = []
    for m in range(MODELS):
        for v in range(1, VERSIONS + 1):
            folder = root / f"m{m}" / str(v)
            folder.mkdir(parents=True)
            onnx.save(onnx_model(offset(m, v)), folder / "model.onnx")
            pad(folder)
        entries.append(f'config {{ name: "m{m}" base_path: "{root / f"m{m}"}" model_version_policy {{ all {{}} }} }}')
    gated = root / "gated" / "1"
    gated.mkdir(parents=True)
    (gated / "model.py").write_text(
        textwrap.dedent(GATED_MODEL).format(gate=str(root / "gate"), held=str(root / "held"))
    )
    pad(gated)
    huge = root / "huge" / "1"  # bigger than the whole budget
    huge.mkdir(parents=True)
    onnx.save(onnx_model(-1.0), huge / "model.onnx")
    pad(huge, 2 * BUDGET)
    entries += [f'config {{ name: "{name}" base_path: "{root / name}" }}' for name in ("gated", "huge")]
    (root / "models.config").write_text("model_config_list {\n  " + "\n  ".join(entries) + "\n}\n")
    (root / "monitoring.config").write_text("prometheus_config { enable: true }\n")
    return root


@pytest.fixture(scope="module")
def served(repository: Path) -> Iterator[tuple[ServerThread, Transitions]]:
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_config_file=str(repository / "models.config"),
        monitoring_config_file=str(repository / "monitoring.config"),
        file_system_poll_wait_seconds=0.2,  # the poller runs beside the evictions: it must not fight them
        allow_python_models=True,
        memory_budget=str(BUDGET),
        load_on_demand=True,
        pin=(f"{PINNED[0]}:{PINNED[1]}",),
    )
    with ServerThread(options) as server:
        yield server, Transitions(server)


def rest_predict(server: ServerThread, model: str, version: int | None, x: float) -> float:
    where = f"/versions/{version}" if version is not None else ""
    r = requests.post(f"{server.rest_url}/v1/models/{model}{where}:predict", json={"instances": [[x]]}, timeout=60)
    assert r.status_code == 200, r.text
    return float(r.json()["predictions"][0][0])


def grpc_predict(stub: Any, model: str, version: int, x: float) -> float:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.version.value = version
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[x]], np.float32)))
    return float(tf.make_ndarray(stub.Predict(request, timeout=60).outputs["y"])[0][0])


def v2_rest_infer(server: ServerThread, model: str, version: int, x: float) -> float:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [x]}]}
    r = requests.post(f"{server.rest_url}/v2/models/{model}/versions/{version}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


def v2_grpc_infer(client: triton_grpc.InferenceServerClient, model: str, version: int, x: float) -> float:
    given = triton_grpc.InferInput("x", [1, 1], "FP32")
    given.set_data_from_numpy(np.array([[x]], np.float32))
    result = client.infer(model, [given], model_version=str(version), client_timeout=60)
    return float(result.as_numpy("y")[0][0])


def memory_of(server: ServerThread) -> dict[str, Any]:
    stats = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=10).json()
    return stats["memory"]


def residency(server: ServerThread, model: str, version: int) -> str:
    doc = requests.get(f"{server.rest_url}/workbench/v1/models/{model}", timeout=10).json()
    return next(v["memory"]["residency"] for v in doc["versions"] if v["version"] == version)


def lru_evictions(requests_in_order: list[tuple[str, int]], slots: int, resident: list[tuple[str, int]]) -> list:
    """What a least-recently-used cache of ``slots`` entries evicts for these requests, starting from ``resident``
    (oldest first)."""
    cache: OrderedDict[tuple[str, int], None] = OrderedDict((key, None) for key in resident)
    evicted = []
    for key in requests_in_order:
        if key in cache:
            cache.move_to_end(key)
            continue
        if len(cache) == slots:
            evicted.append(cache.popitem(last=False)[0])
        cache[key] = None
    return evicted


ALL_VERSIONS = [(f"m{m}", v) for m in range(MODELS) for v in range(1, VERSIONS + 1)]


def test_thirty_versions_in_a_budget_for_five(served: tuple[ServerThread, Transitions]) -> None:
    server, transitions = served
    started = memory_of(server)
    assert started["budget_bytes"] == BUDGET and started["load_on_demand"] is True
    # Only the pinned version loaded at start; the server is ready all the same: the rest load when asked for.
    assert requests.get(f"{server.rest_url}/readyz", timeout=10).status_code == 200
    assert residency(server, *PINNED) == "resident" and residency(server, "m3", 2) == "not_loaded"

    # Round robin over REST, one request at a time: each version loads on demand, the least recently used leave.
    mark = transitions.mark()
    order = [key for key in ALL_VERSIONS if key != PINNED]
    for model, version in order:
        assert rest_predict(server, model, version, 1.0) == 1.0 + offset(int(model[1:]), version)
    assert transitions.evicted(mark) == lru_evictions(order, 4, [])  # 4 slots: the fifth holds the pin
    rss_after_first_round = resident_bytes()

    # An evicted version is answered after its reload (the request waits for it), over TF Serving's gRPC API.
    assert residency(server, "m0", 2) == "evicted"
    mark = transitions.mark()
    channel = grpc.insecure_channel(server.grpc_target)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    for model, version in order:
        assert grpc_predict(stub, model, version, 2.0) == 2.0 + offset(int(model[1:]), version)
    # Continuing the round robin: the residents at the end of the first round are the oldest now.
    assert transitions.evicted(mark) == lru_evictions(order, 4, order[-4:])
    assert residency(server, "m0", 2) == "evicted" and residency(server, "m9", 3) == "resident"
    # The dashboard's versions table and %serve status show each version's residency and memory.
    from workbench.client import Client
    from workbench.notebook.handle import models_table_html, models_table_text

    with Client(server.rest_url) as client:
        models = client.models()
    status = models_table_text(models)
    assert "memory: evicted · 32.0 MiB · 2 evictions" in next(
        line for line in status.splitlines() if "m0 " in line and " v2 " in line
    )
    assert "memory: resident · pinned" in status and "<th>memory</th>" in models_table_html(models)

    # Random order, eight clients at once, over all four APIs: every request answered, and answered right.
    v2 = triton_grpc.InferenceServerClient(server.grpc_target)
    rng = random.Random(33)
    calls = [(rng.choice(ALL_VERSIONS), rng.randrange(4), float(i)) for i in range(120)]

    def call(item: tuple[tuple[str, int], int, float]) -> tuple[float, float]:
        (model, version), api, x = item
        expected = x + offset(int(model[1:]), version)
        if api == 0:
            return rest_predict(server, model, version, x), expected
        if api == 1:
            return grpc_predict(stub, model, version, x), expected
        if api == 2:
            return v2_rest_infer(server, model, version, x), expected
        return v2_grpc_infer(v2, model, version, x), expected

    with ThreadPoolExecutor(8) as clients:
        answers = list(clients.map(call, calls))
    assert all(got == expected for got, expected in answers)
    # A request naming no version gets the latest one, loaded for it.
    assert rest_predict(server, "m4", None, 0.0) == offset(4, 3)

    # Memory stayed within the budget at every transition; the pin never left; the ledger agrees.
    assert not transitions.overdrawn
    assert PINNED not in transitions.evicted()
    summary = memory_of(server)
    assert summary["charged_bytes"] <= BUDGET
    resident = [
        (m, int(v)) for m, versions in summary["versions"].items() for v, f in versions.items() if f["resident"]
    ]
    assert PINNED in resident and len(resident) <= 5
    assert summary["evictions"] == len(transitions.evicted()) and summary["loads"] >= 60
    # What the process really holds stays bounded: 30 versions kept would add 60 MiB or more of weights alone.
    assert rss_after_first_round is not None and resident_bytes() - rss_after_first_round < 48 * MiB

    # Prometheus: each version's memory, residency, loads and evictions, and the budget.
    text = requests.get(f"{server.rest_url}{METRICS_PATH}", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("workbench_memory_budget_bytes", (("memory", "host"),))] == BUDGET
    assert samples[("workbench_memory_charged_bytes", (("memory", "host"),))] <= BUDGET
    pinned = (("model", "m0"), ("version", "1"))
    assert samples[("workbench_model_version_resident", pinned)] == 1
    assert samples[("workbench_model_version_loads_total", pinned)] == 1
    assert samples[("workbench_model_version_memory_bytes", (("memory", "host"), *pinned))] >= CHARGE
    evictions = sum(v for (name, _), v in samples.items() if name == "workbench_model_version_evictions_total")
    assert evictions == summary["evictions"]
    described = requests.get(f"{server.rest_url}/workbench/v1/models/m0", timeout=10).json()
    measured = next(v["memory"] for v in described["versions"] if v["version"] == 1)
    assert measured["pinned"] and measured["measured_bytes"] is not None and measured["charged_bytes"] >= CHARGE


def test_metadata_of_an_evicted_version_loads_it(served: tuple[ServerThread, Transitions]) -> None:
    server, _ = served
    evicted = [key for key in ALL_VERSIONS if residency(server, *key) in ("evicted", "not_loaded")]
    assert len(evicted) >= 3
    (a, va), (b, vb), (c, vc) = evicted[:3]
    r = requests.get(f"{server.rest_url}/v1/models/{a}/versions/{va}/metadata", timeout=60)
    assert r.status_code == 200 and "serving_default" in r.json()["metadata"]["signature_def"]["signature_def"]
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc_target))
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name, request.model_spec.version.value = b, vb
    assert stub.GetModelMetadata(request, timeout=60).model_spec.version.value == vb
    r = requests.get(f"{server.rest_url}/v2/models/{c}/versions/{vc}", timeout=60)
    assert r.status_code == 200 and r.json()["name"] == c
    assert all(residency(server, *key) == "resident" for key in evicted[:3])


def test_a_version_in_use_is_never_evicted(served: tuple[ServerThread, Transitions], repository: Path) -> None:
    server, transitions = served
    gate, held = repository / "gate", repository / "held"
    gate.touch()
    held.unlink(missing_ok=True)
    with ThreadPoolExecutor(1) as background:
        running = background.submit(rest_predict, server, "gated", 1, 21.0)
        wait_until(held.exists, timeout=60, what="the gated request is inside the model")
        mark = transitions.mark()
        # The gated version is now the least recently used: nine loads press on the budget around it.
        for model, version in ALL_VERSIONS[3:12]:
            assert rest_predict(server, model, version, 0.0) == offset(int(model[1:]), version)
        assert ("gated", 1) not in transitions.evicted(mark) and len(transitions.evicted(mark)) >= 5
        assert residency(server, "gated", 1) == "resident"
        gate.unlink()
        assert running.result(timeout=60) == 42.0
    # Idle now (its last use: when that request ended), it is evicted like any other once newer loads need room.
    mark = transitions.mark()
    for model, version in ALL_VERSIONS[12:17]:
        rest_predict(server, model, version, 0.0)
    assert ("gated", 1) in transitions.evicted(mark)
    assert not transitions.overdrawn


def test_a_model_bigger_than_the_budget_is_refused_and_the_rest_keep_serving(
    served: tuple[ServerThread, Transitions],
) -> None:
    server, _ = served
    r = requests.post(f"{server.rest_url}/v1/models/huge:predict", json={"instances": [[1.0]]}, timeout=60)
    assert r.status_code == 429, r.text  # RESOURCE_EXHAUSTED, as TF Serving's REST API maps it
    error = r.json()["error"]
    assert error.startswith("Insufficient resources to load servable huge:1: it needs 352.0 MiB")
    assert f"--memory_budget={BUDGET}" in error
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc_target))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "huge"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=60)
    assert (
        caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Insufficient resources" in caught.value.details()
    )
    doc = requests.get(f"{server.rest_url}/workbench/v1/models/huge", timeout=10).json()
    assert (
        doc["versions"][0]["error_code"] == "RESOURCE_EXHAUSTED"
        and doc["versions"][0]["memory"]["residency"] == "failed"
    )
    assert grpc_predict(stub, "m2", 2, 1.0) == 1.0 + offset(2, 2)  # the server keeps serving the others
    status = json.loads(requests.get(f"{server.rest_url}/v1/models/m2", timeout=10).text)
    assert any(v["state"] == "AVAILABLE" for v in status["model_version_status"])


def test_the_first_model_of_a_framework_is_charged_the_model_not_the_frameworks_import(tmp_path: Path) -> None:
    """A fresh `workbench serve` whose first model is a PyTorch one: importing PyTorch grows the process by some
    300 MiB, once. The load is measured after the import, so a model of a few MiB loads within a 64 MiB budget and
    is charged about its size (it was charged the import, and refused: "it took 335.4 MiB once loaded")."""
    import torch
    from test_cli import START_DEADLINE_S, Workbench

    import workbench

    workbench.export(torch.nn.Linear(512, 512), "linear", tmp_path / "repo", example_inputs=(torch.ones(2, 512),))
    (tmp_path / "cwd").mkdir()
    ready = tmp_path / "ready.json"
    wb = Workbench(
        tmp_path / "cwd",
        f"--model_repository={tmp_path / 'repo'}",
        "--port=0",
        "--rest_api_port=-1",
        "--memory_budget=64Mi",
        f"--ready_file={ready}",
    )
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['rest_port']}"
        r = requests.post(f"{url}/v1/models/linear:predict", json={"instances": [[0.0] * 512]}, timeout=60)
        assert r.status_code == 200, r.text
        memory = requests.get(f"{url}/workbench/v1/models/linear", timeout=10).json()["versions"][0]["memory"]
        assert memory["residency"] == "resident"
        assert memory["charged_bytes"] < 32 * 2**20, memory  # the model (1 MiB of weights), not PyTorch's import
    finally:
        wb.kill()
