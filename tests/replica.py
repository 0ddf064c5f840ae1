"""``workbench serve`` processes for tests about several replicas (on a local repository or an object store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests
from waiting import version_states, wait_until

ONE = {"instances": [[1.0]]}
MODELS = "/workbench/v1/models"
START_TIMEOUT_S = 240  # TensorFlow's import on a loaded 2-core machine
REACH_TIMEOUT_S = 60  # a change reaches a replica within a poll; generous for a loaded machine
REPO_ROOT = Path(__file__).resolve().parents[1]


class Replica:
    """``python -m workbench serve FLAGS`` on free ports, found through its ready file.

    ``env`` adds to the environment (another replica's credentials); ``prefix`` is a command the replica runs
    under (one that makes the repository read-only to it).
    """

    def __init__(
        self, workdir: Path, *flags: str, env: dict[str, str] | None = None, prefix: list[str] | None = None
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready_file = workdir / "ready.json"
        self.log_path = workdir / "server.log"
        environment = dict(os.environ, **(env or {}), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        environment["HOME"] = str(workdir)
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), environment.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "workbench", "serve", "--rest_api_port=-1", "--port=0"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*(prefix or []), *command, f"--ready_file={self.ready_file}", *flags],
                cwd=workdir, env=environment, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.rest_url = self.grpc_target = ""

    def wait_ready(self) -> Replica:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the replica exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return self.ready_file.exists()

        wait_until(ready, timeout=START_TIMEOUT_S, interval=0.1, what="the replica to answer")
        ports = json.loads(self.ready_file.read_text())
        self.rest_url = f"http://127.0.0.1:{ports['rest_port']}"
        self.grpc_target = f"127.0.0.1:{ports['grpc_port']}"
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)

    # the management API
    def model(self, name: str) -> dict[str, Any]:
        r = requests.get(f"{self.rest_url}{MODELS}/{name}", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def manage(self, target: str, body: object = None) -> requests.Response:
        return requests.post(f"{self.rest_url}{MODELS}/{target}", json=body or {}, timeout=120)

    def predict(self, name: str) -> str:
        return requests.post(f"{self.rest_url}/v1/models/{name}:predict", json=ONE, timeout=30).text

    def states(self, name: str) -> dict[str, str]:
        return version_states(self.rest_url, name)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a server drains), then SIGKILL if it has not exited within a minute."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def process_memory(pid: int) -> dict[str, int]:
    """A process's memory in bytes, from /proc/PID/status: ``VmRSS`` (resident now), ``VmHWM`` (its peak) …"""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.startswith("Vm") and value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def resident_bytes(pid: int) -> int:
    """The process's resident set (``VmRSS``)."""
    return process_memory(pid)["VmRSS"]
