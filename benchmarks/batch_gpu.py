"""A batch prediction job on the GPU against the network called in a loop, in-process, on the same images.

Run: `python benchmarks/batch_gpu.py` on a machine with PyTorch and a CUDA GPU (about a minute;
`BENCH=benchmarks/batch_gpu.py bash benchmarks/gpu_device.sh` sets up and runs it on a lent device machine).
`--numpy-stand-in --device cpu` runs the same steps where there is no PyTorch (figures that mean nothing for a GPU).
Writes benchmarks/results/batch_gpu.json (or `--out`).

The model is gpu.py's CNN (784 floats → 10 probabilities; PyTorch, served as a Python model on ``--device``). The
data: ``--rows`` random images in one ``.npy`` file (what a job on images reads without pandas or pyarrow). Side
by side, taking turns, each measured in every round and the median kept:

- the baseline: the images already in memory, the network called on batches of ``--batch_size`` in a loop (each
  batch copied to the device and its answer back, as the served model does);
- ``workbench.batch_predict`` reading the file a shard at a time and writing ``.npz`` parts, with 1, 2 and 4
  batches in flight (``concurrency``): more than one keeps the GPU fed while the last batch's answer comes back.

Issue 31: a job runs "a GPU where there is one" at the engine's best rate; its rows/s over the baseline's is the
figure (1.0: the job costs nothing beyond the model).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import save_results
from gpu import CHANNELS, Framework, network_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--concurrency", default="1,2,4", help="batches in flight, one job each")
    parser.add_argument("--numpy-stand-in", action="store_true", help=argparse.SUPPRESS)  # no PyTorch: plumbing
    parser.add_argument("--out", default="", help="results file (default: benchmarks/results/batch_gpu.json)")
    args = parser.parse_args()

    import workbench

    framework = Framework(args.numpy_stand_in)
    info: dict[str, Any] = {"framework": framework.name, "device": args.device}
    if not args.numpy_stand_in:
        import torch

        info["torch"] = torch.__version__
        if args.device == "cuda":
            info["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        framework.write_repository(root, [args.device])
        model = f"cnn_{args.device}"
        images = np.random.default_rng(0).random((args.rows, 784), dtype=np.float32)
        np.save(root / "images.npy", images)
        module = network_module(root, "")
        net = module.load_network(str(root / "weights"), CHANNELS, args.device)
        module.forward(net, args.device, images[: args.batch_size])  # the device warmed up

        def baseline() -> float:
            started = time.perf_counter()
            for start in range(0, len(images), args.batch_size):
                module.forward(net, args.device, images[start : start + args.batch_size])
            return len(images) / (time.perf_counter() - started)

        def job(concurrency: int) -> float:
            out = root / f"out-{concurrency}"
            shutil.rmtree(out, ignore_errors=True)
            summary = workbench.batch_predict(
                model, root / "images.npy", out, model_repository=root, batch_size=args.batch_size,
                concurrency=concurrency, output_format="npz", allow_python_models=True, progress=False,
            )  # fmt: skip
            assert (summary.rows_out, summary.rows_failed) == (len(images), 0), summary
            return summary.rows_per_second

        levels = [int(c) for c in args.concurrency.split(",")]
        measured: dict[str, list[float]] = {"baseline": [], **{f"job, {c} in flight": [] for c in levels}}
        job(levels[0])  # the job's first run imports what a job needs
        for _ in range(args.rounds):
            measured["baseline"].append(baseline())
            for c in levels:
                measured[f"job, {c} in flight"].append(job(c))
        medians = {k: statistics.median(v) for k, v in measured.items()}
        row = {f"{k} rows/s": round(v, 1) for k, v in medians.items()}
        jobs = {k: v for k, v in medians.items() if k != "baseline"}
        row.update({f"{k} / baseline": round(v / medians["baseline"], 3) for k, v in jobs.items()})
        print(json.dumps(row), flush=True)
    results = {
        "what": "a batch job (.npy in, .npz parts out) on the CNN against the network called in a loop in memory",
        "rows": args.rows,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        **info,
        "results": row,
        "command": f"python benchmarks/batch_gpu.py --rows {args.rows} --rounds {args.rounds} --device {args.device}",
    }
    print(f"results: {save_results('batch_gpu', results, args.out)}")


if __name__ == "__main__":
    main()
