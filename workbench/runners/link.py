"""A frontend's connection to one model runner: requests out, answers back, and what happens when the runner dies.

Requests are sent from the event loop; everything one turn of the loop sends leaves in one write, so under load a
runner receives requests in groups and batches them together. Each request's tensors are written into this
frontend's arena (:mod:`workbench.runners.arena`); the runner's answer frees them. Answers' tensors are read from the
runner's arena, copied out, and the blocks given back with the next write.

A runner that exits (a crash, an out-of-memory kill) fails every request in flight on it at once with UNAVAILABLE;
requests sent while it is away fail the same way. The link reconnects once the supervisor has restarted it, loads
again every version this frontend holds, and serves again. Loads (from the manager's threads) wait for the
connection; inference never does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from workbench.batching.interest import BatchTask, Interest
from workbench.batching.scheduler import BatchRecord
from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError
from workbench.runners import wire
from workbench.runners.arena import Arena
from workbench.runners.runner import LOCAL, Key

log = logging.getLogger("workbench.runner")

REQUEST_ARENA_BYTES = 1 << 30  # virtual: pages are backed only while requests occupy them
RECONNECT_S = 0.2
CONNECT_TIMEOUT_S = 60.0


class _RemoteTask(BatchTask):
    """A request in a runner, as its :class:`Interest` sees it: giving up on it tells the runner to drop it."""

    __slots__ = ("link", "rid")
    link: RunnerLink
    rid: int

    def withdraw(self, error: BaseException | None) -> None:
        if not self.queued:
            return
        self.queued = False
        self.link.cancel(self.rid)
        if error is not None and not self.future.done():
            self.future.set_exception(error)


class RunnerLink(asyncio.Protocol):
    """This frontend's connection to the runner listening on ``path``."""

    def __init__(self, path: Path, index: int, on_batch: Callable[[BatchRecord], None]) -> None:
        self.path, self.index = path, index
        self._on_batch = on_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._requests: Arena | None = None  # ours: request tensors
        self._answers: Arena | None = None  # the runner's: answer tensors
        self._frames = wire.FrameReader()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._freed: list[int] = []  # blocks of the runner's arena read and copied: given back with the next write
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], wire.Spans, _RemoteTask | None, str, int, int]] = {}
        self._records: dict[int, list[Any]] = {}  # traced requests in flight: where the runner's timings go
        self._sent_params: dict[str, BatchingParameters | None] = {}
        self._held: dict[Key, tuple[str, int]] = {}  # key → (platform, holds): loaded again after a restart
        self.ready = False  # connected, and every held version loaded again
        self._ready = asyncio.Event()
        self._closing = False
        self._reconnecting: asyncio.Future[None] | None = None

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def outstanding_rows(self) -> dict[tuple[str, int], int]:
        rows: dict[tuple[str, int], int] = {}
        for _, _, _, model, version, count in self._pending.values():
            rows[(model, version)] = rows.get((model, version), 0) + count
        return rows

    # ------------------------------------------------------------------------------------- connection
    async def connect(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Connect (retrying while the runner starts), then hold again what this frontend held."""
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock, requests, answers = await self._loop.run_in_executor(None, self._greet)
                break
            except OSError:
                if self._closing or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RECONNECT_S)
        self._requests, self._answers = requests, answers
        self._frames = wire.FrameReader()
        self._sent_params.clear()
        await self._loop.connect_accepted_socket(lambda: self, sock)
        for key, (platform, holds) in list(self._held.items()):
            for _ in range(holds):  # the runner counts holds as this frontend will let go of them
                await self._request(wire.LOAD, key, platform)
        self.ready = True
        self._ready.set()

    def _greet(self) -> tuple[socket.socket, Arena, Arena]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10.0)
            sock.connect(str(self.path))
            requests = Arena(REQUEST_ARENA_BYTES, name="workbench-frontend-requests")
            try:
                wire.send_arena(sock, requests)
                answers = wire.receive_arena(sock)
            except BaseException:
                requests.close()
                raise
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        return sock, requests, answers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def connection_lost(self, exc: Exception | None) -> None:
        self.ready = False
        self._ready.clear()
        self._transport = None
        pending, self._pending = self._pending, {}
        self._records.clear()
        gone = ServingError(
            Code.UNAVAILABLE, f"Model runner {self.index} exited while running this request; it is being restarted"
        )
        for future, _, task, *_ in pending.values():
            if task is not None:
                task.queued = False
            if not future.done():
                future.set_exception(gone)
        self._out.clear()
        self._freed.clear()
        for arena in (self._requests, self._answers):
            if arena is not None:
                arena.close()
        self._requests = self._answers = None
        if not self._closing:
            log.error("Model runner %d is gone: %d requests in flight failed; reconnecting", self.index, len(pending))
            self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        while not self._closing:
            try:
                await self.connect(timeout=float("inf"))
                log.info("Model runner %d is back: %d versions loaded again", self.index, len(self._held))
                return
            except (OSError, ServingError) as exc:
                if self._transport is not None:  # connected, but a load failed: start over
                    self._transport.close()
                    return
                log.debug("Model runner %d not back yet: %s", self.index, exc)
                await asyncio.sleep(RECONNECT_S)

    async def close(self) -> None:
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._transport is not None:
            self._transport.close()
            await asyncio.sleep(0)

    # ------------------------------------------------------------------------------------- versions
    def load(self, key: Key, platform: str, timeout: float | None = None) -> Any:
        """Hold ``key`` in the runner (from a load thread): its description, or LOCAL."""
        assert self._loop is not None, "connect() first"
        future = asyncio.run_coroutine_threadsafe(self._load(key, platform), self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServingError(Code.DEADLINE_EXCEEDED, f"Model runner {self.index} did not load {key[0]}") from None

    async def _load(self, key: Key, platform: str) -> Any:
        if not self.ready:  # the runner is being restarted: a version that appears meanwhile loads once it is back
            try:
                await asyncio.wait_for(self._ready.wait(), CONNECT_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise ServingError(Code.UNAVAILABLE, f"Model runner {self.index} is not back") from None
        description = await self._request(wire.LOAD, key, platform)
        if description != LOCAL:
            held = self._held.get(key)
            self._held[key] = (platform, (held[1] if held else 0) + 1)
        return description

    def unload(self, key: Key) -> None:
        """Let go of ``key`` (from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._unload, key)

    def _unload(self, key: Key) -> None:
        held = self._held.get(key)
        if held is None:
            return
        if held[1] > 1:
            self._held[key] = (held[0], held[1] - 1)
        else:
            del self._held[key]
        if self._transport is not None:
            self._send((wire.UNLOAD, key))

    async def _request(self, kind: int, *args: Any) -> Any:
        if self._transport is None:
            raise ServingError(Code.UNAVAILABLE, f"Model runner {self.index} is not connected")
        assert self._loop is not None
        rid = next(self._ids)
        future = self._loop.create_future()
        self._pending[rid] = (future, [], None, "", 0, 0)
        self._send((kind, rid, *args))
        return await future

    # ------------------------------------------------------------------------------------- requests
    async def infer(
        self,
        key: Key,
        signature_name: str,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        interest: Interest | None,
        params: BatchingParameters | None,
        records: list[Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run a request in the runner; ``records`` (a traced request's): filled with what the runner recorded of
        it (:mod:`workbench.runners.timings`) before the answer comes back."""
        if not self.ready or self._transport is None:
            raise ServingError(Code.UNAVAILABLE, f"Model runner {self.index} is restarting: try again shortly")
        loop = self._loop
        assert loop is not None
        if interest is not None and interest.error is not None:
            raise interest.error
        rid = next(self._ids)
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        rows = next(iter(feed.values())).shape[0] if feed else 0
        task = _RemoteTask(feed, rows, (), future, 0.0, None, interest)
        task.link, task.rid = self, rid
        timeout = None
        if interest is not None:
            interest._add(task)  # noqa: SLF001 - as the batcher's own tasks join their request's interest
            if interest.deadline is not None:
                timeout = max(0.0, interest.deadline - loop.time())
        model = key[0]
        sent = () if self._sent_params.get(model, _UNSENT) is params else (params,)
        self._sent_params[model] = params
        message = (wire.INFER, rid, key, signature_name, tuple(outputs), timeout, sent, feed, records is not None)
        frame, spans = wire.encode(message, self._requests)
        self._pending[rid] = (future, spans, task, model, key[1], rows)
        if records is not None:
            self._records[rid] = records
        self._write(frame)
        try:
            return await future
        except asyncio.CancelledError:
            task.withdraw(None)
            raise

    def cancel(self, rid: int) -> None:
        if rid in self._pending and self._transport is not None:
            self._send((wire.CANCEL, rid))

    # ------------------------------------------------------------------------------------- the wire
    def _send(self, message: tuple[Any, ...]) -> None:
        frame, _ = wire.encode(message, None)
        self._write(frame)

    def _write(self, frame: bytes) -> None:
        self._out.append(frame)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._freed:
            frame, _ = wire.encode((wire.FREE, self._freed), None)
            self._out.append(frame)
            self._freed = []
        out, self._out = self._out, []
        if self._transport is not None and out:
            self._transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        for frame in self._frames.feed(data):
            message, spans = wire.decode(frame, self._answers)
            kind = message[0]
            if kind == wire.REPLIES:
                replies = message[1]
                if spans:  # the answers view the runner's arena: copy them out, then give the blocks back
                    replies = [(rid, ok, _copied(payload) if ok else payload) for rid, ok, payload in replies]
                    self._freed.extend(offset for offset, _ in spans)
                    self._schedule_flush()
                for rid, ok, payload in replies:
                    self._answered(rid, ok, payload)
            elif kind == wire.BATCH:
                self._on_batch(message[1])
            elif kind == wire.TIMINGS:
                records = self._records.get(message[1])
                if records is not None:
                    records.extend(message[2])

    def _answered(self, rid: int, ok: bool, payload: Any) -> None:
        self._records.pop(rid, None)
        entry = self._pending.pop(rid, None)
        if entry is None:
            return
        future, request_spans, task, *_ = entry
        if request_spans and self._requests is not None:
            for offset, _ in request_spans:
                self._requests.free(offset)
        if task is not None:
            if not task.queued:  # given up: its caller was answered already
                return
            task.queued = False
        if future.done():
            return
        if ok:
            future.set_result(payload)
        else:
            future.set_exception(wire.error_from(payload))


_UNSENT: Any = object()


def _copied(payload: Any) -> Any:
    """An answer's tensors out of the runner's arena (a load's description holds none)."""
    if isinstance(payload, dict):
        return {name: np.array(value, copy=True) if isinstance(value, np.ndarray) else value
                for name, value in payload.items()}  # fmt: skip
    return payload
