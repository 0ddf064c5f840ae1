"""A request sent while its model's first load is under way waits for that load, as TF Serving's clients expect.

TF Serving opens its ports only once the initial models have loaded, so scripts, health checks and test harnesses
written for it wait for the port, then predict. workbench opens its ports first (liveness and readiness answer during
a long start-up), so a request for a model the config or repository names, sent while that model still loads, waits
for the load (bounded by its deadline and --wait_for_model_load_seconds) instead of getting NOT_FOUND; a model that
failed to load answers with its load error, and a model nobody named is NOT_FOUND at once.

The first tests drive the manager and the dataplane directly with a loader the test releases; the last ones start
``workbench serve`` on ports the test then knocks on, a model that takes seconds to load, and send TF Serving's and
Triton's clients the moment each port opens, over REST, gRPC and v2, with one process and with ``--num_workers 2``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from replica import Replica
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc, predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc as tfs_grpc
from test_cli import free_port
from tritonclient.utils import InferenceServerException
from waiting import wait_until

from workbench.batching.scheduler import BatchScheduler
from workbench.batching.threads import InferenceThreads
from workbench.config.options import ModelConfig
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import Signature
from workbench.models.manager import DiskVersion, Manager
from workbench.observability.metrics import ServingMetrics
from workbench.observability.stats import RollingStats
from workbench.planes.dataplane import Dataplane, ModelSpec

# ----------------------------------------------------------------------------------- the engine, no sockets


class _Nothing(Servable):
    """A loaded version that is never run: these tests only resolve it."""

    def __init__(self, name: str, version: int) -> None:
        self.name, self.version, self.path = name, version, ""
        self.signatures: Mapping[str, Signature] = {}

    def run(self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, Any]:
        raise AssertionError("not run in these tests")


class GatedLoader:
    """Loads a version once the test opens its model's gate; a model in ``failing`` fails with a reason."""

    def __init__(self, failing: Mapping[str, str] = {}) -> None:  # read only
        self.gates: dict[str, threading.Event] = {}
        self.failing = failing

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def __call__(self, name: str, version: int, path: str, platform: str = "") -> Servable:
        assert self.gate(name).wait(60)
        if name in self.failing:
            raise ServingError(Code.INVALID_ARGUMENT, self.failing[name])
        return _Nothing(name, version)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Manager, Dataplane, GatedLoader]]:
    loader = GatedLoader(failing={"broken": "no weights in this folder"})
    manager = Manager(loader, load_threads=4)
    threads = InferenceThreads(2, "test-infer")
    scheduler = BatchScheduler(threads, lambda servable: None)
    dataplane = Dataplane(manager, ServingMetrics(), RollingStats(), threads, scheduler, first_load_wait=30.0)
    try:
        yield manager, dataplane, loader
    finally:
        for gate in loader.gates.values():
            gate.set()
        manager.stop()
        threads.shutdown(wait=False)


def configure(manager: Manager, tmp_path: Path, *names: str, labels: Mapping[str, int] | None = None) -> None:
    manager.set_models([ModelConfig(n, str(tmp_path / n), labels=dict(labels or {})) for n in names])


def scan(manager: Manager, tmp_path: Path, name: str, *versions: int) -> None:
    manager.set_aspired_versions(name, {v: DiskVersion(str(tmp_path / name / str(v))) for v in versions})


