"""``workbench serve --num_workers 2`` as a real process: two workers on the same ports behave as one server.

Which worker answered is told by ``/workbench/v1/health``'s ``pid`` (REST) and by the per-worker request counts of
``/workbench/v1/stats`` (gRPC); the kernel spreads new connections, so every check uses many connections.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from test_cli import START_DEADLINE_S, Workbench, free_port
from test_drain import (  # noqa: F401 - gated_model and gated are fixtures
    ON_THREADS,
    Client,
    GrpcClient,
    Ports,
    RestClient,
    gated,
    gated_model,
    gated_repo,
    grpc_refuses,
    rest_refuses,
    sigterm_and_expect_a_drain,
)
from waiting import wait_until

import workbench
from workbench.client.bench import run_load
from workbench.deploy.workers import resolve_num_workers

CONNECTIONS = 24  # new connections per check: both workers get some (each misses with odds 2 ** -24)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[tuple[Workbench, dict]]:
    """hp (v1: x/2+2, v2: x/2+3) served by 2 workers, Prometheus on TF Serving's path too; its ready file."""
    root = tmp_path_factory.mktemp("workers")
    for version, stored in ((1, "hp2_tf2"), (2, "hp3_tf2")):
        shutil.copytree(model_store / stored, root / "repo" / "hp" / str(version))
    monitoring = root / "monitoring.config"
    monitoring.write_text("prometheus_config { enable: true }\n")
    ready = root / "ready.json"
    (root / "cwd").mkdir()
    wb = Workbench(
        root / "cwd",
        f"--model_repository={root / 'repo'}",
        "--num_workers=2",
        "--rest_api_port=-1",
        "--port=0",
        "--file_system_poll_wait_seconds=0.2",
        f"--monitoring_config_file={monitoring}",
        f"--ready_file={ready}",
    )
    wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
    assert wb.proc.poll() is None, wb.stderr[-3000:]
    yield wb, json.loads(ready.read_text())
    wb.proc.send_signal(signal.SIGTERM)
    assert wb.wait(120) == 0, wb.stderr[-3000:]


def url(ready: dict) -> str:
    return f"http://127.0.0.1:{ready['rest_port']}"


def health(ready: dict) -> dict:
    # A fresh connection each time (no session): the kernel picks the worker
    return requests.get(url(ready) + "/workbench/v1/health", timeout=30).json()


def stats(ready: dict) -> dict:
    return requests.get(url(ready) + "/workbench/v1/stats", timeout=30).json()


def worker_totals(ready: dict) -> list[int]:
    rows = stats(ready)["workers"]
    assert all(row["answered"] for row in rows), rows
    return [row["total_requests"] for row in rows]


