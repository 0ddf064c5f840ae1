"""Memory across reloads: 100 load/unload cycles of a TensorFlow SavedModel in a ``workbench serve`` process.

TF Serving's users report servers that grow with every reload and keep an unloaded model's memory
(tensorflow/serving#1664, #1346). Here a model with ``WEIGHTS_MIB`` of weights has two versions; version 2 serves
(the latest), and each cycle loads version 1 through the management API, predicts with it, unloads it and waits for
its END. The server's resident memory (``VmRSS`` from /proc) is read after every cycle, and two promises are held:

- growth: around cycle 100 it is within ``GROWTH_LIMIT`` (10%) of what it was around cycle 10, once the allocators
  have their working set. Each is the median of ten cycles: an allocator may hold one freed copy of the model for a
  cycle or two (a bump of 3%), which is not growth; a leak of a thirtieth of the model a cycle fails;
- return: after the hundred cycles the server holds at most ``RETAINED_COPIES`` copies of the weights beyond what
  it held before the first (and ``RETAINED_SLACK_MIB``): oneDNN's allocator keeps one in its pool for the next load,
  and malloc may hold a freed one or two until the next unload's trim.

It runs with both of TensorFlow's CPU allocators: oneDNN's (its default on x86), which keeps freed tensors in a pool
of its own and reuses them, and the plain one (``TF_ENABLE_ONEDNN_OPTS=0``), which hands them to malloc. There,
without the server's ``malloc_trim`` after each unload (workbench/models/harness.py), glibc kept up to eight freed
copies beside the live ones: 137 MB more after the cycles than before them (benchmarks/reload_memory.py).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from models import save_weighty
from replica import Replica, resident_bytes
from waiting import version_states, wait_until

MODEL = "weighty"
WEIGHTS_MIB = 16
CYCLES = 100
GROWTH_LIMIT = 0.10
# Copies of the weights the server may hold after the cycles beyond what it held before them: oneDNN's pool keeps
# one for the next load; malloc may hold one or two freed ones that the last unload's trim did not reach.
RETAINED_COPIES = 3
RETAINED_SLACK_MIB = 8  # the graphs, callables and bookkeeping of the cycles
# rss[n] is read after cycle n; "cycle 10" is the median of cycles 6 to 15, "cycle 100" of cycles 91 to 100.
AROUND_CYCLE_10 = slice(6, 16)
LAST_TEN_CYCLES = slice(CYCLES - 9, CYCLES + 1)
MANAGEMENT = "/workbench/v1/models"
ALLOCATORS = {"onednn": "1", "plain": "0"}  # TF_ENABLE_ONEDNN_OPTS


@pytest.fixture(scope="module")
def weighty_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("reload") / MODEL
    for version in (1, 2):
        save_weighty(base / str(version), offset=float(version), weights_mib=WEIGHTS_MIB)
    return base


def load_predict_unload(server: Replica, session: requests.Session) -> None:
    """One cycle: version 1 loaded (the call returns once it serves), asked once, unloaded, and gone (END)."""
    versions = f"{server.rest_url}{MANAGEMENT}/{MODEL}/versions/1"
    loaded = session.post(f"{versions}:load", json={}, timeout=120)
    assert loaded.status_code == 200, loaded.text
    answer = session.post(f"{server.rest_url}/v1/models/{MODEL}/versions/1:predict", json={"instances": [[1.0]]})
    assert answer.status_code == 200, answer.text
    assert np.allclose(answer.json()["predictions"], [[2.0]]), answer.text
    unloaded = session.post(f"{versions}:unload", json={}, timeout=120)
    assert unloaded.status_code == 200, unloaded.text
    wait_until(lambda: version_states(server.rest_url, MODEL).get("1") == "END", timeout=60, interval=0.01)


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_a_hundred_reloads_do_not_grow_the_server(
    weighty_base: Path, tmp_path: Path, allocator: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = Replica(
        tmp_path / "server",
        f"--model_name={MODEL}",
        f"--model_base_path={weighty_base}",
        env={"TF_ENABLE_ONEDNN_OPTS": ALLOCATORS[allocator]},
    )
    try:
        server.wait_ready()
        wait_until(lambda: version_states(server.rest_url, MODEL) == {"2": "AVAILABLE"}, timeout=120)
        rss = [resident_bytes(server.proc.pid)]  # rss[n]: after cycle n
        started = time.perf_counter()
        with requests.Session() as session:
            for _ in range(CYCLES):
                load_predict_unload(server, session)
                rss.append(resident_bytes(server.proc.pid))
        seconds = time.perf_counter() - started
    finally:
        server.stop()

    settled = statistics.median(rss[AROUND_CYCLE_10])
    last = statistics.median(rss[LAST_TEN_CYCLES])
    figures = {
        "allocator": allocator,
        "weights_mib": WEIGHTS_MIB,
        "rss_start_mib": round(rss[0] / 2**20, 1),
        "rss_cycle_10_mib": round(settled / 2**20, 1),
        f"rss_cycle_{CYCLES}_mib": round(last / 2**20, 1),
        "rss_peak_mib": round(max(rss) / 2**20, 1),
        "growth": round(last / settled - 1, 4),
        "seconds_per_cycle": round(seconds / CYCLES, 3),
    }
    with capsys.disabled():
        print(f"\nreload memory figures: {json.dumps(figures)}")
    per_cycle = [round(r / 2**20, 1) for r in rss]
    assert last <= settled * (1 + GROWTH_LIMIT), (figures, per_cycle)
    assert last <= rss[0] + (RETAINED_COPIES * WEIGHTS_MIB + RETAINED_SLACK_MIB) * 2**20, (figures, per_cycle)
