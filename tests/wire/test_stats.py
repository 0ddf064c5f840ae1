"""workbench's own endpoints: ``/workbench/v1/health``, the rolling ``/workbench/v1/stats`` snapshot per model
version, its server-sent-events stream, and the RollingStats window itself (with an injected clock)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import requests
from waiting import model_config_text

from workbench.observability.stats import TOKEN_BUCKET_SECONDS, RollingStats
from workbench.observability.whole_server import merge_stats

ENTRY_KEYS = {
    "requests_per_second",
    "errors_per_second",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mean_batch_size",
    "batches_per_second",
    "queue_depth",
    "total_requests",
    "total_errors",
}


@pytest.fixture
def two_versions(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("m", base, "model_version_policy { all {} }")))
    return serve(model_config_file=str(config), file_system_poll_wait_seconds=0)


def stats(server) -> dict:
    r = requests.get(server.rest_url + "/workbench/v1/stats", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    return r.json()


def assert_snapshot_shape(snapshot: dict) -> None:
    assert set(snapshot) == {"time", "window_seconds", "models"}
    assert isinstance(snapshot["time"], float) and snapshot["window_seconds"] > 0
    for versions in snapshot["models"].values():
        for entry in versions.values():
            assert set(entry) == ENTRY_KEYS


def test_stats_per_version_after_requests_and_errors(two_versions):
    server = two_versions
    n = 12
    for version, offset in ((1, 2.0), (2, 3.0)):
        for i in range(n):
            r = requests.post(
                f"{server.rest_url}/v1/models/m/versions/{version}:predict",
                json={"instances": [[float(i)]]},
                timeout=30,
            )
            assert r.json() == {"predictions": [[0.5 * i + offset]]}

    snapshot = stats(server)
    assert_snapshot_shape(snapshot)
    assert set(snapshot["models"]) == {"m"}
    assert set(snapshot["models"]["m"]) == {"1", "2"}
    for entry in snapshot["models"]["m"].values():
        assert entry["total_requests"] == n
        assert entry["total_errors"] == 0
        assert entry["requests_per_second"] > 0
        assert entry["errors_per_second"] == 0
        assert 0 < entry["p50_ms"] <= entry["p95_ms"] <= entry["p99_ms"]
        assert entry["mean_batch_size"] == 1.0  # batching is off: one TensorFlow call per one-row request
        assert entry["batches_per_second"] > 0
        assert entry["queue_depth"] == 0

    # A bad input on a known version is an error of that version, and only of that one.
    r = requests.post(f"{server.rest_url}/v1/models/m/versions/1:predict", json={"instances": [["x"]]}, timeout=30)
    assert r.status_code == 400
    versions = stats(server)["models"]["m"]
    assert versions["1"]["total_requests"] == n + 1
    assert versions["1"]["total_errors"] == 1
    assert versions["1"]["errors_per_second"] > 0
    assert versions["2"]["total_requests"] == n
    assert versions["2"]["total_errors"] == 0


def read_events(url: str, count: int, deadline_s: float = 20.0) -> list[dict]:
    """The first ``count`` ``data:`` events of an SSE stream, parsed; fails past the deadline."""
    events: list[dict] = []
    deadline = time.monotonic() + deadline_s
    with requests.get(url, stream=True, timeout=(5, deadline_s)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            assert time.monotonic() < deadline, f"only {len(events)} events within {deadline_s}s"
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: ") :]))
                if len(events) == count:
                    break
            else:
                assert line == b"", f"unexpected SSE line {line!r}"
    assert len(events) == count, "the stream ended early"
    return events


def test_stats_stream_pushes_snapshots(two_versions):
    server = two_versions
    r = requests.post(f"{server.rest_url}/v1/models/m/versions/2:predict", json={"instances": [[1.0]]}, timeout=30)
    assert r.status_code == 200
    events = read_events(f"{server.rest_url}/workbench/v1/stats/stream?interval=0.1", 3)
    for event in events:
        assert_snapshot_shape(event)
        assert event["models"]["m"]["2"]["total_requests"] == 1
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    assert len({e["time"] for e in events}) == 3


@pytest.mark.parametrize(
    ("interval", "message"),
    [
        ("abc", "interval must be a number of seconds"),
        ("0.01", "interval must be between 0.05 and 60 seconds"),
        ("61", "interval must be between 0.05 and 60 seconds"),
        ("-1", "interval must be between 0.05 and 60 seconds"),
        ("nan", "interval must be between 0.05 and 60 seconds"),
    ],
)
def test_stats_stream_refuses_a_bad_interval(two_versions, interval, message):
    r = requests.get(f"{two_versions.rest_url}/workbench/v1/stats/stream?interval={interval}", timeout=30)
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": message}


def test_health_lists_models_and_ports(two_versions):
    server = two_versions
    r = requests.get(server.rest_url + "/workbench/v1/health", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "status": "ok",
        "readiness": {"status": "ready"},
        "pid": os.getpid(),
        "grpc_port": server.server.grpc_port,
        "rest_port": server.server.rest_port,
        "openai_port": None,  # OpenAI's endpoints on the REST port
        "rest_scheme": "http",
        "grpc_tls": False,
        "models": ["m"],
        "batching": {"m": False},
        "request_log": {},
    }
    assert server.server.grpc_port > 0 and server.server.rest_port > 0


def test_stopping_the_server_ends_an_open_stream_and_leaves_no_thread(serve, make_repo):
    before = set(threading.enumerate())
    server = serve(model_name="m", model_base_path=str(make_repo("m", {1: "hp2_tf2"})), file_system_poll_wait_seconds=0)
    first = threading.Event()
    outcome: list[object] = []

    def reader() -> None:
        try:
            with requests.get(
                f"{server.rest_url}/workbench/v1/stats/stream?interval=0.1", stream=True, timeout=30
            ) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data: "):
                        first.set()
            outcome.append("ended")
        except requests.RequestException as exc:  # a reset instead of a clean end still ends the iteration
            outcome.append(exc)

    thread = threading.Thread(target=reader, name="test-sse-reader", daemon=True)
    thread.start()
    assert first.wait(20), "no event arrived"
    server.stop()
    thread.join(30)
    assert not thread.is_alive(), "the stream kept going after the server stopped"
    assert outcome == ["ended"]

    def leftovers() -> list[str]:
        return sorted(t.name for t in threading.enumerate() if t not in before and t.is_alive())

    deadline = time.monotonic() + 5  # threads may take a moment to notice; poll, then name the stragglers
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert leftovers() == [], "threads the server started are still running after stop()"


# ---------------------------------------------------------------------------------------- RollingStats
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rolling_stats_window_with_an_injected_clock():
    clock = FakeClock()
    rolling = RollingStats(window_seconds=10.0, clock=clock)
    for ms in (10, 20, 30):
        rolling.record_request("m", 1, ms / 1000, ok=True)
    rolling.record_batch("m", 1, rows=4, tasks=2)
    clock.now += 5
    rolling.record_request("m", 1, 0.040, ok=True)
    rolling.record_request("m", 1, 0.500, ok=False)  # an error's latency is not in the percentiles
    rolling.record_batch("m", 1, rows=2, tasks=1)
    rolling.record_request("m", None, 0.001, ok=False)  # failed before a version was known

    clock.now += 1  # 6 s after the start: everything is in the window
    entry = rolling.snapshot()["models"]["m"]["1"]
    assert entry["requests_per_second"] == round(5 / 6, 3)
    assert entry["errors_per_second"] == round(1 / 6, 3)
    assert entry["p50_ms"] == 25.0
    assert entry["p50_ms"] <= entry["p95_ms"] <= entry["p99_ms"] <= 40.0
    assert entry["mean_batch_size"] == 3.0
    assert entry["batches_per_second"] == round(2 / 6, 3)
    assert (entry["total_requests"], entry["total_errors"]) == (5, 1)
    assert rolling.snapshot()["models"]["m"][""]["total_errors"] == 1

    clock.now += 6  # 12 s: the first three requests and the first batch fell out of the 10 s window
    snapshot = rolling.snapshot({("m", 1): 7, ("queued", 3): 2})
    entry = snapshot["models"]["m"]["1"]
    assert snapshot["window_seconds"] == 10.0
    assert entry["requests_per_second"] == 0.2  # 2 requests over a full 10 s window
    assert entry["errors_per_second"] == 0.1
    assert entry["p50_ms"] == entry["p95_ms"] == entry["p99_ms"] == 40.0
    assert entry["mean_batch_size"] == 2.0
    assert entry["queue_depth"] == 7
    assert (entry["total_requests"], entry["total_errors"]) == (5, 1)  # totals never fall out
    assert snapshot["models"]["m"][""]["queue_depth"] == 0  # no version, no queue
    # A version whose requests are all still queued is listed with its queue.
    assert snapshot["models"]["queued"]["3"]["queue_depth"] == 2
    assert snapshot["models"]["queued"]["3"]["total_requests"] == 0

    clock.now += 100  # all of it is history now
    entry = rolling.snapshot()["models"]["m"]["1"]
    assert entry["requests_per_second"] == 0
    assert entry["errors_per_second"] == 0
    assert entry["p50_ms"] is None and entry["p95_ms"] is None and entry["p99_ms"] is None
    assert entry["mean_batch_size"] is None
    assert entry["batches_per_second"] == 0
    assert (entry["total_requests"], entry["total_errors"]) == (5, 1)


def test_requests_recorded_from_threads_while_snapshots_trim_the_window_are_all_counted():
    # Recording takes no lock: every request still counts once, whether a snapshot trimmed it out or not.
    rolling = RollingStats(window_seconds=0.001)  # the real clock: snapshots keep trimming while threads record
    per_thread, threads = 5000, 4
    start = threading.Barrier(threads + 1)

    def record() -> None:
        start.wait(30)
        for i in range(per_thread):
            rolling.record_request("m", 1, 0.001, ok=i % 5 != 0)

    workers = [threading.Thread(target=record) for _ in range(threads)]
    for worker in workers:
        worker.start()
    start.wait(30)
    while any(worker.is_alive() for worker in workers):
        rolling.snapshot()
    for worker in workers:
        worker.join(30)
    entry = rolling.snapshot()["models"]["m"]["1"]
    assert (entry["total_requests"], entry["total_errors"]) == (threads * per_thread, threads * per_thread // 5)


def test_merged_workers_stats_add_up_cache_hits_and_misses_and_recompute_the_hit_rate():
    # --num_workers: each worker has its own response cache; the server's rate is all hits over all lookups.
    clock = FakeClock()
    workers = [RollingStats(window_seconds=10.0, clock=clock) for _ in range(3)]
    for rolling in workers:
        rolling.record_request("cached", 1, 0.010, ok=True)
        rolling.record_request("plain", 1, 0.010, ok=True)
    for hit in (True, True, True, False):
        workers[1].record_cache("cached", 1, hit)
    for hit in (False, False):
        workers[2].record_cache("cached", 1, hit)
    # The first worker has had no lookup yet: its entry has no cache fields, the merged one still does.
    snapshots = [rolling.snapshot() for rolling in workers]
    assert "cache_hits" not in snapshots[0]["models"]["cached"]["1"]
    assert snapshots[1]["models"]["cached"]["1"]["cache_hit_rate"] == 0.75

    merged = merge_stats(snapshots)["models"]
    entry = merged["cached"]["1"]
    assert (entry["cache_hits"], entry["cache_misses"]) == (3, 3)
    assert entry["cache_hit_rate"] == 0.5  # 3 of 6 lookups; not the first worker's rate, nor the rates' mean
    assert entry["total_requests"] == 3
    # A model without the cache on any worker has none of the cache fields.
    assert not {"cache_hits", "cache_misses", "cache_hit_rate"} & set(merged["plain"]["1"])
    assert set(merged["plain"]["1"]) == ENTRY_KEYS


def test_a_generators_time_to_first_token_and_tokens_per_second_over_the_window():
    clock = FakeClock()
    rolling = RollingStats(window_seconds=10.0, clock=clock)
    rolling.record_request("plain", 1, 0.010, ok=True)
    for first_token_ms, tokens in ((20, (1, 1, 1)), (40, (2, 2))):
        rolling.record_first_token("gen", 1, first_token_ms / 1000)
        for count in tokens:
            rolling.record_tokens("gen", 1, count)
        rolling.record_request("gen", 1, 0.5, ok=True)
    clock.now += 4  # 4 s after the start: 7 tokens in the window
    entry = rolling.snapshot()["models"]["gen"]["1"]
    assert set(entry) == ENTRY_KEYS | {"time_to_first_token_p50_ms", "time_to_first_token_p95_ms", "tokens_per_second"}
    assert entry["time_to_first_token_p50_ms"] == 30.0
    assert 30.0 < entry["time_to_first_token_p95_ms"] <= 40.0
    assert entry["tokens_per_second"] == 1.75
    assert set(rolling.snapshot()["models"]["plain"]["1"]) == ENTRY_KEYS  # never generated: no generation fields

    clock.now += 100  # out of the window: the fields stay, with nothing in them
    entry = rolling.snapshot()["models"]["gen"]["1"]
    assert entry["time_to_first_token_p50_ms"] is None and entry["time_to_first_token_p95_ms"] is None
    assert entry["tokens_per_second"] == 0


def test_tokens_at_thousands_of_responses_a_second_keep_one_entry_a_bucket():
    clock = FakeClock()
    rolling = RollingStats(window_seconds=10.0, clock=clock)
    for _ in range(20_000):  # 20,000 responses of 2 tokens over 4 s: 10,000 tokens/s
        rolling.record_tokens("gen", 1, 2)
        clock.now += 0.0002
    assert len(rolling._series[("gen", 1)].tokens) <= 4 / TOKEN_BUCKET_SECONDS + 1
    entry = rolling.snapshot()["models"]["gen"]["1"]
    assert entry["tokens_per_second"] == 10_000.0  # 40,000 tokens over the 4 s since the start
    clock.now += 8  # the buckets of the first 2 s leave the window: 20,000 tokens over its 10 s, give or take a bucket
    assert abs(rolling.snapshot()["models"]["gen"]["1"]["tokens_per_second"] - 2_000.0) <= 100


def test_merged_workers_stats_add_up_tokens_and_weigh_the_time_to_first_token_by_requests():
    clock = FakeClock()
    workers = [RollingStats(window_seconds=10.0, clock=clock) for _ in range(3)]
    for rolling, (requests_made, first_token_ms) in zip(workers[:2], ((1, 10), (3, 50)), strict=True):
        for _ in range(requests_made):
            rolling.record_first_token("gen", 1, first_token_ms / 1000)
            rolling.record_tokens("gen", 1, 5)
            rolling.record_request("gen", 1, 0.1, ok=True)
    workers[2].record_request("gen", 1, 0.1, ok=True)  # a request that ended before its first token
    clock.now += 10
    merged = merge_stats([rolling.snapshot() for rolling in workers])["models"]["gen"]["1"]
    assert merged["tokens_per_second"] == 2.0  # 20 tokens over 10 s, all workers together
    assert merged["time_to_first_token_p50_ms"] == 40.0  # 10 ms once, 50 ms three times (weighted by requests)
    assert merged["total_requests"] == 5
    plain = [RollingStats(window_seconds=10.0, clock=clock) for _ in range(2)]
    for rolling in plain:
        rolling.record_request("plain", 1, 0.1, ok=True)
    assert set(merge_stats([rolling.snapshot() for rolling in plain])["models"]["plain"]["1"]) == ENTRY_KEYS
