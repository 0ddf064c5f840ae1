"""The engine on a GPU with model runners: a CNN's served images/s, mean batch and GPU memory, 1, 4 and 16 frontends.

Run: `python benchmarks/gpu.py` on a machine with PyTorch and a CUDA GPU (about 4 minutes on 16 cores and an H100;
`benchmarks/gpu_device.sh` sets up and runs it on a lent device machine); `--quick` is a one-minute smoke run;
`--cpu-only` runs the same steps with the CPU model only and no nvidia-smi (where there is no GPU). Writes
benchmarks/results/gpu.json (or `--out`), after every server, so that a run cut short keeps what it measured.

Since issue 30, `workbench serve --num_workers N` (N > 1) runs N frontends and a model runner per GPU, which holds
each model version once and batches what every frontend hands it; `--model_runners=in_process` keeps the earlier
shared-nothing workers (each loads and batches on its own), `--model_runners=K` forces K runners (also with one
worker). This measures issue 30's targets, each under ``targets`` in the results with its goal and earlier figure:

1. ``cnn_cuda`` served images/s with 16 frontends and runners, as a share of the network's own rate in-process at
   batch 64 (goal >= 0.3; 0.03 with one worker before runners), and 16 frontends over 1 (goal >= 8x); the rows
   also hold 4 frontends, 16 shared-nothing workers (the earlier design) and one worker without runners;
2. the mean formed batch (requests a batch, from the server's Prometheus ``workbench_batch_size``, and the
   ``/workbench/v1/stats`` snapshot's ``mean_batch_size``), runners against in_process;
3. the whole card's memory (nvidia-smi) once the model is loaded with 1, 4 and 16 frontends: about one copy of the
   model whatever N (before: 1.5, 3.7 and 12.7 GB), and 16 in_process workers beside it;
4. a process training a network on the same GPU while 4 frontends and the runner serve: both must finish, and
   the served rate beside it is given over the rate alone;
5. ``cnn_cpu`` (the same network on the CPU) with 16 frontends, runners against in_process;

and, as the request path's ceiling on this machine with this load, ``half_plus_two`` (a Python model that costs
nothing) on 16 frontends, in_process and with runners.

The CNN is the one the other benchmarks serve as a SavedModel (28x28x1 → conv 3x3 → conv 3x3 → max-pool → dense 128
→ 10, random weights), in PyTorch (not in workbench's install: its Linux wheels carry CUDA), served as a Python
model (``model.py``, ``--allow_python_models``) on the GPU (``cnn_cuda``) and the CPU (``cnn_cpu``). Every server's
answer is first checked against the network run in this process on the CPU. The in-process rates run in a child
process, so that this one holds no CUDA context and the card's memory is the server's alone.

Load: 64 gRPC requests in flight, one 784-float image each, from 16 client processes of workbench's own generator,
each client on a connection of its own (so the kernel spreads 64 connections over the frontends); the clients share
the 16 cores with the server. Every row says where the CPU went while it was measured (cores used by the clients,
the frontends, the runners, the runners' event-loop threads, and the whole machine), so that a row the generator or
the machine's cores limited shows it: a client process near 1.0 core is its own limit.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import multiprocessing
import os
import platform
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import (
    BATCHING,
    MONITORING,
    ServeProcess,
    counters_since,
    free_port,
    loop_cpu_seconds,
    server_counters,
    taking_turns,
    write_config,
)

from workbench.client.bench import run_load

REQUEST_PATH_CLIENTS = (1, 32)
REQUEST_PATH_ROUNDS = 5  # alternating measurements of each request-path row; the row is the median

CLIENTS = 64
# 16 processes of 4 clients: 8 processes (the earlier figure) held a core each at ~16k requests/s of half_plus_two,
# below what 16 frontends answer. Idle processes cost nothing; a busy one shows in the rows' client_cores.
CLIENT_PROCESSES = 16
CHANNELS = (32, 64)  # the other benchmarks' CNN

# What issue 30 measured before runners (benchmarks/results/gpu.json of 2026-11-23: 1 worker, 64 clients).
EARLIER = {
    "cnn_cuda 1 worker, batching on: served / in-process at batch 64": 0.03,
    "cnn_cuda batching on: 16 workers / 1 worker": 2.32,
    "cnn_cuda 16 workers, batching on: mean batch": 2.85,
    "GPU memory after load, MiB, 1 / 4 / 16 workers": [1511.0, 3742.0, 12667.0],
}

# The network, shared by model.py (written into each version folder), the in-process rates and the trainer.
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


    def load_network(folder, channels, device="cpu"):
        net = digits_cnn(*channels)
        net.load_state_dict(torch.load(f"{folder}/weights.pt", map_location="cpu"))
        return net.to(device).eval()


    def forward(net, device, images):
        with torch.inference_mode():
            return net(torch.from_numpy(images).to(device)).cpu().numpy()
    """
)

