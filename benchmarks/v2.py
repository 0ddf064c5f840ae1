"""The Open Inference Protocol (v2) against TF Serving's API, on one server, in one run.

Run: `.venv/bin/python benchmarks/v2.py` (about 3 minutes on 2 cores). Prints a table and writes
benchmarks/results/v2.json. One `workbench serve` child process serves a 784-float MLP (784 → 256 → 256 → 10);
16 closed-loop clients send 1 image, then 32 images, a request over

- v2 gRPC (``ModelInfer`` with ``raw_input_contents``, tritonclient's form),
- v2 REST with Triton's binary tensor extension (what tritonclient.http sends by default),
- v2 REST with JSON ``data``,
- TF Serving's gRPC ``Predict`` and REST ``:predict`` (the reference),

all from `workbench bench`'s generator: each request is encoded once up front and answers are not decoded, so on
a 2-core machine the figures are the server's, not the client's. The protocols take turns for ``--rounds`` rounds
(the order rotates), and each row reports the median round.

Then the same v2 load from tritonclient's own asyncio clients (``tritonclient.grpc.aio``, ``tritonclient.http.aio``)
as a user's code would send it: every request built from numpy anew and every answer decoded, in this one Python
process. These rows say what Triton's clients get from workbench, client costs included, and that they run unchanged.

Last, Triton's system shared memory against its binary REST, 32 images a request, taking turns: each
``tritonclient.http.aio`` client writes its images into a region of its own (``tritonclient.utils.shared_memory``)
and sends only the region's name, or sends the images as binary data; answers come back as binary data either way.
``vs_binary_rest`` is the shared-memory row's requests/s over the binary row's, measured in the same rounds.

And Triton's response cache: the same MLP served twice, ``mnist`` without the cache and ``mnist-cached`` with it
(``--response_cache_models``); the same 32-image request sent over v2 gRPC again and again, by 1 client (latency)
and 16 (throughput), taking turns. Every request to ``mnist`` runs the model (what a miss costs); every one to
``mnist-cached`` but the first is a hit. ``vs_miss`` is the hit row's requests/s over the miss row's; the hit rate
is read from the server's stats.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parent))

from _common import ServeProcess, save_mnist_mlp, save_results, taking_turns, write_config

from workbench.client.bench import BenchResult, format_table, run_load

CLIENTS = 16
# (row name, protocol, binary_data): how each row sends its requests.
WAYS = [
    ("v2 gRPC", "v2-grpc", None),
    ("v2 REST binary", "v2-rest", True),
    ("v2 REST JSON", "v2-rest", False),
    ("TF Serving gRPC", "grpc", None),
    ("TF Serving REST", "rest", None),
]


def measure(server: ServeProcess, images: np.ndarray, duration: float, rounds: int) -> list[dict[str, Any]]:
    """One row per way of sending: the median round's requests/s, p50 and p99."""
    results: dict[str, list[BenchResult]] = {name: [] for name, _, _ in WAYS}
    for round_ in range(rounds):
        for name, protocol, binary_data in WAYS[round_ % len(WAYS) :] + WAYS[: round_ % len(WAYS)]:
            target = server.grpc_target if protocol.endswith("grpc") else server.rest_url
            results[name].append(
                run_load(
                    target,
                    protocol,
                    "mnist",
                    {"images": images},
                    concurrency=CLIENTS,
                    duration=duration,
                    binary_data=binary_data,
                )
            )
    rows = []
    for name, protocol, _ in WAYS:
        runs = sorted(results[name], key=lambda r: r.requests_per_second)
        median = runs[len(runs) // 2]
        rows.append(
            {
                "way": name,
                "protocol": protocol,
                "images": len(images),
                "requests_per_second": round(median.requests_per_second, 1),
                "images_per_second": round(median.requests_per_second * len(images), 1),
                "p50_ms": round(median.percentile(50), 3),
                "p99_ms": round(median.percentile(99), 3),
                "errors": sum(r.errors for r in runs),
                "rounds_requests_per_second": [round(r.requests_per_second, 1) for r in results[name]],
            }
        )
    reference = next(r["requests_per_second"] for r in rows if r["way"] == "TF Serving gRPC")
    for row in rows:
        row["vs_tf_serving_grpc"] = round(row["requests_per_second"] / reference, 2)
    return rows


async def tritonclient_load(
    server: ServeProcess, images: np.ndarray, duration: float, kind: str, shared_memory: bool = False
) -> dict[str, Any]:
    """16 tritonclient asyncio clients, each building, sending and decoding one request after another;
    ``shared_memory``: each writes its images into a system shared-memory region of its own and sends the region."""
    if kind == "grpc":
        import tritonclient.grpc.aio as triton
    else:
        import tritonclient.http.aio as triton  # type: ignore[no-redef]
    import tritonclient.utils.shared_memory as shm

    target = server.grpc_target if kind == "grpc" else server.rest_url.removeprefix("http://")
    client = triton.InferenceServerClient(target, **({} if kind == "grpc" else {"conn_limit": CLIENTS}))
    latencies: list[float] = []
    errors = 0
    regions: list[Any] = []
    if shared_memory:
        await client.unregister_system_shared_memory()
        for index in range(CLIENTS):
            name, key = f"images_{index}", f"/workbench_bench_{os.getpid()}_{index}"
            regions.append(shm.create_shared_memory_region(name, key, images.nbytes))
            await client.register_system_shared_memory(name, key, images.nbytes)

    async def one_client(deadline: float, index: int) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            request = triton.InferInput("images", list(images.shape), "FP32")
            if shared_memory:  # the client's own region: concurrent clients never write each other's
                shm.set_shared_memory_region(regions[index], [images])
                request.set_shared_memory(f"images_{index}", images.nbytes)
            else:
                request.set_data_from_numpy(images)
            try:
                result = await client.infer("mnist", [request])
                result.as_numpy("probabilities")
            except Exception:  # noqa: BLE001 - counted, as workbench bench counts a failed request
                errors += 1
            latencies.append((time.perf_counter() - started) * 1000)

    try:
        await asyncio.gather(*(one_client(time.perf_counter() + 1.0, index) for index in range(4)))  # warm up
        latencies.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one_client(started + duration, index) for index in range(CLIENTS)))
        seconds = time.perf_counter() - started
    finally:
        if shared_memory:
            await client.unregister_system_shared_memory()
            for region in regions:
                shm.destroy_shared_memory_region(region)
        await client.close()
    return {
        "way": f"tritonclient.{kind}.aio" + (" shared memory" if shared_memory else ""),
        "protocol": f"v2-{'grpc' if kind == 'grpc' else 'rest'}",
        "images": len(images),
        "requests_per_second": round(len(latencies) / seconds, 1),
        "images_per_second": round(len(latencies) / seconds * len(images), 1),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(float(np.percentile(latencies, 99)), 3),
        "errors": errors,
    }


