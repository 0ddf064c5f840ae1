"""The real ``mlflow models serve`` as a test's reference: started on a model folder, ready when ``/ping`` answers."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import requests

from tests.waiting import wait_until

# A busy 2-core machine imports MLflow, pandas and scikit-learn slowly: readiness is polled up to this long.
START_SECONDS = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_models_serve(model: Path, log: Path) -> Iterator[str]:
    """``mlflow models serve --env-manager local -m MODEL`` on 127.0.0.1, yielding its URL once it answers /ping."""
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)  # MLflow starts `uvicorn` by name
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    command = [sys.executable, "-m", "mlflow", "models", "serve", "--env-manager", "local"]
    command += ["-m", str(model), "-p", str(port), "-h", "127.0.0.1"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"mlflow models serve exited {process.returncode}: {log.read_text()[-3000:]}")
            return requests.get(f"{url}/ping", timeout=5).status_code == 200

        wait_until(ready, timeout=START_SECONDS, interval=0.25, what="mlflow models serve's /ping")
        yield url
    finally:
        # Its process group: MLflow's CLI runs uvicorn as a child.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            process.wait(timeout=30)