# The same network in numpy, for --numpy-stand-in: where PyTorch is not installed, the benchmark's plumbing
# (servers, runners, loads, counters, the trainer beside) still runs, with figures that mean nothing for a GPU.
NETWORK_NUMPY = textwrap.dedent(
    """
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view


    def random_weights(c1=32, c2=64, seed=0):
        rng = np.random.default_rng(seed)
        shapes = {"w1": (c1, 1, 3, 3), "b1": (c1,), "w2": (c2, c1, 3, 3), "b2": (c2,),
                  "w3": (128, 12 * 12 * c2), "b3": (128,), "w4": (10, 128), "b4": (10,)}
        return {k: rng.normal(0, 0.05, s).astype(np.float32) for k, s in shapes.items()}


    def load_network(folder, channels, device="cpu"):
        return dict(np.load(f"{folder}/weights.npz"))


    def forward(w, device, images):
        x = images.reshape(-1, 28, 28)
        h = np.einsum("nhwij,cij->nchw", sliding_window_view(x, (3, 3), axis=(1, 2)), w["w1"][:, 0])
        h = np.maximum(h + w["b1"][:, None, None], 0)
        h = np.tensordot(sliding_window_view(h, (3, 3), axis=(2, 3)), w["w2"], axes=([1, 4, 5], [1, 2, 3]))
        h = np.maximum(h + w["b2"], 0).transpose(0, 3, 1, 2)
        n, c = h.shape[:2]
        h = h.reshape(n, c, 12, 2, 12, 2).max(axis=(3, 5)).reshape(n, -1)
        h = np.maximum(h @ w["w3"].T + w["b3"], 0) @ w["w4"].T + w["b4"]
        e = np.exp(h - h.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    """
)

MODEL_PY = textwrap.dedent(
    """

    import json
    from pathlib import Path

    import workbench


    class DigitsCNN(workbench.PythonModel):
        inputs = {"images": ("float32", [-1, 784])}
        outputs = {"probabilities": ("float32", [-1, 10])}

        def load(self, path):
            settings = json.loads((Path(path) / "settings.json").read_text())
            self.device = settings["device"]
            self.net = load_network(path, settings["channels"], self.device)

        def predict(self, inputs):
            return {"probabilities": forward(self.net, self.device, inputs["images"])}
    """
)

# The request path alone: a model that costs nothing, to see what the frontends and the load generator can do.
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

# A notebook kernel training on the GPU the server uses. It says "ready" once its first step ran (PyTorch imported,
# CUDA up), trains for the seconds given from then on, and prints what it did.
TRAINER = textwrap.dedent(
    """
    import json, sys, time
    import torch
    sys.path.insert(0, sys.argv[1])
    from digits_network import digits_cnn

    seconds, device = float(sys.argv[2]), sys.argv[3]
    torch.manual_seed(1)
    net = digits_cnn(64, 128).to(device)  # wider than the served one: training takes memory and compute
    optimizer = torch.optim.Adam(net.parameters())
    loss_fn = torch.nn.NLLLoss()

    def step():
        images = torch.rand(512, 784, device=device)
        labels = torch.randint(0, 10, (512,), device=device)
        optimizer.zero_grad()
        loss = loss_fn(torch.log(net(images) + 1e-9), labels)
        loss.backward()
        optimizer.step()

    step()
    if device == "cuda":
        torch.cuda.synchronize()
    print("ready", flush=True)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        steps += 1
    if device == "cuda":
        torch.cuda.synchronize()
    print(json.dumps({
        "steps_per_second": round(steps / (time.perf_counter() - started), 1),
        "batch": 512,
        "max_memory_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1) if device == "cuda" else None,
    }))
    """
)

