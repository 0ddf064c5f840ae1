"""The perf_analyzer-class load generator (workbench.client.perf, ``workbench bench`` with ranges, rates and windows)
proved honest against a server whose answer time is known: ``workbench serve`` (a process of its own) serving a
Python model that sleeps 20 ms a call, with batching off and four inference threads, so that the arithmetic says
what every figure must be.

- closed loop, c clients: each request at least 20 ms, at most c / (its mean latency) requests a second (Little's
  law), the server's compute 20 ms or more of each, and nothing queued behind another call;
- open loop at r < 200 requests/s: r requests a second (constant or Poisson): a late send is made up at once, so the
  schedule's count is sent whatever the machine's load;
- open loop past the four threads' 200 requests/s: at most 200 served, and the rest queue (latency grows with the
  queue), as overload looks to real clients, rather than the client slowing down.

Only bounds that hold on a busy machine are asserted (a call is never shorter than its sleep, four threads never
serve more than four calls at once); how close a quiet machine comes to them is for benchmarks/.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests
from waiting import free_port, wait_until

from workbench.client import load_inputs, perf

SLEEP_S = 0.02
THREADS = 4
ROOT = Path(__file__).resolve().parents[2]

SLEEPY = textwrap.dedent(
    """
    import time

    import workbench


    class Sleepy(workbench.PythonModel):
        inputs = {"x": ("float32", [-1, 1])}
        outputs = {"y": ("float32", [-1, 1])}

        def predict(self, inputs):
            time.sleep(0.02)
            return {"y": inputs["x"] * 2.0}
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("sleepy")
    (root / "sleepy" / "1").mkdir(parents=True)
    (root / "sleepy" / "1" / "model.py").write_text(SLEEPY)
    rest, grpc_port = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "serve", f"--model_repository={root}", f"--port={grpc_port}",
         f"--rest_api_port={rest}", "--allow_python_models", f"--num_inference_threads={THREADS}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def ready() -> bool:
        assert proc.poll() is None, "workbench serve exited"
        try:
            return requests.get(f"http://127.0.0.1:{rest}/v1/models/sleepy", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(ready, timeout=120, interval=0.1, what="workbench serve answers")
        yield SimpleNamespace(rest=f"http://127.0.0.1:{rest}", grpc=f"127.0.0.1:{grpc_port}")
    finally:
        proc.terminate()
        proc.wait(60)


QUICK = perf.Stability(interval_s=1.0, percentage=15.0, max_trials=8, warmup_s=0.5)
ONE_ROW = [{"x": np.array([[1.0]], dtype=np.float32)}]


def test_closed_loop_figures_are_what_the_arithmetic_says(server: SimpleNamespace) -> None:
    (two, three) = perf.run_measurement(
        server.rest, "rest", "sleepy", ONE_ROW, [perf.Point(concurrency=2), perf.Point(concurrency=3)], QUICK
    )
    for result, clients in ((two, 2), (three, 3)):
        assert result.errors == 0 and result.requests > 0, result
        assert result.mean_latency_us >= SLEEP_S * 1e6
        # c clients, each with one request in flight: no more than c / latency a second.
        assert 0 < result.inferences_per_second <= 1.05 * clients / (result.mean_latency_us / 1e6)
        (row,) = perf.perf_rows([result])
        assert row["Concurrency"] == clients
        # The server's statistics split each request: 20 ms of compute or more, and no request queued behind
        # another's call (four threads, at most three requests in flight).
        assert row["Server Compute Infer"] >= 0.95 * SLEEP_S * 1e6
        assert row["Server Queue"] < SLEEP_S * 1e6
        assert row["Network+Server Send/Recv"] >= 0
        assert row["Avg Batch"] == 1.0


@pytest.mark.parametrize("distribution", ["constant", "poisson"])
def test_an_open_loop_below_capacity_sends_at_its_rate(server: SimpleNamespace, distribution: str) -> None:
    point = perf.Point(request_rate=60.0, distribution=distribution)
    stability = perf.Stability(interval_s=2.0, percentage=25.0, max_trials=6, warmup_s=0.5)
    (result,) = perf.run_measurement(server.rest, "rest", "sleepy", ONE_ROW, [point], stability)
    # A send over 1 ms late counts as delayed (a preempted loop makes some, the more the busier the machine), and is
    # sent at once: the schedule is kept on the whole. A generator that waited its gap after each send instead would
    # fall behind for good, and miss the count below.
    assert result.errors == 0 and result.delayed < result.requests, result
    # Poisson arrivals: the count in 6 s of a 60/s process is 360 ± 19 (one standard deviation).
    assert result.requests_per_second == pytest.approx(60.0, rel=0.1 if distribution == "constant" else 0.2)
    assert result.latency_us(50) >= SLEEP_S * 1e6


def test_an_open_loop_past_capacity_shows_queueing_not_a_slower_client(server: SimpleNamespace) -> None:
    capacity = THREADS / SLEEP_S  # 200 requests/s
    stability = perf.Stability(interval_s=1.0, percentage=5.0, max_trials=3, warmup_s=0.5)
    (result,) = perf.run_measurement(
        server.rest, "rest", "sleepy", ONE_ROW, [perf.Point(request_rate=2 * capacity)], stability
    )
    assert result.errors == 0, result
    assert result.requests_per_second <= 1.05 * capacity  # the server's rate, not the asked one
    # Requests wait their turn: the later ones far longer than a call, and the server says they queued.
    assert result.latency_us(99) > 10 * SLEEP_S * 1e6
    (row,) = perf.perf_rows([result])
    assert row["Server Queue"] > 2 * row["Server Compute Infer"]
    assert row["Request Rate"] == 2 * capacity


@pytest.mark.parametrize("protocol", ["grpc", "v2-grpc", "v2-rest"])
def test_every_protocol_is_measured_with_the_servers_split(server: SimpleNamespace, protocol: str) -> None:
    target = server.grpc if "grpc" in protocol else server.rest
    (result,) = perf.run_measurement(target, protocol, "sleepy", ONE_ROW, [perf.Point(concurrency=2)], QUICK)
    assert result.errors == 0 and result.requests > 0 and result.mean_latency_us >= SLEEP_S * 1e6, result
    (row,) = perf.perf_rows([result])
    assert row["Server Compute Infer"] >= 0.95 * SLEEP_S * 1e6


@pytest.mark.parametrize("protocol", ["v2-rest", "v2-grpc"])
def test_inputs_in_system_shared_memory(server: SimpleNamespace, protocol: str) -> None:
    """perf_analyzer's --shared-memory system: the inputs written once into a region the load registers, each
    request naming its place; the region is unregistered when the load ends."""
    target = server.grpc if "grpc" in protocol else server.rest
    rows = [{"x": np.array([[float(i)]], dtype=np.float32)} for i in range(3)]
    (result,) = perf.run_measurement(
        target, protocol, "sleepy", rows, [perf.Point(concurrency=2)], QUICK, shared_memory="system"
    )
    assert result.errors == 0 and result.requests > 0 and result.mean_latency_us >= SLEEP_S * 1e6, result
    regions = requests.get(f"{server.rest}/v2/systemsharedmemory/status", timeout=30).json()
    assert regions == []
    with pytest.raises(ValueError, match="v2 protocol"):
        perf.run_measurement(target, "rest", "sleepy", rows, [perf.Point(concurrency=1)], QUICK, shared_memory="system")


def test_the_command_line_writes_perf_analyzers_csv(server: SimpleNamespace, tmp_path: Path) -> None:
    data = tmp_path / "rows.npz"
    np.savez(data, x=np.arange(8, dtype=np.float32).reshape(8, 1))
    out = tmp_path / "points.csv"
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "bench", f"--target={server.rest}", "--model=sleepy",
         f"--input_data={data}", "--batch_size=2", "--concurrency=1:3:2", "--measurement_interval=700",
         "--stability_percentage=20", f"--csv={out}", "--json"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[: 1 + len(perf.PERF_COLUMNS)] == ["Concurrency", *perf.PERF_COLUMNS]
    assert [int(row["Concurrency"]) for row in rows] == [1, 3]
    for row, clients in zip(rows, (1, 3), strict=True):
        # two rows a request: inferences/s are twice the requests/s, at most c clients / latency of those
        latency_s = int(row["Avg latency"]) / 1e6
        assert latency_s >= SLEEP_S
        assert 0 < float(row["Inferences/Second"]) <= 1.05 * 2 * clients / latency_s
    assert json.loads(done.stdout)[1]["Concurrency"] == 3


def test_the_command_line_refuses_a_fixed_length_with_windows(server: SimpleNamespace) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "bench", f"--target={server.rest}", "--model=sleepy",
         '--inputs={"x": [[1.0]]}', "--concurrency=1:4", "--duration=2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--duration" in done.stderr, done.stderr


# --------------------------------------------------------------------------------------------- pure parts
def test_ranges_are_perf_analyzers() -> None:
    assert perf.parse_range("4") == [4]
    assert perf.parse_range("1:64:16") == [1, 17, 33, 49]
    assert perf.parse_range("2:4") == [2, 3, 4]
    assert perf.parse_range("50:100:25", float) == [50.0, 75.0, 100.0]
    for bad in ("0", "4:2", "a:b", "1:2:3:4", "1::2"):
        with pytest.raises(ValueError):
            perf.parse_range(bad)


def test_stability_needs_three_windows_that_agree() -> None:
    def window(requests: int, latency: float) -> perf._Window:
        return perf._Window(0.0, 1.0, [latency] * requests, 0, None)

    assert perf._stable([window(100, 20.0), window(104, 20.5), window(98, 19.8)], 10.0)
    assert not perf._stable([window(100, 20.0), window(130, 20.0), window(98, 20.0)], 10.0)
    assert not perf._stable([window(100, 20.0), window(100, 30.0), window(100, 20.0)], 10.0)
    assert not perf._stable([window(100, 20.0), window(100, 20.0)], 10.0)
    assert not perf._stable([window(0, 0.0)] * 3, 10.0)


def test_request_files_and_random_shapes(tmp_path: Path) -> None:
    dtypes = {"x": np.dtype(np.float32), "n": np.dtype(np.int64)}
    doc = {"data": [{"x": [[1.0, 2.0]], "n": [3]}, {"x": {"content": [4.0, 5.0], "shape": [1, 2]}, "n": [6]}]}
    (tmp_path / "in.json").write_text(json.dumps(doc))
    first, second = load_inputs.from_file(str(tmp_path / "in.json"), dtypes)
    assert first["x"].dtype == np.float32 and first["n"].tolist() == [3]
    assert second["x"].tolist() == [[4.0, 5.0]]
    np.savez(tmp_path / "in.npz", x=np.zeros((5, 2)), n=np.arange(5))
    parts = load_inputs.from_file(str(tmp_path / "in.npz"), dtypes, rows_per_request=2)
    assert [part["n"].tolist() for part in parts] == [[0, 1], [2, 3], [4]]
    assert load_inputs.rows_of(parts[0]) == 2
    shaped = load_inputs.random_inputs(load_inputs.parse_shapes(["x:3,2", "n:3"]), dtypes)
    assert shaped["x"].shape == (3, 2) and shaped["x"].dtype == np.float32 and shaped["n"].dtype == np.int64
    with pytest.raises(ValueError, match="n has none"):
        load_inputs.random_inputs(load_inputs.parse_shapes(["x:3,2"]), dtypes)
    with pytest.raises(ValueError, match="no input n, x"):
        load_inputs.from_file(str(tmp_path / "in.json"), {"y": np.dtype(np.float32)})
