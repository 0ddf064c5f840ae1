"""Batch prediction jobs: a whole data set through a model, on the same engine that serves requests.

A job runs on a :class:`~workbench.planes.dataplane.Dataplane`: the one of a server started for it alone, with no
ports (:func:`batch_predict`, ``workbench batch``), so the model folder, platform, handler, pipeline, versions and
labels are exactly those a server would serve. Its requests go through the data plane as any request does
(counted in the server's metrics under the protocol ``batch``), in batches of ``batch_size`` rows, ``concurrency``
of them in flight, so that reading the next shard, running this one's batches and writing the last one overlap.

What it writes, and how a job killed and started again finishes without losing or repeating a row, is
:mod:`workbench.batch_prediction.plan`'s; how columns become inputs, and which rows fail alone, is
:mod:`workbench.batch_prediction.feeding`'s. A row the model refuses (INVALID_ARGUMENT) fails alone too: a refused batch
is split until the rows that fail are found. Any other error (the model failing, the version unloading) stops the job
with that error; the shards written so far stay, and running it again finishes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from workbench.batch_prediction.feeding import Feeding, RowErrors, feeding_for
from workbench.batch_prediction.formats import (
    RowReader,
    child,
    list_inputs,
    list_names,
    read_text,
    write_table,
    write_text,
)
from workbench.batch_prediction.plan import SUMMARY_FILE, Plan, Shard, make_plan, resume
from workbench.config.batch_flags import DEFAULT_SHARD_ROWS
from workbench.core import inference
from workbench.core.errors import Code, ServingError
from workbench.planes.calls import ModelSpec
from workbench.planes.dataplane import Dataplane

DEFAULT_BATCH_SIZE = 256
ROW_COLUMN = "row"  # the job-wide row number of each answer, where the input has no id column
Prepared = tuple[np.ndarray, dict[str, np.ndarray], RowErrors]  # a shard's ids, its feed, its rows that cannot run


@dataclasses.dataclass(frozen=True)
class BatchJob:
    """What to score, with what, and where the answers go (``workbench batch``'s flags, by their names)."""

    model: str
    input: str
    output: str
    model_version: int | None = None
    version_label: str | None = None
    signature_name: str = ""
    columns: Mapping[str, str] = dataclasses.field(default_factory=dict)  # file column → input (or feature) name
    id_column: str | None = None
    input_format: str | None = None
    output_format: str | None = None
    batch_size: int = 0  # 0: the model's max_batch_size where it batches, else DEFAULT_BATCH_SIZE
    shard_rows: int = DEFAULT_SHARD_ROWS
    concurrency: int = 0  # batches in flight; 0: one per core
    max_failed_rows: int | None = None  # None: failed rows never fail the job
    # One of several processes running the job (batch_predict's workers): (i, n) runs the shards whose index is i
    # modulo n, and leaves the summary to the process that started them. None: the whole job, here.
    part: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Progress:
    rows: int  # of the whole job
    done: int  # rows answered or failed, shards skipped on resuming included
    failed: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class BatchSummary:
    """What a finished job did (also written as the output's ``_SUMMARY.json``)."""

    model: str
    version: int
    signature_name: str
    output: str
    rows_in: int
    rows_out: int
    rows_failed: int
    shards: int
    shards_resumed: int  # already written by an earlier run of the same job
    seconds: float
    rows_per_second: float


async def run_job(
    dataplane: Dataplane, job: BatchJob, progress: Callable[[Progress], None] | None = None
) -> BatchSummary:
    """Run ``job`` on ``dataplane``'s loaded models; ``progress`` is told after each batch (on the event loop)."""
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    await dataplane.loaded(job.model, None, ModelSpec(job.model, job.model_version, job.version_label))
    version, signature = _pinned(dataplane, job)
    inputs = await loop.run_in_executor(None, list_inputs, job.input)
    plan = await loop.run_in_executor(
        None,
        make_plan,
        job.model,
        version,
        signature.name,
        inputs,
        job.input_format,
        job.output_format,
        job.shard_rows,
    )
    # A part leaves the half-written files of a killed run to its coordinator: another part may be writing its own.
    done = await loop.run_in_executor(None, resume, plan, job.output, job.part is None)
    batch_size = job.batch_size or dataplane.max_batch_size(job.model) or DEFAULT_BATCH_SIZE
    concurrency = job.concurrency or os.cpu_count() or 1
    runner = _ShardRunner(dataplane, job, plan, ModelSpec(job.model, version), batch_size, concurrency)
    shards = plan.shards()
    if job.part is not None:
        shards = [s for s in shards if s.index % job.part[1] == job.part[0]]
    rows = sum(s.rows for s in shards)
    skipped = [s for s in shards if s.index in done]
    resumed_rows = sum(s.rows for s in skipped)
    runner.done = resumed_rows

    def report() -> None:
        if progress is not None:
            progress(Progress(rows, runner.done, runner.failed, time.perf_counter() - started))

    runner.report = report
    report()
    todo = [s for s in shards if s.index not in done]
    try:
        await _run_shards(runner, todo, plan, job.output)
    finally:
        runner.reader.close()
    seconds = time.perf_counter() - started
    summary = BatchSummary(
        job.model,
        version,
        signature.name,
        job.output,
        rows,
        runner.answered + resumed_rows,
        runner.failed,
        len(shards),
        len(skipped),
        round(seconds, 3),
        round((rows - resumed_rows) / seconds, 1) if seconds > 0 else 0.0,  # the rows this run went through
    )
    if skipped:  # rows failed in an earlier run are in its errors files: count them from there
        earlier_failed = await loop.run_in_executor(None, _failed_in, plan, job.output, skipped)
        summary = dataclasses.replace(
            summary, rows_out=summary.rows_out - earlier_failed, rows_failed=summary.rows_failed + earlier_failed
        )
    if job.part is None:
        await loop.run_in_executor(None, write_summary, job.output, summary)
    report()
    return summary


async def _run_shards(runner: _ShardRunner, todo: Sequence[Shard], plan: Plan, output: str) -> None:
    """The shards, in order: the next one is read and cast while this one runs, and this one is written while
    the next one runs."""
    loop = asyncio.get_running_loop()
    if not todo:
        return
    first = await loop.run_in_executor(None, runner.read, todo[0])
    runner.decide(first)
    preparing = loop.run_in_executor(None, runner.prepare, todo[0], first)
    writing: asyncio.Future[None] | None = None
    try:
        for position, shard in enumerate(todo):
            prepared = await preparing
            if position + 1 < len(todo):
                preparing = loop.run_in_executor(None, runner.prepare, todo[position + 1], None)
            answers, errors = await runner.score(shard, *prepared)
            if writing is not None:
                await writing
            writing = loop.run_in_executor(None, _write_shard, plan, output, shard, answers, errors)
        if writing is not None:
            await writing
    finally:
        # A failed shard leaves the next one reading: the reader is closed once that read is over.
        with contextlib.suppress(Exception):
            await preparing


def write_summary(output: str, summary: BatchSummary) -> None:
    """``_SUMMARY.json``: written last, once every shard is."""
    write_text(child(output, SUMMARY_FILE), json.dumps(dataclasses.asdict(summary)))


def _pinned(dataplane: Dataplane, job: BatchJob) -> tuple[int, inference.Signature]:
    """The version the whole job runs on (a label resolved once: a promotion mid-job does not mix versions), and
    its signature."""
    with dataplane.handle(ModelSpec(job.model, job.model_version, job.version_label)) as servable:
        return servable.version, inference.predict_signature(servable, job.signature_name)


class _ShardRunner:
    """Scores shards through the data plane, ``concurrency`` batches in flight."""

    def __init__(
        self, dataplane: Dataplane, job: BatchJob, plan: Plan, spec: ModelSpec, batch_size: int, concurrency: int
    ) -> None:
        self.dataplane, self.job, self.plan, self.spec = dataplane, job, plan, spec
        self.batch_size = batch_size
        self.slots = asyncio.Semaphore(concurrency)
        self.feeding: Feeding | None = None
        self.done = self.failed = self.answered = 0
        self.report: Callable[[], None] = lambda: None
        # Shards are read in order, one at a time, each where the one before it ended: a file is read once.
        self.reader = RowReader()

    def read(self, shard: Shard) -> dict[str, np.ndarray]:
        return self.reader.read(shard.file.path, shard.file.format, shard.start, shard.stop)

    def decide(self, columns: Mapping[str, np.ndarray]) -> None:
        """How the files' columns feed the model, from the first shard's."""
        with self.dataplane.handle(self.spec) as servable:
            signature = inference.predict_signature(servable, self.plan.signature_name)
        self.feeding = feeding_for(signature, columns, self.job.columns, self.job.id_column)

    def prepare(self, shard: Shard, columns: Mapping[str, np.ndarray] | None) -> Prepared:
        """On a thread: the shard's ids, and its rows cast to what the model takes (read first unless given)."""
        if columns is None:
            columns = self.read(shard)
        assert self.feeding is not None
        feed, bad = self.feeding.feed(columns)
        return self._ids(shard, columns), feed, bad

    async def score(
        self, shard: Shard, ids: np.ndarray, feed: dict[str, np.ndarray], bad: RowErrors
    ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """The shard's answers (its id column first) and its failed rows."""
        keep = np.ones(shard.rows, dtype=bool)  # the rows that run (the feed holds them alone, in this order)
        keep[list(bad)] = False
        good = np.flatnonzero(keep)
        errors: RowErrors = dict(bad)
        self._count_failed(len(bad))
        pieces = [
            (good[start : start + self.batch_size], {n: v[start : start + self.batch_size] for n, v in feed.items()})
            for start in range(0, len(good), self.batch_size)
        ]
        results = await asyncio.gather(*(self._batch(rows, piece, errors) for rows, piece in pieces))
        answered_rows = [rows for rows, _ in results if len(rows)]
        outputs = [out for rows, out in results if len(rows)]
        answers: dict[str, np.ndarray] = {}
        id_name = self.job.id_column or ROW_COLUMN
        kept = np.concatenate(answered_rows) if answered_rows else np.zeros(0, dtype=np.int64)
        answers[id_name] = ids[kept]
        if outputs:
            for alias in outputs[0]:
                value = np.concatenate([out[alias] for out in outputs])
                # A row's answer is one value or a list of them in every format: an image's (h, w) is flattened.
                answers[alias] = value.reshape(len(value), -1) if value.ndim > 2 else value
        failed = [{id_name: _plain(ids[row]), "error": reason} for row, reason in sorted(errors.items())]
        return answers, failed

    def _ids(self, shard: Shard, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.job.id_column is not None:
            return np.asarray(columns[self.job.id_column])
        return np.arange(shard.first_row, shard.first_row + shard.rows, dtype=np.int64)

    async def _batch(
        self, rows: np.ndarray, feed: dict[str, np.ndarray], errors: RowErrors
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run one batch; a batch the model refuses is split until the refused rows are found (they fail alone)."""
        try:
            async with self.slots:
                with await self.dataplane.admit(self.spec, "predict", "batch") as call:
                    _, result = await self.dataplane.predict(call, self.plan.signature_name, feed)
        except ServingError as exc:
            if exc.code != Code.INVALID_ARGUMENT:
                raise
            if len(rows) == 1:
                errors[int(rows[0])] = exc.message
                self._count_failed(1)
                return rows[:0], {}
            half = len(rows) // 2
            first, second = await asyncio.gather(
                self._batch(rows[:half], {n: v[:half] for n, v in feed.items()}, errors),
                self._batch(rows[half:], {n: v[half:] for n, v in feed.items()}, errors),
            )
            parts = [part for part in (first, second) if len(part[0])]
            if not parts:
                return rows[:0], {}
            if len(parts) == 1:
                return parts[0]
            merged = {alias: np.concatenate([p[1][alias] for p in parts]) for alias in parts[0][1]}
            return np.concatenate([p[0] for p in parts]), merged
        self.answered += len(rows)
        self.done += len(rows)
        self.report()
        return rows, result

    def _count_failed(self, rows: int) -> None:
        if not rows:
            return
        self.failed += rows
        self.done += rows
        limit = self.job.max_failed_rows
        if limit is not None and self.failed > limit:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{self.failed} rows failed, more than --max_failed_rows={limit}; the shards written so far stay "
                "(their failed rows are in their errors files)",
            )


def _write_shard(
    plan: Plan, output: str, shard: Shard, answers: dict[str, np.ndarray], errors: list[dict[str, Any]]
) -> None:
    """The shard's errors file, then its part: a part that exists says both are complete."""
    if errors:
        lines = "".join(json.dumps(error) + "\n" for error in errors)
        write_text(child(output, plan.errors_name(shard)), lines)
    write_table(answers, child(output, plan.part_name(shard)), plan.output_format)


def _failed_in(plan: Plan, output: str, shards: Sequence[Shard]) -> int:
    names = set(list_names(output))
    failed = 0
    for shard in shards:
        name = plan.errors_name(shard)
        if name in names:
            failed += sum(1 for line in read_text(child(output, name)).splitlines() if line.strip())
    return failed


def _plain(value: Any) -> Any:
    """An id as JSON writes it."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
