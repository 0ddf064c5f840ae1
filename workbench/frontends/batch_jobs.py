"""Batch prediction jobs inside a running server: its loaded models score a data set beside its online traffic.

- ``POST /workbench/v1/batch`` ``{"model": ..., "input": URI, "output": URI, ...}`` (the fields of
  :class:`~workbench.batch_prediction.job.BatchJob`, by name) starts a job and answers ``202`` with its id and URL;
- ``GET /workbench/v1/batch/{id}``: its state (``running``, ``done``, ``failed``, ``cancelled``), rows done and
  failed of how many, and its summary or error; ``DELETE`` cancels it (the shards written stay: the same job
  started again finishes the rest).

A job reads and writes files with the server's own rights, so it is a change like the management API's: with a
management token it needs it (``Authorization: Bearer``), without one only clients on the server's host may start
or cancel jobs. Its requests go through the data plane as ``batch`` requests, and at most ``max(1, cores // 2)``
of its batches are in flight (a job asking for more gets that many): the other half of the machine stays for the
online requests, which the job's batches queue beside rather than ahead of. Its rows are counted in Prometheus
(``workbench_batch_rows_total{model, outcome}``, ``workbench_batch_jobs_running``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workbench.batch_prediction.job import BatchJob, BatchSummary, Progress, run_job
from workbench.core.errors import Code, ServingError, from_exception
from workbench.frontends.auth import bearer_matches, is_local_peer
from workbench.frontends.rest import error_response, json_response
from workbench.planes.dataplane import Dataplane

log = logging.getLogger(__name__)

PREFIX = "/workbench/v1/batch"
_FIELDS = {f.name for f in dataclasses.fields(BatchJob)}


def job_share() -> int:
    """The most batches a job in a server keeps in flight: half the cores, at least one."""
    return max(1, (os.cpu_count() or 1) // 2)


@dataclasses.dataclass
class _Job:
    id: str
    job: BatchJob
    started: float
    task: asyncio.Task[None] | None = None
    progress: Progress | None = None
    state: str = "running"
    summary: BatchSummary | None = None
    error: str | None = None

    def document(self) -> dict[str, Any]:
        progress = self.progress
        doc: dict[str, Any] = {
            "id": self.id,
            "model": self.job.model,
            "input": self.job.input,
            "output": self.job.output,
            "state": self.state,
            "rows": progress.rows if progress else None,
            "done": progress.done if progress else 0,
            "failed": progress.failed if progress else 0,
            "seconds": round(time.time() - self.started, 3) if self.state == "running" else None,
        }
        if self.summary is not None:
            doc["summary"] = dataclasses.asdict(self.summary)
        if self.error is not None:
            doc["error"] = self.error
        return doc


class BatchJobs:
    """The jobs of one serving process (a job runs in the process that took its POST)."""

    def __init__(self, dataplane: Dataplane, token: str = "") -> None:
        self.dataplane, self.token = dataplane, token
        self._jobs: dict[str, _Job] = {}

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX, self.start, methods=["POST"]),
            Route(PREFIX + "/{job_id}", self.status, methods=["GET"]),
            Route(PREFIX + "/{job_id}", self.cancel, methods=["DELETE"]),
        ]

    async def start(self, request: Request) -> Response:
        try:
            self._authorize(request)
            job = _job_from(await request.body())
            entry = _Job(uuid.uuid4().hex, job, time.time())
            entry.task = asyncio.get_running_loop().create_task(self._run(entry))
            self._jobs[entry.id] = entry
        except ServingError as exc:
            return error_response(exc)
        body = {"id": entry.id, "state": entry.state, "url": f"{PREFIX}/{entry.id}"}
        return json_response(json.dumps(body).encode(), 202, {"Location": body["url"]})

    async def status(self, request: Request) -> Response:
        entry = self._jobs.get(request.path_params["job_id"])
        if entry is None:
            return error_response(ServingError(Code.NOT_FOUND, f"No batch job {request.path_params['job_id']}"))
        return json_response(json.dumps(entry.document()).encode())

    async def cancel(self, request: Request) -> Response:
        try:
            self._authorize(request)
            entry = self._jobs.get(request.path_params["job_id"])
            if entry is None:
                raise ServingError(Code.NOT_FOUND, f"No batch job {request.path_params['job_id']}")
        except ServingError as exc:
            return error_response(exc)
        if entry.task is not None and not entry.task.done():
            entry.task.cancel()
            await asyncio.wait([entry.task])
        return json_response(json.dumps(entry.document()).encode())

    async def stop(self) -> None:
        """Cancel the jobs still running (the server stops): their shards written so far stay."""
        running = [e.task for e in self._jobs.values() if e.task is not None and not e.task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)

    def _authorize(self, request: Request) -> None:
        if self.token:
            if not bearer_matches(request.headers.get("authorization", ""), self.token):
                raise ServingError(Code.UNAUTHENTICATED, "Batch jobs need this server's management token")
        elif not is_local_peer(request.client.host if request.client else ""):
            raise ServingError(
                Code.PERMISSION_DENIED,
                "Batch jobs read and write files as the server: without a management token, only clients on the "
                "server's host may start them",
            )

    async def _run(self, entry: _Job) -> None:
        metrics = self.dataplane.metrics
        counted = [0, 0]  # rows scored and failed, already counted

        def progress(now: Progress) -> None:
            entry.progress = now
            scored = now.done - now.failed
            metrics.count_batch_rows(entry.job.model, scored - counted[0], now.failed - counted[1])
            counted[0], counted[1] = scored, now.failed

        metrics.batch_jobs_running.inc()
        try:
            entry.summary = await run_job(self.dataplane, entry.job, progress)
            entry.state = "done"
        except asyncio.CancelledError:
            entry.state = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - a file that cannot be read, a store that refuses: the job's error
            error = exc if isinstance(exc, ServingError) else from_exception(exc)
            entry.state, entry.error = "failed", error.message
            log.warning("Batch job %s (%s) failed: %s", entry.id, entry.job.model, error.message)
        finally:
            metrics.batch_jobs_running.dec()


def _job_from(body: bytes) -> BatchJob:
    try:
        fields = json.loads(body or b"{}")
    except ValueError:
        raise ServingError(Code.INVALID_ARGUMENT, "A batch job is a JSON object") from None
    if not isinstance(fields, dict):
        raise ServingError(Code.INVALID_ARGUMENT, "A batch job is a JSON object")
    unknown = sorted(set(fields) - _FIELDS)
    missing = [name for name in ("model", "input", "output") if not fields.get(name)]
    if unknown or missing:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"A batch job needs model, input and output (missing: {', '.join(missing) or 'none'}); "
            f"unknown fields: {', '.join(unknown) or 'none'}. Fields: {', '.join(sorted(_FIELDS))}",
        )
    try:
        job = BatchJob(**fields)
    except TypeError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"A batch job's fields: {exc}") from None
    return dataclasses.replace(job, concurrency=min(job.concurrency or job_share(), job_share()))