def grpc_predict(ready: dict, x: float = 1.0) -> tuple[int, float]:
    """One Predict on a channel of its own: (the version that answered, y)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "hp"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([x], np.float32)))
    with grpc.insecure_channel(f"127.0.0.1:{ready['grpc_port']}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return response.model_spec.version.value, response.outputs["y"].float_val[0]


def prometheus_count(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == ":tensorflow:serving:request_count" and sample.labels["model_name"] == "hp"
    )


def test_num_workers_takes_a_number_or_auto():
    assert resolve_num_workers("3") == 3
    assert resolve_num_workers("auto") == len(os.sched_getaffinity(0))
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="--num_workers"):
            resolve_num_workers(bad)


def test_the_ready_file_names_the_supervisor_and_every_worker(two_workers):
    wb, ready = two_workers
    assert ready["pid"] == wb.proc.pid
    assert [w["index"] for w in ready["workers"]] == [0, 1]
    assert len({w["pid"] for w in ready["workers"]} | {wb.proc.pid}) == 3


def test_both_workers_answer_rest_from_many_connections(two_workers):
    _, ready = two_workers
    answered = [health(ready) for _ in range(CONNECTIONS)]
    workers = {row["pid"] for row in answered[0]["workers"]}
    assert len(workers) == 2 and all(row["readiness"] == {"status": "ready"} for row in answered[0]["workers"])
    assert {h["pid"] for h in answered} == workers  # each worker answered some, and says the server has both


def test_both_workers_answer_grpc_and_the_counts_add_up(two_workers):
    wb, ready = two_workers
    before = worker_totals(ready)
    for _ in range(CONNECTIONS):
        assert grpc_predict(ready)[1] in (2.5, 3.5)
    for _ in range(CONNECTIONS):
        r = requests.post(url(ready) + "/v1/models/hp:predict", json={"instances": [1.0]}, timeout=30)
        assert r.status_code == 200, r.text
    after = worker_totals(ready)
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == 2 * CONNECTIONS and all(n > 0 for n in served), served

    # The stats, the stats stream and both Prometheus paths describe the whole server, whichever worker answers.
    total = sum(entry["total_requests"] for entry in stats(ready)["models"]["hp"].values())
    assert total == sum(after)
    for path in ("/metrics", "/monitoring/prometheus/metrics"):
        for _ in range(4):
            assert prometheus_count(requests.get(url(ready) + path, timeout=30).text) == total
    with requests.get(url(ready) + "/workbench/v1/stats/stream?interval=0.1", stream=True, timeout=30) as r:
        line = next(line for line in r.iter_lines() if line.startswith(b"data: "))
    event = json.loads(line[len(b"data: ") :])
    assert sum(entry["total_requests"] for entry in event["models"]["hp"].values()) == total
    assert [w["answered"] for w in event["workers"]] == [True, True]


def test_v2_statistics_describe_the_whole_server(two_workers):
    """Triton's statistics extension, over REST and gRPC, counts every worker's requests, whichever answers."""
    import tritonclient.grpc as triton_grpc

    _, ready = two_workers
    for _ in range(CONNECTIONS):  # fresh connections: both workers serve some
        assert grpc_predict(ready)[1] in (2.5, 3.5)
    total = sum(worker_totals(ready))

    def successes(doc: dict) -> int:
        return sum(int(entry["inference_stats"]["success"]["count"]) for entry in doc["model_stats"])

    for _ in range(4):
        assert successes(requests.get(url(ready) + "/v2/models/hp/stats", timeout=30).json()) == total
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{ready['grpc_port']}") as client:
            assert successes(client.get_inference_statistics("hp", as_json=True)) == total


def test_bench_spreads_grpc_clients_over_the_workers(two_workers):
    _, ready = two_workers
    before = worker_totals(ready)
    inputs = {"x": np.array([1.0], np.float32)}
    result = run_load(f"127.0.0.1:{ready['grpc_port']}", "grpc", "hp", inputs, concurrency=32, requests=320)
    assert result.errors == 0 and result.requests == 320
    served = [a - b for a, b in zip(worker_totals(ready), before, strict=True)]
    assert all(n > 0 for n in served), served  # 8 channels of 4 clients: both workers got connections


def test_the_notebook_client_spreads_its_grpc_calls_over_the_workers(two_workers):
    from workbench.client import Client

    _, ready = two_workers
    before = worker_totals(ready)
    with Client(url(ready), f"127.0.0.1:{ready['grpc_port']}", protocol="grpc", grpc_channels=16) as client:
        for _ in range(64):  # its 16 connections in turn: the kernel spreads connections (all on one worker: 2^-15)
            assert client.predict("hp", [1.0])["y"].tolist() in ([2.5], [3.5])
    served = [a - b for a, b in zip(worker_totals(ready), before, strict=True)]
    assert all(n > 0 for n in served), served


def test_a_promotion_reaches_both_workers(two_workers):
    _, ready = two_workers
    r = requests.post(url(ready) + "/workbench/v1/models/hp:promote", json={"version": 1}, timeout=120)
    assert r.status_code == 200, r.text
    try:
        # Every new connection, on either worker, is answered by version 1 (x/2 + 2) once both read routing.json.
        wait_until(
            lambda: all(grpc_predict(ready) == (1, 2.5) for _ in range(CONNECTIONS)), 60, 0.2, "v1 on both workers"
        )
    finally:
        r = requests.post(url(ready) + "/workbench/v1/models/hp:promote", json={"version": 2}, timeout=120)
        assert r.status_code == 200, r.text
    wait_until(lambda: all(grpc_predict(ready) == (2, 3.5) for _ in range(CONNECTIONS)), 60, 0.2, "v2 on both")


def test_a_killed_worker_is_restarted(two_workers):
    wb, ready = two_workers
    before = {row["index"]: row["pid"] for row in health(ready)["workers"]}
    os.kill(before[1], signal.SIGKILL)

    def restarted() -> bool:
        rows = health(ready)["workers"]
        ready_rows = all(row["answered"] and row["readiness"] == {"status": "ready"} for row in rows)
        return ready_rows and rows[0]["pid"] == before[0] and rows[1]["pid"] not in (before[0], before[1])

    # While worker 1 restarts and loads, fresh connections (each to whichever worker listens) are all answered: a
    # worker joins the shared ports only once its models serve, so none of them hears "Servable not found".
    # (From the moment the supervisor saw it die: connections queued on the killed worker's socket are reset.)
    wait_until(lambda: f"Worker 1 (pid {before[1]}) exited with signal 9" in wb.stderr, 60, 0.05, "the death seen")
    answers: list[float] = []
    wait_until(lambda: answers.extend(grpc_predict(ready)[1] for _ in range(4)) or restarted(), START_DEADLINE_S, 0.05)
    assert answers and set(answers) == {3.5}
    assert f"Worker 1 (pid {before[1]}) exited with signal 9" in wb.stderr
    assert all(grpc_predict(ready)[1] == 3.5 for _ in range(CONNECTIONS))


@pytest.mark.parametrize("runners", ["in_process", "1"])  # workers on their own, and workers feeding a runner
def test_sigterm_under_load_drains_every_worker_and_loses_no_accepted_request(gated, tmp_path, runners):  # noqa: F811
    base = gated_repo(gated, tmp_path / "gated")
    ports = Ports(free_port(), free_port())
    ready = tmp_path / "ready.json"
    (tmp_path / "cwd").mkdir()
    wb = Workbench(
        tmp_path / "cwd",
        *ports.flags(),
        "--num_workers=2",
        f"--model_runners={runners}",
        "--num_inference_threads=8",  # every client's request runs, held at the gate, whichever worker has it
        "--model_name=gated",
        ON_THREADS,
        f"--model_base_path={base}",
        "--drain_seconds=300",
        f"--ready_file={ready}",
    )
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        clients: list[Client] = [RestClient(ports.url) for _ in range(4)] + [GrpcClient(ports.target) for _ in range(4)]
        for client in clients:
            client.start()
        wait_until(lambda: all(len(c.outcomes) >= 3 for c in clients), 120, what="every client answered 3 times")
        gated.close()
        try:
            wait_until(lambda: gated.held() == len(clients), 120, what="every client's request held in a worker")
        except AssertionError as exc:  # say what each client last saw: one refused request stops its client
            last = [(type(c).__name__, len(c.outcomes), c.outcomes[-1:]) for c in clients]
            raise AssertionError(f"{exc}; held: {gated.held()}; clients: {last}; server: {wb.stderr[-2000:]}") from None
        sigterm_and_expect_a_drain(wb, ports, gated, clients)
        log = wb.stderr
        for worker in (0, 1):
            assert f"[worker {worker}] workbench.server: Every accepted request finished" in log, log[-3000:]
        assert log.rindex("workbench.deploy.workers: Stopped") > log.rindex("workbench.server: Stopped")
    finally:
        wb.kill()


def test_a_notebook_serves_with_several_workers(tmp_path, model_store):
    shutil.copytree(model_store / "hp2_tf2", tmp_path / "repo" / "hp" / "1")
    handle = workbench.serve(tmp_path / "repo", server_name="workers", num_workers=2)
    try:
        ready = {"rest_port": handle.rest_api_port}
        workers = health(ready)["workers"]
        assert [row["answered"] for row in workers] == [True, True]
        pids = [row["pid"] for row in workers]
    finally:
        handle.stop()
    for pid in pids:  # stopping the handle (the supervisor) stopped every worker
        wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 60, 0.1, f"worker {pid} gone")
