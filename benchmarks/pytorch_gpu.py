"""The PyTorch platform on a GPU: the digits CNN exported by ``workbench.export`` and served natively, against the
same network served as a Python model (gpu.py's route) and against the network called in-process.

Run: `python benchmarks/pytorch_gpu.py` on a machine with PyTorch and a CUDA GPU (about a minute;
`BENCH=benchmarks/pytorch_gpu.py benchmarks/gpu_device.sh` on a lent device machine); `--cpu-only` serves on the CPU
(where there is no GPU). Writes benchmarks/results/pytorch_gpu.json (or `--out`).

Rows (one `workbench serve` each, one worker, batching on: at most 64 rows a batch, no timeout, one batch thread;
64 gRPC clients of workbench's own generator in 16 processes, one 784-float image a request):

- ``cnn_pt2``: ``workbench.export(network, example_inputs=...)`` wrote ``model.pt2`` (a ``torch.export`` program with
  a dynamic batch dimension), served by the ``pytorch`` platform on ``--pytorch_device``;
- ``cnn_py``: the same weights in a ``model.py`` Python model that calls the network itself (``--allow_python_models``).

``targets`` gives each served rate over the network's own rate in-process at batch 64 (a child process, so that
this one holds no CUDA context), and the native platform's rate over the Python model's. Every server's answer is
first checked against the network run here on the CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import BATCHING, MONITORING, ServeProcess, counters_since, save_results, server_counters, write_config
from gpu import CHANNELS, CLIENT_PROCESSES, CLIENTS, MODEL_PY, NETWORK, check_answer, in_process_rates, load
from gpu import network_module as import_network


def write_models(root: Path, device: str) -> dict[str, Path]:
    """``cnn_pt2`` (exported by workbench) and ``cnn_py`` (a Python model), with the same weights."""
    import torch

    import workbench

    network = import_network(root, NETWORK)
    torch.manual_seed(0)
    net = network.digits_cnn(*CHANNELS).eval()
    weights = root / "weights"
    weights.mkdir()
    torch.save(net.state_dict(), weights / "weights.pt")
    examples = np.random.default_rng(1).random((8, 784), dtype=np.float32)
    workbench.export(net, "cnn_pt2", model_repository=root / "repo", example_inputs=(torch.from_numpy(examples),))
    python_model = root / "repo" / "cnn_py" / "1"
    python_model.mkdir(parents=True)
    (python_model / "model.py").write_text(NETWORK + MODEL_PY)
    (python_model / "settings.json").write_text(json.dumps({"device": device, "channels": CHANNELS}))
    (python_model / "weights.pt").write_bytes((weights / "weights.pt").read_bytes())
    return {"cnn_pt2": root / "repo" / "cnn_pt2", "cnn_py": python_model.parent}


def signature_input(server: ServeProcess, model: str) -> str:
    """The exported program's input name (forward()'s parameter), as the server's metadata gives it."""
    import urllib.request

    with urllib.request.urlopen(f"{server.rest_url}/v1/models/{model}/metadata", timeout=30) as response:
        metadata = json.loads(response.read())
    inputs = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    (name,) = inputs
    return name


def serve_row(
    root: Path,
    pool: Any,
    model: str,
    base: Path,
    device: str,
    images: np.ndarray,
    expected: np.ndarray,
    seconds: float,
    workers: int,
) -> dict[str, Any]:
    config = write_config(root / f"{model}.config", {model: base}, platform=None)
    flags = [
        "--allow_python_models",
        f"--pytorch_device={device}",
        f"--num_workers={workers}",  # more than one: frontends feeding a model runner (issue 30)
        f"--monitoring_config_file={root / 'monitoring.txt'}",
        "--file_system_poll_wait_seconds=0",
        "--enable_batching",
        f"--batching_parameters_file={root / 'batching.txt'}",
    ]
    server = ServeProcess(config, *flags)
    row: dict[str, Any] = {"model": model, "device": device, "frontends": workers, "clients": CLIENTS, "batching": "on"}
    try:
        name = "images" if model == "cnn_py" else None
        server.wait_ready(timeout=120)
        name = name or signature_input(server, model)
        body = json.dumps({"instances": images[:4].tolist()}).encode()
        row["startup_seconds"] = round(server.wait_for_answer(model, {"inputs": {name: images[:4].tolist()}}), 1)
        row["answer_max_abs_error"] = check_answer(server, model, body, expected[:4], tolerance=1e-2)
        inputs = {name: images[:1]}
        load(pool, server.grpc_target, model, inputs, CLIENTS, 1.0)  # warm: batch sizes, CUDA kernels
        before = server_counters(server.rest_url, model)
        row.update(load(pool, server.grpc_target, model, inputs, CLIENTS, seconds))
        examples, batches, failed = counters_since(server.rest_url, model, before)
        if failed:
            raise RuntimeError(f"{failed:.0f} requests to {model} failed")
        row["mean_batch"] = round(examples / batches, 2) if batches else None
    except Exception as error:  # noqa: BLE001 - the row says why; the run goes on
        row["error"] = f"{type(error).__name__}: {error}"[-3000:]
        traceback.print_exc()
        print(server.log[-3000:], file=sys.stderr)
    finally:
        server.stop()
    print(f"[{time.strftime('%H:%M:%S')}] {json.dumps(row)}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--cpu-only", action="store_true", help="serve on the CPU (no GPU here)")
    parser.add_argument("--workers", default="1,16", help="frontend counts (--num_workers), a server each")
    parser.add_argument("--out", default="", help="results file (default: benchmarks/results/pytorch_gpu.json)")
    args = parser.parse_args()
    device = "cpu" if args.cpu_only else "cuda"
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, spawn.Pool(CLIENT_PROCESSES) as pool:
        root = Path(tmp)
        (root / "batching.txt").write_text(BATCHING)
        (root / "monitoring.txt").write_text(MONITORING)
        bases = write_models(root, device)
        images = np.random.default_rng(0).random((64, 784), dtype=np.float32)
        network = import_network(root, "")
        expected = network.forward(network.load_network(str(root / "weights"), CHANNELS), "cpu", images)
        with spawn.Pool(1) as child:  # no CUDA context in this process: the card's memory is the servers'
            in_process = child.apply(in_process_rates, (str(root), [(device, 64)], args.duration))
        counts = [int(n) for n in args.workers.split(",")]
        rows = [
            serve_row(root, pool, m, b, device, images, expected, args.duration, n)
            for n in counts
            for m, b in bases.items()
        ]
    rate = {f"{row['model']}@{row['frontends']}": row.get("images_per_second") for row in rows}
    alone = in_process["rates"].get(f"cnn_{device}@64")

    def ratio(num: float | None, den: float | None) -> float | None:
        return round(num / den, 3) if num and den else None

    results = {
        "environment": {k: v for k, v in in_process.items() if k != "rates"},
        "in_process_images_per_second_at_64": alone,
        "rows": rows,
        "targets": {
            key: value
            for n in counts
            for key, value in (
                (f"{n} frontends: cnn_pt2 served / in-process at batch 64", ratio(rate.get(f"cnn_pt2@{n}"), alone)),
                (f"{n} frontends: cnn_py served / in-process at batch 64", ratio(rate.get(f"cnn_py@{n}"), alone)),
                (f"{n} frontends: cnn_pt2 / cnn_py", ratio(rate.get(f"cnn_pt2@{n}"), rate.get(f"cnn_py@{n}"))),
            )
        },
    }
    path = save_results("pytorch_gpu", results, args.out)
    print(json.dumps(results["targets"], indent=1))
    print(f"results in {path}")


if __name__ == "__main__":
    main()
