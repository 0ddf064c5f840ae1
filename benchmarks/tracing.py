"""What OpenTelemetry tracing costs a request: `workbench serve` with tracing off, on with every request recorded, and
on with a 10% sample, side by side.

Run: `.venv/bin/python benchmarks/tracing.py` (about a minute). Prints a table and writes
benchmarks/results/tracing.json. Three `workbench serve` processes (one worker each, batching off) serve one tiny
Python model (no framework: the request path is all there is to measure) and export their spans over OTLP/HTTP to a
receiver in this process that reads and drops them. workbench bench's REST client drives each in turn, the order
reversed every other round (:func:`taking_turns`), and each row gives the CPU µs a request cost the server's process
(``proc_us``: its event loop, and the export thread) and its event loop (``loop_us``): steadier than requests/s on a
shared machine. Requests carry no traceparent, so each is the root of its trace and the sampler decides alone.
"""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import (
    ServeProcess,
    load_row,
    loop_cpu_seconds,
    process_cpu_seconds,
    save_results,
    taking_turns,
    write_config,
)

from workbench.client.bench import format_table, run_load

MODEL = """
class Model:
    inputs = {"x": ("float32", [-1, 2])}
    outputs = {"y": ("float32", [-1, 2])}

    def predict(self, inputs):
        return {"y": inputs["x"] * 2}
"""
INPUTS = {"x": np.asarray([[1.0, 2.0]], np.float32)}
SETTINGS: dict[str, dict[str, str]] = {
    "tracing off": {},
    "on, every request": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
    "on, 10% sampled": {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
}


class NullReceiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that reads each export and answers success: the server's export cost, not a backend's."""

    daemon_threads = True

    def __init__(self) -> None:
        exports = self.exports = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                exports[0] += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def serve(config: Path, environ: dict[str, str], endpoint: str) -> ServeProcess:
    saved = dict(os.environ)
    os.environ.update({**environ, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if environ else {})
    try:
        server = ServeProcess(config, "--allow_python_models")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    server.wait_for_answer("m", {"instances": [[1.0, 2.0]]})
    return server


def measure(name: str, server: ServeProcess, clients: int, duration: float) -> dict[str, Any]:
    pid = server.proc.pid
    loop0, proc0 = loop_cpu_seconds(pid), process_cpu_seconds(pid)
    result = run_load(server.rest_url, "rest", "m", INPUTS, concurrency=clients, duration=duration)
    row = load_row(name, result)
    if result.requests:
        row["loop_us"] = round((loop_cpu_seconds(pid) - loop0) / result.requests * 1e6, 1)
        row["proc_us"] = round((process_cpu_seconds(pid) - proc0) / result.requests * 1e6, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds a measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    receiver = NullReceiver()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "m" / "1").mkdir(parents=True)
        (root / "m" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
        config = write_config(root / "models.config", {"m": root / "m"}, platform=None)
        servers = {name: serve(config, environ, endpoint) for name, environ in SETTINGS.items()}
        try:
            rows = taking_turns(
                args.rounds,
                [
                    lambda name=name, server=server: measure(name, server, args.clients, args.duration)  # type: ignore[misc]
                    for name, server in servers.items()
                ],
            )
        finally:
            for server in servers.values():
                server.stop()
    receiver.shutdown()
    print(format_table(rows, ["server", "clients", "requests_per_second", "p50_ms", "p99_ms", "loop_us", "proc_us"]))
    save_results("tracing", {"clients": args.clients, "duration_s": args.duration, "rows": rows})


if __name__ == "__main__":
    main()
