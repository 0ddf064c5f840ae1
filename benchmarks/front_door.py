"""The front door: workbench beside NVIDIA Triton itself, and beside the bare Python stacks, with compiled load clients.

Run: `.venv/bin/python benchmarks/front_door.py [--duration S] [--rounds R] [--scenarios NAME ...]
[--workbench_flags=--http_server=granian] [--baseline_tree DIR [--baseline_flags=FLAGS]] [--venvs DIR]`
Writes benchmarks/results/front_door.json (or ``--out``). Optional: not part of `make test`. About 15 minutes with
the defaults on 2 cores once the venv exists (``--quick``: 2 s rows, one round, about 4). The first run creates the
Triton venv (below) under ``--venvs`` (default ``$XDG_CACHE_HOME/workbench-peers`` or ``~/.cache/workbench-peers``,
shared with benchmarks/peers.py); later runs reuse it.

**Triton**, from PyPI's ``nvidia-pytriton`` wheel (0.7.0 carries ``tritonserver`` 2.51.0: its C++ HTTP and gRPC
frontends, the dynamic batcher, the Python backend and its stubs), installed with ``--no-deps`` into a venv of its
own (``<venvs>/triton``) beside scikit-learn of this interpreter's version and numpy 1.26 (the backend's stub is
built with pybind11 against numpy 1: with numpy 2 every output it sends fails "output tensor shape does not match
size of output", its dtype sizes read from numpy 1's struct layout). Started directly, not through PyTriton's API:
``pytriton/tritonserver/bin/tritonserver --model-repository=… --backend-directory=<venv>/triton-backends``, whose
``python/`` holds the wheel's ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the stub of this
Python (``python_backend_stubs/3.11/triton_python_backend_stub``); ``LD_LIBRARY_PATH`` the wheel's
``nvidia_pytriton.libs`` and the base interpreter's libpython directory; the venv's ``bin`` first on ``PATH``, so
that the stub finds the venv's packages. One Python-backend model per estimator (``model.py`` below): the very
joblib file workbench serves, ``predict`` called once per batch (workbench's sklearn platform answers ``predict``
as ``predictions``, INT64), ``max_batch_size: 64``, ``dynamic_batching { max_queue_delay_microseconds: 1000 }``,
``instance_group [{ kind: KIND_CPU, count: 1 }]``, ``response_cache { enable: false }``; and the logistic
regression once more as ``light_nobatch``, without ``dynamic_batching`` (each request its own run).

**Load clients**, compiled, one a row: ``perf_analyzer`` 2.51.0 (Triton's C++ client; PyPI's ``perf-analyzer`` is a
placeholder, but the manylinux ``tritonclient`` wheels carry ``bin/perf_analyzer`` up to at least 2.55: 2.51.0, the
server's release, is installed with ``--no-deps`` into the same venv; it needs ``libb64.so.0d`` and
``libcudart.so.12``, found as symlinks in ``<venv>/perf_analyzer_libs`` to the copies the pytriton wheel bundles) for
the Open Inference Protocol over HTTP (binary tensors, as it sends them) and gRPC, and TF Serving's gRPC Predict
(``--service-kind tfserving``; its sync API: it has no other there); time windows (``-p`` a third of ``--duration``,
``-s 999`` so that three windows always count, merged as it reports them); requests of the digits rows
(``--input-data``: JSON for the Open Inference Protocol, raw files for TF Serving's, whose JSON tensors perf_analyzer
sends without their values). ``wrk`` (``apt-get install wrk``) for every JSON body: TF Serving REST ``:predict``
(``{"instances": [[64 floats]]}``) and the v2 JSON body Triton and workbench both take, so that TF Serving REST is
compared with Triton through the same client. Without perf_analyzer its rows are left out, with the reason.

**Servers**, all up at once for the whole run and taking turns (every measurement once a round, the order reversed
every other round, each row the median round by requests/s), so that a burst of other work on a shared machine
falls on all of them: Triton; `workbench serve` with batching (``--enable_batching``, max_batch_size 64,
batch_timeout_micros 0 or ``--batch_timeout_micros``, one batch thread) and without, each serving ``light``,
``heavy`` and ``half_plus_two`` (``--workbench_flags`` are added to both; ``--baseline_tree DIR`` serves that
checkout's workbench too, a before and after in one run, with ``--baseline_flags`` instead where given:
``--baseline_tree . --baseline_flags=--model_runners=1`` is a flag's effect in one run);
benchmarks/request_path.py's bare stacks answering half_plus_two's answer without a model: a Starlette app on
uvicorn (httptools, uvloop) and a grpc.aio PredictionService (which answers perf_analyzer's one GetModelMetadata
with workbench's own answer).

Scenarios (``--scenarios``): ``light-1x32`` (the logistic regression, 1 row a request, 32 connections, batching on),
``light-32x32`` (32 rows a request), ``heavy-1x32`` (the random forest, milliseconds a call whatever the batch),
``light-1x1-off`` (1 connection, batching off: Triton's ``light_nobatch``, workbench without batching),
``hp2-rest`` and ``hp2-grpc`` (half_plus_two at 32 connections, batching off and on, against the bare stacks).

Every row: requests/s, p50 and p99 ms (the client's), errors, the server's CPU ms per request (its process and every
process below it, Triton's stubs included, read from /proc before and after) and the client's (its rusage). For
perf_analyzer the requests a CPU time is divided by are its rate times its run (its windows are back to back; the
few ms of its start count against it). Before any load, every server's answers are checked: Triton's and
workbench's labels (TF Serving REST and v2) equal scikit-learn's in this process for each model, row by row and
32 rows at once; half_plus_two's answers equal the bare stacks' fixed ones. The targets of issue 46 are judged in
``targets`` (workbench over Triton, over the bare stacks), each with the rows it compares.

On a 2-core machine the clients share the cores with every server (the idle ones cost nothing): absolute figures
move with the machine (``load_average`` in the JSON), and the ratios, measured in the same minutes, are the result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import BATCHING, ServeProcess, free_port, save_results, stop_process, taking_turns, tree_cpu_seconds
from peers import ensure_venv, tfs_body, train_models, v2_body, versions, wrk_load
from request_path import HP2, HP2_REST_ANSWER, Child, answers_rest, bare_predict_response, grpc_answer

from workbench.demo import save_half_plus_two

# The Triton venv: the server's wheel and the client's, both wanted for their binaries only (--no-deps: their Python
# sides pin numpy < 2 and other packages nothing here uses); numpy 1 for the Python backend's stub.
TRITON_WHEELS = ("nvidia-pytriton==0.7.0", "tritonclient==2.51.0")
TRITON_REQUIREMENTS = ("numpy==1.26.4",)
REPORTED = ("nvidia-pytriton", "tritonclient", "numpy", "scikit-learn", "joblib")
# perf_analyzer's shared libraries by the names it asks for, and the pytriton wheel's copies (auditwheel renames them).
PERF_ANALYZER_LIBS = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}
MAX_BATCH = 64
QUEUE_DELAY_US = 1000
SKLEARN = ("light", "heavy")
NOBATCH = "light_nobatch"  # Triton's logistic regression without dynamic batching

TRITON_CONFIG = """backend: "python"
max_batch_size: {max_batch}
input [{{ name: "x" data_type: TYPE_FP64 dims: [64] }}]
output [{{ name: "predictions" data_type: TYPE_INT64 dims: [1] reshape: {{ shape: [] }} }}]
{batching}instance_group [{{ kind: KIND_CPU count: 1 }}]
response_cache {{ enable: false }}
"""

# What workbench's sklearn platform answers for serving_default: predict's labels as INT64, once per batch.
TRITON_MODEL = '''import os

import joblib
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The estimator's predict, called once per batch Triton's dynamic batcher forms; each request its rows back."""

    def initialize(self, args):
        version = os.path.join(args["model_repository"], args["model_version"])
        self.estimator = joblib.load(os.path.join(version, "model.joblib"))

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]
        rows = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
        labels = self.estimator.predict(rows).astype(np.int64)
        responses, start = [], 0
        for batch in inputs:
            answer = pb_utils.Tensor("predictions", labels[start : start + len(batch)])
            responses.append(pb_utils.InferenceResponse(output_tensors=[answer]))
            start += len(batch)
        return responses
