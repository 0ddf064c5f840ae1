"""Frontends and model runners as real processes: ``workbench serve --num_workers 2 --model_runners 1`` (the default
on a machine with a GPU is a runner per GPU; on CPUs alone, none).

The model is a Python model that writes down what happens to it: each load (with its process id), each batch's
size, and, while the file ``gate`` exists, it holds every call (writing ``holding``), so a test can keep requests
inside the runner as long as it needs and decide exactly what queues behind them.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import models
import numpy as np
import pytest
import requests
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from test_cli import START_DEADLINE_S, Workbench
from waiting import wait_until

from workbench.protocol.tensor_proto import from_numpy

MODEL = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    import numpy as np

    RECORDS = Path(__file__).parents[3] / "records"  # repo/m/1/model.py → beside the repository


    def note(name, line):
        with open(RECORDS / name, "a") as out:  # one short append a line: whole lines, whoever writes
            out.write(f"{line}\\n")


    class Model:
        inputs = {"x": ("float32", [-1, 1])}
        outputs = {"y": ("float32", [-1, 1]), "pid": ("int64", [-1, 1])}

        def load(self, path):
            note("loads", os.getpid())

        def predict(self, inputs):
            x = inputs["x"]
            while (RECORDS / "gate").exists():
                (RECORDS / "holding").touch()
                time.sleep(0.01)
            note("batches", len(x))
            return {"y": x * 2, "pid": np.full(x.shape, os.getpid(), np.int64)}
    """
)
BATCHING = "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 0 }\nnum_batch_threads { value: 1 }\n"


@dataclass
class Served:
    wb: Workbench
    ready: dict
    records: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ready['rest_port']}"

    def lines(self, name: str) -> list[str]:
        path = self.records / name
        return path.read_text().split() if path.exists() else []

    def close_gate(self) -> None:
        (self.records / "gate").touch()
        (self.records / "holding").unlink(missing_ok=True)

    def open_gate(self) -> None:
        (self.records / "gate").unlink(missing_ok=True)

    def holding(self) -> bool:
        return (self.records / "holding").exists()

    def predict(self, x: float, timeout: float = 60) -> requests.Response:
        """One REST predict on a connection of its own (the kernel picks the worker)."""
        return requests.post(f"{self.url}/v1/models/m:predict", json={"instances": [[x]]}, timeout=timeout)

    def stats(self) -> dict:
        return requests.get(f"{self.url}/workbench/v1/stats", timeout=30).json()

    def version_stats(self) -> dict:
        """Version 1's line of the whole server's stats (empty before its first request)."""
        return self.stats()["models"].get("m", {}).get("1", {})


def serve(tmp_path: Path, *flags: str, prepare: Callable[[Path], object] = lambda version: None) -> Iterator[Served]:
    """The model served with ``flags``; ``prepare`` adds to its version folder first."""
    records = tmp_path / "records"
    records.mkdir()
    version = tmp_path / "repo" / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    prepare(version)
    batching = tmp_path / "batching.txt"
    batching.write_text(BATCHING)
    ready = tmp_path / "ready.json"
    (tmp_path / "cwd").mkdir()
    wb = Workbench(
        tmp_path / "cwd",
        f"--model_repository={tmp_path / 'repo'}",
        "--allow_python_models",
        "--enable_batching",
        f"--batching_parameters_file={batching}",
        "--rest_api_port=-1",
        "--port=0",
        f"--ready_file={ready}",
        *flags,
    )
    served = None
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        served = Served(wb, json.loads(ready.read_text()), records)
        yield served
    finally:
        if served is not None:
            served.open_gate()
        if wb.proc.poll() is None:
            wb.proc.send_signal(signal.SIGTERM)
            assert wb.wait(120) == 0, wb.stderr[-3000:]


@pytest.fixture
def with_runner(tmp_path: Path) -> Iterator[Served]:
    yield from serve(tmp_path, "--num_workers=2", "--model_runners=1")


def worker_pids(served: Served) -> set[int]:
    return {worker["pid"] for worker in served.ready["workers"]}


def test_one_runner_holds_the_model_once_and_batches_what_every_worker_hands_it(with_runner):
    served = with_runner
    (runner,) = served.ready["runners"]
    assert served.lines("loads") == [str(runner["pid"])]  # one copy, in the runner, none in the workers
    assert runner["pid"] not in worker_pids(served)

    served.close_gate()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        first = pool.submit(served.predict, 0.5)
        wait_until(served.holding, 60, what="the first request held in the runner")
        rest = [pool.submit(served.predict, float(x)) for x in range(24)]
        # All 24 reached the runner's queue behind the held call (the workers count them in flight there).
        wait_until(lambda: served.version_stats().get("queue_depth") == 25, 60, 0.05, "25 rows in the runner")
        served.open_gate()
        answers = [future.result() for future in rest]
        assert first.result().json()["predictions"] == [{"y": [1.0], "pid": [runner["pid"]]}]
    assert [a.json()["predictions"][0]["y"] for a in answers] == [[2.0 * x] for x in range(24)]
    # One batch of the 24, though they came through both workers (each worker's requests are counted apart).
    assert served.lines("batches") == ["1", "24"]
    per_worker = [row["total_requests"] for row in served.stats()["workers"]]
    assert all(count > 0 for count in per_worker), per_worker
    # The runner's batch records reach the whole server's stats once each: batches of 1 and 24.
    entry = served.version_stats()
    assert entry["mean_batch_size"] == 12.5 and entry["total_requests"] == 25, entry


