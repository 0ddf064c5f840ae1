"""gRPC vs REST, and what the server adds over calling the model in-process.

Run: `.venv/bin/python benchmarks/frontends.py` (about 2 minutes on 2 cores). Prints a table and writes
benchmarks/results/frontends.json. Everything is measured side by side in one run, against one
`workbench serve` child process, by a load generator in this process.

1. start-up: spawning `workbench serve` to its first answered REST predict;
2. one request's cost: median latency of an in-process signature call, a REST predict and a gRPC predict
   on half_plus_two with one client;
3. throughput and p50/p99 for gRPC and REST on half_plus_two (1 value) and on a 784-float MLP (1 image and
   32 images a request), with 1 and 16 concurrent clients.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import ServeProcess, save_mnist_mlp, save_results, write_config

from workbench.client.bench import format_table, run_load
from workbench.demo import save_half_plus_two


def in_process_median_ms(path: Path, inputs: dict[str, np.ndarray], calls: int = 3000) -> float:
    from workbench.core import inference
    from workbench.platforms.tensorflow import load_saved_model

    servable = load_saved_model("m", 1, str(path))
    signature = inference.predict_signature(servable, "")
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        inference.predict(servable, signature, inputs)
        times.append((time.perf_counter() - started) * 1000)
    servable.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_half_plus_two(root / "half_plus_two" / "1")
        save_mnist_mlp(root / "mnist" / "1")
        config = write_config(
            root / "models.config", {"half_plus_two": root / "half_plus_two", "mnist": root / "mnist"}
        )
        hp2 = {"x": np.array([[2.0]], np.float32)}
        rng = np.random.default_rng(0)
        image = {"images": rng.random((1, 784), dtype=np.float32)}
        images = {"images": rng.random((32, 784), dtype=np.float32)}

        server = ServeProcess(config)
        try:
            startup = server.wait_for_answer("half_plus_two", {"instances": [[1.0]]})
            in_process = in_process_median_ms(root / "half_plus_two" / "1", hp2)
            single = {
                p: run_load(
                    server.rest_url if p == "rest" else server.grpc_target,
                    p,
                    "half_plus_two",
                    hp2,
                    concurrency=1,
                    duration=args.duration,
                )
                for p in ("rest", "grpc")
            }
            rows = []
            for model, inputs, per_request in (("half_plus_two", hp2, 1), ("mnist", image, 1), ("mnist", images, 32)):
                for concurrency in (1, 16):
                    pair = {}
                    for protocol in ("grpc", "rest"):
                        target = server.rest_url if protocol == "rest" else server.grpc_target
                        result = run_load(
                            target, protocol, model, inputs, concurrency=concurrency, duration=args.duration
                        )
                        row = result.summary()
                        row["batch"] = per_request
                        row["examples_per_second"] = round(result.requests_per_second * per_request, 1)
                        rows.append(row)
                        pair[protocol] = result
                    rows[-2]["grpc/rest"] = round(
                        pair["grpc"].requests_per_second / max(pair["rest"].requests_per_second, 1e-9), 2
                    )
        finally:
            server.stop()

    rest_ms, grpc_ms = single["rest"].percentile(50), single["grpc"].percentile(50)
    print(f"start-up to first answer: {startup:.2f} s")
    print(
        f"half_plus_two, 1 client, median: in-process {in_process:.3f} ms, REST {rest_ms:.3f} ms "
        f"({rest_ms / in_process:.1f}x), gRPC {grpc_ms:.3f} ms ({grpc_ms / in_process:.1f}x)"
    )
    print()
    print(
        format_table(
            rows,
            [
                "model",
                "batch",
                "protocol",
                "concurrency",
                "requests_per_second",
                "examples_per_second",
                "p50_ms",
                "p99_ms",
                "errors",
                "grpc/rest",
            ],
        )
    )
    path = save_results(
        "frontends",
        {
            "startup_to_first_answer_s": round(startup, 3),
            "in_process_median_ms": round(in_process, 4),
            "rest_single_client_median_ms": round(rest_ms, 4),
            "grpc_single_client_median_ms": round(grpc_ms, 4),
            "rows": rows,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
