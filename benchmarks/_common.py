"""Shared pieces of the benchmarks: models built on the spot, and a `workbench serve` child process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BATCHING = """
max_batch_size { value: 64 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 1 }
"""
MONITORING = 'prometheus_config { enable: true path: "/metrics" }\n'


def server_counters(rest_url: str, model: str) -> tuple[float, float, float]:
    """(examples, batches, failed requests) so far for ``model``, from the server's Prometheus metrics.

    Deltas over a run give its mean batch size (workbench_batch_size's sum / count) and how many of its requests
    failed (TF Serving's request_count with a status other than OK or CANCELLED: h2load cancels the requests it has
    in flight when its time is up, and the server counts those as its client cancelled them).
    """
    text = urllib.request.urlopen(f"{rest_url}/metrics", timeout=10).read().decode()
    examples = batches = failed = 0.0
    for line in text.splitlines():
        value = line.rsplit(" ", 1)[-1]
        if line.startswith("workbench_batch_size_sum") and f'model="{model}"' in line:
            examples += float(value)
        elif line.startswith("workbench_batch_size_count") and f'model="{model}"' in line:
            batches += float(value)
        elif (
            line.startswith(":tensorflow:serving:request_count")
            and f'model_name="{model}"' in line
            and 'status="OK"' not in line
            and 'status="CANCELLED"' not in line
        ):
            failed += float(value)
    return examples, batches, failed


def counters_since(rest_url: str, model: str, before: tuple[float, float, float]) -> tuple[float, float, float]:
    """(examples, batches, failed requests) for ``model`` since ``before`` (an earlier :func:`server_counters`)."""
    after = server_counters(rest_url, model)
    examples, batches, failed = (a - b for a, b in zip(after, before, strict=True))
    return examples, batches, failed


def loop_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the main thread of process ``pid`` has used: the thread of a server's event loop,
    which a Python server's throughput is bound by. Read from Linux's /proc, to a clock tick (10 ms)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) every thread of process ``pid`` has used (its inference threads, an HTTP server's own
    threads, not only its event loop's). Read from Linux's /proc, to a clock tick (10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` and every live process below it have used: a server's whole cost,
    with the helpers it starts (Triton's Python-backend stubs, model runner processes). Read from Linux's /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    total, found = 0.0, [pid]
    while found:
        current = found.pop()
        try:
            total += process_cpu_seconds(current)
        except OSError:  # exited meanwhile
            continue
        found += children.get(current, [])
    return total


def taking_turns(rounds: int, measures: Sequence[Callable[[], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of servers compared with each other: ``rounds`` rounds in which each measure runs once, the order
    reversed every other round; each row is :func:`median_row` of its rounds. A burst of other work on a shared
    machine then falls on all of them alike, where rows measured one after the other can differ by the burst alone."""
    measured: list[list[dict[str, Any]]] = [[] for _ in measures]
    for index in range(rounds):
        order = list(enumerate(measures))
        for which, measure in order if index % 2 == 0 else reversed(order):
            measured[which].append(measure())
    return [median_row(rows) for rows in measured]


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median requests/s, with every round's requests/s and (where rows count them) the errors
    of all rounds."""
    ranked = sorted(rows, key=lambda r: r.get("requests_per_second") or 0.0)
    median = {**ranked[len(ranked) // 2], "rounds_requests_per_second": [r.get("requests_per_second") for r in ranked]}
    if all("errors" in r for r in rows):
        median["errors"] = sum(r["errors"] for r in rows)
    return median


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def save_mnist_mlp(export_dir: Path, hidden: int = 256, seed: int = 0) -> Path:
    """An MNIST-shaped MLP (784 → hidden → hidden → 10), random weights: the compute is what matters here."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    class MLP(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = tf.Variable(rng.normal(0, 0.05, (784, hidden)).astype(np.float32))
            self.w2 = tf.Variable(rng.normal(0, 0.05, (hidden, hidden)).astype(np.float32))
            self.w3 = tf.Variable(rng.normal(0, 0.05, (hidden, 10)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32, name="images")])
        def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            h = tf.nn.relu(images @ self.w1)
            h = tf.nn.relu(h @ self.w2)
            return {"probabilities": tf.nn.softmax(h @ self.w3)}

    module = MLP()
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.serve})
    return export_dir


def write_config(path: Path, models: dict[str, Path], platform: str | None = "tensorflow") -> Path:
    """A model_config_list serving each base path under its name; ``platform=None`` leaves each model's platform to
    be detected from its version's files (a Python model, a PyTorch one)."""
    declared = f' model_platform: "{platform}"' if platform else ""
    entries = "".join(f'  config {{ name: "{name}" base_path: "{base}"{declared} }}\n' for name, base in models.items())
    path.write_text("model_config_list {\n" + entries + "}\n")
    return path