'''


# ============================================================================================ Triton, installed
@dataclass(frozen=True)
class TritonInstall:
    """Where the Triton venv keeps what the run starts: the server, its backends, its libraries, perf_analyzer."""

    python: Path
    server: Path
    backends: Path  # a folder whose python/ holds the Python backend and this Python's stub
    libraries: tuple[Path, ...]  # LD_LIBRARY_PATH: the wheel's bundled libraries, the base interpreter's libpython
    perf_analyzer: Path | None
    perf_analyzer_libs: Path | None
    stub: str  # the stub's Python version

    def server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*map(str, self.libraries), env.get("LD_LIBRARY_PATH", "")])
        env["PATH"] = os.pathsep.join([str(self.python.parent), env.get("PATH", "")])  # the stub finds the venv
        return env

    def client_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.perf_analyzer_libs is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join([str(self.perf_analyzer_libs), env.get("LD_LIBRARY_PATH", "")])
        return env


def install_triton(venvs: Path, log: Callable[[str], None]) -> TritonInstall:
    """The Triton venv (created on first use) and the folders the server is started with."""
    python = ensure_venv("triton", venvs, log, TRITON_REQUIREMENTS, TRITON_WHEELS)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    wheel = site / "pytriton" / "tritonserver"
    stub = ".".join(map(str, sys.version_info[:2]))  # the venv's Python is this interpreter's base
    backend = python.parent.parent / "triton-backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for source in (
        wheel / "backends" / "python" / "libtriton_python.so",
        wheel / "backends" / "python" / "triton_python_backend_utils.py",
        wheel / "python_backend_stubs" / stub / "triton_python_backend_stub",
    ):
        if not source.exists():
            raise RuntimeError(f"the nvidia-pytriton wheel has no {source.relative_to(site)}")
        # Copied beside, then renamed over: another run's Triton may be running the stub (overwriting a running
        # executable in place fails, ETXTBSY), and the rename leaves its open file alone.
        staged = backend / f".{source.name}.{os.getpid()}"
        shutil.copy2(source, staged)
        os.replace(staged, backend / source.name)
    bundled = site / "nvidia_pytriton.libs"
    libpython = Path(sysconfig.get_config_var("LIBDIR") or "")
    if not (libpython / str(sysconfig.get_config_var("INSTSONAME"))).exists():
        raise RuntimeError(f"no shared libpython in {libpython}: the Python backend's stub needs one")
    # perf_analyzer from the tritonclient wheel (its bin/), with the two libraries it does not bundle.
    perf = python.parent / "perf_analyzer"
    perf_libs: Path | None = python.parent.parent / "perf_analyzer_libs"
    assert perf_libs is not None
    perf_libs.mkdir(exist_ok=True)
    for name, pattern in PERF_ANALYZER_LIBS.items():
        found = sorted(bundled.glob(pattern))
        link = perf_libs / name
        if found and not link.exists():
            link.symlink_to(found[0])
    return TritonInstall(
        python=python,
        server=wheel / "bin" / "tritonserver",
        backends=backend.parent,
        libraries=(bundled, libpython),
        perf_analyzer=perf if perf.exists() else None,
        perf_analyzer_libs=perf_libs,
        stub=stub,
    )


def perf_analyzer_runs(install: TritonInstall) -> str | None:
    """None where ``perf_analyzer --version`` runs here, else why not."""
    if install.perf_analyzer is None:
        return "the tritonclient wheel installed no bin/perf_analyzer"
    done = subprocess.run(
        [str(install.perf_analyzer), "--version"], capture_output=True, text=True, env=install.client_env()
    )
    return None if done.returncode == 0 else f"perf_analyzer --version failed: {(done.stdout + done.stderr)[-500:]}"


def triton_repository(folder: Path, estimators: dict[str, Path]) -> Path:
    """Triton's model repository: a Python-backend model per estimator (its joblib file hard-linked, so the very
    file workbench serves), dynamic batching on; and the logistic regression once more without it."""
    models = {**{name: (path, True) for name, path in estimators.items()}, NOBATCH: (estimators["light"], False)}
    for name, (estimator, batching) in models.items():
        version = folder / name / "1"
        version.mkdir(parents=True)
        os.link(estimator, version / "model.joblib")
        (version / "model.py").write_text(TRITON_MODEL)
        queue = f"dynamic_batching {{ max_queue_delay_microseconds: {QUEUE_DELAY_US} }}\n" if batching else ""
        (folder / name / "config.pbtxt").write_text(TRITON_CONFIG.format(max_batch=MAX_BATCH, batching=queue))
    return folder


class TritonProcess:
    """``tritonserver`` as a child, its own session (so that its stubs go with it), its log in a file."""

    def __init__(self, install: TritonInstall, repository: Path, log: Path) -> None:
        self.http_port, self.grpc_port, metrics = free_port(), free_port(), free_port()
        self.log_path = log
        command = [
            str(install.server), f"--model-repository={repository}", f"--backend-directory={install.backends}",
            "--http-address=127.0.0.1", f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
            "--allow-gpu-metrics=false", "--exit-timeout-secs=10",
        ]  # fmt: skip
        self.command = command
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                command, env=install.server_env(), cwd=repository, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, models: list[str], timeout: float = 180) -> None:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if all(_status(f"{self.url}/v2/models/{m}/ready") == 200 for m in models):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"tritonserver's models were not ready in {timeout:.0f} s:\n{self.log()}")

    def log(self, tail: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        stop_process(self.proc)
        with contextlib.suppress(ProcessLookupError):  # stubs left behind, if any
            os.killpg(self.proc.pid, signal.SIGKILL)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def post_json(url: str, body: bytes) -> Any:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


# ============================================================================================ the load clients
def perf_analyzer_load(
    install: TritonInstall,
    target: str,
    model: str,
    protocol: str,
    connections: int,
    seconds: float,
    input_data: Path,
    shape: tuple[int, int],
    work: Path,
    batched: bool = True,
) -> dict[str, Any]:
    """One perf_analyzer run at ``connections`` (its concurrency, sync API): three windows of ``seconds`` / 3,
    always taken as stable (``-s 999``), which it merges. ``protocol``: "http" or "grpc" (the Open Inference
    Protocol) or "tfserving" (TF Serving's gRPC Predict: ``input_data`` a folder of raw values); ``shape``: a
    request's rows and their width. ``batched``: the model's config has a max_batch_size (perf_analyzer's
    ``-b``); without one (workbench without batching) the request's whole shape is given (``--shape``) and the input
    data is shaped."""
    assert install.perf_analyzer is not None
    batch, width = shape
    csv = work / f"pa-{os.getpid()}-{time.monotonic_ns()}.csv"
    window_ms = max(200, round(seconds * 1000 / 3))
    command = [
        str(install.perf_analyzer), "-m", model, "-u", target, f"--concurrency-range={connections}",
        f"--measurement-interval={window_ms}", "--stability-percentage=999", "--max-trials=3",
        f"--input-data={input_data}", "-f", str(csv),
    ]  # fmt: skip
    if protocol == "tfserving":  # input_data is a folder of raw values (perf_analyzer_data): their shape is given
        command += ["-i", "grpc", "--service-kind=tfserving", f"--shape=x:{batch},{width}"]
    elif batched:
        command += ["-i", protocol, f"-b{batch}"]
    else:
        command += ["-i", protocol, f"--shape=x:{batch},{width}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 4 + 120, env=install.client_env())
    lines = csv.read_text().splitlines() if csv.exists() else []
    csv.unlink(missing_ok=True)
    if done.returncode != 0 or len(lines) < 2:
        raise RuntimeError(f"perf_analyzer failed (exit {done.returncode}): {(done.stdout + done.stderr)[-1500:]}")
    row = dict(zip(lines[0].split(","), lines[1].split(","), strict=True))
    rate = float(row["Inferences/Second"]) / (1 if protocol == "tfserving" else batch)
    return {
        "requests_per_second": round(rate, 1),
        "p50_ms": round(float(row["p50 latency"]) / 1000, 3),
        "p90_ms": round(float(row["p90 latency"]) / 1000, 3),
        "p99_ms": round(float(row["p99 latency"]) / 1000, 3),
        "errors": 0,  # perf_analyzer stops at the first failed request (and this run raises)
    }


def perf_analyzer_data(work: Path, rows: list[list[float]]) -> dict[str, Path]:
    """perf_analyzer's ``--input-data``: for the Open Inference Protocol, JSON files of the digits rows as a stream
    (a batch takes consecutive rows) and as one row a request; for TF Serving's gRPC Predict, folders holding each
    input's values as one raw little-endian file (sent with their shape, ``--shape``): the digits' first row
    and all 32 as float64, half_plus_two's x = [[2.0]] as float32. Not JSON there: perf_analyzer 2.51's tfserving
    client sends a JSON file's tensors with their dtype and shape but no values (TF Serving reads such a tensor as
    zeros), where it sends a folder's values."""
    files = {
        "v2": {"data": [{"x": row} for row in rows]},
        "v2-1": {"data": [{"x": {"content": row, "shape": [1, len(row)]}} for row in rows]},
    }
    paths = {}
    for name, data in files.items():
        paths[name] = work / f"input-{name}.json"
        paths[name].write_text(json.dumps(data))
    folders = {"tfs-1": np.asarray(rows[:1], "<f8"), f"tfs-{len(rows)}": np.asarray(rows, "<f8"),
               "hp2": np.asarray([[2.0]], "<f4")}  # fmt: skip
    for name, values in folders.items():
        paths[name] = work / f"input-{name}"
        paths[name].mkdir(exist_ok=True)
        values.tofile(paths[name] / "x")
    return paths


# ============================================================================================ what is measured
@dataclass(frozen=True)
class Target:
    """A server under load: whose CPU a request costs (``pid`` and everything below it), where it answers."""

    server: str  # "Triton", "workbench", "workbench (baseline)", "bare Starlette/uvicorn", "bare grpc.aio"
    batching: bool | None  # None: the server has no batching
    pid: int
    http: str | None = None  # base URL
    grpc: str | None = None  # host:port


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    model: str  # workbench's model name (Triton's, but for NOBATCH)
    rows: int
    connections: int
    batching: bool


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("light-1x32", "logistic regression, 1 row, 32 connections, batching on", "light", 1, 32, True),
        Scenario("light-32x32", "logistic regression, 32 rows, 32 connections, batching on", "light", 32, 32, True),
        Scenario("heavy-1x32", "random forest, 1 row, 32 connections, batching on", "heavy", 1, 32, True),
        Scenario("light-1x1-off", "logistic regression, 1 row, 1 connection, batching off", "light", 1, 1, False),
        Scenario("hp2-rest", "half_plus_two, TF Serving REST, 32 connections", HP2, 1, 32, False),
        Scenario("hp2-grpc", "half_plus_two, TF Serving gRPC, 32 connections", HP2, 1, 32, False),
    )
}
TFS_REST, V2_REST, V2_GRPC, TFS_GRPC = "TF Serving REST", "v2 REST", "v2 gRPC", "TF Serving gRPC"


@dataclass(frozen=True)
class Case:
    """One row: a scenario on one server, through one protocol and client."""

    scenario: Scenario
    target: Target
    protocol: str
    client: str  # "wrk" or "perf_analyzer"


@dataclass
class Context:
    """What every measurement needs: the work folder, perf_analyzer (or None), its input files, the digits rows."""

    work: Path
    triton: TritonInstall | None
    pa_inputs: dict[str, Path]
    rows: list[list[float]]


def cases_of(scenario: Scenario, targets: list[Target], perf: bool) -> list[Case]:
    """The rows of ``scenario`` on each server it runs on (perf_analyzer's only where ``perf``)."""
    found: list[Case] = []
    for target in targets:
        wanted: list[tuple[str, str]] = []
        if scenario.model == HP2:  # workbench (batching off and on) and the bare stack of the protocol
            rest = scenario.name == "hp2-rest"
            if target.server.startswith("workbench") or target.server == ("bare Starlette/uvicorn" if rest else
                                                                          "bare grpc.aio"):  # fmt: skip
                wanted = [(TFS_REST, "wrk")] if rest else [(TFS_GRPC, "perf_analyzer")]
        elif target.server == "Triton":
            wanted = [(V2_REST, "wrk"), (V2_REST, "perf_analyzer"), (V2_GRPC, "perf_analyzer")]
        elif target.server.startswith("workbench"):
            if target.batching != scenario.batching:
                continue
            wanted = [(TFS_REST, "wrk"), (V2_REST, "wrk"), (V2_REST, "perf_analyzer"), (V2_GRPC, "perf_analyzer"),
                      (TFS_GRPC, "perf_analyzer")]  # fmt: skip
        found += [Case(scenario, target, p, c) for p, c in wanted if perf or c != "perf_analyzer"]
    return found


def measure(case: Case, seconds: float, context: Context) -> dict[str, Any]:
    """One measurement of ``case``: the client's figures, the server's and the client's CPU per request."""
    s, target = case.scenario, case.target
    model = NOBATCH if target.server == "Triton" and not s.batching else s.model
    rows = context.rows[: s.rows]
    row: dict[str, Any] = {
        "scenario": s.name,
        "server": target.server,
        "batching": s.batching if target.server == "Triton" else target.batching,
        "protocol": case.protocol,
        "client": case.client,
        "model": model,
        "rows_a_request": s.rows,
        "connections": s.connections,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    cpu0, client0, began = tree_cpu_seconds(target.pid), _children_cpu(), time.perf_counter()
    try:
        if case.client == "wrk":
            if s.model == HP2:
                url, body = f"{target.http}/v1/models/{HP2}:predict", json.dumps({"inputs": {"x": [[2.0]]}}).encode()
            elif case.protocol == TFS_REST:
                url, body = f"{target.http}/v1/models/{model}:predict", tfs_body(rows)
            else:
                url, body = f"{target.http}/v2/models/{model}/infer", v2_body(rows)
            result = wrk_load(url, body, s.connections, max(1, round(seconds)), 1, context.work)
            requests = result.pop("requests")
        else:
            assert context.triton is not None
            # workbench without batching has no max_batch_size: each request's whole shape is given.
            batched = target.server == "Triton" or bool(target.batching)
            if case.protocol == TFS_GRPC:
                data = context.pa_inputs["hp2" if s.model == HP2 else f"tfs-{s.rows}"]
                where, kind = target.grpc, "tfserving"
            else:
                data = context.pa_inputs["v2" if batched or s.rows != 1 else "v2-1"]
                where, kind = (target.http or "").removeprefix("http://"), "http"
                if case.protocol == V2_GRPC:
                    where, kind = target.grpc, "grpc"
            shape = (s.rows, 1 if s.model == HP2 else 64)
            result = perf_analyzer_load(
                context.triton, str(where), model, kind, s.connections, seconds, data, shape, context.work, batched
            )
            requests = result["requests_per_second"] * (time.perf_counter() - began)
    except Exception as exc:  # noqa: BLE001 - the row records why; the others go on
        return {**row, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
    server_cpu, client_cpu = tree_cpu_seconds(target.pid) - cpu0, _children_cpu() - client0
    row.update(result)
    if requests:
        row["server_cpu_ms_per_request"] = round(server_cpu / requests * 1000, 4)
        row["client_cpu_ms_per_request"] = round(client_cpu / requests * 1000, 4)
    return row


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for children (the load clients; the servers are waited for at the end)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


# ============================================================================================ answers, checked
def check_answers(
    triton: TritonProcess | None, workbenches: dict[str, ServeProcess], reference: dict[str, Any]
) -> dict[str, Any]:
    """Every server's labels against scikit-learn's in this process, for each model, one row at a time and all the
    rows at once; half_plus_two's answers against the bare stacks' (checked by the caller for those)."""
    rows = reference["rows"]
    checked: dict[str, Any] = {}
    for model in SKLEARN:
        expected = reference["models"][model]["labels"]
        batches = [[row] for row in rows[:5]] + [rows]
        for name, server in workbenches.items():
            tfs = [v for b in batches for v in post_json(f"{server.rest_url}/v1/models/{model}:predict", tfs_body(b))
                   ["predictions"]]  # fmt: skip
            v2 = [post_json(f"{server.rest_url}/v2/models/{model}/infer", v2_body(b))["outputs"][0] for b in batches]
            for got, protocol in ((tfs, TFS_REST), ([v for o in v2 for v in o["data"]], V2_REST)):
                if got != expected[:5] + expected:
                    raise AssertionError(f"{name} {protocol} {model}: {got}, scikit-learn {expected[:5] + expected}")
            checked[f"{name} {model}"] = {"v2_output": {k: v2[-1][k] for k in ("name", "datatype", "shape")}}
        if triton is not None:
            for served in (model, NOBATCH) if model == "light" else (model,):
                outputs = [post_json(f"{triton.url}/v2/models/{served}/infer", v2_body(b))["outputs"][0]
                           for b in batches]  # fmt: skip
                got = [v for o in outputs for v in o["data"]]
                if got != expected[:5] + expected:
                    raise AssertionError(f"Triton {served}: {got}, scikit-learn {expected[:5] + expected}")
                checked[f"Triton {served}"] = {"v2_output": {k: outputs[-1][k] for k in ("name", "datatype", "shape")}}
    for name, server in workbenches.items():
        assert answers_rest(server.rest_port), f"{name}: half_plus_two's REST answer is not {HP2_REST_ANSWER}"
        assert grpc_answer(server.grpc_target) == bare_predict_response(), f"{name}: half_plus_two's gRPC answer"
    checked["equal"] = (
        f"labels of {len(rows[:5])} single rows and of {len(rows)} rows at once equal scikit-learn's in this "
        "process, for every server, model and protocol; half_plus_two's answers equal the bare stacks' fixed ones"
    )
    checked["shapes"] = (
        "Triton answers the labels as [rows, 1]: with max_batch_size > 0 an output must declare dims (here [1], "
        "reshape [] for the model's side); workbench answers [rows]"
    )
    return checked


def _label(key: str) -> str:
    """``workbench|True`` (a key of the workbench servers) as ``workbench, batching on``."""
    name, batching = key.split("|")
    return f"{name}, batching {'on' if batching == 'True' else 'off'}"


def grpc_metadata(target: str) -> bytes:
    """workbench's GetModelMetadata answer for half_plus_two, serialized (the bare gRPC server answers it)."""
    import grpc

    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = HP2
    with grpc.insecure_channel(target) as channel:
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
    return bytes(answer.SerializeToString())


# ============================================================================================ ratios and targets
def find(rows: list[dict[str, Any]], scenario: str, server: str, protocol: str, client: str, batching: Any = "any"):
    return next(
        (
            r
            for r in rows
            if r["scenario"] == scenario
            and r["server"] == server
            and r["protocol"] == protocol
            and r["client"] == client
            and (batching == "any" or r["batching"] == batching)
            and r.get("requests_per_second")
        ),
        None,
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def judge(rows: list[dict[str, Any]], workbench: str = "workbench") -> list[dict[str, Any]]:
    """Issue 46's targets, each with the figures it compares and whether it is met (None: a row is missing)."""
    found: list[dict[str, Any]] = []

    def add(target: str, ours: dict | None, theirs: dict | None, key: str, want: float, higher: bool) -> None:
        ratio = _ratio(ours.get(key) if ours else None, theirs.get(key) if theirs else None)
        found.append(
            {
                "target": target,
                "figure": key,
                "workbench": ours and {k: ours.get(k) for k in ("server", "protocol", "client", "batching", key)},
                "against": theirs and {k: theirs.get(k) for k in ("server", "protocol", "client", "batching", key)},
                "ratio": ratio,
                "want": f"{'>=' if higher else '<='} {want}",
                "met": None if ratio is None else (ratio >= want if higher else ratio <= want),
            }
        )

    rate, p50, p99, cpu = "requests_per_second", "p50_ms", "p99_ms", "server_cpu_ms_per_request"
    pairs = [  # (workbench's row, Triton's row): the same client and body kind
        ((TFS_REST, "wrk"), (V2_REST, "wrk")),
        ((V2_REST, "perf_analyzer"), (V2_REST, "perf_analyzer")),
        ((V2_REST, "wrk"), (V2_REST, "wrk")),
        ((V2_GRPC, "perf_analyzer"), (V2_GRPC, "perf_analyzer")),
    ]
    for (p, c), (tp, tc) in pairs:
        ours, theirs = find(rows, "light-1x32", workbench, p, c), find(rows, "light-1x32", "Triton", tp, tc)
        want = 1.0 if p == TFS_REST else 0.9
        add(f"light 1 row x32: {p} ({c}) >= {want}x Triton's requests/s", ours, theirs, rate, want, True)
        add(f"light 1 row x32: {p} ({c}) server CPU a request <= Triton's", ours, theirs, cpu, 1.0, False)
    for (p, c), (tp, tc) in pairs:
        ours, theirs = find(rows, "heavy-1x32", workbench, p, c), find(rows, "heavy-1x32", "Triton", tp, tc)
        add(f"heavy 1 row x32: {p} ({c}) >= 1.0x Triton's requests/s", ours, theirs, rate, 1.0, True)
        add(f"heavy 1 row x32: {p} ({c}) p99 <= Triton's", ours, theirs, p99, 1.0, False)
    for (p, c), (tp, tc) in pairs:
        ours, theirs = find(rows, "light-1x1-off", workbench, p, c), find(rows, "light-1x1-off", "Triton", tp, tc)
        add(f"light 1 row x1, batching off: {p} ({c}) p50 <= Triton's", ours, theirs, p50, 1.0, False)
    for batching in (False, True):
        on = "on" if batching else "off"
        bare = find(rows, "hp2-rest", "bare Starlette/uvicorn", TFS_REST, "wrk")
        ours = find(rows, "hp2-rest", workbench, TFS_REST, "wrk", batching)
        add(f"half_plus_two REST (wrk), batching {on}: >= 1.0x bare Starlette on uvicorn", ours, bare, rate, 1.0, True)
        bare = find(rows, "hp2-grpc", "bare grpc.aio", TFS_GRPC, "perf_analyzer")
        ours = find(rows, "hp2-grpc", workbench, TFS_GRPC, "perf_analyzer", batching)
        add(f"half_plus_two gRPC (perf_analyzer), batching {on}: >= 0.9x bare grpc.aio", ours, bare, rate, 0.9, True)
    for r in rows:
        if r["server"] == workbench and r["connections"] == 32 and r.get(p50) and r["scenario"] in (
            "light-1x32", "light-32x32", "heavy-1x32"
        ):  # fmt: skip
            ratio = round(r[p99] / r[p50], 2)
            found.append(
                {
                    "target": f"{r['scenario']}: {r['protocol']} ({r['client']}) p99 <= 3x p50",
                    "figure": "p99_ms / p50_ms",
                    "workbench": {k: r.get(k) for k in ("protocol", "client", p50, p99)},
                    "ratio": ratio,
                    "want": "<= 3",
                    "met": ratio <= 3,
                }
            )
    return found


def over_triton(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every workbench row over Triton's of the same scenario and client (REST over REST, gRPC over gRPC)."""
    found = []
    for r in rows:
        if (
            not r["server"].startswith("workbench")
            or r["scenario"].startswith("hp2")
            or not r.get("requests_per_second")
        ):
            continue
        family = V2_GRPC if "gRPC" in r["protocol"] else V2_REST
        theirs = find(rows, r["scenario"], "Triton", family, r["client"])
        if theirs is None:
            continue
        found.append(
            {
                "scenario": r["scenario"],
                "server": r["server"],
                "protocol": r["protocol"],
                "client": r["client"],
                "triton_protocol": family,
                "requests_per_second": _ratio(r["requests_per_second"], theirs["requests_per_second"]),
                "p50": _ratio(r.get("p50_ms"), theirs.get("p50_ms")),
                "p99": _ratio(r.get("p99_ms"), theirs.get("p99_ms")),
                "server_cpu_per_request": _ratio(
                    r.get("server_cpu_ms_per_request"), theirs.get("server_cpu_ms_per_request")
                ),
            }
        )
    return found


def print_rows(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> None:
    line = "{:<14} {:<22} {:<5} {:<16} {:<14} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}"
    print("\n" + line.format("scenario", "server", "batch", "protocol", "client", "req/s", "p50 ms", "p99 ms",
                             "srv ms/r", "cli ms/r", "errors"))  # fmt: skip
    for r in rows:
        if "error" in r and not r.get("requests_per_second"):
            print(f"{r['scenario']:<14} {r['server']:<22} {r['protocol']} ({r['client']}): {r['error'][:200]}")
            continue
        batching = "n/a" if r["batching"] is None else "on" if r["batching"] else "off"
        print(line.format(r["scenario"], r["server"], batching, r["protocol"], r["client"],
                          f"{r['requests_per_second']:,.0f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                          f"{r.get('server_cpu_ms_per_request', 0):.3f}",
                          f"{r.get('client_cpu_ms_per_request', 0):.3f}", r.get("errors", 0)))  # fmt: skip
    print()
    for t in targets:
        met = "n/a" if t["met"] is None else "met" if t["met"] else "MISSED"
        print(f"{met:<7} {t['ratio']!s:>7} ({t['want']})  {t['target']}")


# ============================================================================================ the run
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds a measurement (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each row is the median round (default 3)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of each load before the first round")
    parser.add_argument("--quick", action="store_true", help="2 s measurements, one round")
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument(
        "--workbench_flags",
        default="",
        help="more `workbench serve` flags, e.g. --workbench_flags=--http_server=granian",
    )
    parser.add_argument(
        "--batch_timeout_micros", type=int, default=0,
        help="workbench's batch_timeout_micros (default 0; Triton's max_queue_delay_microseconds is 1000)",
    )  # fmt: skip
    parser.add_argument("--baseline_tree", type=Path, default=None, help="also serve this checkout's workbench")
    parser.add_argument(
        "--baseline_flags", default=None,
        help="the baseline's `workbench serve` flags instead of --workbench_flags: with --baseline_tree . a flag's "
        'effect in one run, e.g. --baseline_flags=--model_runners=1 (with "=": the value begins with a dash)',
    )  # fmt: skip
    parser.add_argument("--no_triton", action="store_true", help="leave Triton out (and perf_analyzer with it)")
    parser.add_argument("--venvs", type=Path, default=None, help="where the peers' venvs live")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (models, servers' logs)")
    parser.add_argument("--out", type=Path, default=None, help="results file (default front_door.json)")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = min(args.duration, 2.0), 1
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: stop every server
    began = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f} s] {message}", flush=True)

    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk): every REST row needs it")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venvs = (args.venvs or cache / "workbench-peers").expanduser().resolve()
    venvs.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="workbench-front-door-"))
    triton_info: dict[str, Any] = {}
    install: TritonInstall | None = None
    triton: TritonProcess | None = None
    workbenches: dict[str, ServeProcess] = {}
    bare: dict[str, Child] = {}
    try:
        reference = train_models(work / "trained", 32, SKLEARN)
        for m in SKLEARN:
            log(f"model {m}: in-process predict, ms at batch 1 / 32: {reference['models'][m]['in_process_ms']}")
        estimators = {m: Path(reference["models"][m]["path"]) for m in SKLEARN}

        # Triton: installed (or why not), its repository, started.
        perf_reason: str | None = "Triton left out (--no_triton), and perf_analyzer with it" if args.no_triton else None
        if args.no_triton:
            triton_info["skipped"] = "--no_triton"
        else:
            try:
                install = install_triton(venvs, log)
                triton_info["versions"] = versions(install.python, REPORTED)
                perf_reason = perf_analyzer_runs(install)
                repository = triton_repository(work / "triton-models", estimators)
                triton = TritonProcess(install, repository, work / "triton.log")
                triton_info.update(
                    command=" ".join(triton.command),
                    env={k: install.server_env()[k] for k in ("LD_LIBRARY_PATH",)}
                    | {"PATH (first)": str(install.python.parent)},
                    backend=sorted(p.name for p in (install.backends / "python").iterdir()),
                    stub_python=install.stub,
                    config_pbtxt={m: (repository / m / "config.pbtxt").read_text() for m in (*SKLEARN, NOBATCH)},
                    model_py=TRITON_MODEL,
                )
            except Exception as exc:  # noqa: BLE001 - Triton is skipped with its reason; the rest goes on
                triton_info["skipped"] = f"{type(exc).__name__}: {exc}"[-2000:]
                log(f"Triton: SKIPPED: {triton_info['skipped']}")
                if install is None:
                    perf_reason = "Triton's venv could not be made (see triton.skipped)"
        if perf_reason:
            log(f"perf_analyzer: not used: {perf_reason}")

        # workbench: batching on and off (and the baseline tree's), one repository of the same files.
        repository = work / "workbench-models"
        for m, path in estimators.items():
            (repository / m / "1").mkdir(parents=True)
            os.link(path, repository / m / "1" / "model.joblib")
        save_half_plus_two(repository / HP2 / "1")
        config = work / "models.config"
        platforms = {**dict.fromkeys(SKLEARN, "sklearn"), HP2: "tensorflow"}
        entries = [f'  config {{ name: "{m}" base_path: "{repository / m}" model_platform: "{p}" }}\n'
                   for m, p in platforms.items()]  # fmt: skip
        config.write_text("model_config_list {\n" + "".join(entries) + "}\n")
        timeout = f"batch_timeout_micros {{ value: {args.batch_timeout_micros} }}"
        (work / "batching.txt").write_text(BATCHING.replace("batch_timeout_micros { value: 0 }", timeout))
        batching_flags = ["--enable_batching", f"--batching_parameters_file={work / 'batching.txt'}"]
        extra = ["--allow_pickle", "--num_load_threads=1"]
        baseline_flags = args.workbench_flags if args.baseline_flags is None else args.baseline_flags
        trees: dict[str, tuple[Path | None, str]] = {"workbench": (None, args.workbench_flags)}
        if args.baseline_tree is not None:
            trees["workbench (baseline)"] = (args.baseline_tree.resolve(), baseline_flags)
        for name, (tree, own_flags) in trees.items():
            for batching in (True, False):
                flags = [*extra, *shlex.split(own_flags), *(batching_flags if batching else [])]
                workbenches[f"{name}|{batching}"] = ServeProcess(config, *flags, tree=tree)
        rest_port = free_port()
        bare["rest"] = Child("bare-rest-uvicorn", rest_port, log=work / "bare-rest.log")

        if triton is not None:
            try:
                triton.wait_ready([*SKLEARN, NOBATCH])
                log("Triton: ready")
            except Exception as exc:  # noqa: BLE001 - as above
                triton_info["skipped"] = f"{type(exc).__name__}: {exc}"[-3000:]
                log(f"Triton: SKIPPED: {triton_info['skipped']}")
                triton.stop()
                triton = None
        for name, server in workbenches.items():
            server.wait_for_answer(HP2, {"instances": [[1.0]]})
            for m in SKLEARN:
                server.wait_for_answer(m, {"instances": reference["rows"][:1]})
            log(f"{_label(name)}: ready")
        first = workbenches["workbench|False"]
        metadata = work / "hp2-metadata.bin"
        metadata.write_bytes(grpc_metadata(first.grpc_target))
        grpc_port = free_port()
        bare["grpc"] = Child("bare-grpc", grpc_port, metadata, log=work / "bare-grpc.log")
        bare["rest"].wait(lambda: answers_rest(rest_port))
        bare["grpc"].wait(lambda: grpc_answer(f"127.0.0.1:{grpc_port}") == bare_predict_response())
        checked = check_answers(triton, {_label(k): v for k, v in workbenches.items()}, reference)
        log("answers checked: " + checked["equal"])

        targets: list[Target] = []
        if triton is not None:
            targets.append(Target("Triton", True, triton.proc.pid, triton.url, f"127.0.0.1:{triton.grpc_port}"))
        for name, server in workbenches.items():
            label, on = name.split("|")
            targets.append(Target(label, on == "True", server.proc.pid, server.rest_url, server.grpc_target))
        targets.append(Target("bare Starlette/uvicorn", None, bare["rest"].proc.pid, f"http://127.0.0.1:{rest_port}"))
        targets.append(Target("bare grpc.aio", None, bare["grpc"].proc.pid, grpc=f"127.0.0.1:{grpc_port}"))
        context = Context(work, install if not perf_reason else None, perf_analyzer_data(work, reference["rows"]),
                          reference["rows"])  # fmt: skip
        cases = [c for s in args.scenarios for c in cases_of(SCENARIOS[s], targets, context.triton is not None)]
        log(f"{len(cases)} measurements a round, {args.rounds} rounds of {args.duration:g} s each")
        for case in cases:  # every server, connection pool and code path warm before the first round
            measure(case, args.warmup, context)
        log("warmed up")
        loads: list[list[float]] = []

        def measurement(case: Case) -> Callable[[], dict[str, Any]]:
            def run() -> dict[str, Any]:
                row = measure(case, args.duration, context)
                if row.get("requests_per_second"):
                    log(f"  {row['scenario']} {row['server']} {row['protocol']} ({row['client']}): "
                        f"{row['requests_per_second']:,.0f} req/s, p99 {row['p99_ms']:.2f} ms")  # fmt: skip
                else:
                    log(f"  {row['scenario']} {row['server']} {row['protocol']} ({row['client']}): {row.get('error')}")
                if case is cases[0]:
                    loads.append([round(v, 2) for v in os.getloadavg()])
                return row

            return run

        rows = taking_turns(args.rounds, [measurement(c) for c in cases])
        targets_met = judge(rows)
        baseline = judge(rows, "workbench (baseline)") if args.baseline_tree is not None else None
        print_rows(rows, targets_met)
        payload = {
            "benchmark": "workbench's front door beside Triton (same models and compiled clients), and the bare stacks",
            "command": " ".join(["benchmarks/front_door.py", *sys.argv[1:]]),
            "duration_s": args.duration,
            "rounds": args.rounds,
            "workbench_flags": args.workbench_flags,
            "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
            "baseline_flags": baseline_flags if args.baseline_tree else None,
            "machine": {
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
                "load_average_before": [round(v, 2) for v in load_before],
                "load_average_each_round": loads,
                "load_average_after": [round(v, 2) for v in os.getloadavg()],
                "wrk": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0].strip(),
            },
            "clients": {
                "wrk": "one thread, keep-alive connections, the body fixed (JSON)",
                "perf_analyzer": perf_reason
                or f"{install.perf_analyzer if install else ''} (tritonclient 2.51.0 wheel), sync API, "
                "-p duration/3 -s 999 -r 3, --input-data digits rows",
            },
            "models": {m: {k: v for k, v in reference["models"][m].items() if "path" not in k} for m in SKLEARN},
            "triton": triton_info,
            "workbench_batching_parameters": " ".join((work / "batching.txt").read_text().split()),
            "checked": checked,
            "rows": rows,
            "targets": targets_met,
            "baseline_targets": baseline,
            "workbench_over_triton": over_triton(rows),
            "wall_seconds": round(time.perf_counter() - began, 1),
            "note": "Servers and clients share the machine's cores; read the ratios, measured in the same minutes.",
        }
        if args.out is not None:
            args.out.write_text(json.dumps(payload, indent=2) + "\n")
            path = args.out
        else:
            path = save_results("front_door", payload)
        log(f"wrote {path}")
    finally:
        if triton is not None:
            triton.stop()
        for server in workbenches.values():
            server.stop()
        for child in bare.values():
            child.stop()
        if args.keep:
            log(f"models and servers' logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
