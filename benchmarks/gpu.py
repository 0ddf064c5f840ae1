"""The engine on a GPU: a CNN's served images/s, GPU vs CPU, batching off and on, 1, 4 and 16 workers.

Run: `python benchmarks/gpu.py` on a machine with PyTorch and a CUDA GPU (about 6 minutes on 16 cores and an
H100); `--quick` is a one-minute smoke run. Writes benchmarks/results/gpu.json (or `--out`).

PyTorch is not in workbench's install (its Linux wheels carry CUDA: gigabytes). The CNN is the one the other
benchmarks serve as a SavedModel (28x28x1 → conv 3x3 → conv 3x3 → max-pool → dense 128 → 10, random weights),
written here in PyTorch and served three ways from one set of weights:

- ``cnn_cuda``: a Python model (``model.py``, ``--allow_python_models``) running PyTorch on the GPU;
- ``cnn_cpu``: the same model.py running PyTorch on the CPU;
- ``cnn_onnx``: exported to ONNX and served by the ONNX platform (ONNX Runtime's CUDA provider where the installed
  build has it, else its CPU provider; the results say which).

Every served answer is first checked against the model run in-process on the CPU. Load is 64 gRPC requests in
flight, one 784-float image each, from 8 client processes (workbench's own generator, 16 connections, so the
kernel spreads them over the workers); the clients share the machine's cores with the workers. The in-process
rate of each model at batch 1 and 64 is the ceiling. Then:

- the GPU model, 4 workers, measured alone and then while another process trains a network on the same GPU, as a
  notebook kernel would: both must finish without running out of memory;
- requests of 32 images (16 in flight, batches up to 512 images), GPU vs CPU: where the model's work, not the
  request path, is what a request costs;
- half_plus_two as a Python model on 1, 4 and 16 workers: the request path alone, scaled over the cores;
- the same model on 1 worker from one Python client process, against a bare grpc.aio server answering the same
  messages without a model (benchmarks/request_path.py's comparison, on a quieter machine), batching off and on,
  in alternating rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import (  # noqa: E402
    BATCHING,
    MONITORING,
    ServeProcess,
    counters_since,
    free_port,
    save_results,
    server_counters,
    taking_turns,
    write_config,
)

from workbench.client.bench import run_load  # noqa: E402

REQUEST_PATH_CLIENTS = (1, 32)
REQUEST_PATH_ROUNDS = 5  # alternating measurements of each request-path row; the row is the median

CLIENTS = 64
CLIENT_PROCESSES = 8
CHANNELS = (32, 64)  # the other benchmarks' CNN
# Requests of many images: 16 in flight of 32 images each, batched up to 512 images (TF Serving's advice for GPUs:
# large batches).
LARGE_REQUEST, LARGE_CLIENTS = 32, 16
BATCHING_LARGE = BATCHING.replace("max_batch_size { value: 64 }", "max_batch_size { value: 512 }")

# The network, shared by model.py (written into each version folder) and this script's own checks and trainer.
NETWORK = textwrap.dedent(
    """
    import torch
    from torch import nn


    def digits_cnn(c1: int = 32, c2: int = 64) -> nn.Module:
        return nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, c1, 3),
            nn.ReLU(),
            nn.Conv2d(c1, c2, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(12 * 12 * c2, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
            nn.Softmax(dim=1),
        )
    """
)

MODEL_PY = NETWORK + textwrap.dedent(
    """

    import json
    from pathlib import Path

    import workbench


    class DigitsCNN(workbench.PythonModel):
        inputs = {"images": ("float32", [-1, 784])}
        outputs = {"probabilities": ("float32", [-1, 10])}

        def load(self, path):
            settings = json.loads((Path(path) / "settings.json").read_text())
            self.device = torch.device(settings["device"])
            self.net = digits_cnn(*settings["channels"])
            self.net.load_state_dict(torch.load(Path(path) / "weights.pt", map_location="cpu"))
            self.net.to(self.device).eval()

        def predict(self, inputs):
            images = torch.from_numpy(inputs["images"]).to(self.device)
            with torch.inference_mode():
                probabilities = self.net(images)
            return {"probabilities": probabilities.cpu().numpy()}
    """
)


# The request path alone: a model that costs nothing, to see how N workers scale what the frontends can do.
HALF_PLUS_TWO_PY = textwrap.dedent(
    """
    import workbench


    class HalfPlusTwo(workbench.PythonModel):
        inputs = {"x": ("float32", [-1, 1])}
        outputs = {"y": ("float32", [-1, 1])}

        def predict(self, inputs):
            return {"y": inputs["x"] * 0.5 + 2.0}
    """
)


def network_module(root: Path) -> Any:
    """The network's definition, imported from a file so that it is the same code model.py runs."""
    import importlib.util

    path = root / "digits_network.py"
    path.write_text(NETWORK)
    spec = importlib.util.spec_from_file_location("digits_network", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_repository(root: Path, devices: list[str]) -> tuple[dict[str, Path], Any, dict[str, Any]]:
    """One base path a model; returns them, the CPU reference network and what the ONNX export used."""
    import torch

    torch.manual_seed(0)
    net = network_module(root).digits_cnn(*CHANNELS).eval()
    bases: dict[str, Path] = {}
    for device in devices:
        version = root / f"cnn_{device}" / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(MODEL_PY)
        (version / "settings.json").write_text(json.dumps({"device": device, "channels": CHANNELS}))
        torch.save(net.state_dict(), version / "weights.pt")
        bases[f"cnn_{device}"] = version.parent
    onnx: dict[str, Any] = {}
    version = root / "cnn_onnx" / "1"
    version.mkdir(parents=True)
    try:
        example = torch.zeros(2, 784)
        with warnings.catch_warnings():  # the TorchScript exporter is deprecated, and still the one that
            warnings.simplefilter("ignore")  # exports this network with every PyTorch from 2.0 on
            torch.onnx.export(
                net,
                (example,),
                str(version / "model.onnx"),
                input_names=["images"],
                output_names=["probabilities"],
                dynamic_axes={"images": {0: "batch"}, "probabilities": {0: "batch"}},
                dynamo=False,
            )
        bases["cnn_onnx"] = version.parent
        import onnxruntime

        onnx["providers"] = onnxruntime.get_available_providers()
    except Exception as error:  # an exporter that cannot run here leaves the ONNX rows out, and says why
        onnx["error"] = f"{type(error).__name__}: {error}"
    return bases, net, onnx


def write_half_plus_two(root: Path) -> Path:
    version = root / "half_plus_two" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(HALF_PLUS_TWO_PY)
    return version.parent


def in_process_rate(net: Any, device: str, batch: int, seconds: float = 2.0) -> float:
    """Images/s of the network called directly, on ``device``, at ``batch`` images a call."""
    import torch

    net = net.to(device)
    images = torch.rand(batch, 784)
    done, started = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - started < seconds:
            net(images.to(device)).cpu()  # the copy back waits for the GPU, as a served answer does
            done += batch
    rate = done / (time.perf_counter() - started)
    net.to("cpu")
    return rate


def onnx_in_process_rate(path: Path, batch: int, seconds: float = 2.0) -> float:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=onnxruntime.get_available_providers())
    images = np.random.default_rng(0).random((batch, 784), dtype=np.float32)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, {"images": images})
        done += batch
    return done / (time.perf_counter() - started)