def test_in_process_workers_each_load_the_model(tmp_path):
    for served in serve(tmp_path, "--num_workers=2", "--model_runners=in_process"):
        assert "runners" not in served.ready or served.ready["runners"] == []
        assert sorted(map(int, served.lines("loads"))) == sorted(worker_pids(served))
        assert served.predict(1.0).json()["predictions"][0]["y"] == [2.0]


def test_the_runner_warms_a_version_up_once_whatever_the_workers(tmp_path):
    def warmup_file(version: Path) -> None:
        models.write_warmup_file(version, [models.predict_log("m", {"x": np.array([[1], [2], [3]], np.float32)})])

    for served in serve(tmp_path, "--num_workers=2", "--model_runners=1", prepare=warmup_file):
        assert served.lines("batches") == ["3"]  # the warmup request, replayed in the runner before it served
        assert served.predict(1.0).json()["predictions"][0]["y"] == [2.0]


def test_a_deadline_passed_in_the_runners_queue_never_runs(with_runner):
    served = with_runner
    served.close_gate()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    from_numpy(np.array([[7.0]], np.float32), request.inputs["x"])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(served.predict, 1.0)
        wait_until(served.holding, 60, what="the first request held in the runner")
        with grpc.insecure_channel(f"127.0.0.1:{served.ready['grpc_port']}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(request, timeout=1.0)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - started < 10
        served.open_gate()
        assert held.result().status_code == 200
    # One batch thread takes the runner's queue in order: had the expired request stayed in it, it would have run
    # before (or with) the next one, which is answered only after it.
    assert served.predict(4.0).json()["predictions"][0]["y"] == [8.0]
    assert served.lines("batches") == ["1", "1"]


def test_a_killed_runner_fails_what_was_in_flight_at_once_and_serves_again_once_restarted(with_runner):
    served = with_runner
    (runner,) = served.ready["runners"]
    outcomes: list[tuple[float, int, str]] = []  # (seconds, status, error)
    stop = threading.Event()

    def client() -> None:
        session = requests.Session()
        while not stop.is_set():
            started = time.monotonic()
            response = session.post(f"{served.url}/v1/models/m:predict", json={"instances": [[1.0]]}, timeout=60)
            error = response.json().get("error", "") if response.status_code != 200 else ""
            outcomes.append((time.monotonic() - started, response.status_code, error))

    clients = [threading.Thread(target=client) for _ in range(8)]
    for thread in clients:
        thread.start()
    try:
        wait_until(lambda: len(outcomes) >= 50, 60, what="load")
        served.close_gate()  # requests now pile up in the runner: some are surely in flight when it dies
        wait_until(served.holding, 60, what="requests held in the runner")
        before = len(outcomes)
        os.kill(runner["pid"], signal.SIGKILL)
        wait_until(lambda: f"Model runner 0 (pid {runner['pid']}) exited with signal 9" in served.wb.stderr, 60)
        served.open_gate()
        # Restarted, the model loaded again (in a new runner), and answers come back.
        wait_until(lambda: len(served.lines("loads")) == 2, START_DEADLINE_S, 0.1, "the model loaded again")
        wait_until(lambda: any(status == 200 for _, status, _ in outcomes[before:]), 60, what="answers again")
        # A health probe answers while, and after, the runner was away.
        assert requests.get(f"{served.url}/workbench/v1/health", timeout=10).status_code == 200
    finally:
        stop.set()
        for thread in clients:
            thread.join(60)
    failed = [(seconds, status, error) for seconds, status, error in outcomes[before:] if status != 200]
    assert failed, "no request was in flight when the runner died"
    assert {status for _, status, _ in failed} == {503}, failed
    assert all("Model runner 0" in error for _, _, error in failed), failed
    assert max(seconds for seconds, _, _ in outcomes) < 30  # nothing hung until a timeout
    new_pid = int(served.lines("loads")[-1])
    assert new_pid != runner["pid"] and new_pid not in worker_pids(served)
    assert served.predict(3.0).json()["predictions"][0] == {"y": [6.0], "pid": [new_pid]}


# A Triton Python model answers each request with its own row count: a runner that merged requests before the
# batcher would hand execute() one request of several clients' rows, and each would hear the group's count.
ROWS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            rows = np.full((len(x), 1), len(x), dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("ROWS", rows)]))
        return responses
"""
ROWS_CONFIG = """
backend: "python"
max_batch_size: 64
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "ROWS" data_type: TYPE_INT64 dims: [ 1 ] } ]
dynamic_batching { }
"""


def test_a_runner_hands_a_model_that_answers_per_request_each_request_as_its_own(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    (repository / "rows" / "1").mkdir(parents=True)
    (repository / "rows" / "1" / "model.py").write_text(ROWS_MODEL)
    (repository / "rows" / "config.pbtxt").write_text(ROWS_CONFIG)
    ready = tmp_path / "ready.json"
    (tmp_path / "cwd").mkdir()
    wb = Workbench(
        tmp_path / "cwd",
        f"--model_repository={repository}",
        "--allow_python_models",
        "--rest_api_port=-1",
        "--port=0",
        "--num_workers=2",
        "--model_runners=1",
        f"--ready_file={ready}",
    )
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['rest_port']}/v2/models/rows/infer"
        body = {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}

        def rows(_: int) -> list[int]:
            answer = requests.post(url, json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            return answer.json()["outputs"][0]["data"]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(rows, range(160)))
        assert answers == [[1]] * 160
    finally:
        if wb.proc.poll() is None:
            wb.proc.send_signal(signal.SIGTERM)
            assert wb.wait(120) == 0, wb.stderr[-3000:]
