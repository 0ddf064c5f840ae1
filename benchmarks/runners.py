"""Frontends and model runners on this machine's CPUs: the CNN, 1 image a request, 64 clients, batching on.

Run: `.venv/bin/python benchmarks/runners.py` (about 2 minutes on 2 cores). Writes benchmarks/results/runners.json.

Side by side in one run, taking turns (each configuration measured in every round, the median kept):

- the limit: the CNN called in-process (no server) at batch 64, images/s;
- `workbench serve` with 1 worker in one process (``--model_runners=in_process``, the default for 1 worker);
- 1 worker handing requests to 1 model runner (``--model_runners=1``);
- 2 workers and 1 runner (the default for ``--num_workers=2``): batches form across both workers;
- 2 shared-nothing workers (``--model_runners=in_process``), as ``--num_workers`` served before runners;
- the first server again over REST (wrk, 64 connections, TF Serving's columnar JSON: 784 numbers a request), where
  wrk is installed: a Python server's REST path costs less a request than its gRPC path.

Load: gRPC, 64 requests in flight from h2load (Debian's nghttp2-client; 4 connections, so both workers get some),
else from workbench's own generator in a process of its own, which takes more of the same cores. For each server:
images/s over the in-process batch-64 rate, and the mean batch the batcher formed (the whole server's stats, which
count each of the runner's batches once). Every request must succeed (the server's own counts say so).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import (
    BATCHING,
    ServeProcess,
    counters_since,
    save_results,
    save_small_cnn,
    server_counters,
    write_config,
)
from batching import h2load
from peers import wrk_load

from workbench.client.bench import grpc_predict_bytes

CLIENTS = 64
SERVERS: dict[str, tuple[str, ...]] = {
    "1 worker, in process": ("--model_runners=in_process",),
    "1 worker + 1 runner": ("--model_runners=1",),
    "2 workers + 1 runner": ("--num_workers=2",),
    "2 workers, in process": ("--num_workers=2", "--model_runners=in_process"),
}


def in_process_rate(path: Path, batch: int, seconds: float = 3.0) -> float:
    from workbench.platforms.tensorflow import load_saved_model

    servable = load_saved_model("cnn", 1, str(path))
    signature = servable.signatures["serving_default"]
    feed = {"images": np.random.default_rng(0).random((batch, 784), dtype=np.float32)}
    for _ in range(3):
        servable.run(signature, feed, ["probabilities"])
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.perf_counter()
        servable.run(signature, feed, ["probabilities"])
        times.append(time.perf_counter() - started)
    servable.close()
    return batch / statistics.median(times)


def _load(target: str, duration: float, out: Any) -> None:
    from workbench.client.bench import run_load

    image = {"images": np.random.default_rng(1).random((1, 784), dtype=np.float32)}
    result = run_load(target, "grpc", "cnn", image, concurrency=CLIENTS, duration=duration)
    out.put({"rate": result.requests_per_second, "errors": result.errors, "p99_ms": result.percentile(99)})


def with_server_counts(server: ServeProcess, before: tuple[float, float, float], result: dict[str, Any]) -> dict:
    """``result`` with the failures the server counted since ``before`` and its mean formed batch; raises if any
    request failed."""
    examples, batches, failed = counters_since(server.rest_url, "cnn", before)
    result["errors"] += failed
    result["mean_batch"] = round(examples / batches, 2) if batches else None
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} requests failed:\n{server.log()[-2000:]}")
    return result


def measure(server: ServeProcess, duration: float, body: Path | None) -> dict[str, Any]:
    """One load of ``duration`` seconds (h2load with ``body``, else a process of its own); the rate and the mean
    formed batch."""
    before = server_counters(server.rest_url, "cnn")
    if body is not None:
        measured = h2load(server.grpc_target, body, CLIENTS, duration, body.with_suffix(".log"))
        result = {"rate": measured["requests_per_second"], "errors": 0, "p99_ms": measured["p99_ms"]}
    else:
        queue: Any = multiprocessing.get_context("spawn").Queue()
        process = multiprocessing.get_context("spawn").Process(target=_load, args=(server.grpc_target, duration, queue))
        process.start()
        result = queue.get(timeout=duration + 120)
        process.join()
    return with_server_counts(server, before, result)


REST_ROW = "1 worker, in process, REST (wrk)"


def measure_rest(server: ServeProcess, duration: float, body: bytes, work: Path) -> dict[str, Any]:
    """One wrk load of ``duration`` seconds over REST; the rate and the mean formed batch."""
    before = server_counters(server.rest_url, "cnn")
    url = f"{server.rest_url}/v1/models/cnn:predict"
    measured = wrk_load(url, body, CLIENTS, max(1, round(duration)), 1, work)
    result = {"rate": measured["requests_per_second"], "errors": measured["errors"], "p99_ms": measured["p99_ms"]}
    return with_server_counts(server, before, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python-load", action="store_true", help="workbench's Python generator, not h2load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_small_cnn(root / "cnn" / "1")
        config = write_config(root / "models.config", {"cnn": root / "cnn"})
        batching = root / "batching.txt"
        batching.write_text(BATCHING)
        limit = in_process_rate(root / "cnn" / "1", 64)
        servers = {
            name: ServeProcess(config, "--enable_batching", f"--batching_parameters_file={batching}", *flags)
            for name, flags in SERVERS.items()
        }
        try:
            for server in servers.values():
                server.wait_for_answer("cnn", {"instances": [[0.0] * 784]})
            body = None
            if shutil.which("h2load") and not args.python_load:
                body = root / "request.bin"
                image = {"images": np.random.default_rng(1).random((1, 784), dtype=np.float32)}
                payload = grpc_predict_bytes("cnn", image)
                body.write_bytes(b"\x00" + struct.pack(">I", len(payload)) + payload)  # gRPC's message framing
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            rest_body = None
            if shutil.which("wrk"):
                image = np.random.default_rng(1).random((1, 784), dtype=np.float32)
                rest_body = json.dumps({"inputs": {"images": image.tolist()}}).encode()
                runs[REST_ROW] = []
            for _ in range(args.rounds):
                for name, server in servers.items():
                    runs[name].append(measure(server, args.duration, body))
                if rest_body is not None:
                    first = servers["1 worker, in process"]
                    runs[REST_ROW].append(measure_rest(first, args.duration, rest_body, root))
        finally:
            for server in servers.values():
                server.stop()
    rows = []
    for name, measured in runs.items():
        rate = statistics.median(m["rate"] for m in measured)
        rows.append(
            {
                "server": name,
                "images_per_second": round(rate, 1),
                "over_in_process_batch_64": round(rate / limit, 3),
                "p99_ms": round(statistics.median(m["p99_ms"] for m in measured), 2),
                "mean_formed_batch": statistics.median(m["mean_batch"] or 0 for m in measured),
            }
        )
    payload = {
        "what": "CNN, 1 image a request, 64 clients (gRPC, and REST in its own row), batching on (max 64), this "
        "machine's CPUs",
        "cores": multiprocessing.cpu_count(),
        "in_process_batch_64_images_per_second": round(limit, 1),
        "load": "h2load" if body is not None else "workbench bench (Python)",
        "rows": rows,
        "command": ".venv/bin/python benchmarks/runners.py",
    }
    print(json.dumps(payload, indent=2))
    print(f"results: {save_results('runners', payload)}")


if __name__ == "__main__":
    main()
