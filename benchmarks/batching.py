"""Dynamic batching, measured: what it buys, against what the model and the frontends allow.

Run: `.venv/bin/python benchmarks/batching.py` (about 4 minutes on 2 cores). Prints a table and the issue's
targets, writes benchmarks/results/batching.json. All figures come from one run, side by side:

1. the limit: the model called in-process (no server) at the batch sizes the batcher formed;
2. the frontends' ceiling: the same gRPC load on a `workbench_null` model (same signatures, no TensorFlow);
3. `workbench serve` with batching off and on, 1, 16, 32 and 64 concurrent gRPC clients, on half_plus_two and
   on a compute-bound CNN on 28x28 inputs (one example a request).

Load comes from h2load (Debian's nghttp2-client) when it is installed, else from workbench's own Python
generator (`workbench bench`), which saturates sooner; the table says which.

Every request must succeed: a run in which any fails stops the benchmark (figures with failures in them compare
nothing). Success is counted by the server, from TF Serving's `request_count` metric by status, because h2load
judges a response by its HTTP status alone, and a gRPC error is an HTTP 200 with an error trailer.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import (
    BATCHING,
    MONITORING,
    ServeProcess,
    counters_since,
    save_results,
    save_small_cnn,
    server_counters,
    write_config,
)

from workbench.client.bench import format_table, grpc_predict_bytes, run_load
from workbench.demo import save_half_plus_two


def h2load(target: str, body: Path, clients: int, duration: float, log: Path) -> dict[str, float]:
    connections = min(clients, 4)
    streams = max(1, clients // connections)
    command = [
        "h2load",
        "-c",
        str(connections),
        "-m",
        str(streams),
        "-D",
        str(max(1, round(duration))),  # whole seconds only
        "--warm-up-time=1",
        "-d",
        str(body),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"--log-file={log}",
        f"http://{target}/tensorflow.serving.PredictionService/Predict",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=duration + 60)
    out = run.stdout
    if "finished in" not in out:
        raise RuntimeError(f"h2load failed: {' '.join(command)}\n{out[-2000:]}{run.stderr[-2000:]}")
    rps = next(float(line.split()[3]) for line in out.splitlines() if line.startswith("finished in"))
    # Streams h2load saw broken or timed out; its "failed" count is about HTTP statuses, which gRPC does not use.
    broken = sum(int(re.search(rf"(\d+) {what}", out).group(1)) for what in ("errored", "timeout"))  # type: ignore[union-attr]
    if broken:
        raise RuntimeError(f"h2load: {broken} requests errored or timed out\n{out[-2000:]}")
    latencies = [int(line.split()[2]) / 1000 for line in log.read_text().splitlines() if line.strip()]
    log.unlink()
    return {
        "requests_per_second": rps,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
    }


def python_load(target: str, model: str, inputs: dict[str, np.ndarray], clients: int, duration: float) -> dict:
    result = run_load(target, "grpc", model, inputs, concurrency=clients, duration=duration)
    if result.errors:
        raise RuntimeError(f"{result.errors} requests to {model} failed")
    return {
        "requests_per_second": result.requests_per_second,
        "p50_ms": result.percentile(50),
        "p99_ms": result.percentile(99),
    }


def in_process_limit(path: Path, inputs_for_batch, batch: int, seconds: float = 2.0) -> float:
    """Examples per second of the bare signature call at ``batch`` rows (the batcher's best case)."""
    from workbench.platforms.tensorflow import load_saved_model

    servable = load_saved_model("m", 1, str(path))
    signature = servable.signatures["serving_default"]
    feed = inputs_for_batch(batch)
    outputs = list(signature.outputs)
    for _ in range(3):
        servable.run(signature, feed, outputs)
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.perf_counter()
        servable.run(signature, feed, outputs)
        times.append(time.perf_counter() - started)
    servable.close()
    return batch / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--python-load", action="store_true", help="use workbench's Python generator, not h2load")
    args = parser.parse_args()
    use_h2load = shutil.which("h2load") is not None and not args.python_load
    generator = "h2load" if use_h2load else "workbench bench (Python)"

    rng = np.random.default_rng(0)
    hp_inputs = {"x": np.array([[2.0]], np.float32)}
    image = {"images": rng.random((1, 784), dtype=np.float32)}

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_half_plus_two(root / "half_plus_two" / "1")
        save_small_cnn(root / "cnn" / "1")
        save_small_cnn(root / "cnn_wide" / "1", channels=(64, 128))
        config = write_config(
            root / "models.config",
            {"half_plus_two": root / "half_plus_two", "cnn": root / "cnn", "cnn_wide": root / "cnn_wide"},
        )
        # The ceiling: the same signatures, answered without running the model.
        with open(config) as f:
            text = f.read().rstrip().rstrip("}")
        null = f'  config {{ name: "null" base_path: "{root / "half_plus_two"}" model_platform: "workbench_null" }}\n'
        config.write_text(text + null + "}\n")
        (root / "batching.txt").write_text(BATCHING)
        (root / "monitoring.txt").write_text(MONITORING)
        bodies = {}
        for model, inputs in (("half_plus_two", hp_inputs), ("null", hp_inputs), ("cnn", image), ("cnn_wide", image)):
            payload = grpc_predict_bytes(model, inputs)
            bodies[model] = root / f"{model}.bin"
            bodies[model].write_bytes(b"\x00" + struct.pack(">I", len(payload)) + payload)

        plan = [
            ("null", hp_inputs, 32),
            ("half_plus_two", hp_inputs, 1),
            ("half_plus_two", hp_inputs, 16),
            ("half_plus_two", hp_inputs, 32),
            ("half_plus_two", hp_inputs, 64),
            ("cnn", image, 1),
            ("cnn", image, 16),
            ("cnn", image, 64),
            ("cnn_wide", image, 1),
            ("cnn_wide", image, 64),
        ]
        for batching in (False, True):
            flags = [f"--monitoring_config_file={root / 'monitoring.txt'}", "--file_system_poll_wait_seconds=0"]
            if batching:
                flags += ["--enable_batching", f"--batching_parameters_file={root / 'batching.txt'}"]
            server = ServeProcess(config, *flags)
            try:
                server.wait_for_answer("half_plus_two", {"instances": [[1.0]]})
                for model, inputs, clients in plan:
                    before = server_counters(server.rest_url, model)
                    if use_h2load:
                        measured = h2load(server.grpc_target, bodies[model], clients, args.duration, root / "h2.log")
                    else:
                        measured = python_load(server.grpc_target, model, inputs, clients, args.duration)
                    examples, batches, failed = counters_since(server.rest_url, model, before)
                    if failed:
                        raise RuntimeError(f"{failed:.0f} requests to {model} failed ({clients} clients)")
                    mean_batch = examples / batches if batches else float("nan")
                    rows.append(
                        {
                            "model": model,
                            "batching": "on" if batching else "off",
                            "clients": clients,
                            "requests_per_second": round(measured["requests_per_second"], 1),
                            "p50_ms": round(measured["p50_ms"], 2),
                            "p99_ms": round(measured["p99_ms"], 2),
                            "mean_batch": round(mean_batch, 2),
                        }
                    )
                    print(format_table([rows[-1]], list(rows[-1])).splitlines()[-1], flush=True)
            finally:
                server.stop()

        # The limit, in-process, at the batch sizes the batcher formed (and at 1, for reference).
        formed = {
            r["model"]: max(1, round(r["mean_batch"]))
            for r in rows
            if r["batching"] == "on" and r["clients"] == 64 and r["mean_batch"] == r["mean_batch"]
        }
        limits = {}
        for model, make in (
            ("cnn", lambda n: {"images": rng.random((n, 784), dtype=np.float32)}),
            ("cnn_wide", lambda n: {"images": rng.random((n, 784), dtype=np.float32)}),
            ("half_plus_two", lambda n: {"x": np.full((n, 1), 2.0, np.float32)}),
        ):
            for batch in sorted({1, formed.get(model, 1)}):
                limits[f"{model}@{batch}"] = round(in_process_limit(root / model / "1", make, batch), 1)

    def row(model: str, batching: str, clients: int) -> dict:
        return next(r for r in rows if r["model"] == model and r["batching"] == batching and r["clients"] == clients)

    ceiling = max(row("null", b, 32)["requests_per_second"] for b in ("off", "on"))
    hp32 = row("half_plus_two", "on", 32)
    cnn_on, cnn_off = row("cnn", "on", 64), row("cnn", "off", 64)
    cnn_limit = limits[f"cnn@{formed.get('cnn', 1)}"]
    wide_on, wide_off = row("cnn_wide", "on", 64), row("cnn_wide", "off", 64)
    wide_limit = limits[f"cnn_wide@{formed.get('cnn_wide', 1)}"]
    hp1_on, hp1_off = row("half_plus_two", "on", 1), row("half_plus_two", "off", 1)
    targets = [
        (
            "half_plus_two, 32 clients, batching on: req/s vs frontend ceiling",
            hp32["requests_per_second"] / ceiling,
            ">= 0.80",
        ),
        ("half_plus_two, 32 clients, batching on: p99 ms", hp32["p99_ms"], "<= 20"),
        (
            "cnn, 64 clients, batching on: examples/s vs in-process limit at the batch formed",
            cnn_on["requests_per_second"] / cnn_limit,
            ">= 0.80",
        ),
        (
            "cnn, 64 clients: batching on / off",
            cnn_on["requests_per_second"] / cnn_off["requests_per_second"],
            ">= 2.0",
        ),
        (
            "cnn_wide, 64 clients, batching on: examples/s vs in-process limit at the batch formed",
            wide_on["requests_per_second"] / wide_limit,
            ">= 0.80",
        ),
        (
            "cnn_wide, 64 clients: batching on / off",
            wide_on["requests_per_second"] / wide_off["requests_per_second"],
            ">= 2.0",
        ),
        ("half_plus_two, 1 client: p50 on / off", hp1_on["p50_ms"] / hp1_off["p50_ms"], "<= 1.1"),
    ]
    print(f"\nload generator: {generator}; frontend ceiling (workbench_null, 32 clients): {ceiling:.0f} req/s")
    print("in-process limits (examples/s): " + ", ".join(f"{k} {v:.0f}" for k, v in limits.items()))
    print()
    print(format_table(rows, list(rows[0])))
    print()
    for name, value, goal in targets:
        print(f"{name}: {value:.2f} (target {goal})")
    path = save_results(
        "batching",
        {
            "generator": generator,
            "cpu_count": os.cpu_count(),
            "ceiling_requests_per_second": ceiling,
            "in_process_examples_per_second": limits,
            "rows": rows,
            "targets": [{"what": n, "value": round(v, 3), "target": g} for n, v, g in targets],
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
