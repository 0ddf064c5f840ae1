"""The notebook's first answer: `workbench.serve()` on a folder holding one scikit-learn model, to its first predict.

Run: `.venv/bin/python benchmarks/first_answer.py` (about a minute on 2 cores). Writes
benchmarks/results/first_answer.json.

The repository is made once, here: scikit-learn's digits, a LogisticRegression fit on them and exported with
`workbench.export` (`model.skops`), and three rows to ask about. Each run is a fresh Python process, as a notebook's
kernel is: it imports numpy and workbench (which imports nothing more until used), then times
`workbench.serve(repository)`, which returns once the server is ready (its ports open, its models loaded), and the
first `handle.client.predict("digits", rows)`: `first_answer_seconds` is from calling serve() to holding the answer.
Each row also has the server's own figures: how long its load of the version took (its log's "Loaded digits
version 1 in ...s") and the CPU time (user + system) the server process had used by the answer, which a busy
machine changes less than it changes the wall-clock times.

`--tree [NAME=]PATH` runs another checkout's workbench too (`git archive HEAD | tar -x -C PATH`: a before and after in
one run; its processes get PATH first on PYTHONPATH, so a `sitecustomize.py` there applies to them alone): each round
runs every tree once, the order reversed every other round, so a burst of other work on a shared machine falls on
all alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _common import save_results

MODEL = "digits"
# The measured process: a notebook's kernel, in short. It prints one JSON line.
CHILD = r"""
import json, os, sys, time
started = time.perf_counter()
import numpy as np
import workbench
imported = time.perf_counter()
repository, rows = sys.argv[1], np.load(sys.argv[2])
handle = workbench.serve(repository, server_name="first-answer")
ready = time.perf_counter()
try:
    answer = handle.client.predict("digits", rows)
    answered = time.perf_counter()
    with open(f"/proc/{handle.pid}/stat") as stat:  # the server's CPU time so far: user + system, in clock ticks
        fields = stat.read().rsplit(")", 1)[1].split()
    server_cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    log = handle.logs()
finally:
    handle.stop()
print(json.dumps({
    "import_seconds": imported - started,
    "serve_seconds": ready - imported,
    "first_answer_seconds": answered - imported,
    "server_cpu_seconds": server_cpu,
    "predictions": np.asarray(answer["predictions"]).tolist(),
    "log": log,
}))
"""
LOADED = re.compile(r"Loaded digits version 1 in ([0-9.]+)s")


def make_repository(folder: Path) -> Path:
    """``folder``/models/digits/1/model.skops and ``folder``/rows.npy (three digits' pixels)."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    import workbench

    x, y = load_digits(return_X_y=True)
    estimator = LogisticRegression(max_iter=2000).fit(x, y)
    workbench.export(estimator, MODEL, folder / "models")
    np.save(folder / "rows.npy", x[:3])
    return folder / "models"


def one_run(folder: Path, tree: Path | None) -> dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if tree is not None:  # that checkout's package first on the path, for this process and the server it starts
        env["PYTHONPATH"] = str(tree)
    begun = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder / "models"), str(folder / "rows.npy")],
        env=env, cwd=tree or folder, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    process_seconds = time.perf_counter() - begun
    if done.returncode != 0:
        raise RuntimeError(f"the measured process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = LOADED.search(row.pop("log"))
    return {
        **{key: round(value, 3) if isinstance(value, float) else value for key, value in row.items()},
        "load_seconds": float(loaded.group(1)) if loaded else None,
        "process_seconds": round(process_seconds, 3),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answers = [r["first_answer_seconds"] for r in rows]
    loads = [r["load_seconds"] for r in rows if r["load_seconds"] is not None]
    return {
        "first_answer_seconds_median": round(statistics.median(answers), 3),
        "first_answer_seconds_min": round(min(answers), 3),
        "first_answer_seconds": answers,
        "load_seconds_median": round(statistics.median(loads), 3) if loads else None,
        "server_cpu_seconds_median": round(statistics.median(r["server_cpu_seconds"] for r in rows), 3),
        "serve_seconds_median": round(statistics.median(r["serve_seconds"] for r in rows), 3),
        "import_seconds_median": round(statistics.median(r["import_seconds"] for r in rows), 3),
        "predictions": rows[0]["predictions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per tree (default 7)")
    parser.add_argument(
        "--tree", action="append", default=[], help="another checkout to run too, NAME=PATH or PATH (repeatable)"
    )
    parser.add_argument("--out", default="", help="results file (default: benchmarks/results/first_answer.json)")
    args = parser.parse_args()

    trees: dict[str, Path | None] = {"this": None}
    for given in args.tree:
        name, _, path = given.rpartition("=")
        trees[name or path] = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="workbench-first-answer-") as scratch:
        folder = Path(scratch)
        make_repository(folder)
        one_run(folder, None)  # the first process of all reads every file from disk: not counted
        measured: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for index in range(args.runs):
            order = list(trees.items())
            for name, tree in order if index % 2 == 0 else reversed(order):
                measured[name].append(one_run(folder, tree))
                print(f"run {index + 1}/{args.runs} {name}: {measured[name][-1]['first_answer_seconds']:.3f} s")

    results = {
        "benchmark": "workbench.serve() on a folder of one scikit-learn model (model.skops) to its first answer",
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": os.cpu_count(),
        "runs": args.runs,
        "trees": {
            name: {"path": str(trees[name] or Path.cwd()), **summary(rows), "rows": rows}
            for name, rows in measured.items()
        },
    }
    for name, tree in results["trees"].items():
        print(
            f"{name}: first answer median {tree['first_answer_seconds_median']:.3f} s "
            f"(min {tree['first_answer_seconds_min']:.3f}), load median {tree['load_seconds_median']} s, "
            f"server CPU median {tree['server_cpu_seconds_median']} s"
        )
    print(f"results: {save_results('first_answer', results, args.out)}")


if __name__ == "__main__":
    main()
