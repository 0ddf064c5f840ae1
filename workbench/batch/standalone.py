"""A batch job on a server of its own: the model loaded as ``workbench serve`` would load it, no ports opened.

:func:`batch_predict` is the Python API (``workbench.batch_predict``) and ``workbench batch``'s body. Progress is a
tqdm bar: in a terminal a text line, in a notebook tqdm's widget (rows/s, time left, failed rows).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from workbench.batch.job import DEFAULT_SHARD_ROWS, BatchJob, BatchSummary, Progress, run_job, write_summary
from workbench.batch.plan import remove_temporaries
from workbench.config.options import ServerOptions
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
        return _run_to_end(_standalone(options, job, told))
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


async def _standalone(
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
    """``job`` in ``workers`` processes of their own (spawned: no state of this one's, a notebook kernel's), each
    scoring every ``workers``-th shard; their progress gathered here, and the summary written once all are done."""
    remove_temporaries(job.output)  # before any part writes: a killed run's half-written files
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    concurrency = job.concurrency or max(1, (os.cpu_count() or 1) // workers)
    with context.Manager() as manager, ProcessPoolExecutor(workers, mp_context=context) as pool:
        events = manager.Queue()
        parts = [
            pool.submit(
                _run_part, options, dataclasses.replace(job, part=(i, workers), concurrency=concurrency), events
            )
            for i in range(workers)
        ]
        latest: dict[int, Progress] = {}
        while not all(part.done() for part in parts):
            try:
                index, now = events.get(timeout=0.2)
            except queue.Empty:
                continue
            latest[index] = now
            if progress is not None:
                rows, done, failed = (sum(getattr(p, f) for p in latest.values()) for f in ("rows", "done", "failed"))
                progress(Progress(rows, done, failed, time.perf_counter() - started))
        summaries = [part.result() for part in parts]  # the first part's error, if one failed
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


def _run_part(options: ServerOptions, job: BatchJob, events: Any) -> BatchSummary:
    """One worker's part of a job (in a process of its own); its progress goes to ``events``."""
    assert job.part is not None
    index = job.part[0]
    return _run_to_end(_standalone(options, job, lambda now: events.put((index, now))))


def _run_to_end(work: Any) -> BatchSummary:
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
