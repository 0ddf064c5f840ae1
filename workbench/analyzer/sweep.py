"""Serving each candidate and measuring it: a ``workbench serve`` of its own per candidate, on free ports, with the
model's versions linked into a folder of its own beside the candidate's ``batching_parameters.txt`` (so the model's
own file, if it has one, does not decide instead); then perf_analyzer's measurement at each concurrency, and what
the server's processes used meanwhile (CPU, memory, and GPU memory where there is a GPU).

Brute force measures every candidate at every concurrency. The quick search climbs each candidate's concurrencies
and stops when a step gains less than 5% throughput or the p99 passes the latency budget: past either, a higher
concurrency only adds queueing, as the frontier has flattened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.analyzer.candidates import Candidate
from workbench.client import perf

QUICK_GAIN = 1.05  # a step up in concurrency must gain this much throughput for the quick search to go on
READY_SECONDS = 180.0


@dataclasses.dataclass(frozen=True)
class Measured:
    """One candidate at one load: a concurrency (closed loop), or a request rate (open loop)."""

    candidate: Candidate
    concurrency: int | None
    inferences_per_second: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    queue_us: int | None  # the server's, per request
    compute_us: int | None
    avg_batch: float | None
    stable: bool
    errors: int
    cpu_cores: float | None  # the server's processes, busy cores while measured
    memory_mib: float | None  # their resident memory after the point
    gpu_memory_mib: float | None  # theirs on the GPU (None without one)
    request_rate: float | None = None

    @property
    def load(self) -> str:
        """The load it was measured at, in words."""
        return (
            f"concurrency {self.concurrency}" if self.concurrency is not None else f"{self.request_rate:g} requests/s"
        )

    def row(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.name,
            **dataclasses.asdict(self.candidate),
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "candidate"},
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def staged(model: str, base_path: Path, candidate: Candidate, folder: Path) -> Path:
    """A base path for ``model`` holding links to its versions and the candidate's batching parameters."""
    staged_path = folder / model
    if staged_path.exists():
        shutil.rmtree(staged_path)
    staged_path.mkdir(parents=True)
    for entry in base_path.iterdir():
        if entry.name != "batching_parameters.txt":
            (staged_path / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    if candidate.batching:
        (staged_path / "batching_parameters.txt").write_text(candidate.batching_parameters_text())
    return staged_path


@dataclasses.dataclass
class Served:
    rest_url: str
    grpc_target: str
    process: subprocess.Popen[bytes]

    def target(self, protocol: str) -> str:
        """Where a load of ``protocol`` is sent."""
        from workbench.client.protocols import GRPC_PROTOCOLS, canonical_protocol

        return self.grpc_target if canonical_protocol(protocol) in GRPC_PROTOCOLS else self.rest_url


@contextlib.contextmanager
def serving(
    model: str, base_path: Path, candidate: Candidate, folder: Path, flags: Sequence[str] = ()
) -> Iterator[Served]:
    """``workbench serve`` of ``model`` as ``candidate`` says, ready; stopped (its whole process group) after."""
    path = staged(model, base_path, candidate, folder)
    rest, grpc_port = free_port(), free_port()
    log = open(folder / f"serve-{rest}.log", "wb")  # noqa: SIM115 - closed below, after the process
    command = [
        sys.executable, "-m", "workbench", "serve", f"--model_name={model}", f"--model_base_path={path}",
        f"--port={grpc_port}", f"--rest_api_port={rest}", *candidate.serve_flags(), *flags,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    served = Served(f"http://127.0.0.1:{rest}", f"127.0.0.1:{grpc_port}", process)
    try:
        _wait_ready(served, model, folder / f"serve-{rest}.log")
        yield served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


def _wait_ready(served: Served, model: str, log: Path) -> None:
    import requests

    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            raise RuntimeError(f"workbench serve exited with {served.process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            answer = requests.get(f"{served.rest_url}/v1/models/{model}", timeout=5)
            statuses = answer.json().get("model_version_status", []) if answer.status_code == 200 else []
            if any(status.get("state") == "AVAILABLE" for status in statuses):
                return
        time.sleep(0.2)
    raise RuntimeError(f"{model} did not become available in {READY_SECONDS:.0f} s: {log.read_text()[-2000:]}")


class ProcessTree:
    """The server's processes (the one started and its children): CPU time, resident and GPU memory. Read with
    psutil where it is installed (Jupyter's installs bring it); without it, those figures are left out."""

    def __init__(self, pid: int) -> None:
        try:
            import psutil
        except ImportError:
            self._root: Any = None
            return
        self._root = psutil.Process(pid)

    def _all(self) -> list[Any]:
        if self._root is None:
            return []
        import psutil

        with contextlib.suppress(psutil.Error):
            return [self._root, *self._root.children(recursive=True)]
        return []

    @property
    def readable(self) -> bool:
        return self._root is not None

    def cpu_seconds(self) -> float:
        if not self.readable:
            return 0.0
        import psutil

        total = 0.0
        for process in self._all():
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def memory_mib(self) -> float:
        if not self.readable:
            return 0.0
        import psutil

        total = 0
        for process in self._all():
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total / 2**20

    def gpu_memory_mib(self) -> float | None:
        """Their memory on the GPU, from nvidia-smi (None where there is none)."""
        if shutil.which("nvidia-smi") is None:
            return None
        pids = {process.pid for process in self._all()}
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        used = [
            float(mib) for pid, mib in (line.split(",") for line in out.splitlines() if "," in line) if int(pid) in pids
        ]
        return sum(used)


def measure_candidate(
    served: Served,
    model: str,
    inputs: Sequence[Mapping[str, np.ndarray]],
    candidate: Candidate,
    loads: Sequence[perf.Point],
    stability: perf.Stability,
    quick: bool,
    latency_budget_ms: float | None,
    on_point: Callable[[Measured], None] | None = None,
    protocol: str = "rest",
) -> list[Measured]:
    """``candidate`` at each load (concurrencies, or request rates), loaded over ``protocol`` (the quick search stops
    where the frontier flattens)."""
    tree = ProcessTree(served.process.pid)
    found: list[Measured] = []
    best = 0.0
    for load in loads:
        cpu, wall = tree.cpu_seconds(), time.perf_counter()
        (result,) = perf.run_measurement(served.target(protocol), protocol, model, inputs, [load], stability)
        cores = (tree.cpu_seconds() - cpu) / (time.perf_counter() - wall)
        (row,) = perf.perf_rows([result])
        measured = Measured(
            candidate=candidate,
            concurrency=load.concurrency,
            request_rate=load.request_rate,
            inferences_per_second=round(result.inferences_per_second, 2),
            p50_ms=round(result.latency_us(50) / 1000, 3),
            p90_ms=round(result.latency_us(90) / 1000, 3),
            p95_ms=round(result.latency_us(95) / 1000, 3),
            p99_ms=round(result.latency_us(99) / 1000, 3),
            avg_ms=round(result.mean_latency_us / 1000, 3),
            queue_us=row["Server Queue"],
            compute_us=row["Server Compute Infer"],
            avg_batch=row["Avg Batch"],
            stable=result.stable,
            errors=result.errors,
            cpu_cores=round(cores, 3) if tree.readable else None,
            memory_mib=round(tree.memory_mib(), 1) if tree.readable else None,
            gpu_memory_mib=tree.gpu_memory_mib(),
        )
        found.append(measured)
        if on_point is not None:
            on_point(measured)
        if quick:
            over_budget = latency_budget_ms is not None and measured.p99_ms > latency_budget_ms
            if over_budget or measured.inferences_per_second < best * QUICK_GAIN:
                break
        best = max(best, measured.inferences_per_second)
    return found
