"""A request's hold on its model version lasts until the worker thread running it returns.

The client's answer may leave earlier (its deadline passed, it cancelled), but a thread inside ``run()`` cannot be
stopped: if the request let go of its version when it answered, an unload could close the model under that thread.
These tests make the race deterministic with a real Python model whose ``predict`` blocks until the test lets it
return: the request is answered (DEADLINE_EXCEEDED or CANCELLED) while its run is still blocked, the version is
unloaded, and the close must wait for the run, on every frontend.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.utils import InferenceServerException
from waiting import states_are, wait_until

from workbench.models.harness import Harness
from workbench.protocol.tensor_proto import from_numpy, to_numpy
from workbench.server import ServerThread

GATE_MODULE = "workbench_test_request_lifecycle_gate"  # where the model finds the test's Gate

BLOCKING_MODEL = f'''
import sys

import workbench


class Blocking(workbench.PythonModel):
    """y = x, once the test opens the gate; reports its run and its close to the test, in order."""

    inputs = {{"x": ("float32", [-1])}}
    outputs = {{"y": ("float32", [-1])}}

    def load(self, path):
        self.gate = sys.modules["{GATE_MODULE}"].gate
        self.version = int(path.name)
        self.closed = False

    def predict(self, inputs):
        self.gate.ran(inputs["x"].tolist())
        self.gate.started.set()
        self.gate.opened.wait(60)
        self.gate.record("run returned after close" if self.closed else "run returned", self.version)
        return {{"y": inputs["x"]}}

    def close(self):
        self.closed = True
        self.gate.record("closed", self.version)
'''


class Gate:
    """The test's side of the blocking model: when a run started, the switch that lets it return, what happened."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.opened = threading.Event()
        self._lock = threading.Lock()
        self.events: list[tuple[str, int]] = []
        self.runs: list[list[float]] = []  # the inputs of every run, as it started

    def record(self, event: str, version: int) -> None:
        with self._lock:
            self.events.append((event, version))

    def ran(self, x: list[float]) -> None:
        with self._lock:
            self.runs.append(x)


@pytest.fixture
def gate(serve: Callable[..., ServerThread]) -> Iterator[Gate]:
    """(Needs ``serve`` so it is torn down first: a failed test still lets the blocked run return.)"""
    module = types.ModuleType(GATE_MODULE)
    module.gate = Gate()  # type: ignore[attr-defined]
    sys.modules[GATE_MODULE] = module
    yield module.gate  # type: ignore[attr-defined]
    module.gate.opened.set()  # type: ignore[attr-defined]
    del sys.modules[GATE_MODULE]


def start(serve: Callable[..., ServerThread], tmp_path: Path, **options: object) -> ServerThread:
    """Versions 1 and 2 of the blocking model, both loaded (version 2 takes the default traffic)."""
    base = tmp_path / "models" / "blocking"
    for version in (1, 2):
        (base / str(version)).mkdir(parents=True)
        (base / str(version) / "model.py").write_text(textwrap.dedent(BLOCKING_MODEL))
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "blocking" base_path: "{base}" model_platform: "python" '
        "model_version_policy { all {} } } }\n"
    )
    return serve(model_config_file=str(config), allow_python_models=True, file_system_poll_wait_seconds=0, **options)


def version_one(server: ServerThread) -> Harness:
    """Version 1's harness, found as a request finds it (the hold taken to find it is given back at once)."""
    handle = server.server.manager.served.handle("blocking", 1)
    with handle as servable:
        assert servable.version == 1
    return handle.harness


def holders(harness: Harness) -> int:
    """The holds an unload of this version waits for. (Harness keeps the count to itself; reading it here tells
    at once whether the hold outlived the answer, instead of waiting to see that a close does not come.)"""
    return harness._holders


def answered(server: ServerThread, protocol: str) -> float:
    """Requests for version 1 counted with a failure status (each request is counted exactly once)."""
    registry = server.server.metrics.registry
    return sum(
        registry.get_sample_value(
            "workbench_requests_total",
            {"model": "blocking", "version": "1", "api": "predict", "protocol": protocol, "code": code},
        )
        or 0.0
        for code in ("DEADLINE_EXCEEDED", "CANCELLED")
    )


# ------------------------------------------------------------------------------ how each client gives up
def rest_deadline(server: ServerThread) -> None:
    r = requests.post(
        f"{server.rest_url}/v1/models/blocking/versions/1:predict", json={"instances": [1.0, 2.0]}, timeout=60
    )
    assert (r.status_code, r.json()) == (504, {"error": "Deadline Exceeded"})


def tf_grpc_request(*x: float) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "blocking"
    request.model_spec.version.value = 1
    from_numpy(np.array(x or [1.0, 2.0], np.float32), request.inputs["x"])
    return request


def grpc_deadline(server: ServerThread) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.Predict(tf_grpc_request(), timeout=0.5)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def grpc_cancelled(server: ServerThread) -> None:
    gate = sys.modules[GATE_MODULE].gate  # type: ignore[attr-defined]
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        call = stub.Predict.future(tf_grpc_request(), timeout=60)
        assert gate.started.wait(30), "the run never started"
        assert call.cancel()
    assert call.cancelled()


def v2_grpc_deadline(server: ServerThread) -> None:
    with triton.InferenceServerClient(server.grpc_target) as client:
        x = triton.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        with pytest.raises(InferenceServerException) as failed:
            client.infer("blocking", [x], model_version="1", client_timeout=0.5)
    assert failed.value.status() == "StatusCode.DEADLINE_EXCEEDED"


