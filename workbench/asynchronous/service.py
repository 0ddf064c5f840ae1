"""Asynchronous inference: ``:predictAsync`` answers ``202 Accepted`` at once, a consumer answers the request later.

- ``POST /v1/models/{m}[/versions/{v}|/labels/{l}]:predictAsync`` takes the body ``:predict`` takes. The model
  must exist and the body must decode against its signature (a mistake is a 4xx now, not a failure found later);
  the request is then queued (:mod:`~workbench.asynchronous.queues`) and answered ``202`` with its id
  and where its answer will be: ``{"id": ..., "state": "queued", "url": "/workbench/v1/async/<id>"}``.
- ``POST /v2/models/{m}[/versions/{v}]/infer`` with ``"parameters": {"async": true}`` (a workbench extension of
  the Open Inference Protocol) is queued the same way, checked as an inference request is; its answer, once done, is
  the v2 response (JSON: outputs in binary or shared memory are refused, as there is no one to hand them to).
- ``GET /workbench/v1/async/{id}``: its state (``queued``, ``running``, ``done``, ``failed``), attempts and times,
  and once answered the HTTP status and the answer itself, exactly what ``:predict`` would have answered
  (``{"predictions": ...}`` or ``{"error": ...}``). 404 once its answer's time (``--async_results_seconds``) is over.

Every serving process runs a :class:`Consumer` once it has a queue (a ``:predictAsync`` reached it, or the queue's
file existed when it started): it claims up to ``--async_concurrency`` requests at a time and runs each through the
same REST handler a synchronous ``:predict`` takes (:class:`~workbench.frontends.rest.RestApi`), so routing,
batching, deadlines, metrics and errors are a synchronous request's. An answer with a server-side status (5xx, 429)
is retried, up to ``--async_max_attempts`` claims, then failed with its last answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workbench.asynchronous.notify import Notifier
from workbench.asynchronous.queues import AsyncQueue, open_queue, queue_exists
from workbench.asynchronous.sqlite_queue import Claimed
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.core.sticky import STICKY_HEADER
from workbench.frontends.rest import PostHandler, RestApi, error_response, json_response
from workbench.frontends.v2_rest import V2Rest, V2Settings
from workbench.planes.calls import ModelSpec
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane
from workbench.protocol import json_tensor, v2_json
from workbench.runtime.storage import StorageError, is_remote, join, redact, translated

log = logging.getLogger(__name__)

ASYNC_PATH = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:predictAsync", re.IGNORECASE)
STATUS_PREFIX = "/workbench/v1/async/"
# Large inputs and outputs by reference, as SageMaker's asynchronous endpoints take them: the request's body is read
# from the input location when it runs, its answer written to the output location (the record then says where).
INPUT_LOCATION = "X-Workbench-Input-Location"
OUTPUT_LOCATION = "X-Workbench-Output-Location"
IDLE_POLL_SECONDS = 0.5  # how often an idle consumer looks for requests other processes queued
RETRY_SECONDS = 1.0  # before a request whose answer was a server error is tried again


class AsyncInference:
    """One serving process's side of asynchronous inference: accepting, answering status, consuming."""

    def __init__(
        self,
        dataplane: Dataplane,
        controlplane: ControlPlane,
        queue_uri: str,
        *,
        concurrency: int = 4,
        visibility_seconds: float = 60.0,
        results_seconds: float = 86400.0,
        max_attempts: int = 3,
        timeout_ms: int = 30000,
        max_request_bytes: int = 256 * 1024 * 1024,
        output: str = "",
        notify_url: str = "",
    ) -> None:
        """``output``: a folder (local or fsspec URL) each answer is also written to, as ``<id>.json``;
        ``notify_url``: where each answered request is told of (a webhook, or a result queue: :mod:`.notify`)."""
        self.dataplane = dataplane
        self.queue_uri = queue_uri
        self.concurrency = concurrency
        self.visibility_seconds = visibility_seconds
        self.results_seconds = results_seconds
        self.max_attempts = max_attempts
        self.max_request_bytes = max_request_bytes
        self.output = output.rstrip("/")
        self.notify_url = notify_url
        self._notifier = Notifier(notify_url) if notify_url else None
        # The synchronous paths every answer takes: TF Serving's REST API, and v2's for requests queued through it.
        self._rest = RestApi(dataplane, timeout_ms, max_request_bytes)
        self._v2 = V2Rest(dataplane, controlplane, V2Settings(timeout_ms, max_request_bytes))
        self._store: AsyncQueue | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()  # a request queued here: no need to wait for the next poll
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = False

    # ------------------------------------------------------------------------------------------- lifecycle
    def start(self, force: bool = False) -> None:
        """Consume at once if the queue exists already (requests queued before a restart, or by other processes),
        or whatever it is (``force``: a consumer alone, ``workbench consume``)."""
        if force or queue_exists(self.queue_uri):
            self._open()

    async def stop(self, timeout: float) -> None:
        """Take no more requests; let those running finish (those that do not in ``timeout`` are claimed again by
        whoever consumes next, once their claim expires)."""
        self._stopping = True
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer
        if self._running:
            await asyncio.wait(self._running, timeout=timeout)
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.get_running_loop().run_in_executor(None, store.close)

    def _open(self) -> AsyncQueue:
        if self._store is None:
            self._store = open_queue(self.queue_uri, self.results_seconds, self.max_attempts)
        if self._consumer is None and not self._stopping:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # opened from another thread (a metrics scrape): the loop's next use consumes
                return self._store
            self._consumer = loop.create_task(self._consume())
        return self._store

    # ------------------------------------------------------------------------------------------- the API
    async def accept(self, match: re.Match[str], path: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """``:predictAsync``: checked as ``:predict`` would check it, queued, answered 202."""
        try:
            name, version, label = match.groups()
            spec = ModelSpec(name=name, version=int(version) if version else None, label=label)
            await self.dataplane.loaded(name, None, spec)  # (loaded again if a memory budget evicted it)
            source = headers.get(INPUT_LOCATION, "")
            target = headers.get(OUTPUT_LOCATION, "")
            with self.dataplane.handle(spec) as servable:  # an unknown model or version: 404 now
                if not source:
                    json_tensor.PredictBody(body).decode(servable.signatures)
            # What the consumer runs: the same request, as :predict.
            query = {"input": source, "output": target, "key": headers.get(STICKY_HEADER, "")}
            return await self._enqueue(name, path[: -len("Async")], body, query)
        except ServingError as exc:
            return error_response(exc)

    async def accept_v2(self, model: str, version: str | None, body: bytes, headers: Mapping[str, str]) -> Response:
        """A v2 inference request with ``parameters.async`` true: checked as ``…/infer`` would check it (but for
        outputs in binary or in shared memory, which have no one to go to), queued, answered 202."""
        try:
            spec = await self._v2.models.loaded_spec(model, version, None)
            source = headers.get(INPUT_LOCATION, "")
            length = headers.get(v2_json.HEADER_LENGTH)
            with self.dataplane.handle(spec) as servable:  # an unknown version: 404 now
                if not source:
                    decoded = v2_json.decode_infer_request(body, v2_json.header_length(length, len(body)))
                    specs = json_tensor.input_specs(servable.signatures, DEFAULT_SIGNATURE, tuple(decoded.inputs))
                    v2_json.check_datatypes(decoded, specs)
                    _refuse_raw_outputs(decoded)
            path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
            query = {
                "input": source,
                "output": headers.get(OUTPUT_LOCATION, ""),
                "header_length": length or "",
                "key": headers.get(STICKY_HEADER, ""),  # a canary's stickiness key: the version is picked when it runs
            }
            return await self._enqueue(model, path, body, query)
        except ServingError as exc:
            return error_response(exc)

    async def _enqueue(self, model: str, path: str, body: bytes, query: Mapping[str, str]) -> Response:
        """Queue the request the consumer will run as ``path`` (with ``query``: where its body and answer go, if
        elsewhere, and a v2 body's header length), answered 202 with its id."""
        loop = asyncio.get_running_loop()
        source = query.get("input", "")
        if source:
            if body.strip():
                raise ServingError(Code.INVALID_ARGUMENT, f"A request with {INPUT_LOCATION} has no body")
            await loop.run_in_executor(None, _check_readable, source)
        if self._stopping:
            raise ServingError(Code.UNAVAILABLE, "The server is shutting down: queue the request elsewhere")
        store = self._open()
        given = {key: value for key, value in query.items() if value}
        if given:
            path += "?" + urllib.parse.urlencode(given)
        request_id = await loop.run_in_executor(None, store.put, model, path, body)
        self._arrived.set()
        answer = {"id": request_id, "state": "queued", "url": STATUS_PREFIX + request_id}
        return json_response(json.dumps(answer).encode(), 202, {"Location": answer["url"]})

    async def status(self, request: Request) -> Response:
        request_id = request.path_params["request_id"]
        store = self._store
        if store is None and queue_exists(self.queue_uri):
            store = self._open()
        record = (
            await asyncio.get_running_loop().run_in_executor(None, store.get, request_id) if store is not None else None
        )
        if record is None:
            return error_response(
                ServingError(Code.NOT_FOUND, f"No asynchronous request {request_id} (unknown, or its answer expired)")
            )
        document: dict[str, object] = {
            "id": record.id,
            "model": record.model,
            "state": record.state,
            "attempts": record.attempts,
            "created": record.created,
            "updated": record.updated,
        }
        if record.status is not None and record.answer is not None:
            document["status"] = record.status
            document["answer"] = json.loads(record.answer)
        return json_response(json.dumps(document).encode())

    @property
    def in_use(self) -> bool:
        """Whether this server has an asynchronous queue (it took a request, or found the queue at its start)."""
        return self._store is not None

    def waiting(self) -> tuple[int, float]:
        """Requests not answered yet and the oldest one's age, for the metrics (on the event loop, at scrape time: a
        queue another process of the server created is opened, and consumed, from then on)."""
        store = self._store
        if store is None and queue_exists(self.queue_uri):
            store = self._open()
        return store.waiting() if store is not None else (0, 0.0)

    def routes(self) -> list[Route]:
        return [Route(STATUS_PREFIX + "{request_id}", self.status, methods=["GET"])]

    def posts(self) -> list[tuple[re.Pattern[str], PostHandler]]:
        """What the REST API's /v1 answers here: ``:predictAsync``."""
        return [(ASYNC_PATH, self.accept)]

    # ------------------------------------------------------------------------------------------- consuming
    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        store = self._store
        assert store is not None
        while not self._stopping:
            free = self.concurrency - len(self._running)
            claimed = await loop.run_in_executor(None, store.claim, free, self.visibility_seconds) if free > 0 else []
            for item in claimed:
                task = loop.create_task(self._answer(store, item))
                self._running.add(task)
                task.add_done_callback(self._ended)
            if claimed and len(self._running) < self.concurrency:
                continue  # there may be more waiting
            self._arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), IDLE_POLL_SECONDS)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._arrived.set()  # a slot is free

    async def _answer(self, store: AsyncQueue, item: Claimed) -> None:
        loop = asyncio.get_running_loop()
        path, _, query = item.path.partition("?")
        locations = dict(urllib.parse.parse_qsl(query))
        try:
            request = await loop.run_in_executor(None, _read, locations["input"]) if "input" in locations else item.body
        except StorageError as exc:  # gone since it was accepted, or unreadable: the request's own failure
            status, body = 400, json_tensor.encode_error(f"Could not read the request's input: {exc}")
        else:
            status, body = await self._run(path, request, locations.get("header_length"), locations.get("key"))
        try:
            if status == 200 and "output" in locations:  # the answer goes there; the record says where
                await loop.run_in_executor(None, _write, locations["output"], body)
                body = json.dumps({"output_location": locations["output"]}).encode()
            if (status >= 500 or status == 429) and item.attempts < self.max_attempts:
                await loop.run_in_executor(None, store.retry, item, RETRY_SECONDS)
            elif await loop.run_in_executor(None, store.finish, item, status, body):
                if self.output:
                    await loop.run_in_executor(None, self._write_output, item, status, body)
                if self.notify_url:
                    await loop.run_in_executor(None, self._notify, item, status)
        except Exception:  # the claim expires and the request is taken again
            log.exception("Could not record the answer to asynchronous request %s", item.id)

    async def _run(
        self, path: str, request: bytes, header_length: str | None, key: str | None = None
    ) -> tuple[int, bytes]:
        """The answer to a queued request, as its synchronous path gives it (a failure its status and error)."""
        v2 = _V2_PATH.fullmatch(path)
        if v2 is None:
            match = _SYNC_PATH.fullmatch(path)
            assert match is not None  # written by accept()
            status, body, _ = await self._rest.inference(match, _body_of(request), path, key)
            return status, body
        model, version = v2.groups()
        try:
            encoded = await self._v2.run(model, version, request, header_length, key=key)
        except Exception as exc:  # the request's answer, as v2's REST API would give it
            if not isinstance(exc, ServingError):
                log.exception("Asynchronous v2 request failed")
            failed = error_response(exc if isinstance(exc, ServingError) else from_exception(exc))
            return failed.status_code, bytes(failed.body)
        return 200, encoded.body

    def _notify(self, item: Claimed, status: int) -> None:
        """Tell ``notify_url`` the request was answered (a webhook, or a result queue: :mod:`.notify`)."""
        assert self._notifier is not None
        state = "done" if 200 <= status < 300 else "failed"
        url = STATUS_PREFIX + item.id
        self._notifier.notify({"id": item.id, "model": item.model, "state": state, "status": status, "url": url})

    def _write_output(self, item: Claimed, status: int, body: bytes) -> None:
        """The answer as ``<output>/<id>.json``, written whole."""
        document = {"id": item.id, "model": item.model, "status": status, "answer": json.loads(body)}
        _write(join(self.output, f"{item.id}.json"), json.dumps(document).encode())