# The trainer's stand-in: matrix products on the CPU for the seconds given.
TRAINER_NUMPY = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np

    seconds = float(sys.argv[2])
    a = np.random.default_rng(1).random((256, 256), dtype=np.float32)
    print("ready", flush=True)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a = np.tanh(a @ a)
        steps += 1
    print(json.dumps({"steps_per_second": round(steps / (time.perf_counter() - started), 1), "batch": 256,
                      "max_memory_reserved_mib": None}))
    """
)


@dataclass(frozen=True)
class Setup:
    """One server: ``frontends`` workers, and ``runners`` as --model_runners takes it ("" leaves the default)."""

    model: str
    frontends: int
    runners: str  # "in_process", "1", or "" (the default: a runner per GPU, or one, when frontends > 1)
    beside_trainer: bool = False
    batch_threads: int = 1  # num_batch_threads of the batching parameters

    @property
    def uses_runners(self) -> bool:
        return self.runners not in ("in_process",) and (self.frontends > 1 or self.runners != "")

    @property
    def design(self) -> str:
        return "runners" if self.uses_runners else "in_process"

    @property
    def name(self) -> str:
        design = f"{self.runners} runners" if self.runners.isdigit() and int(self.runners) > 1 else self.design
        threads = f", {self.batch_threads} batch threads" if self.batch_threads != 1 else ""
        return f"{self.model}, {self.frontends} frontend{'s' if self.frontends > 1 else ''}, {design}{threads}"

    def flags(self) -> list[str]:
        flags = [f"--num_workers={self.frontends}"]
        if self.runners:
            flags.append(f"--model_runners={self.runners}")
        return flags


class Framework:
    """The network's code: PyTorch's, or numpy's stand-in for it."""

    def __init__(self, stand_in: bool) -> None:
        self.stand_in = stand_in
        self.name = "numpy (stand-in for PyTorch)" if stand_in else "torch"
        self.source = NETWORK_NUMPY if stand_in else NETWORK
        self.trainer = TRAINER_NUMPY if stand_in else TRAINER

    def write_repository(self, root: Path, devices: list[str]) -> dict[str, Path]:
        """A base path for each ``cnn_<device>``, all with the same weights."""
        module = network_module(root, self.source)
        weights = root / "weights"
        weights.mkdir()
        if self.stand_in:
            np.savez(weights / "weights.npz", **module.random_weights(*CHANNELS))
            files = ["weights.npz"]
        else:
            import torch

            torch.manual_seed(0)
            torch.save(module.digits_cnn(*CHANNELS).state_dict(), weights / "weights.pt")
            files = ["weights.pt"]
        bases: dict[str, Path] = {}
        for device in devices:
            version = root / f"cnn_{device}" / "1"
            version.mkdir(parents=True)
            (version / "model.py").write_text(self.source + MODEL_PY)
            (version / "settings.json").write_text(json.dumps({"device": device, "channels": CHANNELS}))
            for name in files:
                (version / name).write_bytes((weights / name).read_bytes())
            bases[f"cnn_{device}"] = version.parent
        return bases


def network_module(root: Path, source: str) -> Any:
    """The network's definition, imported from a file so that it is the same code model.py runs."""
    import importlib.util

    path = root / "digits_network.py"
    if not path.exists():
        path.write_text(source)
    spec = importlib.util.spec_from_file_location("digits_network", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_process_rates(root: str, batches: list[tuple[str, int]], seconds: float) -> dict[str, Any]:
    """Run in a child process: images/s of the network called directly at each (device, batch), and the machine."""
    module = network_module(Path(root), "")
    info: dict[str, Any] = {}
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.cuda.is_available())
        if info["cuda"]:
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        info.update(torch=None, cuda=False)
    rates: dict[str, float] = {}
    for device, batch in batches:
        if device == "cuda" and not info["cuda"]:
            continue
        net = module.load_network(str(Path(root) / "weights"), CHANNELS, device)
        images = np.random.default_rng(0).random((batch, 784), dtype=np.float32)
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            module.forward(net, device, images)  # the copy back waits for the GPU, as a served answer does
            done += batch
        rates[f"cnn_{device}@{batch}"] = round(done / (time.perf_counter() - started), 1)
    info["rates"] = rates
    return info


def _load_share(args: tuple[str, str, dict[str, np.ndarray], int, float]) -> dict[str, Any]:
    from workbench.client import bench

    bench.CLIENTS_PER_CHANNEL = 1  # a connection a client: 64 connections for the kernel to spread over frontends
    target, model, inputs, clients, duration = args
    cpu = time.process_time()
    result = run_load(target, "grpc", model, inputs, concurrency=clients, duration=duration)
    return {
        "requests": result.requests,
        "errors": result.errors,
        "seconds": result.seconds,
        "ms": result.latencies_ms,
        "cpu": time.process_time() - cpu,
    }