def shared_memory_rows(server: ServeProcess, images: np.ndarray, duration: float, rounds: int) -> list[dict[str, Any]]:
    """Binary REST and system shared memory from tritonclient.http.aio, taking turns; the ratio of their rates."""
    binary, shared = taking_turns(
        rounds,
        [
            lambda: asyncio.run(tritonclient_load(server, images, duration, "http")),
            lambda: asyncio.run(tritonclient_load(server, images, duration, "http", shared_memory=True)),
        ],
    )
    shared["vs_binary_rest"] = round(shared["requests_per_second"] / binary["requests_per_second"], 2)
    return [binary, shared]


def cache_rows(server: ServeProcess, images: np.ndarray, duration: float, rounds: int) -> list[dict[str, Any]]:
    """The same request to the uncached and the cached copy of the model, by 1 and by 16 clients, taking turns."""
    rows = []
    for clients in (1, CLIENTS):

        def measure(model: str, clients: int = clients) -> dict[str, Any]:
            result = run_load(
                server.grpc_target, "v2-grpc", model, {"images": images}, concurrency=clients, duration=duration
            )
            return {
                "way": "hit" if model == "mnist-cached" else "miss",
                "clients": clients,
                "requests_per_second": round(result.requests_per_second, 1),
                "p50_ms": round(result.percentile(50), 3),
                "p99_ms": round(result.percentile(99), 3),
                "errors": result.errors,
            }

        miss, hit = taking_turns(rounds, [lambda: measure("mnist"), lambda: measure("mnist-cached")])
        hit["vs_miss"] = round(hit["requests_per_second"] / miss["requests_per_second"], 2)
        hit["p50_vs_miss"] = round(hit["p50_ms"] / miss["p50_ms"], 2)
        rows += [miss, hit]
    stats = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json()["models"]["mnist-cached"]["1"]
    for row in rows:
        if row["way"] == "hit":
            row["hit_rate"] = stats["cache_hit_rate"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of taking turns; rows are the median round")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    batches = [rng.random((n, 784), dtype=np.float32) for n in (1, 32)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_mnist_mlp(root / "mnist" / "1")
        shutil.copytree(root / "mnist", root / "mnist-cached")
        server = ServeProcess(
            write_config(root / "models.config", {"mnist": root / "mnist", "mnist-cached": root / "mnist-cached"}),
            "--response_cache_bytes=268435456",
            "--response_cache_models=mnist-cached",
        )
        try:
            server.wait_for_answer("mnist", {"instances": [[0.0] * 784]})
            rows = [row for images in batches for row in measure(server, images, args.duration, args.rounds)]
            triton_rows = [
                asyncio.run(tritonclient_load(server, images, args.duration, kind))
                for images in batches
                for kind in ("grpc", "http")
            ]
            shm_rows = shared_memory_rows(server, batches[1], args.duration, args.rounds)
            cached_rows = cache_rows(server, batches[1], args.duration, args.rounds)
        finally:
            server.stop()

    columns = ["way", "images", "requests_per_second", "images_per_second", "p50_ms", "p99_ms", "errors"]
    print(f"784-float MLP, {CLIENTS} clients, median of {args.rounds} rounds of {args.duration:g} s (workbench bench):")
    print(format_table(rows, [*columns, "vs_tf_serving_grpc"]))
    print(f"\nThe same v2 load from tritonclient's asyncio clients ({args.duration:g} s, encoding every request):")
    print(format_table(triton_rows, columns))
    print(f"\nSystem shared memory against binary REST (tritonclient.http.aio, median of {args.rounds} rounds):")
    print(format_table(shm_rows, [*columns, "vs_binary_rest"]))
    print(f"\nThe response cache, 32 images over v2 gRPC, a hit against a miss (median of {args.rounds} rounds):")
    cache_columns = ["way", "clients", "requests_per_second", "p50_ms", "p99_ms", "errors", "vs_miss", "p50_vs_miss"]
    print(format_table(cached_rows, [*cache_columns, "hit_rate"]))
    path = save_results(
        "v2",
        {
            "model": "784-float MLP (784-256-256-10)",
            "clients": CLIENTS,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "rows": rows,
            "tritonclient_rows": triton_rows,
            "shared_memory_rows": shm_rows,
            "response_cache_rows": cached_rows,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
