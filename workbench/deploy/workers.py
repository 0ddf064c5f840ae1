"""``workbench serve --num_workers N``: a supervisor, N worker processes on the same ports, and the model runners.

One Python process answers on about one core (its event loop), so N workers serve N cores' worth. The supervisor
imports neither gRPC nor TensorFlow (neither survives a fork); it starts each worker as a fresh
``python -m workbench serve ... --worker_of=RUN_DIR --worker_index=I`` process. Every worker binds the same REST
and gRPC ports with SO_REUSEPORT (the kernel spreads new connections among them), loads the models and batches on
its own, and answers for the whole server (:mod:`workbench.observability.whole_server`). Routing changes reach every
worker through the repository's routing state (``routing.json`` beside each model's versions), which each polls.

The supervisor holds the ports from the start (bound with SO_REUSEPORT, never listening: it takes no connection),
so a free port it picks (``--port=0``, ``--rest_api_port=-1``) stays this server's while workers come and go. It
writes the ready file once every worker is ready, restarts a worker that dies (logged, with a growing pause if it
keeps dying), and on SIGTERM or SIGINT has every worker drain as one process does, then exits 0. A second signal
is passed on: the workers exit at once, and so does the supervisor (128 + the signal's number).

With model runners (``--model_runners``: by default one per GPU when N is above 1, none without GPUs), the workers
are frontends: they answer the wire and route, and hand each request to a runner, which holds every model version once
and batches what all workers send it (:mod:`workbench.runners`). The supervisor starts the runners first (each
``workbench serve ... --runner_of=RUN_DIR --runner_index=I``, GPU I's only with CUDA_VISIBLE_DEVICES), the workers
once the runners listen; it restarts a runner that dies as it restarts a worker (the workers fail what was in
flight on it with UNAVAILABLE and load their versions again once it is back), and stops the runners after the
workers drained. Without runners (no GPU, or ``--model_runners=in_process``) the workers are shared-nothing: each
loads the models and batches on its own.

Each worker's TensorFlow thread pools (and OpenMP's, for the other frameworks) get cores // N threads, so N workers
do not fight over the cores (with runners, each runner gets cores // runners); variables already set in the
environment are left as they are.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workbench.config.serve_options import resolve_num_workers as resolve_num_workers  # --num_workers, read
from workbench.runtime.process import available_cores, parent_gone, visible_gpus, write_json_atomically

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often the supervisor looks at its workers (not on any request's path)
STEADY_S = 30.0  # a worker that ran this long before dying is restarted at once; sooner, after a growing pause
MAX_PAUSE_S = 30.0
STOP_MARGIN_S = 30.0  # beyond --drain_seconds, before workers still running are killed


def thread_environment(num_workers: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of each worker: thread pools sized to its share of the cores, unless already set."""
    env = dict(os.environ if environ is None else environ)
    share = str(max(1, available_cores() // num_workers))
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(name, share)
    env["PYTHONUNBUFFERED"] = "1"  # workers' log lines reach the supervisor's output as they are written
    return env


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind ``port`` (0: a free one) with SO_REUSEPORT without listening: the workers bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"Could not bind {host}:{port}: {exc.strerror}") from None
    return sock


@dataclass
class _Worker:
    index: int
    kind: str = "worker"  # or "runner"
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0  # deaths in a row, each soon after its start
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Runs ``num_workers`` copies of ``workbench serve <serve_args>`` as one server."""

    serve_args: Sequence[str]  # the command line's words after ``serve``
    num_workers: int
    host: str
    grpc_port: int
    rest_api_port: int  # 0: REST off; -1: a free port
    openai_port: int = 0  # 0: OpenAI's endpoints on the REST port; -1: a free port of their own
    drain_seconds: float = 30.0
    ready_file: str = ""
    parent_pid: int = 0
    model_runners: int = 0  # 0: shared-nothing workers
    _workers: list[_Worker] = field(default_factory=list)
    _runners: list[_Worker] = field(default_factory=list)
    _signals: list[signal.Signals] = field(default_factory=list)

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT (or the parent's exit); the exit code, as ``workbench serve``'s."""
        grpc_socket = reserve_port(self.host, self.grpc_port)
        rest_socket = reserve_port(self.host, max(self.rest_api_port, 0)) if self.rest_api_port != 0 else None
        self.grpc_port = grpc_socket.getsockname()[1]
        self.rest_api_port = rest_socket.getsockname()[1] if rest_socket is not None else 0
        # Picked once here, so every worker joins the same port.
        openai_socket = reserve_port(self.host, max(self.openai_port, 0)) if self.openai_port != 0 else None
        self.openai_port = openai_socket.getsockname()[1] if openai_socket is not None else 0
        run_dir = Path(tempfile.mkdtemp(prefix="workbench-workers-"))
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            log.info(
                "Starting %d workers on gRPC port %d%s",
                self.num_workers,
                self.grpc_port,
                f" and REST port {self.rest_api_port}" if rest_socket is not None else "",
            )
            self._runners = [_Worker(index, "runner") for index in range(self.model_runners)]
            self._workers = [_Worker(index) for index in range(self.num_workers)]
            env = thread_environment(self.num_workers)
            if self._runners:
                code = self._start_runners(run_dir)
                if code is not None:
                    return code
            for worker in self._workers:
                self._start(worker, run_dir, env)
            return self._supervise(run_dir, env)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for worker in [*self._workers, *self._runners]:  # only after a failure: a normal end has waited for them
                if worker.process is not None and worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait()
            grpc_socket.close()
            if rest_socket is not None:
                rest_socket.close()
            if openai_socket is not None:
                openai_socket.close()
            shutil.rmtree(run_dir, ignore_errors=True)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signal.Signals(signum))

    def _command(self, worker: _Worker, run_dir: Path) -> list[str]:
        # argparse keeps a flag's last value: these override whatever the command line said.
        common = [
            sys.executable, "-m", "workbench", "serve", *self.serve_args,
            f"--num_workers={self.num_workers}",
            f"--parent_pid={os.getpid()}",  # it stops when the supervisor is gone, even killed -9
        ]  # fmt: skip
        if worker.kind == "runner":
            return [
                *common,
                f"--model_runners={self.model_runners}",
                f"--runner_of={run_dir}",
                f"--runner_index={worker.index}",
            ]
        return [
            *common,
            f"--port={self.grpc_port}",
            f"--rest_api_port={self.rest_api_port}",
            f"--openai_port={self.openai_port}",
            f"--model_runners={self.model_runners or 'in_process'}",
            f"--worker_of={run_dir}",
            f"--worker_index={worker.index}",
            f"--ready_file={self._worker_ready_file(run_dir, worker.index)}",
        ]

    @staticmethod
    def _worker_ready_file(run_dir: Path, index: int) -> Path:
        return run_dir / f"worker-{index}.ready.json"

    def _runner_environment(self, index: int) -> dict[str, str]:
        """A runner's environment: its share of the cores, and its GPU alone (runner i drives GPU i mod the GPUs)."""
        env = thread_environment(self.model_runners)
        gpus = visible_gpus()
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
        return env

    def _start_runners(self, run_dir: Path) -> int | None:
        """Start every runner and wait until each listens; the exit code to return if one cannot start."""
        from workbench.runners.runner import ready_path

        for runner in self._runners:
            self._start(runner, run_dir, self._runner_environment(runner.index))
        while not all(ready_path(run_dir, runner.index).exists() for runner in self._runners):
            for runner in self._runners:
                code = runner.process.poll() if runner.process is not None else None
                if code is not None:
                    log.error("Model runner %d exited with status %d while starting: stopping", runner.index, code)
                    self._stop("a model runner could not start")
                    return code or 1
            if self._signals:
                return self._stop(self._signals[0].name)
            time.sleep(POLL_S / 4)
        log.info("%d model runners listening", len(self._runners))
        return None

    def _start(self, worker: _Worker, run_dir: Path, env: dict[str, str]) -> None:
        if worker.kind == "runner":
            from workbench.runners.runner import ready_path

            ready_path(run_dir, worker.index).unlink(missing_ok=True)
        else:
            self._worker_ready_file(run_dir, worker.index).unlink(missing_ok=True)
        # Its own process group: a Ctrl-C at the terminal reaches the supervisor only, which has each worker
        # drain once (the terminal's signal and ours would be two, and a second signal exits at once).
        worker.process = subprocess.Popen(self._command(worker, run_dir), env=env, stdin=subprocess.DEVNULL,
                                          process_group=0)  # fmt: skip
        worker.started = time.monotonic()
        worker.restart_at = None
        what = "Model runner" if worker.kind == "runner" else "Worker"
        log.info("%s %d started (pid %d)", what, worker.index, worker.process.pid)

    def _supervise(self, run_dir: Path, env: dict[str, str]) -> int:
        ready = False
        while True:
            if self._signals:
                return self._stop(self._signals[0].name)
            if self.parent_pid and parent_gone(self.parent_pid):
                log.warning("Parent process %d is gone: stopping", self.parent_pid)
                return self._stop("parent exited")
            for worker in self._workers:
                code = worker.process.poll() if worker.process is not None else None
                if worker.process is not None and code is not None:
                    if not ready:  # a worker that cannot start (a bad flag, port or config): the server cannot
                        log.error("Worker %d exited with status %d while starting: stopping", worker.index, code)
                        self._stop("a worker could not start")
                        return code or 1
                    self._schedule_restart(worker, code)
                if worker.restart_at is not None and time.monotonic() >= worker.restart_at:
                    self._start(worker, run_dir, env)
            for runner in self._runners:
                code = runner.process.poll() if runner.process is not None else None
                if runner.process is not None and code is not None:
                    self._schedule_restart(runner, code)
                if runner.restart_at is not None and time.monotonic() >= runner.restart_at:
                    self._start(runner, run_dir, self._runner_environment(runner.index))
            if not ready and all(self._worker_ready_file(run_dir, w.index).exists() for w in self._workers):
                ready = True
                log.info("All %d workers ready", self.num_workers)
                if self.ready_file:
                    self._write_ready_file(run_dir)
            time.sleep(POLL_S)

    def _schedule_restart(self, worker: _Worker, code: int) -> None:
        ran = time.monotonic() - worker.started
        worker.failures = worker.failures + 1 if ran < STEADY_S else 0
        pause = min(MAX_PAUSE_S, 0.5 * 2**worker.failures) if worker.failures else 0.0
        how = f"signal {-code}" if code < 0 else f"status {code}"
        assert worker.process is not None
        log.warning(
            "%s %d (pid %d) exited with %s after %.1fs: restarting it%s",
            "Model runner" if worker.kind == "runner" else "Worker",
            worker.index,
            worker.process.pid,
            how,
            ran,
            f" in {pause:.1f}s" if pause else "",
        )
        worker.process = None
        worker.restart_at = time.monotonic() + pause

    def _write_ready_file(self, run_dir: Path) -> None:
        content = json.loads(self._worker_ready_file(run_dir, 0).read_text())
        content["pid"] = os.getpid()
        content["workers"] = [
            {"index": w.index, "pid": w.process.pid if w.process is not None else None} for w in self._workers
        ]
        content["runners"] = [
            {"index": r.index, "pid": r.process.pid if r.process is not None else None} for r in self._runners
        ]
        write_json_atomically(self.ready_file, content)

    def _stop(self, cause: str) -> int:
        """Every worker drains (SIGTERM) at once; wait for them. Returns 0, or the first worker's failure."""
        live = [w for w in self._workers if w.process is not None and w.process.poll() is None]
        log.info("Stopping (%s): %d workers drain", cause, len(live))
        for worker in live:
            assert worker.process is not None
            worker.process.send_signal(signal.SIGTERM)
        handled = len(self._signals)
        deadline = time.monotonic() + self.drain_seconds + STOP_MARGIN_S
        while any(w.process is not None and w.process.poll() is None for w in live):
            if len(self._signals) > handled:  # a second signal: pass it on, and every worker exits at once
                sig = self._signals[-1]
                log.warning("Second %s: the workers exit at once", sig.name)
                for worker in live:
                    if worker.process is not None and worker.process.poll() is None:
                        worker.process.send_signal(sig)
                for worker in live:
                    if worker.process is not None:
                        worker.process.wait()
                return 128 + sig.value
            if time.monotonic() > deadline:
                log.error("Workers still running %.0fs after the drain budget: killing them", STOP_MARGIN_S)
                return 1  # run() kills them on its way out
            time.sleep(POLL_S)
        codes = [w.process.returncode for w in live if w.process is not None]
        self._stop_runners()
        log.info("Stopped")
        return next((code for code in codes if code not in (0, None)), 0)

    def _stop_runners(self) -> None:
        """The workers are gone, and with them every request: the runners close their models and exit."""
        live = [r for r in self._runners if r.process is not None and r.process.poll() is None]
        for runner in live:
            assert runner.process is not None
            runner.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_MARGIN_S
        for runner in live:
            assert runner.process is not None
            try:
                runner.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("Model runner %d did not stop: killing it", runner.index)
                runner.process.kill()
                runner.process.wait()
