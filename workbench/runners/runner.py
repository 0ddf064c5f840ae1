"""A model runner process: each model version loaded once, batched across every frontend that sends it requests.

Started by the supervisor of ``workbench serve`` (:mod:`workbench.deploy.workers`) as ``workbench serve <flags>
--runner_of=RUN_DIR --runner_index=I``, one per device; it listens on ``RUN_DIR/runner-I.sock``. Each frontend
process connects, passes its request arena and maps the runner's answer arena (:mod:`workbench.runners.wire`), then
sends LOADs for the versions its manager serves, and INFERs. A version is loaded on the first LOAD (and warmed up),
held while any frontend holds it, and closed once the last lets go and its last batch ended. Requests of every
frontend meet in the runner's own :class:`~workbench.batching.scheduler.BatchScheduler`, where batches form.

A request is answered exactly once, and only when nothing of the runner still reads its tensors (the frontend then
reuses their memory): after its batch ran, or once it left its queue unrun (cancelled, deadline passed). A frontend
that goes away gives up its queued requests and lets go of what it held.

What stays in the frontends: decoding, routing (versions, labels, canaries), deadlines, request logs, the response
cache and metrics. Models that keep state between requests or answer in streams (sequences, decoupled models) and
composites (handlers, pipelines, whose code calls back into the server) are loaded by the frontends themselves: the
runner tells the frontend so when it loads one (:data:`LOCAL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from workbench.batching.interest import Interest
from workbench.batching.merge import batch_key, merge, split
from workbench.batching.scheduler import BatchRecord, BatchScheduler
from workbench.batching.threads import InferenceThreads
from workbench.config.batching_parameters import BatchingParameters
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Composite, PerRequestServable, Servable
from workbench.core.signatures import Signature
from workbench.models.residency import memory_held
from workbench.models.warmup_replay import warm_up
from workbench.observability import tracing
from workbench.platforms import Loader
from workbench.platforms.base import LoadPolicy
from workbench.platforms.triton import own_batching
from workbench.runners import wire
from workbench.runners.arena import Arena
from workbench.runners.timings import RunnerTimings
from workbench.runtime.heap import LongLivedHeap
from workbench.runtime.loop import new_event_loop
from workbench.runtime.process import hand_over_the_gil_quickly, parent_gone, write_json_atomically
from workbench.runtime.storage import VersionCache, caching_loader

log = logging.getLogger("workbench.runner")

ANSWER_ARENA_BYTES = 1 << 30  # virtual: pages are backed only while answers occupy them
LOCAL = "local"  # a LOAD's answer for a version the frontend must load itself
Key = tuple[str, int, str]  # model, version, version folder
# An INFER's fields: rid, key, signature name, outputs, timeout, (batching parameters,) or (), feed, traced.
Request = tuple[Any, ...]
Arrival = tuple["_Frontend", Request]


def socket_path(run_dir: str | Path, index: int) -> Path:
    return Path(run_dir) / f"runner-{index}.sock"


def ready_path(run_dir: str | Path, index: int) -> Path:
    return Path(run_dir) / f"runner-{index}.ready.json"


def served_remotely(servable: Servable) -> bool:
    """Whether a runner serves ``servable`` for the frontends: stateless, one answer a request, no callbacks."""
    return not isinstance(servable, Composite) and servable.sequence is None and not servable.decoupled


def describe(servable: Servable) -> dict[str, Any]:
    """What a frontend needs of a version it does not hold: its signatures and metadata."""
    return {
        "platform": servable.platform,
        "signatures": dict(servable.signatures),
        "model_config": servable.model_config,
        "signature_defs": _serialized(getattr(servable, "signature_defs", None)),
        "load_warnings": servable.load_warnings,
        # For the frontends' memory budgets, which measure nothing of a load in another process.
        "memory_held": memory_held(servable),
    }


def _serialized(signature_defs: Mapping[str, Any] | None) -> bytes | None:
    """A SavedModel's own SignatureDefs as a serialized ``SignatureDefMap``: the frontend parses it with TF Serving's
    protos alone (unpickling the messages would import all of TensorFlow there)."""
    if signature_defs is None:
        return None
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import get_model_metadata_pb2

    definitions = get_model_metadata_pb2.SignatureDefMap()
    for name, definition in signature_defs.items():
        definitions.signature_def[name].CopyFrom(definition)
    return bytes(definitions.SerializeToString())


class _Version:
    """A version in the runner: loading or loaded, who holds it, how many requests run on it."""

    __slots__ = ("key", "loading", "servable", "holders", "running")

    def __init__(self, key: Key, loading: asyncio.Future[Servable | None]) -> None:
        self.key = key
        self.loading = loading
        self.servable: Servable | None = None
        self.holders: dict[_Frontend, int] = {}
        self.running = 0


class ModelRunner:
    """The runner's engine: versions, the batcher and the frontends connected to it."""

    def __init__(self, options: ServerOptions, index: int = 0) -> None:
        self.index = index
        # Versions in object stores are downloaded here, once for every worker: the workers name a version by its
        # source (name, version, URL), so they all hold the same copy.
        self._cache = VersionCache(options.model_cache_dir, options.mlflow_tracking_uri)
        self._loader = caching_loader(
            Loader(
                LoadPolicy(
                    options.allow_pickle,
                    options.allow_python_models,
                    pytorch_device=options.pytorch_device,
                    pytorch_threads=options.pytorch_threads,
                    auto_complete_config=not options.disable_auto_complete_config,
                    prefer_tflite_model=options.prefer_tflite_model,
                    tflite_interpreters=options.tflite_interpreters,
                    max_batched_tokens=options.max_batched_tokens,
                )
            ),
            self._cache,
        )
        self._warm_up = options.enable_model_warmup
        threads = options.num_inference_threads or max(4, 2 * (os.cpu_count() or 1))
        self._executor = InferenceThreads(threads, "workbench-runner")
        self._loads = ThreadPoolExecutor(max(1, options.num_load_threads), thread_name_prefix="workbench-runner-load")
        self._params: dict[str, BatchingParameters | None] = {}
        self.scheduler = BatchScheduler(
            self._executor,
            lambda servable: self._params.get(servable.name) or own_batching(servable),
            listener=self._on_batch,
        )
        self._versions: dict[Key, _Version] = {}
        self._frontends: set[_Frontend] = set()
        self._reporter: dict[str, _Frontend] = {}  # model → the frontend its batch records go to
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived: list[Arrival] = []  # INFERs read in this turn of the loop, from every frontend
        self.heap = LongLivedHeap()  # frozen after each load and unload (see workbench.runtime.heap)

    # ------------------------------------------------------------------------------------- serving
    async def serve(self, sock: socket.socket, stopping: asyncio.Event) -> None:
        """Take frontends on the listening ``sock`` until ``stopping`` is set; then wait for the last request."""
        loop = self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        accepting = asyncio.ensure_future(self._accept(loop, sock))
        await stopping.wait()
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting
        while any(version.running for version in self._versions.values()):
            await asyncio.sleep(0.05)
        for frontend in list(self._frontends):
            frontend.close()

    async def _accept(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        while True:
            peer, _ = await loop.sock_accept(sock)
            try:
                arenas = await loop.run_in_executor(None, _greet, peer)
            except (OSError, ConnectionError) as exc:
                log.warning("A frontend's connection failed before it began: %s", exc)
                peer.close()
                continue
            peer.setblocking(False)
            await loop.connect_accepted_socket(functools.partial(_Frontend, self, *arenas), peer)

    def _close(self, servable: Servable) -> None:
        servable.close()
        self._cache.release(servable.name, servable.version)  # a downloaded copy goes with it

    def stop(self) -> None:
        """Close every version (the frontends are gone), the threads and the download cache."""
        self.heap.stop()
        for version in list(self._versions.values()):
            self._drop(version)
        self._loads.shutdown(wait=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._cache.close()

    # ------------------------------------------------------------------------------------- versions
    async def load(self, frontend: _Frontend, key: Key, platform: str) -> Any:
        """Hold ``key`` for ``frontend``, loading it first if nobody holds it; its description, or :data:`LOCAL`."""
        version = self._versions.get(key)
        if version is None:
            loop = asyncio.get_running_loop()
            loading = loop.run_in_executor(self._loads, self._load_blocking, key, platform)
            version = self._versions[key] = _Version(key, loading)
        version.holders[frontend] = version.holders.get(frontend, 0) + 1
        try:
            servable = await asyncio.shield(version.loading)
        except BaseException:
            self.unload(frontend, key)
            raise
        if servable is None:
            self.unload(frontend, key)
            return LOCAL
        version.servable = servable
        return describe(servable)

    def _load_blocking(self, key: Key, platform: str) -> Servable | None:
        name, number, path = key
        try:
            servable = self._loader(name, number, path, platform)
        except BaseException:
            self._cache.release(name, number)  # a failed load keeps no downloaded copy
            raise
        if not served_remotely(servable):
            self._close(servable)  # the worker loads it itself, from a copy of its own
            return None
        if self._warm_up:
            try:
                warm_up(servable)
            except BaseException:
                self._close(servable)
                raise
        log.info("Loaded %s version %d (%s)", name, number, servable.platform)
        self.heap.settle_soon()  # the model's objects join the long-lived heap, out of full collections' way
        return servable

    def unload(self, frontend: _Frontend, key: Key, all_of_them: bool = False) -> None:
        version = self._versions.get(key)
        if version is None or frontend not in version.holders:
            return
        version.holders[frontend] -= 1
        if all_of_them or version.holders[frontend] <= 0:
            del version.holders[frontend]
        if not version.holders:
            del self._versions[key]
            if version.running == 0:
                self._drop(version)

    def _drop(self, version: _Version) -> None:
        """Close ``version`` once loaded (on a load thread: a framework's close may take a while)."""

        def close(done: asyncio.Future[Servable | None]) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            servable = done.result()
            if servable is not None:
                log.info("Unloading %s version %d", servable.name, servable.version)
                with contextlib.suppress(RuntimeError):  # stopping: close on this thread
                    self._loads.submit(self._close, servable).add_done_callback(lambda _: self.heap.settle_soon())
                    return
                self._close(servable)

        self._versions.pop(version.key, None)
        version.loading.add_done_callback(close)

    # ------------------------------------------------------------------------------------- requests
    def arrived(self, frontend: _Frontend, requests: list[Request]) -> None:
        """The INFERs of one read from ``frontend``, started at the end of this turn of the loop with those every
        other frontend's reads brought in the same turn (:meth:`_start_arrived`)."""
        if not self._arrived:
            asyncio.get_running_loop().call_soon(self._start_arrived)
        self._arrived.extend((frontend, request) for request in requests)

    def _start_arrived(self) -> None:
        """Requests for the same version, signature and outputs whose inputs concatenate go to the batcher together,
        as one request (:meth:`_run_together`), whichever frontends they came from: one task, one interest and one
        answer to split, instead of one of each per request, which is most of what a request costs the runner's
        loop; the batcher still merges them with whatever else waits."""
        arrivals, self._arrived = self._arrived, []
        if len(arrivals) == 1:
            frontend, request = arrivals[0]
            self.infer(frontend, *request)
            return
        groups: dict[tuple[Key, str, tuple[str, ...]], list[Arrival]] = {}
        for arrival in arrivals:
            request = arrival[1]
            if request[5]:
                self._params[request[1][0]] = request[5][0]
            groups.setdefault((request[1], request[2], request[3]), []).append(arrival)
        for (key, signature_name, outputs), members in groups.items():
            alone = self._together(key, signature_name, outputs, members) if len(members) > 1 else members
            for frontend, request in alone:
                self.infer(frontend, *request)

    def _together(
        self, key: Key, signature_name: str, outputs: tuple[str, ...], members: list[Arrival]
    ) -> list[Arrival]:
        """Run ``members`` in groups of at most a batch each; the requests that must run alone."""
        version = self._versions.get(key)
        servable = version.servable if version is not None else None
        params = self._params.get(key[0])
        if version is None or servable is None or params is None:
            return members
        signature = servable.signatures.get(signature_name)
        # A model that answers each request on its own (Triton's Python backend, a handler, Hugging Face's tasks)
        # must get each as its own: merged, execute() would see one request of several clients' rows.
        if signature is None or not signature.batchable or isinstance(servable, PerRequestServable):
            return members
        alone: list[Arrival] = []
        by_shape: dict[tuple[Any, ...], list[Arrival]] = {}
        for arrival in members:
            feed = arrival[1][6]
            shape = batch_key(feed, params.pad_variable_length_inputs) if feed else None
            if shape is None:
                alone.append(arrival)
            else:
                by_shape.setdefault(shape, []).append(arrival)
        for similar in by_shape.values():
            group: list[Arrival] = []
            rows = 0
            for arrival in similar:
                size = next(iter(arrival[1][6].values())).shape[0]
                if group and rows + size > params.max_batch_size:
                    self._run_together(version, servable, signature, outputs, group, params)
                    group, rows = [], 0
                group.append(arrival)
                rows += size
            if len(group) == 1 or rows > params.max_batch_size:
                alone += group  # alone, it is refused as too large by the batcher, in its words
            else:
                self._run_together(version, servable, signature, outputs, group, params)
        return alone

    def _run_together(
        self,
        version: _Version,
        servable: Servable,
        signature: Signature,
        outputs: tuple[str, ...],
        group: list[Arrival],
        params: BatchingParameters,
    ) -> None:
        """One request made of ``group``; each member gets its own rows of the answer. Its deadline is the
        latest of theirs (an earlier one is answered by its frontend); a member's cancellation does not stop the
        others (its frontend drops that member's answer)."""
        if len(group) == 1:
            frontend, request = group[0]
            self.infer(frontend, *request)
            return
        feeds = [request[6] for _, request in group]
        sizes = [next(iter(feed.values())).shape[0] for feed in feeds]
        feed = merge(feeds, params.pad_variable_length_inputs, sum(sizes))
        timeouts = [request[4] for _, request in group]
        loop = asyncio.get_running_loop()
        interest = Interest(None if None in timeouts else max(timeouts), loop)
        traced = [(frontend, request[0]) for frontend, request in group if len(request) > 7 and request[7]]
        if traced and tracing.batches is not None:
            interest.trace = []  # one run for the group: each traced member gets its records
        self._reporter[servable.name] = group[0][0]
        version.running += 1
        run = loop.create_task(self.scheduler.run(servable, signature, feed, outputs, interest))
        askers = [(frontend, request[0]) for frontend, request in group]
        run.add_done_callback(lambda done: self._ran_together(askers, sizes, version, interest, done, traced))

    def _ran_together(
        self,
        askers: list[tuple[_Frontend, int]],
        sizes: list[int],
        version: _Version,
        interest: Interest,
        done: asyncio.Task[dict[str, np.ndarray]],
        traced: list[tuple[_Frontend, int]],
    ) -> None:
        answers: list[tuple[bool, Any]]
        try:
            parts = split(done.result(), sizes, sum(sizes))
            answers = [(True, part) for part in parts]
        except asyncio.CancelledError:
            answers = [(False, (Code.CANCELLED.value, "Cancelled"))] * len(askers)
        except Exception as exc:  # noqa: BLE001 - every member's answer
            answers = [(False, wire.error_of(exc))] * len(askers)

        def finished() -> None:
            if interest.trace:
                for frontend, rid in traced:
                    frontend.send((wire.TIMINGS, rid, interest.trace))
            for (frontend, rid), answer in zip(askers, answers, strict=True):
                frontend.reply(rid, *answer)
            self._ran_one(version)

        interest.when_idle(finished)

    def _ran_one(self, version: _Version) -> None:
        version.running -= 1
        if version.running == 0 and not version.holders and version.key not in self._versions:
            self._drop(version)

    def infer(
        self,
        frontend: _Frontend,
        rid: int,
        key: Key,
        signature_name: str,
        outputs: Sequence[str],
        timeout: float | None,
        params: tuple[BatchingParameters | None, ...],
        feed: Mapping[str, np.ndarray],
        traced: bool = False,
    ) -> None:
        if params:
            self._params[key[0]] = params[0]
        version = self._versions.get(key)
        servable = version.servable if version is not None else None
        if version is None or servable is None:
            message = f"{key[0]} version {key[1]} is not loaded in model runner {self.index}"
            frontend.reply(rid, False, (Code.UNAVAILABLE.value, message))
            return
        signature = servable.signatures.get(signature_name)
        if signature is None:
            frontend.reply(rid, False, (Code.INVALID_ARGUMENT.value, f'Serving signature "{signature_name}" not found'))
            return
        self._reporter[servable.name] = frontend
        loop = asyncio.get_running_loop()
        interest = Interest(timeout, loop)
        if traced and tracing.batches is not None:
            interest.trace = []  # what the batcher records of it (workbench.runners.timings), sent back with it
        frontend.calls[rid] = interest
        version.running += 1
        run = loop.create_task(self.scheduler.run(servable, signature, feed, outputs, interest))
        run.add_done_callback(lambda done: self._ran(frontend, rid, version, interest, done))

    def _ran(
        self,
        frontend: _Frontend,
        rid: int,
        version: _Version,
        interest: Interest,
        done: asyncio.Task[dict[str, np.ndarray]],
    ) -> None:
        if done.cancelled():
            answer: tuple[bool, Any] = (False, (Code.CANCELLED.value, "Cancelled"))
        elif (exc := done.exception()) is not None:
            answer = (False, wire.error_of(exc if isinstance(exc, ServingError) else from_exception(exc)))
        else:
            answer = (True, done.result())

        def finished() -> None:  # no thread reads its tensors any more: answer, and the frontend frees them
            frontend.calls.pop(rid, None)
            if interest.trace:
                frontend.send((wire.TIMINGS, rid, interest.trace))  # ahead of the answer, which leaves at the flush
            frontend.reply(rid, *answer)
            self._ran_one(version)

        interest.when_idle(finished)

    def cancel(self, frontend: _Frontend, rid: int) -> None:
        interest = frontend.calls.get(rid)
        if interest is not None:
            interest.give_up(ServingError(Code.CANCELLED, "Cancelled"))

    def _on_batch(self, record: BatchRecord) -> None:
        """A batch ran (on an inference thread): its record goes to one frontend (the last to send the model a
        request), so that the whole server's metrics count it once."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody counts any more
                self._loop.call_soon_threadsafe(self._report, record)

    def _report(self, record: BatchRecord) -> None:
        frontend = self._reporter.get(record.model)
        if frontend is not None and frontend.open:
            frontend.send((wire.BATCH, record))

    def gone(self, frontend: _Frontend) -> None:
        """``frontend`` disconnected: its queued requests are dropped, its holds let go."""
        self._frontends.discard(frontend)
        for interest in list(frontend.calls.values()):
            interest.give_up(ServingError(Code.CANCELLED, "The frontend went away"))
        for key in [key for key, version in self._versions.items() if frontend in version.holders]:
            self.unload(frontend, key, all_of_them=True)
        for model, reporter in list(self._reporter.items()):
            if reporter is frontend:
                del self._reporter[model]


def _greet(peer: socket.socket) -> tuple[Arena, Arena]:
    """The handshake, on a thread: map the frontend's request arena, pass it this runner's answer arena."""
    peer.setblocking(True)
    peer.settimeout(10.0)
    theirs = wire.receive_arena(peer)
    ours = Arena(ANSWER_ARENA_BYTES, name="workbench-runner-answers")
    try:
        wire.send_arena(peer, ours)
    except BaseException:
        ours.close()
        theirs.close()
        raise
    peer.settimeout(None)
    return theirs, ours


class _Frontend(asyncio.Protocol):
    """One frontend's connection, on the runner's side."""

    def __init__(self, runner: ModelRunner, requests: Arena, answers: Arena) -> None:
        self.runner = runner
        self.requests, self.answers = requests, answers  # the frontend's arena (read here), this runner's (written)
        self.calls: dict[int, Interest] = {}
        self.open = False
        self._frames = wire.FrameReader()
        self._out: list[bytes] = []
        self._replies: list[tuple[int, bool, Any]] = []
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.open = True
        self.runner._frontends.add(self)  # noqa: SLF001 - the runner's own bookkeeping

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.runner.gone(self)
        self.requests.close()
        self.answers.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        runner = self.runner
        requests: list[Request] = []
        for frame in self._frames.feed(data):
            message, _ = wire.decode(frame, self.requests)
            kind = message[0]
            if kind == wire.INFER:
                requests.append(message[1:])
            elif kind == wire.CANCEL:
                runner.cancel(self, message[1])
            elif kind == wire.FREE:
                for offset in message[1]:
                    self.answers.free(offset)
            elif kind == wire.LOAD:
                asyncio.ensure_future(self._load(*message[1:]))
            elif kind == wire.UNLOAD:
                runner.unload(self, message[1])
        if requests:
            runner.arrived(self, requests)

    async def _load(self, rid: int, key: Key, platform: str) -> None:
        try:
            description = await self.runner.load(self, key, platform)
        except BaseException as exc:  # noqa: BLE001 - the frontend's load fails with it
            self.reply(rid, False, wire.error_of(exc))
        else:
            self.reply(rid, True, description)

    def reply(self, rid: int, ok: bool, payload: Any) -> None:
        """Answer request ``rid``: with the other answers of this turn of the loop, in one message."""
        if self.open:
            self._replies.append((rid, ok, payload))
            self._schedule_flush()

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue ``message``; everything queued in one turn of the loop leaves in one write."""
        frame, _ = wire.encode(message, self.answers)
        self._out.append(frame)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        replies, self._replies = self._replies, []
        if replies:
            self._out.append(self._replies_frame(replies))
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing() and out:
            self._transport.write(b"".join(out))

    def _replies_frame(self, replies: list[tuple[int, bool, Any]]) -> bytes:
        try:
            frame, _ = wire.encode((wire.REPLIES, replies), self.answers)
            return frame
        except Exception:  # noqa: BLE001 - one answer does not pickle: send the others, fail that one alone
            frames = []
            for rid, ok, payload in replies:
                try:
                    frame, _ = wire.encode((wire.REPLIES, [(rid, ok, payload)]), self.answers)
                except Exception as exc:  # its request fails with why
                    log.exception("Answer to request %d could not be sent", rid)
                    frame, _ = wire.encode((wire.REPLIES, [(rid, False, wire.error_of(exc))]), None)
                frames.append(frame)
            return b"".join(frames)


# ---------------------------------------------------------------------------------------------- process
def run(options: ServerOptions, run_dir: str, index: int) -> int:
    """The runner process's life: listen, write the ready file, serve until SIGTERM (or the parent's exit)."""
    loop = new_event_loop()  # uvloop where installed: its transports cost the runner's loop a third of asyncio's
    try:
        return loop.run_until_complete(_main(options, run_dir, index))
    finally:
        loop.close()


async def _main(options: ServerOptions, run_dir: str, index: int) -> int:
    hand_over_the_gil_quickly()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    path = socket_path(run_dir, index)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(256)
    runner = ModelRunner(options, index)
    with contextlib.suppress(ServingError):  # the frontends refuse a bad tracing set-up, and say why
        if tracing.configured():  # its frontends trace: record their traced requests' times for them
            tracing.batches = RunnerTimings()
    watching = asyncio.ensure_future(_watch_parent(options.parent_pid, stopping)) if options.parent_pid else None
    write_json_atomically(ready_path(run_dir, index), {"pid": os.getpid(), "socket": str(path)})
    log.info("Model runner %d listening (pid %d)", index, os.getpid())
    try:
        await runner.serve(sock, stopping)
    finally:
        if watching is not None:
            watching.cancel()
        sock.close()
        await loop.run_in_executor(None, runner.stop)
    log.info("Model runner %d stopped", index)
    return 0


async def _watch_parent(parent_pid: int, stopping: asyncio.Event) -> None:
    while not parent_gone(parent_pid):
        await asyncio.sleep(1.0)
    log.warning("Parent process %d is gone: stopping", parent_pid)
    stopping.set()