_V2_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_SYNC_PATH = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(predict)", re.IGNORECASE)


def _check_readable(url: str) -> None:
    """An input location the server can read: a 400 now, rather than a request that fails later."""
    try:
        fs, path = _filesystem_of(url)
        with translated(url):
            exists = fs.exists(path)
    except StorageError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{INPUT_LOCATION}: {exc}") from None
    if not exists:
        raise ServingError(Code.INVALID_ARGUMENT, f"{INPUT_LOCATION}: {redact(url)} does not exist")


def _read(url: str) -> bytes:
    fs, path = _filesystem_of(url)
    with translated(url):
        return bytes(fs.cat_file(path))


def _write(url: str, data: bytes) -> None:
    """``data`` at ``url``, written whole: an object store's one PUT, a local file's rename."""
    if not is_remote(url):
        folder = os.path.dirname(os.path.abspath(url))
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".tmp-{os.getpid()}-{os.path.basename(url)}")
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, url)
        return
    fs, path = _filesystem_of(url)
    with translated(url):
        fs.pipe_file(path, data)


def _filesystem_of(url: str) -> tuple[Any, str]:
    from fsspec.core import url_to_fs  # a location by reference: fsspec, as repositories are read

    with translated(url):
        fs, path = url_to_fs(url)
    return fs, path


def _refuse_raw_outputs(decoded: v2_json.InferRequest) -> None:
    """A queued v2 request's answer is JSON: nobody is there to take raw outputs."""
    if decoded.binary_outputs or any(output.binary for output in decoded.outputs):
        raise ServingError(
            Code.INVALID_ARGUMENT,
            "An asynchronous request's answer is JSON: ask for its outputs without binary_data",
        )


def _body_of(body: bytes) -> Callable[[], Awaitable[bytes]]:
    async def read() -> bytes:
        return body

    return read
