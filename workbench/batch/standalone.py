"""A batch job on a server of its own: the model loaded as ``workbench serve`` would load it, no ports opened.

:func:`batch_predict` is the Python API (``workbench.batch_predict``) and ``workbench batch``'s body. Progress is a
tqdm bar: in a terminal a text line, in a notebook tqdm's widget (rows/s, time left, failed rows).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from workbench.batch.job import DEFAULT_SHARD_ROWS, BatchJob, BatchSummary, Progress, run_job, write_summary
from workbench.batch.plan import remove_temporaries
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.runtime.storage import is_remote

log = logging.getLogger(__name__)

DEFAULT_REPOSITORY = "workbench-models"  # workbench.export's


def batch_predict(
    model: str,
    input: str,  # noqa: A002 - the flag's name
    output: str,
    *,
    model_repository: str | os.PathLike[str] = DEFAULT_REPOSITORY,
    model_base_path: str | os.PathLike[str] | None = None,
    model_config_file: str | os.PathLike[str] | None = None,
    model_version: int | None = None,
    version_label: str | None = None,
    signature_name: str = "",
    columns: Mapping[str, str] | None = None,
    id_column: str | None = None,
    input_format: str | None = None,
    output_format: str | None = None,
    batch_size: int = 0,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    concurrency: int = 0,
    max_failed_rows: int | None = None,
    num_workers: int = 1,
    allow_pickle: bool = False,
    allow_python_models: bool = False,
    progress: bool | Callable[[Progress], None] = True,
) -> BatchSummary:
    """Score every row of ``input`` (a file, folder, glob or ``s3://``/``gs://`` URL of CSV, Parquet, JSON Lines,
    ``.npy``/``.npz`` or TFRecord files) with ``model``, writing the answers to the folder ``output``.

    The model is ``<model_repository>/<model>`` (what ``workbench.export`` wrote), or ``model_base_path``, or a model
    of ``model_config_file``; its latest version unless ``model_version`` or ``version_label`` says otherwise.
    Each shard of ``shard_rows`` rows is written whole as ``part-NNNNN.<format>``, with an id column (``id_column``,
    else ``row``: the row's number in the input), and its failed rows with their reasons in
    ``errors-NNNNN.jsonl``; run the same job again after it was stopped and it finishes the shards left.
    ``max_failed_rows`` stops the job once more rows than that failed. ``num_workers`` processes score the
    shards side by side, each with the model loaded (what a model whose calls hold the GIL needs to use several
    cores). ``progress``: a tqdm bar (True), nothing (False), or a function told after each batch.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, not {num_workers}")
    job = BatchJob(
        model,
        str(input),
        str(output),
        model_version,
        version_label,
        signature_name,
        dict(columns or {}),
        id_column,
        input_format,
        output_format,
        batch_size,
        shard_rows,
        concurrency,
        max_failed_rows,
    )
    options = job_server_options(
        model, model_repository, model_base_path, model_config_file, allow_pickle, allow_python_models
    )
    bar = _ProgressBar(model) if progress is True else None
    told = bar.update if bar is not None else (progress if callable(progress) else None)
    try:
        if num_workers > 1:
            return _in_workers(options, job, num_workers, told)
        return run_to_end(standalone(options, job, told))
    finally:
        if bar is not None:
            bar.close()


def job_server_options(
    model: str,
    model_repository: str | os.PathLike[str],
    model_base_path: str | os.PathLike[str] | None,
    model_config_file: str | os.PathLike[str] | None,
    allow_pickle: bool,
    allow_python_models: bool,
) -> ServerOptions:
    """A server that loads ``model`` alone (from a config file: every model it names, a pipeline's members too)."""
    common: dict[str, Any] = {
        "allow_pickle": allow_pickle,
        "allow_python_models": allow_python_models,
        "file_system_poll_wait_seconds": 0.0,  # the versions there at the start: a job pins one anyway
        # A job's batches are not cheap calls: each runs on a thread of its own, side by side.
        "inline_cheap_calls": False,
    }
    if model_config_file:
        return ServerOptions(model_config_file=str(model_config_file), **common)
    if model_base_path is None:
        repository = str(model_repository)
        model_base_path = (
            f"{repository.rstrip('/')}/{model}" if is_remote(repository) else os.path.join(repository, model)
        )
    return ServerOptions(model_name=model, model_base_path=str(model_base_path), **common)


async def standalone(
    options: ServerOptions, job: BatchJob, progress: Callable[[Progress], None] | None
) -> BatchSummary:
    from workbench.server.model_server import ModelServer  # the engine: imported when a job runs

    server = ModelServer(options)
    await server.start(open_ports=False)
    try:
        return await run_job(server.dataplane, job, progress)
    finally:
        await server.stop(cause="batch job done")


def _in_workers(
    options: ServerOptions, job: BatchJob, workers: int, progress: Callable[[Progress], None] | None
) -> BatchSummary:
    """``job`` in ``workers`` processes of their own (:mod:`workbench.batch.part`), each scoring every
    ``workers``-th shard; their progress gathered here, and the summary written once all are done."""
    remove_temporaries(job.output)  # before any part writes: a killed run's half-written files
    started = time.perf_counter()
    concurrency = job.concurrency or max(1, (os.cpu_count() or 1) // workers)
    latest: dict[int, Progress] = {}
    outcomes: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def follow(index: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            message = json.loads(line)
            with lock:
                if "progress" in message:
                    latest[index] = Progress(*message["progress"])
                    if progress is not None:
                        totals = [sum(getattr(p, f) for p in latest.values()) for f in ("rows", "done", "failed")]
                        progress(Progress(totals[0], totals[1], totals[2], time.perf_counter() - started))
                else:
                    outcomes[index] = message

    processes = []
    for index in range(workers):
        part = dataclasses.replace(job, part=(index, workers), concurrency=concurrency)
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench.batch.part"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert process.stdin is not None
        process.stdin.write(spec_of(options, part))
        process.stdin.close()
        processes.append(process)
    readers = [threading.Thread(target=follow, args=item, daemon=True) for item in enumerate(processes)]
    for reader in readers:
        reader.start()
    try:
        for process in processes:
            process.wait()
    finally:
        for process in processes:  # interrupted (a notebook's stop button): the parts stop with it
            if process.poll() is None:
                process.kill()
    for reader in readers:
        reader.join()
    errors = [outcomes.get(i, {}).get("error") or f"worker {i} exited with {p.returncode}" for i, p in
              enumerate(processes) if "summary" not in outcomes.get(i, {})]  # fmt: skip
    if errors:
        raise ServingError(Code.INTERNAL, "; ".join(dict.fromkeys(errors)))
    summaries = [BatchSummary(**outcomes[i]["summary"]) for i in range(workers)]
    seconds = time.perf_counter() - started
    first = summaries[0]
    summary = BatchSummary(
        first.model,
        first.version,
        first.signature_name,
        job.output,
        sum(s.rows_in for s in summaries),
        sum(s.rows_out for s in summaries),
        sum(s.rows_failed for s in summaries),
        sum(s.shards for s in summaries),
        sum(s.shards_resumed for s in summaries),
        round(seconds, 3),
        round(sum(s.rows_per_second * s.seconds for s in summaries) / seconds, 1) if seconds > 0 else 0.0,
    )
    write_summary(job.output, summary)
    if progress is not None:
        progress(Progress(summary.rows_in, summary.rows_in, summary.rows_failed, seconds))
    return summary


def spec_of(options: ServerOptions, job: BatchJob) -> str:
    """What a worker process of a job reads (:mod:`workbench.batch.part`): the server's options and its part."""
    return json.dumps({"options": dataclasses.asdict(options), "job": dataclasses.asdict(job)})


def options_of(fields: dict[str, Any]) -> ServerOptions:
    """:func:`spec_of`'s options back (JSON has no tuples: those options come back as lists)."""
    tuples = {f.name for f in dataclasses.fields(ServerOptions) if str(f.type).startswith("tuple")}
    values: dict[str, Any] = {k: tuple(v) if k in tuples else v for k, v in fields.items()}
    return ServerOptions(**values)


def run_to_end(work: Any) -> BatchSummary:
    """Run the coroutine ``work`` to its end, also from a notebook cell, where an event loop already runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="workbench-batch") as thread:
        return thread.submit(asyncio.run, work).result()


class _ProgressBar:
    """tqdm's bar (its notebook widget inside Jupyter), in rows, with the failed rows beside."""

    def __init__(self, model: str) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=None, unit="rows", unit_scale=True, desc=f"scoring with {model}", dynamic_ncols=True)
        self._failed = -1

    def update(self, progress: Progress) -> None:
        bar = self._bar
        if bar.total != progress.rows:
            bar.total = progress.rows
        bar.n = progress.done
        if progress.failed != self._failed:
            self._failed = progress.failed
            bar.set_postfix(failed=progress.failed, refresh=False)
        bar.refresh()

    def close(self) -> None:
        self._bar.close()