class ServeProcess:
    """`workbench serve` as a child process, as users run it.

    The server picks its own free ports (``--port=0 --rest_api_port=-1``) and says which in its ready file: a port
    chosen here would be free only until released, and another process may take it before the server binds it.
    Its output goes to a log file (a pipe nobody reads would stop a talkative server once full).
    """

    def __init__(self, config: Path, *extra: str, tree: Path | None = None) -> None:
        """``tree``: serve the workbench of that checkout (another commit's, for a before and after in one run)
        rather than the one this process imports."""
        self._tree = tree
        self._spawn([sys.executable, "-m", "workbench"], f"--model_config_file={config}", *extra)

    def _spawn(self, command: list[str], *flags: str) -> None:
        tree = getattr(self, "_tree", None)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        if tree is not None:  # `-m` puts the working directory first on sys.path: the tree's own package wins
            env["PYTHONPATH"] = str(tree)
        self._folder = Path(tempfile.mkdtemp(prefix="workbench-bench-"))
        self.ready_file, self.log_path = self._folder / "ready.json", self._folder / "server.log"
        self._ports: tuple[int, int] | None = None
        self.started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*command, "serve", "--port=0", "--rest_api_port=-1", f"--ready_file={self.ready_file}", *flags],
                env=env, cwd=tree, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def grpc_port(self) -> int:
        return self.wait_ready()[0]

    @property
    def rest_port(self) -> int:
        return self.wait_ready()[1]

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> tuple[int, int]:
        """The (gRPC, REST) ports, once the server has opened them."""
        deadline = time.perf_counter() + timeout
        while self._ports is None:
            self.check_running()
            if self.ready_file.exists():
                ready = json.loads(self.ready_file.read_text())
                self._ports = ready["grpc_port"], ready["rest_port"]
            elif time.perf_counter() > deadline:
                raise TimeoutError(f"workbench serve did not open its ports in {timeout} s:\n{self.log()[-3000:]}")
            else:
                time.sleep(0.02)
        return self._ports

    def wait_for_answer(self, model: str, body: dict, timeout: float = 180) -> float:
        """Seconds from spawning the process to its first answered predict request."""
        data = json.dumps(body).encode()
        deadline = time.perf_counter() + timeout
        self.wait_ready(timeout)
        while time.perf_counter() < deadline:
            self.check_running()
            try:
                req = urllib.request.Request(f"{self.rest_url}/v1/models/{model}:predict", data=data)
                with urllib.request.urlopen(req, timeout=5) as response:
                    if response.status == 200:
                        return time.perf_counter() - self.started
            except OSError:
                time.sleep(0.02)
        raise TimeoutError(f"workbench serve did not answer in time:\n{self.log()[-3000:]}")

    def check_running(self) -> None:
        """Raise, with the end of its log, if the server has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"workbench serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self._folder, ignore_errors=True)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains), then SIGKILL if it has not exited within 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def save_results(name: str, payload: dict, path: str | Path = "") -> Path:
    """``payload`` as JSON at ``path``, or by default as benchmarks/results/<name>.json."""
    if not path:
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        path = out / f"{name}.json"
    path = Path(path)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def save_small_cnn(export_dir: Path, channels: tuple[int, int] = (32, 64), seed: int = 0) -> Path:
    """A compute-bound MNIST-style CNN (28x28x1 → conv → conv → pool → dense 128 → 10), random weights.

    ``channels`` (32, 64) is the classic Keras MNIST example (≈12 M multiply-adds an image); (64, 128) is
    about four times the work.
    """
    c1, c2 = channels
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> tf.Variable:
        return tf.Variable(rng.normal(0, 0.05, shape).astype(np.float32))

    class CNN(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = weight(3, 3, 1, c1), weight(3, 3, c1, c2)
            self.d1, self.d2 = weight(12 * 12 * c2, 128), weight(128, 10)

        @tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32, name="images")])
        def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
            x = tf.reshape(images, [-1, 28, 28, 1])
            x = tf.nn.relu(tf.nn.conv2d(x, self.c1, 1, "VALID"))
            x = tf.nn.relu(tf.nn.conv2d(x, self.c2, 1, "VALID"))
            x = tf.nn.max_pool2d(x, 2, 2, "VALID")
            x = tf.nn.relu(tf.reshape(x, [-1, 12 * 12 * c2]) @ self.d1)
            return {"probabilities": tf.nn.softmax(x @ self.d2)}

    module = CNN()
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.serve})
    return export_dir


def load_row(server: str, result: Any, **extra: Any) -> dict[str, Any]:
    """One result table row from a :class:`workbench.client.bench.BenchResult`: rate, p50, p99 and errors."""
    return {
        "server": server,
        "protocol": result.protocol,
        "clients": result.concurrency,
        "requests_per_second": round(result.requests_per_second, 1),
        "p50_ms": round(result.percentile(50), 3),
        "p99_ms": round(result.percentile(99), 3),
        "errors": result.errors,
        **extra,
    }