def load(pool: Any, target: str, model: str, inputs: dict[str, np.ndarray], clients: int, duration: float) -> dict:
    """``clients`` requests in flight, spread over the pool's processes; the rates add up."""
    shares = min(clients, CLIENT_PROCESSES)
    started = time.perf_counter()
    parts = pool.map(_load_share, [(target, model, inputs, clients // shares, duration)] * shares)
    wall = time.perf_counter() - started
    errors = sum(p["errors"] for p in parts)
    if errors:
        raise RuntimeError(f"{errors} requests to {model} failed")
    latencies = [ms for p in parts for ms in p["ms"]]
    (images,) = inputs.values()
    busiest = max(p["cpu"] / p["seconds"] for p in parts if p["seconds"])
    return {
        "images_per_second": round(len(images) * sum(p["requests"] / p["seconds"] for p in parts), 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
        # Client processes' CPU over the whole call (warm-up requests and connecting included), in cores.
        "client_cores": round(sum(p["cpu"] for p in parts) / wall, 2),
        "busiest_client_core_share": round(busiest, 2),
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


NVIDIA_SMI = True  # --cpu-only: False


def nvidia_smi(*query: str) -> list[list[str]] | None:
    """nvidia-smi's CSV rows for a query, or None where it cannot be run (or --cpu-only)."""
    if not NVIDIA_SMI:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_memory_used_mib() -> float | None:
    """The whole GPU's memory in use (every process), as nvidia-smi reports it."""
    rows = nvidia_smi("--query-gpu=memory.used")
    return float(rows[0][0]) if rows else None


def gpu_processes() -> list[dict[str, Any]] | None:
    """Each process holding GPU memory: its pid and MiB."""
    rows = nvidia_smi("--query-compute-apps=pid,used_memory")
    if rows is None:
        return None
    out = []
    for row in rows:
        try:
            out.append({"pid": int(row[0]), "mib": float(row[1])})
        except (ValueError, IndexError):
            continue
    return out


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


# Where the CPU goes: the server's processes (from /proc), by role.


def _proc_stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def server_processes(root_pid: int) -> dict[int, str]:
    """The server's process tree, each pid with its role: runner, frontend, or supervisor."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    roles: dict[int, str] = {}
    for pid in tree:
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(w.startswith(b"--runner_of") for w in words):
            roles[pid] = "runner"
        elif any(w.startswith(b"--worker_of") for w in words):
            roles[pid] = "frontend"
        else:
            roles[pid] = "other"
    if root_pid in roles:  # the supervisor, or (one worker without runners) the server itself
        roles[root_pid] = "supervisor" if {"frontend", "runner"} & set(roles.values()) else "frontend"
    return roles


def cpu_seconds(pid: int) -> float:
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def cpu_snapshot(roles: dict[int, str]) -> dict[str, Any]:
    loops = {}
    for pid, role in roles.items():
        if role == "runner":
            with suppress(OSError):
                loops[pid] = loop_cpu_seconds(pid)
    return {
        "time": time.perf_counter(),
        "pids": {pid: cpu_seconds(pid) for pid in roles},
        "loops": loops,
        "machine": machine_cpu(),
    }


def cpu_since(roles: dict[int, str], before: dict[str, Any]) -> dict[str, Any]:
    """Cores used by each role since ``before``; the whole machine's busy share; the runners' event-loop threads."""
    after = cpu_snapshot(roles)
    wall = after["time"] - before["time"]
    by_role: dict[str, float] = {}
    for pid, role in roles.items():
        by_role[role] = by_role.get(role, 0.0) + after["pids"][pid] - before["pids"].get(pid, 0.0)
    busy = after["machine"][0] - before["machine"][0]
    total = after["machine"][1] - before["machine"][1]
    out: dict[str, Any] = {f"{role}_cores": round(seconds / wall, 2) for role, seconds in sorted(by_role.items())}
    out["machine_busy_share"] = round(busy / total, 3) if total else None
    if after["loops"]:
        out["runner_loop_thread_core_share"] = [
            round((after["loops"][pid] - before["loops"].get(pid, 0.0)) / wall, 2) for pid in sorted(after["loops"])
        ]
    return out


def holding_library(pids: list[int], name: str) -> int:
    """How many of ``pids`` have a shared library whose path holds ``name`` mapped (libtorch: the model's code)."""
    count = 0
    for pid in pids:
        try:
            if name in Path(f"/proc/{pid}/maps").read_text():
                count += 1
        except OSError:
            pass
    return count


def stats_mean_batch(rest_url: str, model: str) -> float | None:
    """The server's own ``/workbench/v1/stats`` mean batch size for ``model`` (its rolling 10-second window)."""
    try:
        with urllib.request.urlopen(f"{rest_url}/workbench/v1/stats", timeout=10) as response:
            snapshot = json.loads(response.read())
        versions = snapshot["models"].get(model, {})
        sizes = [entry.get("mean_batch_size") for entry in versions.values() if entry.get("mean_batch_size")]
        return round(float(sizes[0]), 2) if len(sizes) == 1 else None
    except (OSError, KeyError, ValueError):
        return None


class Bench:
    """The run's shared state: where models live, the client pool, what was measured."""

    def start_profiles(self, name: str, roles: dict[int, str]) -> list[subprocess.Popen[bytes]]:
        """With ``--profile DIR``: py-spy samples the runner and one frontend of the largest runner setup while it is
        measured, every thread, into DIR as collapsed stacks (where the processes' time goes, read afterwards)."""
        folder = self.args.profile
        if not folder or "16 frontends, runners" not in name or not shutil.which("py-spy"):
            return []
        runner = next((pid for pid, role in roles.items() if role == "runner"), None)
        frontend = next((pid for pid, role in roles.items() if role == "frontend"), None)
        stem = "".join(c if c.isalnum() else "_" for c in name)
        started = []
        for role, pid in (("runner", runner), ("frontend", frontend)):
            if pid is None:
                continue
            command = ["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(self.duration) - 1)),
                       "--rate", "200", "--format", "raw", "--threads", "--nonblocking",
                       "--output", str(Path(folder) / f"{stem}_{role}.txt")]  # fmt: skip
            started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return started

    def __init__(self, args: argparse.Namespace, root: Path, pool: Any, framework: Framework) -> None:
        self.args, self.root, self.pool, self.framework = args, root, pool, framework
        self.duration: float = args.duration
        self.rows: list[dict[str, Any]] = []
        self.trainer_device = "cpu" if args.cpu_only else "cuda"

    def start_trainer(self, seconds: float) -> tuple[subprocess.Popen[str], float]:
        """The trainer, once it said it is ready; and how long that took."""
        started = time.perf_counter()
        training = subprocess.Popen(
            [sys.executable, "-c", self.framework.trainer, str(self.root), str(seconds), self.trainer_device],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert training.stdout is not None
        ready, _, _ = select.select([training.stdout], [], [], 120)
        line = training.stdout.readline() if ready else ""
        if line.strip() != "ready":
            training.kill()
            _, err = training.communicate()
            raise RuntimeError(f"the trainer did not start:\n{line}{err[-3000:]}")
        return training, time.perf_counter() - started

    def finish_trainer(self, training: subprocess.Popen[str]) -> dict[str, Any]:
        out, err = training.communicate(timeout=60)
        if training.returncode != 0:
            raise RuntimeError(f"the trainer failed:\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])

    def serve(
        self,
        setup: Setup,
        config: Path,
        inputs: dict[str, np.ndarray],
        expected: np.ndarray,
        tolerance: float = 1e-2,
    ) -> list[dict[str, Any]]:
        """One server's rows: 64 clients alone, then (``beside_trainer``) again beside a training process."""
        flags = [
            "--allow_python_models",
            *setup.flags(),
            f"--monitoring_config_file={self.root / 'monitoring.txt'}",
            "--file_system_poll_wait_seconds=0",
            "--enable_batching",
            f"--batching_parameters_file={self.root / batching_file(setup.batch_threads)}",
        ]
        (instances,) = inputs.values()
        body = json.dumps({"instances": instances.tolist()}).encode()
        label: dict[str, Any] = {
            "server": setup.name,
            "model": setup.model,
            "frontends": setup.frontends,
            "model_runners": setup.runners or "default",
            "design": setup.design,
            "batching": "on",
            "num_batch_threads": setup.batch_threads,
            "clients": CLIENTS,
        }
        memory_before = gpu_memory_used_mib()
        server = ServeProcess(config, *flags)
        rows: list[dict[str, Any]] = []
        training: subprocess.Popen[str] | None = None
        try:
            startup = server.wait_for_answer(setup.model, {"instances": instances.tolist()}, timeout=120)
            every_worker_ready(server, setup.model, body, setup.frontends, timeout=120)
            ready = time.perf_counter() - server.started
            served = check_answer(server, setup.model, body, expected, tolerance)
            roles = server_processes(server.proc.pid)
            counts = {role: sum(1 for r in roles.values() if r == role) for role in ("frontend", "runner")}
            if counts["frontend"] != setup.frontends or (counts["runner"] > 0) != setup.uses_runners:
                raise RuntimeError(f"{setup.name}: the server runs {counts}")
            frontends = [pid for pid, role in roles.items() if role == "frontend"]
            memory = {
                "gpu_memory_before_mib": memory_before,
                "gpu_memory_after_load_mib": gpu_memory_used_mib(),
                "gpu_process_mib": (
                    sorted(p["mib"] for p in gpu_processes() or []) if memory_before is not None else None
                ),
                # PyTorch mapped in a frontend: that frontend holds the model itself (no runner does it for it).
                "frontends_with_torch": holding_library(frontends, "libtorch") if not self.framework.stand_in else None,
            }
            if memory_before is not None and memory["gpu_memory_after_load_mib"] is not None:
                memory["gpu_memory_server_mib"] = memory["gpu_memory_after_load_mib"] - memory_before
            load(self.pool, server.grpc_target, setup.model, inputs, CLIENTS, 1.0)  # warm: every frontend, batch sizes
            label.update(
                processes=counts,
                startup_seconds=round(startup, 1),  # spawned to the first answer
                every_frontend_ready_seconds=round(ready, 1),
                answer_max_abs_error=served,
                **memory,
            )
            for beside in [False, True] if setup.beside_trainer else [False]:
                extra: dict[str, Any] = {}
                if beside:
                    training, trainer_start = self.start_trainer(self.duration + 1.5)
                profilers = self.start_profiles(setup.name, roles) if not beside else []
                before = server_counters(server.rest_url, setup.model)
                cpu_before = cpu_snapshot(roles)
                # nvidia-smi every 0.2 s costs CPU the rows measure: sampled beside the trainer only.
                with peak_gpu_memory() if beside else contextlib.nullcontext({}) as peak:
                    measured = load(self.pool, server.grpc_target, setup.model, inputs, CLIENTS, self.duration)
                cpu = cpu_since(roles, cpu_before)
                for profiler in profilers:
                    profiler.wait(timeout=60)
                examples, batches, failed = counters_since(server.rest_url, setup.model, before)
                if failed:
                    raise RuntimeError(f"{failed:.0f} requests to {setup.model} failed")
                if training is not None:
                    extra = {
                        "beside": f"a process training on the same {self.trainer_device.upper()}",
                        "trainer": {**self.finish_trainer(training), "start_seconds": round(trainer_start, 1)},
                        "gpu_memory_peak_mib": peak.get("peak_mib"),
                    }
                    training = None
                rows.append(
                    {
                        **label,
                        **measured,
                        "mean_batch": round(examples / batches, 2) if batches else None,
                        "stats_mean_batch_size": stats_mean_batch(server.rest_url, setup.model),
                        "cpu": cpu,
                        **extra,
                    }
                )
                self.log(rows[-1])
        except Exception as error:  # noqa: BLE001 - the row says why, and the run goes on to the next server
            rows.append({**label, "error": f"{type(error).__name__}: {error}"[-4000:]})
            self.log(rows[-1])
            traceback.print_exc()
        finally:
            if training is not None and training.poll() is None:
                training.kill()
            stopping = time.perf_counter()
            server.stop()
            print(f"[{time.strftime('%H:%M:%S')}] {setup.name}: stopped in {time.perf_counter() - stopping:.1f} s")
        self.rows += rows
        return rows

    def log(self, row: dict[str, Any]) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {json.dumps(row)}", flush=True)


def request_path_rows(root: Path, duration: float, rounds: int = REQUEST_PATH_ROUNDS) -> list[dict[str, Any]]:
    """half_plus_two over gRPC from one Python client process, against bare grpc.aio answering the same messages.

    As benchmarks/request_path.py measures it on the 2-core machine (there with TensorFlow's half_plus_two): here
    the model is the Python one, and the machine is quieter and has 16 cores. The three servers run side by side
    and take turns (a run moves by ~10% on a shared machine); each row is the median round. Only with
    ``--request-path`` (issue 30's targets do not need it).
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


def check_answer(server: ServeProcess, model: str, body: bytes, expected: np.ndarray, tolerance: float) -> float:
    """The served answer against the network's in this process (on the CPU); returns the largest difference."""
    request = urllib.request.Request(f"{server.rest_url}/v1/models/{model}:predict", data=body)
    with urllib.request.urlopen(request, timeout=30) as response:
        served = np.asarray(json.loads(response.read())["predictions"], np.float32)
    error = float(np.max(np.abs(served - expected)))
    # TF32 convolutions on the GPU round differently from the CPU's float32; probabilities stay within 1e-2.
    if error > tolerance:
        raise AssertionError(f"{model} answered {served}, the network in-process {expected}")
    return round(error, 6)


def batching_file(threads: int) -> str:
    return "batching.txt" if threads == 1 else f"batching-{threads}-threads.txt"


def plan(args: argparse.Namespace, main: str) -> list[Setup]:
    """The servers, in order: issue 30's targets first, comparisons after (a run cut short loses those)."""
    counts = [int(n) for n in args.frontends.split(",")]
    small, middle, large = counts[0], counts[len(counts) // 2], counts[-1]
    if args.runner_counts:  # the largest frontends' default against several runners (each its own GIL) only
        return [Setup(main, large, ""), *(Setup(main, large, count) for count in args.runner_counts.split(","))]
    if args.batch_threads:  # the largest frontends' default with several batch threads in its runner, and the
        # request path's ceiling beside them (a model that costs nothing, through the same frontends and runner)
        counts = [int(n) for n in args.batch_threads.split(",")]
        return [*(Setup(main, large, "1", batch_threads=n) for n in counts), Setup("half_plus_two", large, "1")]
    setups = [
        Setup(main, large, ""),  # the default: frontends and a runner
        Setup(main, small, "1"),  # one frontend and a runner
        Setup(main, middle, "", beside_trainer=True),
        Setup(main, large, "in_process"),  # the earlier design
    ]
    if not args.quick:
        setups.append(Setup(main, 1, ""))  # one worker, no runner: the earlier 0.03
        if main != "cnn_cpu":
            setups += [Setup("cnn_cpu", large, ""), Setup("cnn_cpu", large, "in_process")]
        setups += [Setup("half_plus_two", large, "in_process"), Setup("half_plus_two", large, "")]
    return setups


def targets(
    every_row: list[dict[str, Any]],
    limits: dict[str, float],
    main: str,
    large: int,
    small: int,
    trainer_alone: dict[str, Any] | None = None,
) -> dict:
    """Issue 30's targets, each with its value, goal and (where measured) the earlier figure."""
    rows = [r for r in every_row if "images_per_second" in r]  # not those that failed or were skipped

    def row(model: str, frontends: int, design: str, beside: bool = False) -> dict[str, Any] | None:
        for r in rows:
            if (r["model"], r["frontends"], r["design"], "beside" in r) == (model, frontends, design, beside):
                return r
        return None

    def rate(*key: Any) -> float | None:
        r = row(*key)
        return r["images_per_second"] if r else None

    def ratio(num: float | None, den: float | None) -> float | None:
        return round(num / den, 3) if num is not None and den else None

    out: dict[str, Any] = {}
    gpu = main == "cnn_cuda"  # the earlier figures are the GPU model's
    ceiling = limits.get(f"{main}@64")
    share = ratio(rate(main, large, "runners"), ceiling)
    out[f"{main}: {large} frontends with runners / in-process at batch 64"] = {
        "value": share,
        "goal": ">= 0.3",
        "met": share is not None and share >= 0.3,
        "earlier": EARLIER["cnn_cuda 1 worker, batching on: served / in-process at batch 64"] if gpu else None,
        "in_process_images_per_second_at_64": ceiling,
    }
    scaling = ratio(rate(main, large, "runners"), rate(main, small, "runners"))
    out[f"{main}: {large} frontends / {small} with runners"] = {
        "value": scaling,
        "goal": ">= 8",
        "met": scaling is not None and scaling >= 8,
        "earlier": EARLIER["cnn_cuda batching on: 16 workers / 1 worker"] if gpu else None,
    }
    out[f"{main}: images/s by frontends with runners"] = {
        str(r["frontends"]): r["images_per_second"]
        for r in rows
        if r["model"] == main and r["design"] == "runners" and "beside" not in r
    }
    out[f"{main}: {large} frontends, runners / in_process"] = ratio(
        rate(main, large, "runners"), rate(main, large, "in_process")
    )
    out[f"{main}: 1 worker without runners / in-process at batch 64"] = ratio(rate(main, 1, "in_process"), ceiling)
    out["mean batch (requests a batch, Prometheus workbench_batch_size over the load)"] = {
        r["server"]: r.get("mean_batch") for r in rows if "beside" not in r
    }
    out["mean batch (the /workbench/v1/stats snapshot's mean_batch_size, its 10 s window)"] = {
        r["server"]: r.get("stats_mean_batch_size") for r in rows if "beside" not in r
    }
    memory = {
        r["server"]: {
            "card_used_mib": r.get("gpu_memory_after_load_mib"),
            "server_mib": r.get("gpu_memory_server_mib"),
            "processes_mib": r.get("gpu_process_mib"),
            "frontends_with_torch": r.get("frontends_with_torch"),
        }
        for r in rows
        if r["model"] == main and "beside" not in r
    }
    if gpu:
        out["GPU memory after load (the whole card, nvidia-smi)"] = {
            **memory,
            "earlier, MiB, 1 / 4 / 16 workers": EARLIER["GPU memory after load, MiB, 1 / 4 / 16 workers"],
        }
    beside = next((r for r in rows if "beside" in r), None)
    if beside is not None:
        alone = row(main, beside["frontends"], "runners")
        out[f"training beside {beside['frontends']} frontends and a runner"] = {
            "both_finished": True,
            "served_beside / alone": ratio(beside["images_per_second"], alone["images_per_second"] if alone else None),
            "trainer_steps_per_second_beside": beside["trainer"]["steps_per_second"],
            "trainer_steps_per_second_alone": trainer_alone["steps_per_second"] if trainer_alone else None,
            "trainer beside / alone": ratio(
                beside["trainer"]["steps_per_second"], trainer_alone["steps_per_second"] if trainer_alone else None
            ),
            "trainer_max_memory_reserved_mib": beside["trainer"]["max_memory_reserved_mib"],
            "gpu_memory_peak_mib": beside.get("gpu_memory_peak_mib"),
        }
    if main != "cnn_cpu":
        out[f"cnn_cpu: {large} frontends, runners / in_process"] = ratio(
            rate("cnn_cpu", large, "runners"), rate("cnn_cpu", large, "in_process")
        )
    hpt = {design: rate("half_plus_two", large, design) for design in ("in_process", "runners")}
    if any(hpt.values()):
        out[f"half_plus_two (the request path's ceiling here), {large} frontends, requests/s"] = hpt
    failed = [r["server"] for r in every_row if "error" in r or "skipped" in r]
    if failed:
        out["servers that failed or were skipped"] = failed
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 s loads, issue 30's four servers")
    parser.add_argument("--cpu-only", action="store_true", help="the CPU model only, no GPU and no nvidia-smi")
    parser.add_argument("--frontends", default="1,4,16", help="frontend counts: smallest, middle, largest")
    parser.add_argument("--request-path", action="store_true", help="also the 1-worker request-path rows")
    parser.add_argument(
        "--deadline", type=float, default=480, help="seconds: no server is started past this (default 480)"
    )
    parser.add_argument("--numpy-stand-in", action="store_true", help=argparse.SUPPRESS)  # no PyTorch: plumbing
    parser.add_argument("--out", default="", help="results file (default: benchmarks/results/gpu.json)")
    parser.add_argument("--profile", default="", help="py-spy the 16-frontend runner setup into this folder")
    parser.add_argument("--runner-counts", default="", help="only the largest frontends with these runner counts")
    parser.add_argument(
        "--batch-threads", default="", help="only the largest frontends with these num_batch_threads (e.g. 1,2,4)"
    )
    args = parser.parse_args()
    if args.quick:
        args.duration = min(args.duration, 2.0)
    if args.numpy_stand_in:
        args.cpu_only = True
    if args.cpu_only:
        global NVIDIA_SMI
        NVIDIA_SMI = False
    out_path = Path(args.out) if args.out else Path(__file__).parent / "results" / "gpu.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    framework = Framework(args.numpy_stand_in)
    gpu = None if args.cpu_only else nvidia_smi("--query-gpu=name,memory.total,driver_version")
    devices = ["cpu"] if args.cpu_only else ["cuda", "cpu"]
    main_model = f"cnn_{devices[0]}"
    counts = [int(n) for n in args.frontends.split(",")]
    image = {"images": np.random.default_rng(0).random((1, 784), dtype=np.float32)}
    results: dict[str, Any] = {
        "machine": {
            "cpu_cores": os.cpu_count(),
            "gpu": gpu[0] if gpu else None,
            "python": platform.python_version(),
            "framework": framework.name,
        },
        "mode": "quick" if args.quick else ("cpu-only" if args.cpu_only else "full"),
        "load": (
            f"{CLIENTS} gRPC requests in flight (1 image each) from {CLIENT_PROCESSES} processes, a connection a "
            f"client; {args.duration:g} s a measurement after a 1 s warm-up"
        ),
        "batching_parameters": BATCHING.strip(),
    }

    def save() -> None:
        results["wall_seconds"] = round(time.perf_counter() - began, 1)
        out_path.write_text(json.dumps(results, indent=2) + "\n")

    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, spawn.Pool(CLIENT_PROCESSES) as pool:
        root = Path(tmp)
        for threads in {1, *(int(n) for n in args.batch_threads.split(",") if n)}:
            (root / batching_file(threads)).write_text(
                BATCHING.replace("num_batch_threads { value: 1 }", f"num_batch_threads {{ value: {threads} }}")
            )
        (root / "monitoring.txt").write_text(MONITORING)
        bases = framework.write_repository(root, devices)
        module = network_module(root, framework.source)
        net = module.load_network(str(root / "weights"), CHANNELS)
        expected = module.forward(net, "cpu", image["images"])
        # In a child process: this one then holds no CUDA context, and the card's memory is the servers'.
        batches = [("cpu", 64)] if args.cpu_only else [("cuda", 1), ("cuda", 64), ("cpu", 64)]
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
            info = child.submit(in_process_rates, str(root), batches, 1.0 if args.quick else 2.0).result()
        limits: dict[str, float] = info.pop("rates")
        results["machine"].update(info)
        if not args.cpu_only and not info.get("cuda"):
            raise SystemExit("PyTorch sees no CUDA GPU here: run with --cpu-only")
        results["in_process_images_per_second"] = limits
        print(json.dumps(results), flush=True)
        save()

        bench = Bench(args, root, pool, framework)
        if not args.quick:  # the trainer alone, for its rate beside the server
            training, start = bench.start_trainer(args.duration)
            results["trainer_alone"] = {**bench.finish_trainer(training), "start_seconds": round(start, 1)}
            print(json.dumps({"trainer_alone": results["trainer_alone"]}), flush=True)
        configs = {m: write_config(root / f"{m}.config", {m: bases[m]}, platform=None) for m in bases}
        hpt_version = root / "half_plus_two" / "1"
        hpt_version.mkdir(parents=True)
        (hpt_version / "model.py").write_text(HALF_PLUS_TWO_PY)
        configs["half_plus_two"] = write_config(
            root / "half_plus_two.config", {"half_plus_two": hpt_version.parent}, platform=None
        )
        x = {"x": np.array([[2.0]], np.float32)}
        for setup in plan(args, main_model):
            if time.perf_counter() - began > args.deadline:
                bench.rows.append({"server": setup.name, "skipped": f"past --deadline={args.deadline:g} s"})
                print(json.dumps(bench.rows[-1]), flush=True)
                continue
            if setup.model == "half_plus_two":
                bench.serve(setup, configs[setup.model], x, np.array([[3.0]], np.float32))
            else:
                # numpy's float32 sums in another order than PyTorch's: the stand-in checks as closely.
                bench.serve(setup, configs[setup.model], image, expected)
            results["rows"] = bench.rows
            results["targets"] = targets(
                bench.rows, limits, main_model, counts[-1], counts[0], results.get("trainer_alone")
            )
            save()
        if args.request_path:
            results["request_path"] = request_path_rows(root, args.duration, 1 if args.quick else REQUEST_PATH_ROUNDS)
            save()
    print(json.dumps(results["targets"], indent=2))
    print(f"results: {out_path} ({results['wall_seconds']} s)")


if __name__ == "__main__":
    main()
