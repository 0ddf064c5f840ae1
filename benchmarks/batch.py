"""Batch prediction jobs against a plain in-process loop of ``model.predict`` over the same rows.

Run: `.venv/bin/python benchmarks/batch.py [--rows 600000] [--rounds 3]` (about four minutes on 2 cores; each
round is about a minute). Writes benchmarks/results/batch.json.

The data: scikit-learn's digits, repeated to ``--rows`` rows, in one Parquet file (64 pixel columns). For each
model (a LogisticRegression, a call costs ~0.1 ms a row-batch; and a 50-tree random forest, ~10 ms), side by side
in one run, taking turns (each measured in every round, the median kept):

- the baseline: the rows already in memory as one array, ``model.predict`` called on batches of ``--batch_size``
  rows in a loop (no reading, no writing);
- ``workbench.batch_predict`` with ``concurrency=1`` (one batch at a time: one core's worth of model calls), reading
  the Parquet file, writing Parquet parts with an id column;
- the same with ``concurrency`` 0 (one batch in flight per core);
- the same with ``num_workers`` set to the cores (a process each, the model loaded in each: several cores for a
  model whose calls hold the GIL);
- and, once per model, what the job does without the model: the file read a shard at a time and cast to the
  model's input (one thread). A job's rows/s cannot pass it where reading is the larger cost: the light model's
  ceiling.

Rows/s of each, and each job's over the baseline. Issue 31's targets: ≥ 0.8 with one batch at a time, > 1 with
workers on every core.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import save_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Enough rows that a job runs for seconds: its workers' start-up (a process each, the model loaded) is paid once.
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import os
    import warnings

    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    import workbench
    from workbench.batch_prediction import formats

    warnings.filterwarnings("ignore")
    x, y = load_digits(return_X_y=True)
    models = {
        "logistic_regression": LogisticRegression(max_iter=2000).fit(x, y),
        "random_forest_200": RandomForestClassifier(n_estimators=200, random_state=0, n_jobs=1).fit(x, y),
    }
    data = np.tile(x, (args.rows // len(x) + 1, 1))[: args.rows]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        formats.write_table({f"p{i}": data[:, i] for i in range(64)}, str(root / "digits.parquet"), "parquet")
        for name, model in models.items():
            workbench.export(model, name, root / "models")

        def baseline(model: Any) -> float:
            started = time.perf_counter()
            for start in range(0, len(data), args.batch_size):
                model.predict(data[start : start + args.batch_size])
            return len(data) / (time.perf_counter() - started)

        def reading_alone(name: str) -> float:
            """The file read shard by shard and fed as the job feeds the model, nothing run."""
            from workbench.batch_prediction.feeding import feeding_for
            from workbench.batch_prediction.job import DEFAULT_SHARD_ROWS
            from workbench.core import inference
            from workbench.platforms import Loader

            signature = inference.predict_signature(Loader()(name, 1, str(root / "models" / name / "1")), "")
            path = str(root / "digits.parquet")
            started = time.perf_counter()
            with formats.RowReader() as reader:
                feeding = None
                for start in range(0, len(data), DEFAULT_SHARD_ROWS):
                    columns = reader.read(path, "parquet", start, start + DEFAULT_SHARD_ROWS)
                    feeding = feeding or feeding_for(signature, columns, {}, None)
                    feeding.feed(columns)
            return len(data) / (time.perf_counter() - started)

        def job(name: str, concurrency: int, workers: int = 1) -> float:
            out = root / f"out-{name}-{concurrency}-{workers}"
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()  # workers: their start-up counts (each loads the model)
            summary = workbench.batch_predict(
                name, root / "digits.parquet", out, model_repository=root / "models", batch_size=args.batch_size,
                concurrency=concurrency, num_workers=workers, progress=False,
            )  # fmt: skip
            assert summary.rows_out == len(data), summary
            return len(data) / (summary.seconds if workers == 1 else time.perf_counter() - started)

        rows: list[dict[str, Any]] = []
        for name, model in models.items():
            cores = os.cpu_count() or 1
            measured: dict[str, list[float]] = {
                "baseline": [],
                "job, 1 batch at a time": [],
                "job, every core": [],
                f"job, {cores} workers": [],
                "reading and casting alone": [],
            }
            for _ in range(args.rounds):
                measured["baseline"].append(baseline(model))
                measured["job, 1 batch at a time"].append(job(name, 1))
                measured["job, every core"].append(job(name, 0))
                measured[f"job, {cores} workers"].append(job(name, 0, cores))
                measured["reading and casting alone"].append(reading_alone(name))
            medians = {k: statistics.median(v) for k, v in measured.items()}
            row = {
                "model": name,
                **{f"{k} rows/s": round(v, 1) for k, v in medians.items()},
                "job, 1 batch at a time / baseline": round(medians["job, 1 batch at a time"] / medians["baseline"], 3),
                "job, every core / baseline": round(medians["job, every core"] / medians["baseline"], 3),
                f"job, {cores} workers / baseline": round(medians[f"job, {cores} workers"] / medians["baseline"], 3),
                "reading and casting alone / baseline": round(
                    medians["reading and casting alone"] / medians["baseline"], 3
                ),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    results = {
        "what": "a batch job (Parquet in, Parquet parts out) against model.predict in a loop over the rows in memory",
        "rows": args.rows,
        "batch_size": args.batch_size,
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "results": rows,
        "command": f"python benchmarks/batch.py --rows {args.rows} --rounds {args.rounds}",
    }
    print(f"results: {save_results('batch', results)}")


if __name__ == "__main__":
    main()
