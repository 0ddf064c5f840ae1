"""Memory across reloads: a `workbench serve` process's resident memory over 100 load/unload cycles.

Run: `.venv/bin/python benchmarks/reload_memory.py` (about a minute on 2 cores). Writes
benchmarks/results/reload_memory.json. tests/wire/test_reload_memory.py holds the server to the figure that matters
(no more than 10% growth from cycle 10 to 100); this script also measures what the server's mitigation buys.

A TensorFlow SavedModel with 16 MiB of weights has two versions; version 2 serves, and each cycle loads version 1
through the management API, predicts with it once, unloads it and waits for its END; VmRSS is read from /proc after
each cycle. Four servers, one at a time: TensorFlow's two CPU allocators (oneDNN's, its default on x86, and the
plain one with TF_ENABLE_ONEDNN_OPTS=0), each as shipped (malloc_trim(0) after every unload,
workbench/models/harness.py) and with that call replaced by nothing, in the child process only.

Measured on the 2-core machine (TensorFlow 2.21, glibc): oneDNN's allocator keeps a freed version in its own pool
for the next load (about one version above the start after the cycles, no growth, trim or not); the plain
allocator without the trim held 137 MB more after the cycles than before them (eight versions' weights) and peaked
36% above the start; with it, 3 MB more, peaking 1.3% above the start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import save_results, stop_process

# The model is the reload-memory test's (tests/models.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models import save_weighty
from replica import resident_bytes

MODEL = "weighty"
WEIGHTS_MIB = 16
# `workbench serve` with the unload's malloc_trim replaced by nothing: the "before" of the mitigation.
WITHOUT_TRIM = (
    "import sys, workbench.models.harness as harness; harness.return_freed_memory = lambda: None; "
    "from workbench.cli import main; sys.exit(main())"
)


def post(url: str, body: object) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def states(rest_url: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{rest_url}/v1/models/{MODEL}", timeout=30) as response:
        return {s["version"]: s["state"] for s in json.loads(response.read())["model_version_status"]}


def wait_for(predicate: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def resident_mib(pid: int) -> float:
    return resident_bytes(pid) / 2**20


def run(base: Path, workdir: Path, onednn: bool, trim: bool, cycles: int) -> dict[str, Any]:
    """One server, ``cycles`` load/predict/unload cycles of version 1; its RSS after each."""
    workdir.mkdir(parents=True)
    ready = workdir / "ready.json"
    entry = ["-m", "workbench"] if trim else ["-c", WITHOUT_TRIM]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="1" if onednn else "0")
    flags = ["--port=0", "--rest_api_port=-1", f"--ready_file={ready}", f"--model_name={MODEL}"]
    with open(workdir / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *entry, "serve", *flags, f"--model_base_path={base}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, "the server", timeout=300)
        if proc.poll() is not None:
            raise RuntimeError((workdir / "server.log").read_text()[-3000:])
        rest_url = f"http://127.0.0.1:{json.loads(ready.read_text())['rest_port']}"
        wait_for(lambda: states(rest_url) == {"2": "AVAILABLE"}, "version 2")
        versions = f"{rest_url}/workbench/v1/models/{MODEL}/versions/1"
        rss = [resident_mib(proc.pid)]
        started = time.perf_counter()
        for _ in range(cycles):
            post(f"{versions}:load", {})
            answer = post(f"{rest_url}/v1/models/{MODEL}/versions/1:predict", {"instances": [[1.0]]})
            assert np.allclose(answer["predictions"], [[2.0]]), answer
            post(f"{versions}:unload", {})
            wait_for(lambda: states(rest_url).get("1") == "END", "version 1 to unload")
            rss.append(resident_mib(proc.pid))
        seconds = time.perf_counter() - started
    finally:
        stop_process(proc)
    # As tests/wire/test_reload_memory.py reads them: medians of cycles 6 to 15 and of the last ten.
    settled, last = statistics.median(rss[6:16]), statistics.median(rss[-10:])
    return {
        "allocator": "oneDNN" if onednn else "plain",
        "malloc_trim_after_unload": trim,
        "rss_start_mib": round(rss[0], 1),
        "rss_cycle_10_mib": round(settled, 1),
        "rss_last_cycles_mib": round(last, 1),
        "rss_peak_mib": round(max(rss), 1),
        "growth": round(last / settled - 1, 4),
        "peak_over_start": round(max(rss) / rss[0] - 1, 4),
        "seconds_per_cycle": round(seconds / cycles, 3),
        "rss_per_cycle_mib": [round(r, 1) for r in rss],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100, help="load/unload cycles a run (at least 20)")
    args = parser.parse_args()
    if args.cycles < 20:  # "cycle 10" is the median of cycles 6 to 15, the end the median of the last 10
        parser.error("--cycles must be at least 20")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / MODEL
        for version in (1, 2):
            save_weighty(base / str(version), offset=float(version), weights_mib=WEIGHTS_MIB)
        rows = [
            run(base, Path(tmp) / f"server-{onednn}-{trim}", onednn, trim, args.cycles)
            for onednn in (True, False)
            for trim in (True, False)
        ]
    print("RSS in MiB; @10 and @last: medians of cycles 6-15 and of the last ten; growth: @last / @10")
    print(f"{'allocator':<10} {'malloc_trim':<12} {'start':>7} {'@10':>7} {'@last':>7} {'peak':>7} "
          f"{'growth':>7} {'peak/start':>10} {'s/cycle':>8}")  # fmt: skip
    for row in rows:
        print(
            f"{row['allocator']:<10} {str(row['malloc_trim_after_unload']):<12} {row['rss_start_mib']:>7} "
            f"{row['rss_cycle_10_mib']:>7} {row['rss_last_cycles_mib']:>7} {row['rss_peak_mib']:>7} "
            f"{row['growth']:>7.1%} {row['peak_over_start']:>10.1%} {row['seconds_per_cycle']:>8}"
        )
    payload = {"weights_mib": WEIGHTS_MIB, "cycles": args.cycles, "runs": rows}
    print(f"wrote {save_results('reload_memory', payload)}")


if __name__ == "__main__":
    main()