def _load_share(args: tuple[str, str, dict[str, np.ndarray], int, float]) -> dict[str, Any]:
    target, model, inputs, clients, duration = args
    result = run_load(target, "grpc", model, inputs, concurrency=clients, duration=duration)
    return {"requests": result.requests, "errors": result.errors, "seconds": result.seconds, "ms": result.latencies_ms}


def load(pool: Any, target: str, model: str, inputs: dict[str, np.ndarray], clients: int, duration: float) -> dict:
    """``clients`` requests in flight, spread over the pool's processes; the rates add up."""
    shares = min(clients, CLIENT_PROCESSES)
    parts = pool.map(_load_share, [(target, model, inputs, clients // shares, duration)] * shares)
    errors = sum(p["errors"] for p in parts)
    if errors:
        raise RuntimeError(f"{errors} requests to {model} failed")
    latencies = [ms for p in parts for ms in p["ms"]]
    (images,) = inputs.values()
    return {
        "images_per_second": round(len(images) * sum(p["requests"] / p["seconds"] for p in parts), 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
    }


def every_worker_ready(server: ServeProcess, model: str, body: bytes, workers: int, timeout: float = 300) -> None:
    """Fresh connections answer ``4 x workers`` times in a row: the kernel spreads them over the workers."""
    deadline, in_a_row = time.perf_counter() + timeout, 0
    while in_a_row < 4 * workers:
        if time.perf_counter() > deadline:
            raise TimeoutError("not every worker answered in time")
        server.check_running()
        try:
            request = urllib.request.Request(f"{server.rest_url}/v1/models/{model}:predict", data=body)
            with urllib.request.urlopen(request, timeout=30):
                in_a_row += 1
        except OSError:
            in_a_row = 0
            time.sleep(0.1)


def gpu_memory_used_mib() -> float | None:
    """The whole GPU's memory in use (every process), as nvidia-smi reports it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out.split()[0])


@contextmanager
def peak_gpu_memory() -> Iterator[dict[str, float | None]]:
    """Samples nvidia-smi while the block runs; yields a dict that holds the peak (MiB) afterwards."""
    peak: dict[str, float | None] = {"peak_mib": gpu_memory_used_mib()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            used = gpu_memory_used_mib()
            if used is not None:
                peak["peak_mib"] = max(peak["peak_mib"] or 0.0, used)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


TRAINER = textwrap.dedent(
    """
    import json, sys, time
    import torch
    sys.path.insert(0, sys.argv[1])
    from digits_network import digits_cnn

    seconds = float(sys.argv[2])
    torch.manual_seed(1)
    net = digits_cnn(64, 128).cuda()  # wider than the served one: training takes memory and compute
    optimizer = torch.optim.Adam(net.parameters())
    loss_fn = torch.nn.NLLLoss()
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        images = torch.rand(512, 784, device="cuda")
        labels = torch.randint(0, 10, (512,), device="cuda")
        optimizer.zero_grad()
        loss = loss_fn(torch.log(net(images) + 1e-9), labels)
        loss.backward()
        optimizer.step()
        steps += 1
    torch.cuda.synchronize()
    print(json.dumps({
        "steps_per_second": round(steps / (time.perf_counter() - started), 1),
        "batch": 512,
        "max_memory_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1),
    }))
    """
)


def serve_rows(
    pool: Any,
    root: Path,
    config: Path,
    model: str,
    workers: int,
    batching: bool,
    duration: float,
    image: dict[str, np.ndarray],
    expected: np.ndarray,
    plan: list[tuple[int, bool]] | None = None,
    trainer: Callable[[], subprocess.Popen[str]] | None = None,
    batching_file: str = "batching.txt",
) -> list[dict[str, Any]]:
    """One server's rows: ``plan`` is (requests in flight, beside the trainer) for each measurement."""
    flags = [
        "--allow_python_models",
        f"--num_workers={workers}",
        f"--monitoring_config_file={root / 'monitoring.txt'}",
        "--file_system_poll_wait_seconds=0",
    ]
    if batching:
        flags += ["--enable_batching", f"--batching_parameters_file={root / batching_file}"]
    (instances,) = image.values()
    body = json.dumps({"instances": instances.tolist()}).encode()
    server = ServeProcess(config, *flags)
    rows: list[dict[str, Any]] = []
    try:
        server.wait_for_answer(model, {"instances": instances.tolist()}, timeout=300)
        every_worker_ready(server, model, body, workers)
        served = check_answer(server, model, body, expected)
        memory = gpu_memory_used_mib() if "cuda" in model else None
        run_load(server.grpc_target, "grpc", model, image, concurrency=16, duration=1.0)  # warm every connection
        label = {
            "model": model,
            "workers": workers,
            "batching": "on" if batching else "off",
            "images_per_request": len(instances),
        }
        if plan is None:
            plan = [(1, False), (CLIENTS, False)] if workers == 1 else [(CLIENTS, False)]
        for clients, beside in plan:
            before = server_counters(server.rest_url, model)
            extra: dict[str, Any] = {}
            if beside:
                assert trainer is not None
                with peak_gpu_memory() as peak:
                    training = trainer()
                    measured = load(pool, server.grpc_target, model, image, clients, duration)
                    out, err = training.communicate(timeout=120)
                if training.returncode != 0:
                    raise RuntimeError(f"the trainer failed beside the server:\n{err[-3000:]}")
                extra = {
                    "beside": "a process training on the same GPU",
                    "trainer": json.loads(out),
                    "gpu_memory_peak_mib": peak["peak_mib"],
                }
            else:
                measured = load(pool, server.grpc_target, model, image, clients, duration)
            examples, batches, failed = counters_since(server.rest_url, model, before)
            if failed:
                raise RuntimeError(f"{failed:.0f} requests to {model} failed")
            rows.append(
                {
                    **label,
                    "clients": clients,
                    **measured,
                    "mean_batch": round(examples / batches, 2) if batches else None,
                    "answer_max_abs_error": served,
                    "gpu_memory_after_load_mib": memory,
                    **extra,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    return rows


def request_path_rows(root: Path, duration: float, rounds: int = REQUEST_PATH_ROUNDS) -> list[dict[str, Any]]:
    """half_plus_two over gRPC from one Python client process, against bare grpc.aio answering the same messages.

    As benchmarks/request_path.py measures it on the 2-core machine (there with TensorFlow's half_plus_two): here
    the model is the Python one, and the machine is quieter and has 16 cores. The three servers run side by side
    and take turns (a run moves by ~10% on a shared machine); each row is the median round.
    """
    import grpc
    from request_path import Child, bare_predict_response

    x = {"x": np.array([[2.0]], np.float32)}
    port = free_port()
    bare = Child("bare-grpc", port, log=root / "bare.log")
    servers: dict[str, ServeProcess] = {}
    try:
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        def answers() -> bool:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                return stub.Predict(predict_pb2.PredictRequest(), timeout=5) == bare_predict_response()

        bare.wait(answers)
        config = root / "half_plus_two.config"
        for batching in (False, True):
            flags = [
                "--allow_python_models",
                "--file_system_poll_wait_seconds=0",
                f"--monitoring_config_file={root / 'monitoring.txt'}",
            ]
            if batching:
                flags += ["--enable_batching", f"--batching_parameters_file={root / 'batching.txt'}"]
            server = servers[f"workbench, 1 worker, batching {'on' if batching else 'off'}"] = ServeProcess(
                config, *flags
            )
            server.wait_for_answer("half_plus_two", {"instances": [[2.0]]})
        targets = {"bare grpc.aio": f"127.0.0.1:{port}", **{name: s.grpc_target for name, s in servers.items()}}

        def measure(name: str, target: str, clients: int) -> dict[str, Any]:
            server = servers.get(name)
            before = server_counters(server.rest_url, "half_plus_two") if server is not None else None
            result = run_load(target, "grpc", "half_plus_two", x, concurrency=clients, duration=duration)
            if result.errors:
                raise RuntimeError(f"{result.errors} requests to {name} failed")
            row: dict[str, Any] = {
                "server": name,
                "clients": clients,
                "requests_per_second": round(result.requests_per_second, 1),
                "p50_ms": round(result.percentile(50), 3),
            }
            if server is not None and before is not None:
                examples, batches, _ = counters_since(server.rest_url, "half_plus_two", before)
                row["mean_batch"] = round(examples / batches, 2) if batches else None
            return row

        rows = []
        for clients in REQUEST_PATH_CLIENTS:
            measures = [functools.partial(measure, name, target, clients) for name, target in targets.items()]
            for row in taking_turns(rounds, measures):
                rows.append(row)
                print(json.dumps(row), flush=True)
        return rows
    finally:
        bare.stop()
        for server in servers.values():
            server.stop()


def check_answer(server: ServeProcess, model: str, body: bytes, expected: np.ndarray) -> float:
    """The served probabilities against the CPU network's, in-process; returns the largest difference."""
    request = urllib.request.Request(f"{server.rest_url}/v1/models/{model}:predict", data=body)
    with urllib.request.urlopen(request, timeout=30) as response:
        served = np.asarray(json.loads(response.read())["predictions"], np.float32)
    error = float(np.max(np.abs(served - expected)))
    # TF32 convolutions on the GPU round differently from the CPU's float32; probabilities stay within 1e-2.
    if error > 1e-2:
        raise AssertionError(f"{model} answered {served}, the network in-process {expected}")
    return round(error, 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 s loads, 1 worker, 4 workers once")
    parser.add_argument("--out", default="", help="results file (default: benchmarks/results/gpu.json)")
    args = parser.parse_args()
    import torch

    duration = 2.0 if args.quick else args.duration
    cuda = torch.cuda.is_available()
    devices = ["cuda", "cpu"] if cuda else ["cpu"]
    worker_counts = [1, 4] if args.quick else [1, 4, 16]
    image = {"images": np.random.default_rng(0).random((1, 784), dtype=np.float32)}
    results: dict[str, Any] = {
        "machine": {
            "cpu_cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "load": f"{CLIENTS} gRPC requests in flight (1 image each) from {CLIENT_PROCESSES} processes",
        "batching_parameters": BATCHING.strip(),
    }
    with tempfile.TemporaryDirectory() as tmp, multiprocessing.get_context("spawn").Pool(CLIENT_PROCESSES) as pool:
        root = Path(tmp)
        (root / "batching.txt").write_text(BATCHING)
        (root / "monitoring.txt").write_text(MONITORING)
        bases, net, onnx = write_repository(root, devices)
        results["onnx"] = onnx
        with torch.inference_mode():
            expected = net(torch.from_numpy(image["images"])).numpy()
        limits: dict[str, float] = {}
        for device in devices:
            for batch in (1, CLIENTS):
                limits[f"cnn_{device}@{batch}"] = round(in_process_rate(net, device, batch), 1)
        if "cnn_onnx" in bases:
            for batch in (1, CLIENTS):
                limits[f"cnn_onnx@{batch}"] = round(onnx_in_process_rate(bases["cnn_onnx"] / "1" / "model.onnx", batch))
        results["in_process_images_per_second"] = limits
        print(json.dumps(limits), flush=True)

        rows: list[dict[str, Any]] = []
        for model in bases:
            config = write_config(root / f"{model}.config", {model: bases[model]}, platform=None)
            counts = worker_counts if model != "cnn_onnx" else [1]
            for workers in counts:
                for batching in (False, True):
                    rows += serve_rows(pool, root, config, model, workers, batching, duration, image, expected)
        if cuda:
            # A notebook kernel training on the GPU the server uses: measured alone, then beside the trainer.
            def start_trainer() -> subprocess.Popen[str]:
                return subprocess.Popen(
                    [sys.executable, "-c", TRAINER, str(root), str(duration + 2)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )

            config = root / "cnn_cuda.config"
            plan = [(CLIENTS, False), (CLIENTS, True)]
            rows += serve_rows(
                pool, root, config, "cnn_cuda", 4, True, duration, image, expected, plan, trainer=start_trainer
            )
        # Requests of 32 images: where the model's compute, not the request path, is the work.
        (root / "batching_large.txt").write_text(BATCHING_LARGE)
        images = {"images": np.random.default_rng(1).random((LARGE_REQUEST, 784), dtype=np.float32)}
        with torch.inference_mode():
            expected_large = net(torch.from_numpy(images["images"])).numpy()
        for device in devices:
            limits[f"cnn_{device}@512"] = round(in_process_rate(net, device, 512), 1)
            config = root / f"cnn_{device}.config"
            for workers in worker_counts[:2]:
                for batching in (False, True):
                    rows += serve_rows(
                        pool,
                        root,
                        config,
                        f"cnn_{device}",
                        workers,
                        batching,
                        duration,
                        images,
                        expected_large,
                        [(LARGE_CLIENTS, False)],
                        batching_file="batching_large.txt",
                    )
        # The request path on many cores: half_plus_two as a Python model, batching off.
        config = write_config(
            root / "half_plus_two.config", {"half_plus_two": write_half_plus_two(root)}, platform=None
        )
        x = {"x": np.array([[2.0]], np.float32)}
        for workers in worker_counts:
            rows += serve_rows(
                pool, root, config, "half_plus_two", workers, False, duration, x, np.array([[3.0]]), [(CLIENTS, False)]
            )
        results["request_path"] = request_path_rows(root, duration, 1 if args.quick else REQUEST_PATH_ROUNDS)
        results["rows"] = rows
    results["ratios"] = ratios(rows, limits, results["request_path"])
    path = Path(args.out) if args.out else save_results("gpu", results)
    if args.out:
        path.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["ratios"], indent=2))
    print(f"results: {path}")


def ratios(
    rows: list[dict[str, Any]], limits: dict[str, float], request_path: list[dict[str, Any]]
) -> dict[str, float]:
    def rate(model: str, workers: int, batching: str, clients: int = CLIENTS, **match: Any) -> float | None:
        want = {"images_per_request": 1, "beside": None, **match}
        for row in rows:
            key = (row["model"], row["workers"], row["batching"], row["clients"])
            if key == (model, workers, batching, clients) and all(row.get(k) == v for k, v in want.items()):
                return float(row["images_per_second"])
        return None

    out: dict[str, float] = {}

    def put(name: str, num: float | None, den: float | None) -> None:
        if num is not None and den:
            out[name] = round(num / den, 2)

    for model in sorted({r["model"] for r in rows}):
        put(f"{model}, 1 worker: batching on / off", rate(model, 1, "on"), rate(model, 1, "off"))
        put(
            f"{model}, 1 worker, batching on: served / in-process at batch 64",
            rate(model, 1, "on"),
            limits.get(f"{model}@64"),
        )
        for workers in (4, 16):
            put(f"{model}, batching on: {workers} workers / 1", rate(model, workers, "on"), rate(model, 1, "on"))
            put(f"{model}, batching off: {workers} workers / 1", rate(model, workers, "off"), rate(model, 1, "off"))
    for workers in (4, 16):
        put(
            f"half_plus_two (request path), {workers} workers / 1, per worker",
            rate("half_plus_two", workers, "off"),
            (rate("half_plus_two", 1, "off") or 0) * workers,
        )
    for workers in (1, 4, 16):
        for batching in ("off", "on"):
            put(
                f"GPU / CPU, {workers} workers, batching {batching}",
                rate("cnn_cuda", workers, batching),
                rate("cnn_cpu", workers, batching),
            )
    large = {"images_per_request": LARGE_REQUEST}
    for workers in (1, 4):
        for batching in ("off", "on"):
            put(
                f"GPU / CPU, {LARGE_REQUEST} images a request, {workers} workers, batching {batching}",
                rate("cnn_cuda", workers, batching, LARGE_CLIENTS, **large),
                rate("cnn_cpu", workers, batching, LARGE_CLIENTS, **large),
            )
    for device in ("cuda", "cpu"):
        put(
            f"cnn_{device}, {LARGE_REQUEST} images a request, 1 worker, batching on: served / in-process at 512",
            rate(f"cnn_{device}", 1, "on", LARGE_CLIENTS, **large),
            limits.get(f"cnn_{device}@512"),
        )
    bare = {r["clients"]: r["requests_per_second"] for r in request_path if r["server"] == "bare grpc.aio"}
    for r in request_path:
        if r["server"] != "bare grpc.aio":
            put(
                f"request path: {r['server']}, {r['clients']} gRPC clients / bare grpc.aio",
                r["requests_per_second"],
                bare.get(r["clients"]),
            )
    beside = [r for r in rows if r.get("beside")]
    alone = [r for r in rows if r["model"] == "cnn_cuda" and r["workers"] == 4 and r["batching"] == "on"]
    if beside and len(alone) >= 2:
        # The pair measured one after the other on the same server (the row before the trainer's).
        index = rows.index(beside[0])
        put(
            "cnn_cuda, 4 workers, batching on: beside training / alone",
            rows[index]["images_per_second"],
            rows[index - 1]["images_per_second"],
        )
    return out


if __name__ == "__main__":
    main()