GIVING_UP = {
    # (how the client gives up, the protocol its request is counted under, server options)
    "rest-deadline": (rest_deadline, "rest", {"rest_api_timeout_in_ms": 500}),
    "grpc-deadline-batched": (grpc_deadline, "grpc", {"enable_batching": True}),
    "grpc-cancelled": (grpc_cancelled, "grpc", {}),
    "v2-grpc-deadline": (v2_grpc_deadline, "v2-grpc", {}),
}


@pytest.mark.parametrize("case", list(GIVING_UP))
def test_an_unload_waits_for_the_run_of_a_request_already_answered(
    serve: Callable[..., ServerThread], gate: Gate, tmp_path: Path, case: str
) -> None:
    give_up, protocol, options = GIVING_UP[case]
    server = start(serve, tmp_path, **options)
    harness = version_one(server)
    assert holders(harness) == 0

    give_up(server)
    assert gate.started.wait(30), "the run never started"
    # The server has finished the request (counted once, as its client saw it) while its run is still blocked.
    wait_until(lambda: answered(server, protocol) == 1, what="the request counted")
    assert not gate.opened.is_set()
    assert holders(harness) == 1, "the request let go of version 1 while its worker thread still runs on it"

    # Unload version 1 (v2's repository API): it begins at once, and waits for the run, not for the answer.
    r = requests.post(
        f"{server.rest_url}/v2/repository/models/blocking/unload", json={"parameters": {"version": 1}}, timeout=60
    )
    assert r.status_code == 200, r.text
    wait_until(lambda: refuses_new_holders(harness), what="version 1's unload to begin")
    assert gate.events == []  # not closed: the run still holds it

    gate.opened.set()
    wait_until(states_are(server.rest_url, "blocking", {"2": "AVAILABLE", "1": "END"}), what="version 1 END")
    assert gate.events == [("run returned", 1), ("closed", 1)]
    assert holders(harness) == 0
    assert answered(server, protocol) == 1  # the run's late return is not counted again


def refuses_new_holders(harness: Harness) -> bool:
    """True once the version is unloading (a new request could no longer hold it)."""
    if harness.acquire():
        harness.release()
        return False
    return True


def test_an_answered_request_releases_its_version_at_once(serve: Callable[..., ServerThread], gate: Gate, tmp_path):
    """The other side: a request whose run returned in time holds nothing once answered, so an unload is prompt."""
    gate.opened.set()
    server = start(serve, tmp_path)
    r = requests.post(
        f"{server.rest_url}/v1/models/blocking/versions/1:predict", json={"instances": [1.0, 2.0]}, timeout=60
    )
    assert (r.status_code, r.json()) == (200, {"predictions": [1.0, 2.0]})
    assert r.headers["X-Model-Version"] == "1"
    assert holders(version_one(server)) == 0
    registry = server.server.metrics.registry
    labels = {"model": "blocking", "version": "1", "api": "predict", "protocol": "rest", "code": "OK"}
    assert registry.get_sample_value("workbench_requests_total", labels) == 1


# ------------------------------------------------------------------ queued requests nobody waits for any more
def queue_depth(server: ServerThread) -> int:
    """Rows of version 1 waiting for a batch, as the stats API reports them."""
    models = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json()["models"]
    return int(models.get("blocking", {}).get("1", {}).get("queue_depth", 0))


def test_a_queued_request_whose_client_gave_up_never_runs_and_the_wanted_ones_do(
    serve: Callable[..., ServerThread], gate: Gate, tmp_path: Path
) -> None:
    """One batch thread, blocked in a run: requests queue behind it. One client's deadline passes and another
    cancels while their requests wait; those leave the queue at once (answered DEADLINE_EXCEEDED and CANCELLED,
    counted once) and never reach the model, while a request still wanted, queued with them, runs when the
    thread is free."""
    params = tmp_path / "batching.config"
    params.write_text("max_batch_size { value: 8 } batch_timeout_micros { value: 0 } num_batch_threads { value: 1 }")
    server = start(serve, tmp_path, enable_batching=True, batching_parameters_file=str(params))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        running = stub.Predict.future(tf_grpc_request(1, 2), timeout=60)
        assert gate.started.wait(30), "the first run never started"

        with pytest.raises(grpc.RpcError) as expired:
            stub.Predict(tf_grpc_request(3, 4), timeout=0.5)  # queued behind the blocked run until its deadline
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: queue_depth(server) == 0, what="the expired request out of the queue")

        cancelled = stub.Predict.future(tf_grpc_request(5, 6), timeout=60)
        wait_until(lambda: queue_depth(server) == 2, what="the request to cancel queued")
        assert cancelled.cancel()
        wait_until(lambda: queue_depth(server) == 0, what="the cancelled request out of the queue")
        wait_until(lambda: answered(server, "grpc") == 2, what="both counted")

        wanted = stub.Predict.future(tf_grpc_request(7, 8), timeout=60)
        wait_until(lambda: queue_depth(server) == 2, what="the wanted request queued")
        assert gate.runs == [[1.0, 2.0]] and not gate.opened.is_set()

        gate.opened.set()
        assert y(running.result(timeout=60)) == [1.0, 2.0]
        assert y(wanted.result(timeout=60)) == [7.0, 8.0]
    assert gate.runs == [[1.0, 2.0], [7.0, 8.0]], "a request nobody waited for any more reached the model"
    assert answered(server, "grpc") == 2
    wait_until(lambda: holders(version_one(server)) == 0, what="every hold given back")


def y(response: predict_pb2.PredictResponse) -> list[float]:
    return to_numpy(response.outputs["y"], "y").tolist()  # type: ignore[no-any-return]
