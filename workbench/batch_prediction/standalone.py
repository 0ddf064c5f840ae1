"""A batch job on a server of its own: the model loaded as ``workbench serve`` would load it, no ports opened; in
this process (:func:`standalone`), or in worker processes of their own (:func:`in_workers`), whose summaries are
:func:`merged`. :mod:`workbench.batch_prediction.launch` chooses.
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
from collections.abc import Callable
from typing import Any

from workbench.batch_prediction.job import BatchJob, BatchSummary, Progress, run_job, write_summary
from workbench.batch_prediction.plan import remove_temporaries
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError

log = logging.getLogger(__name__)


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


def in_workers(
    options: ServerOptions, job: BatchJob, workers: int, progress: Callable[[Progress], None] | None
) -> BatchSummary:
    """``job`` in ``workers`` processes of their own (:mod:`workbench.batch_prediction.job_worker`), each scoring every
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
            [sys.executable, "-m", "workbench.batch_prediction.job_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
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
    summary = merged(job, summaries, time.perf_counter() - started)
    write_summary(job.output, summary)
    if progress is not None:
        progress(Progress(summary.rows_in, summary.rows_in, summary.rows_failed, summary.seconds))
    return summary


def merged(job: BatchJob, summaries: list[BatchSummary], seconds: float) -> BatchSummary:
    """One summary of a job run in parts (each part's summary counts its own shards)."""
    first = summaries[0]
    return BatchSummary(
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


def spec_of(options: ServerOptions, job: BatchJob) -> str:
    """What a worker process of a job reads (:mod:`workbench.batch_prediction.job_worker`): the server's options and its
    part."""
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