def test_a_request_while_the_model_is_listed_or_loading_waits_and_is_answered(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    manager, dataplane, loader = engine
    configure(manager, tmp_path, "slow")
    assert manager.served.loading_first("slow")

    async def main() -> int:
        waiting = asyncio.ensure_future(dataplane.admit(ModelSpec("slow"), "predict", "test", timeout=30))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # configured, not even listed yet: it waits
        scan(manager, tmp_path, "slow", 3)
        await asyncio.sleep(0.1)
        assert not waiting.done()  # listed, loading: it still waits
        loader.gate("slow").set()
        with await waiting as call:
            return call.version

    assert asyncio.run(main()) == 3
    assert not manager.served.loading_first("slow")  # from now on a request resolves at once, as before


def test_a_model_nobody_named_is_not_found_at_once_and_a_failed_one_says_why(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    manager, dataplane, loader = engine
    configure(manager, tmp_path, "broken", "empty")

    async def main() -> tuple[ServingError, ServingError, ServingError, float]:
        started = time.monotonic()
        with pytest.raises(ServingError) as unknown:
            await dataplane.admit(ModelSpec("nobody"), "predict", "test", timeout=30)
        quick = time.monotonic() - started
        broken = asyncio.ensure_future(dataplane.admit(ModelSpec("broken"), "predict", "test", timeout=30))
        empty = asyncio.ensure_future(dataplane.admit(ModelSpec("empty"), "predict", "test", timeout=30))
        await asyncio.sleep(0.1)
        scan(manager, tmp_path, "broken", 1)
        scan(manager, tmp_path, "empty")  # listed, and no version in it
        loader.gate("broken").set()
        errors = []
        for waiting in (broken, empty):
            with pytest.raises(ServingError) as failed:
                await waiting
            errors.append(failed.value)
        return unknown.value, errors[0], errors[1], quick

    unknown, broken, empty, quick = asyncio.run(main())
    assert (unknown.code, unknown.message) == (Code.NOT_FOUND, "Servable not found for request: Latest(nobody)")
    assert quick < 1.0
    assert broken.code is Code.NOT_FOUND
    assert broken.message == (
        "Servable not found for request: Latest(broken): version 1 failed to load: no weights in this folder"
    )
    assert (empty.code, empty.message) == (
        Code.NOT_FOUND,
        "Servable not found for request: Latest(empty): no version found in its base path",
    )


def test_the_wait_is_bounded_by_the_deadline_then_by_the_flag(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    manager, dataplane, _ = engine
    configure(manager, tmp_path, "slow")
    scan(manager, tmp_path, "slow", 1)

    async def main() -> tuple[ServingError, ServingError]:
        with pytest.raises(ServingError) as deadline:
            await dataplane.admit(ModelSpec("slow"), "predict", "test", timeout=0.2)
        dataplane.first_load_wait = 0.2
        with pytest.raises(ServingError) as flag:
            await dataplane.loaded("slow", timeout=None)
        return deadline.value, flag.value

    deadline, flag = asyncio.run(main())
    assert (deadline.code, deadline.message) == (
        Code.DEADLINE_EXCEEDED,
        "Model slow is still loading: the request's deadline passed first",
    )
    assert (flag.code, flag.message) == (
        Code.UNAVAILABLE,
        "Model slow is still loading after 0.2s (--wait_for_model_load_seconds)",
    )
    assert manager.served.loading_first("slow")  # the load goes on without them


def test_a_zero_wait_answers_as_the_model_stands(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    manager, dataplane, _ = engine
    dataplane.first_load_wait = 0
    configure(manager, tmp_path, "slow")
    scan(manager, tmp_path, "slow", 1)

    async def main() -> ServingError:
        with pytest.raises(ServingError) as refused:
            await dataplane.admit(ModelSpec("slow"), "predict", "test", timeout=30)
        return refused.value

    assert asyncio.run(main()).message == "Servable not found for request: Latest(slow)"


def test_a_label_request_waits_until_the_configs_labels_are_applied(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    """The config's labels come once its versions have loaded: the first load is over only then."""
    manager, dataplane, loader = engine
    configure(manager, tmp_path, "slow", labels={"stable": 2})
    scan(manager, tmp_path, "slow", 2)
    loader.gate("slow").set()
    assert manager.served.wait_until_settled(30)
    assert manager.served.loading_first("slow")  # loaded, its label not applied yet

    async def main() -> int:
        waiting = asyncio.ensure_future(dataplane.admit(ModelSpec("slow", label="stable"), "predict", "test", 30))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await asyncio.get_running_loop().run_in_executor(None, manager.set_labels, {"slow": {"stable": 2}})
        with await waiting as call:
            return call.version

    assert asyncio.run(main()) == 2


def test_a_refused_label_still_ends_the_first_load(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    manager, _, loader = engine
    configure(manager, tmp_path, "slow", labels={"stable": 9})
    scan(manager, tmp_path, "slow", 1)
    loader.gate("slow").set()
    assert manager.served.wait_until_settled(30)
    with pytest.raises(ServingError, match="version 9 of model slow"):
        manager.set_labels({"slow": {"stable": 9}})
    assert not manager.served.loading_first("slow")


def test_a_model_removed_while_loading_first_ends_its_wait(
    engine: tuple[Manager, Dataplane, GatedLoader], tmp_path: Path
) -> None:
    manager, dataplane, _ = engine
    configure(manager, tmp_path, "slow", "other")

    async def main() -> ServingError:
        waiting = asyncio.ensure_future(dataplane.admit(ModelSpec("slow"), "predict", "test", timeout=30))
        await asyncio.sleep(0.1)
        await asyncio.get_running_loop().run_in_executor(None, configure, manager, tmp_path, "other")
        with pytest.raises(ServingError) as gone:
            await waiting
        return gone.value

    assert asyncio.run(main()).message == "Servable not found for request: Latest(slow)"
    assert not manager.served.loading_first("slow")


# --------------------------------------------------------------------------- workbench serve, real clients

LOAD_SECONDS = 4.0
SLOW_MODEL = f"""
import time
import workbench

class Slow(workbench.PythonModel):
    inputs = {{"x": ("float32", [-1, 1])}}
    outputs = {{"y": ("float32", [-1, 1])}}

    def load(self, path):
        time.sleep({LOAD_SECONDS})  # a big model: its first load takes seconds

    def predict(self, inputs):
        return {{"y": inputs["x"] * 2.0}}
"""
BROKEN_MODEL = """
import workbench

class Broken(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 1])}
    outputs = {"y": ("float32", [-1, 1])}

    def load(self, path):
        raise ValueError("no weights in this folder")

    def predict(self, inputs):
        return inputs
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("first-load")
    for name, source in (("slow", SLOW_MODEL), ("broken", BROKEN_MODEL)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
    return root


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_and_knock(workdir: Path, repository: Path | None, *flags: str) -> tuple[Replica, int, int]:
    """``workbench serve`` on two ports picked here (on ``repository``, or what ``flags`` name); returns once both
    accept connections (before it is ready)."""
    grpc_port, rest_port = free_port(), free_port()
    replica = Replica(
        workdir,
        f"--port={grpc_port}",
        f"--rest_api_port={rest_port}",
        *([f"--model_repository={repository}"] if repository is not None else []),
        "--allow_python_models",
        *flags,
    )

    def both_open() -> bool:
        if replica.proc.poll() is not None:
            raise AssertionError(f"the server exited with {replica.proc.returncode}:\n{replica.log()[-3000:]}")
        return port_open(rest_port) and port_open(grpc_port)

    wait_until(both_open, timeout=120, interval=0.01, what="the server's ports")
    return replica, grpc_port, rest_port


def tfs_predict(target: str, model: str, timeout: float = 60, version: int | None = None) -> np.ndarray:
    import tensorflow as tf

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.5]], np.float32)))
    with grpc.insecure_channel(target) as channel:
        response = tfs_grpc.PredictionServiceStub(channel).Predict(request, timeout=timeout)
    return tf.make_ndarray(response.outputs["y"])


def tfs_status(target: str, model: str) -> list[str]:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = model
    with grpc.insecure_channel(target) as channel:
        response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=60)
    return [get_model_status_pb2.ModelVersionStatus.State.Name(s.state) for s in response.model_version_status]


def v2_inputs(module: Any) -> list[Any]:
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5]], np.float32))
    return [x]


def v2_grpc_infer(target: str, model: str, version: str = "") -> np.ndarray:
    client = triton_grpc.InferenceServerClient(target)
    try:
        return client.infer(model, v2_inputs(triton_grpc), model_version=version, client_timeout=60).as_numpy("y")
    finally:
        client.close()


def v2_rest_infer(url: str, model: str, version: str = "") -> np.ndarray:
    client = triton_http.InferenceServerClient(url, network_timeout=60)
    try:
        return client.infer(model, v2_inputs(triton_http), model_version=version).as_numpy("y")
    finally:
        client.close()


def rest_predict(url: str, model: str, version: int | None = None) -> requests.Response:
    path = f"{model}/versions/{version}" if version is not None else model
    return requests.post(f"http://{url}/v1/models/{path}:predict", json={"instances": [[1.5]]}, timeout=60)


def grpc_error(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code().name, failed.value.details()


def test_clients_that_send_the_moment_the_ports_open_are_answered(tmp_path: Path, repository: Path) -> None:
    replica, grpc_port, rest_port = start_and_knock(tmp_path / "one", repository)
    target, url = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}"
    try:
        assert requests.get(f"http://{url}/readyz", timeout=10).status_code == 503  # still loading: not ready
        with ThreadPoolExecutor(max_workers=16) as pool:
            asked = {
                "rest": pool.submit(rest_predict, url, "slow"),
                "rest status": pool.submit(requests.get, f"http://{url}/v1/models/slow", timeout=60),
                "rest metadata": pool.submit(requests.get, f"http://{url}/v1/models/slow/metadata", timeout=60),
                "grpc": pool.submit(tfs_predict, target, "slow"),
                "grpc status": pool.submit(tfs_status, target, "slow"),
                "v2 grpc": pool.submit(v2_grpc_infer, target, "slow"),
                "v2 rest": pool.submit(v2_rest_infer, url, "slow"),
                "short deadline": pool.submit(grpc_error, lambda: tfs_predict(target, "slow", timeout=0.5)),
            }
            answers = {what: future.result(timeout=120) for what, future in asked.items()}
        assert answers["rest"].status_code == 200, answers["rest"].text
        assert answers["rest"].json() == {"predictions": [[3.0]]}
        assert answers["rest status"].json()["model_version_status"][0]["state"] == "AVAILABLE"
        assert "signature_def" in answers["rest metadata"].json()["metadata"]
        for what in ("grpc", "v2 grpc", "v2 rest"):
            np.testing.assert_array_equal(answers[what], [[3.0]])
        assert answers["grpc status"] == ["AVAILABLE"]
        assert answers["short deadline"][0] == "DEADLINE_EXCEEDED"
    finally:
        replica.stop()


def test_unknown_and_failed_models_while_others_load(tmp_path: Path, repository: Path) -> None:
    replica, grpc_port, rest_port = start_and_knock(tmp_path / "one", repository)
    target, url = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}"
    try:
        started = time.monotonic()
        unknown = rest_predict(url, "nobody")
        unknown_grpc = grpc_error(lambda: tfs_predict(target, "nobody"))
        with pytest.raises(InferenceServerException) as unknown_v2:
            v2_rest_infer(url, "nobody")
        assert time.monotonic() - started < LOAD_SECONDS  # answered at once, while "slow" still loads
        assert (unknown.status_code, unknown.json()) == (
            404,
            {"error": "Servable not found for request: Latest(nobody)"},
        )
        # What TF Serving's test harness waits for: a missing model's error that names a "Servable".
        assert unknown_grpc == ("NOT_FOUND", "Servable not found for request: Latest(nobody)")
        assert unknown_v2.value.message() == "Request for unknown model: 'nobody' is not found"
        broken = rest_predict(url, "broken")
        assert broken.status_code == 404
        assert "failed to load" in broken.json()["error"] and "no weights in this folder" in broken.json()["error"]
        with pytest.raises(InferenceServerException, match="no weights in this folder"):
            v2_grpc_infer(target, "broken")
    finally:
        replica.stop()


def test_the_same_with_two_workers(tmp_path: Path, repository: Path) -> None:
    replica, grpc_port, rest_port = start_and_knock(tmp_path / "two", repository, "--num_workers=2")
    target, url = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}"
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            rest = [pool.submit(rest_predict, url, "slow") for _ in range(4)]
            grpc_answers = [pool.submit(tfs_predict, target, "slow") for _ in range(4)]
            v2 = [pool.submit(v2_grpc_infer, target, "slow") for _ in range(4)]
            for answer in rest:
                assert answer.result(timeout=120).json() == {"predictions": [[3.0]]}
            for future in (*grpc_answers, *v2):
                np.testing.assert_array_equal(future.result(timeout=120), [[3.0]])
    finally:
        replica.stop()


def test_the_flag_bounds_the_wait(tmp_path: Path, repository: Path) -> None:
    replica, _, rest_port = start_and_knock(tmp_path / "one", repository, "--wait_for_model_load_seconds=0.5")
    try:
        answer = rest_predict(f"127.0.0.1:{rest_port}", "slow")
        assert (answer.status_code, answer.json()) == (
            503,
            {"error": "Model slow is still loading after 0.5s (--wait_for_model_load_seconds)"},
        )
    finally:
        replica.stop()


# ------------------------------------------------- a version still in its first load once another one serves

GATED_VERSION = """
import pathlib
import time
import workbench

class Gated(workbench.PythonModel):
    inputs = {{"x": ("float32", [-1, 1])}}
    outputs = {{"y": ("float32", [-1, 1])}}

    def load(self, path):
        # A big version: its first load lasts until the test says (a file), long after the other version serves.
        deadline = time.monotonic() + 300
        while not pathlib.Path({gate!r}).exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def predict(self, inputs):
        return {{"y": inputs["x"] + {version}.0}}
"""


def test_a_request_for_a_version_still_in_its_first_load_waits_for_it(tmp_path: Path) -> None:
    """Versions 123 and 124 of one model; 124 serves at once, 123's first load lasts until the test releases it.
    TF Serving opens its ports only once both have loaded, so its clients never see 123 missing: requests for 123
    over TF Serving's REST and gRPC and v2's REST and gRPC wait for it, while one for a version that does not exist
    is answered NOT_FOUND at once."""
    gate = tmp_path / "release-123"
    base = tmp_path / "repo" / "two"
    for version in (123, 124):
        (base / str(version)).mkdir(parents=True)
        source = GATED_VERSION.format(gate=str(gate) if version == 123 else str(tmp_path), version=version)
        (base / str(version) / "model.py").write_text(source)
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "two" base_path: "{base}" model_platform: "python" '
        "model_version_policy { all {} } } }"
    )
    replica, grpc_port, rest_port = start_and_knock(tmp_path / "one", None, f"--model_config_file={config}")
    target, url = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}"
    try:
        # The model's own first load is over (124 serves, as a request for the model finds): 123 still loads.
        assert rest_predict(url, "two").json() == {"predictions": [[125.5]]}
        states = requests.get(f"http://{url}/v1/models/two", timeout=60).json()["model_version_status"]
        assert {s["version"]: s["state"] for s in states} == {"123": "LOADING", "124": "AVAILABLE"}

        with ThreadPoolExecutor(max_workers=8) as pool:
            asked = {
                "rest": pool.submit(rest_predict, url, "two", 123),
                "rest metadata": pool.submit(
                    requests.get, f"http://{url}/v1/models/two/versions/123/metadata", timeout=60
                ),
                "grpc": pool.submit(tfs_predict, target, "two", 60, 123),
                "v2 rest": pool.submit(v2_rest_infer, url, "two", "123"),
                "v2 grpc": pool.submit(v2_grpc_infer, target, "two", "123"),
            }
            missing = rest_predict(url, "two", 125)  # nothing loads as 125: answered now, while 123 still loads
            assert (missing.status_code, missing.json()) == (
                404,
                {"error": "Servable not found for request: Specific(two, 125)"},
            )
            done, _ = wait(asked.values(), timeout=1.0)
            assert not done, {what: f.result() for what, f in asked.items() if f in done}  # answered while loading
            gate.touch()
            answers = {what: future.result(timeout=120) for what, future in asked.items()}
        assert answers["rest"].status_code == 200, answers["rest"].text
        assert answers["rest"].json() == {"predictions": [[124.5]]}
        assert answers["rest metadata"].json()["model_spec"]["version"] == "123"
        for what in ("grpc", "v2 rest", "v2 grpc"):
            np.testing.assert_array_equal(answers[what], [[124.5]])
    finally:
        gate.touch()
        replica.stop()
