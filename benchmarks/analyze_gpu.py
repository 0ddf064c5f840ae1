"""The model analyzer on the GPU: which batching settings serve gpu.py's CNN best, within a p99 budget.

Run: `python benchmarks/analyze_gpu.py` on a machine with PyTorch and a CUDA GPU (about two minutes;
`BENCH=benchmarks/analyze_gpu.py bash benchmarks/gpu_device.sh` sets up and runs it on a lent device machine).
`--numpy-stand-in --device cpu` runs the same steps where there is no PyTorch. Writes
benchmarks/results/analyze_gpu.json (or `--out`): every point, the winner and why.

The model is gpu.py's CNN (784 floats → 10 probabilities, PyTorch) served as a Python model on ``--device``, one image
a request over gRPC; candidates: no batching, and batches of 16 and 64 (1 ms timeout, one batch thread); loads: 1,
16 and 64 clients; budget: p99 ≤ 20 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import save_results
from gpu import Framework


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--max_batch_size", default="1,16,64")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--latency_budget_ms", type=float, default=20.0)
    parser.add_argument("--measurement_interval", type=float, default=1000.0, help="milliseconds a window")
    parser.add_argument("--numpy-stand-in", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help="results file (default: benchmarks/results/analyze_gpu.json)")
    args = parser.parse_args()

    import workbench

    framework = Framework(args.numpy_stand_in)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        framework.write_repository(root, [args.device])
        model = f"cnn_{args.device}"
        analysis = workbench.analyze(
            model, root / model, inputs={"images": np.random.default_rng(0).random((1, 784), dtype=np.float32)},
            max_batch_size=[int(v) for v in args.max_batch_size.split(",")], batch_timeout_micros=[1000],
            concurrency=[int(v) for v in args.concurrency.split(",")], protocol="grpc",
            latency_budget_ms=args.latency_budget_ms, measurement_interval_ms=args.measurement_interval,
            stability_percentage=15, max_trials=5, serve_flags=["--allow_python_models"],
            on_point=lambda p: print(f"{p.candidate.name}, {p.load}: {p.inferences_per_second:,.0f}/s, "
                                     f"p99 {p.p99_ms:.1f} ms, batch {p.avg_batch}", flush=True),
        )  # fmt: skip
    print(analysis.why, flush=True)
    results = {
        "what": "workbench analyze on gpu.py's CNN as a Python model, one image a request over gRPC",
        "device": args.device,
        "framework": framework.name,
        "seconds": round(time.perf_counter() - started, 1),
        **analysis.to_json(),
        "command": f"python benchmarks/analyze_gpu.py --device {args.device} --max_batch_size {args.max_batch_size} "
        f"--concurrency {args.concurrency} --latency_budget_ms {args.latency_budget_ms:g}",
    }
    print(f"results: {save_results('analyze_gpu', results, args.out)}")


if __name__ == "__main__":
    main()
