"""The one place a request is resolved and executed, for every frontend.

Frontends decode their wire format, then call here: model/version/label resolution, signature lookup, the
run itself (on worker threads, never on the event loop), deadlines and metrics all live once, so REST and
gRPC cannot drift apart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import numpy as np
from prometheus_client.metrics_core import Metric

from workbench.batching.interest import Interest, deadline_exceeded
from workbench.batching.scheduler import BatchScheduler
from workbench.batching.sequences import SequenceBatcher
from workbench.config.batching_parameters import BatchingParameters
from workbench.core import inference
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.sequences import SequenceId, SequenceRequest, missing_correlation_id
from workbench.core.servable import Composite, Servable
from workbench.core.signatures import Signature, TensorSpec
from workbench.models.harness import Harness
from workbench.models.manager import Manager, ServableHandle, VersionStatus
from workbench.observability import prediction_logs
from workbench.observability.metrics import ServingMetrics
from workbench.observability.request_logger import RequestLogger
from workbench.observability.stats import RollingStats
from workbench.planes.response_cache import ResponseCache, request_digest
from workbench.protocol.v2_models import Duration, ModelStatistics, RepositoryRow

T = TypeVar("T")
_END = object()  # what next() answers once a decoupled model's generator is over


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a request names: a model and at most one of a version or a label."""

    name: str
    version: int | None = None
    label: str | None = None
    signature_name: str = ""


class Call:
    """One request in flight: ``with dataplane.request(spec, api, protocol) as call:``.

    Entering resolves ``spec`` and holds the servable (``call.servable``); leaving counts the request once, by its
    final status, in the metrics and the rolling stats. The hold outlives the answer when it must: a request
    answered early (its deadline passed, its client cancelled) while a worker thread still runs its servable
    releases the servable only when that thread returns, so an unload never closes a model under a running
    ``run()``. A plain ``with``, not ``async with``: nothing here awaits, and this runs on every request.
    """

    __slots__ = ("_dataplane", "_harness", "_started", "_work", "_interest", "servable", "model", "api", "protocol")

    def __init__(self, dataplane: Dataplane, spec: ModelSpec, api: str, protocol: str) -> None:
        self._dataplane = dataplane
        self.model, self.api, self.protocol = spec.name, api, protocol
        self._started = time.perf_counter()
        self._work: asyncio.Future[Any] | None = None  # a composite's run, as a task of its own
        self._interest: Interest | None = None  # a plain servable's run: its batch tasks, awaited by the request
        try:
            # The harness itself, not a ServableHandle around it: one object less on every request.
            self._harness = dataplane.resolve(spec)
        except BaseException as exc:  # an unknown model or version is a request too: count it
            self._count(exc, None)
            raise
        self.servable: Servable = self._harness.servable

    @property
    def version(self) -> int:
        return self.servable.version

    def switch(self, spec: ModelSpec) -> None:
        """Run on the servable ``spec`` names instead (the version a sequence started on): held, the other released."""
        harness = self._dataplane.resolve(spec)
        self._harness.release()
        self._harness, self.servable = harness, harness.servable

    def __enter__(self) -> Call:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        # Answered; a worker thread may still run the servable for it: hold it until that thread returns.
        work, interest = self._work, self._interest
        if interest is not None and interest.running:
            interest.when_idle(self._harness.release)
        elif work is not None and not work.done():
            work.add_done_callback(self._release)
        else:
            self._harness.release()
        self._count(exc, self.servable.version)

    def _release(self, _: object) -> None:
        self._harness.release()

    def _count(self, exc: BaseException | None, version: int | None) -> None:
        if exc is None:
            code = "OK"
        elif isinstance(exc, ServingError):
            code = exc.code.name
        elif isinstance(exc, asyncio.CancelledError):
            code = Code.CANCELLED.name
        else:
            code = from_exception(exc).code.name
        seconds = time.perf_counter() - self._started
        self._dataplane.metrics.observe_request(self.model, version, self.api, self.protocol, code, seconds)
        self._dataplane.stats.record_request(self.model, version, seconds, code == "OK")


class _Expired(Exception):
    """A request's deadline passed before its answer came (set on the answer future by its timer)."""


def _expire(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.set_exception(_Expired())


async def _until_answered(waiting: Awaitable[T], interest: Interest, expiry: asyncio.TimerHandle | None) -> T:
    """What a request awaits, until it is answered: a cancelled caller gives up the work still queued for it, an
    expired answer (:func:`_expire`) is DEADLINE_EXCEEDED, and the deadline's timer ends with the wait."""
    try:
        return await waiting
    except _Expired:
        interest.give_up(deadline_exceeded())
        raise deadline_exceeded() from None
    except asyncio.CancelledError:
        interest.give_up(ServingError(Code.CANCELLED, "Cancelled"))
        raise
    finally:
        if expiry is not None:
            expiry.cancel()


async def _answering(work: Awaitable[T], answer: asyncio.Future[T]) -> None:
    """Await ``work`` and hand its outcome to ``answer``, unless nobody waits for it any more.

    Run as the request's task: setting ``answer`` is the task's last step, so by the time the caller resumes the
    task is done (and ``Call`` releases the servable at once). An outcome nobody waits for (the caller's deadline
    passed, it cancelled) is dropped here, never left unretrieved.
    """
    try:
        result = await work
    except asyncio.CancelledError:
        if not answer.done():
            answer.cancel()
        raise
    except Exception as exc:  # noqa: BLE001 - the caller's to raise
        if not answer.done():
            answer.set_exception(exc)
    else:
        if not answer.done():
            answer.set_result(result)


class Dataplane:
    def __init__(
        self,
        manager: Manager,
        metrics: ServingMetrics,
        stats: RollingStats,
        executor: Executor,
        scheduler: BatchScheduler,
        request_log: RequestLogger | None = None,
        batching_for: Callable[[str], BatchingParameters | None] = lambda model: None,
        first_load_wait: float = 60.0,
        cache: ResponseCache | None = None,
    ) -> None:
        """``first_load_wait``: how long a request for a model whose first load is under way waits for it
        (--wait_for_model_load_seconds; 0: not at all)."""
        self.manager = manager
        self.first_load_wait = first_load_wait
        self.cache = cache  # Triton's response cache, for the models that opt in (None: none do)
        # Per model whose first load is under way: the future its waiting requests share (one manager callback).
        self._first_loads: dict[str, asyncio.Future[None]] = {}
        # Stateful models: a sequence batcher per version, and the version each sequence started on.
        self._sequence_batchers: dict[tuple[str, int], SequenceBatcher] = {}
        self._pinned: dict[tuple[str, SequenceId], int] = {}
        self.metrics = metrics
        self.stats = stats
        self.scheduler = scheduler
        self.request_log = request_log
        self._executor = executor
        self._batching_for = batching_for
        self._members = _Members(self)

    # --------------------------------------------------------------------------------- resolution
    def request(self, spec: ModelSpec, api: str, protocol: str) -> Call:
        """The one entry of an inference request: resolved, held and counted (see :class:`Call`).

        ``api`` and ``protocol`` label its metrics ("predict", "rest"). Raises (already counted) when ``spec``
        names no servable.
        """
        return Call(self, spec, api, protocol)

    async def admit(self, spec: ModelSpec, api: str, protocol: str, timeout: float | None = None) -> Call:
        """:meth:`request`, once the model's first load is over (see :meth:`loaded`); what waits longer than
        ``timeout`` seconds is answered DEADLINE_EXCEEDED and counted as refused."""
        if self.manager.loading_first(spec.name):
            try:
                await self._first_load(spec.name, timeout)
            except ServingError as exc:
                self.refused(spec.name, api, protocol, exc)
                raise
        return Call(self, spec, api, protocol)

    async def loaded(self, name: str, timeout: float | None = None) -> None:
        """Return once ``name``'s first load is over, at once when it is not under way (nearly always).

        TF Serving opens its ports only after the initial models load, so scripts written for it send requests the
        moment a port answers; workbench opens them earlier (liveness and readiness answer during a long start-up),
        and a request for a model the config or repository names waits for that model's first load rather than
        being told it does not exist. The wait is bounded by ``timeout`` (the request's deadline) and
        :attr:`first_load_wait`; a model nobody named is not waited for.
        """
        if self.manager.loading_first(name):
            await self._first_load(name, timeout)

    async def _first_load(self, name: str, timeout: float | None) -> None:
        if self.first_load_wait <= 0:  # told not to wait: answered as the model stands (NOT_FOUND while loading)
            return
        loop = asyncio.get_running_loop()
        over = self._first_loads.get(name)
        if over is None:
            over = self._first_loads[name] = loop.create_future()

            def settled() -> None:  # from a load thread, under the manager's lock
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                    loop.call_soon_threadsafe(self._first_load_over, name, over)

            if not self.manager.when_first_loaded(name, settled):
                self._first_load_over(name, over)
        bound = self.first_load_wait if timeout is None else min(timeout, self.first_load_wait)
        if over.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(over), bound)
        except asyncio.TimeoutError:
            if timeout is not None and timeout <= self.first_load_wait:
                raise ServingError(
                    Code.DEADLINE_EXCEEDED, f"Model {name} is still loading: the request's deadline passed first"
                ) from None
            raise ServingError(
                Code.UNAVAILABLE,
                f"Model {name} is still loading after {self.first_load_wait:g}s (--wait_for_model_load_seconds)",
            ) from None

    def _first_load_over(self, name: str, over: asyncio.Future[None]) -> None:
        if self._first_loads.get(name) is over:
            del self._first_loads[name]
        if not over.done():
            over.set_result(None)

    def refused(self, model: str, api: str, protocol: str, error: ServingError) -> None:
        """Count a request refused before it named a servable (a frontend could not read its model or version)."""
        self.metrics.observe_request(model, None, api, protocol, error.code.name, 0.0)
        self.stats.record_request(model, None, 0.0, False)

    def handle(self, spec: ModelSpec) -> ServableHandle:
        """The servable ``spec`` names, held until the ``with`` block ends (it cannot unload meanwhile).

        For what reads a servable on the event loop (metadata); inference requests enter :meth:`request`.
        """
        return ServableHandle(self.resolve(spec))

    def resolve(self, spec: ModelSpec) -> Harness:
        """The harness of the servable ``spec`` names, already held for the caller (who releases it)."""
        if spec.version is not None and spec.label is not None:
            raise ServingError(Code.INVALID_ARGUMENT, "A request may name a version or a label, not both")
        return self.manager.resolve(spec.name, spec.version, spec.label)

    @staticmethod
    def rest_input_specs(
        servable: Servable, signature_name: str, sent: tuple[str, ...] = ()
    ) -> Mapping[str, TensorSpec]:
        """Inputs of a signature for decoding REST JSON (TF Serving's REST layer has its own message)."""
        key = inference.signature_name_or_default(signature_name)
        sig = servable.signatures.get(key)
        if sig is None:
            raise ServingError(Code.INVALID_ARGUMENT, f'Serving signature name: "{key}" not found in signature def')
        return sig.request_inputs(sent)

    @staticmethod
    def grpc_input_specs(servable: Servable, signature_name: str) -> Mapping[str, TensorSpec]:
        """Inputs of a signature for decoding TensorProtos (gRPC's unknown-signature error is TF Serving's)."""
        return inference.predict_signature(servable, signature_name).request_inputs()

    # ------------------------------------------------------------------------------------ running
    async def execute(
        self, servable: Servable, signature: Signature, feed: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run a validated request: through the servable's batcher, or a composite's members through theirs."""
        if isinstance(servable, Composite):
            return await servable.run_with(self._members, signature, feed, outputs)
        return await self.scheduler.run(servable, signature, feed, outputs)

    async def _execute_for(
        self,
        call: Call,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        timeout: float | None,
    ) -> dict[str, np.ndarray]:
        """:meth:`execute` for ``call``, answered DEADLINE_EXCEEDED once ``timeout`` seconds pass.

        A plain servable's request awaits its own batch tasks: the deadline answers them early
        (``Interest.answer_early``) and ``call`` keeps the servable held until their runs return. A composite's
        run awaits other models and code of its own, so it runs as a task of its own (:meth:`_run`).
        """
        servable = call.servable
        if isinstance(servable, Composite):
            return await self._run(call, servable.run_with(self._members, signature, feed, outputs), timeout)
        loop = asyncio.get_running_loop()
        interest = call._interest = Interest(timeout, loop)
        expiry = loop.call_later(timeout, interest.answer_early, deadline_exceeded()) if timeout is not None else None
        return await _until_answered(self.scheduler.run(servable, signature, feed, outputs, interest), interest, expiry)

    @staticmethod
    async def _run(call: Call, work: Awaitable[T], timeout: float | None) -> T:
        """Await ``work`` for ``call`` until ``timeout`` seconds pass (DEADLINE_EXCEEDED).

        ``work`` runs as a task of its own that neither the deadline nor a cancelled caller cancels: once it has
        reached a worker thread nothing can stop that thread, so ``call`` keeps the servable held until the task
        (and with it the thread) is done. What ``work`` still has queued for a batch when the caller gives up
        leaves its queue unrun (the batcher's Interest).

        The caller waits on ``answer``, a plain future the task fills as its last step (see :func:`_answering`),
        not on a shield of the task under ``wait_for``: a cancelled caller cancels only ``answer``, the deadline
        is one timer, and the answer arrives in the loop turn after the work ends, as if awaited directly.
        """
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        interest = Interest(timeout, loop)  # what it still has queued for a batch when the caller gives up never runs
        call._work = interest.start(_answering(work, answer))
        expiry = loop.call_later(timeout, _expire, answer) if timeout is not None else None
        return await _until_answered(answer, interest, expiry)

    async def predict(
        self,
        call: Call,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout: float | None = None,
        sequence: SequenceRequest | None = None,
    ) -> tuple[Signature, dict[str, np.ndarray]]:
        """Run a predict; ``sequence`` is what the request says of its sequence (a stateful model needs one)."""
        if call.servable.sequence is not None:
            return await self._predict_step(call, signature_name, inputs, output_filter, timeout, sequence)
        servable = call.servable
        signature = inference.predict_signature(servable, signature_name)
        feed, outputs = inference.prepare_predict(signature, inputs, output_filter)
        cache, key = self.cache, None
        if cache is not None and cache.enabled(servable.name):  # keyed on the resolved version: never across them
            key = cache.key(servable.name, servable.version, signature.name, outputs, request_digest(feed))
            cached = cache.get(key)
            if cached is not None:
                return signature, cached
        try:
            result = await self._execute_for(call, signature, feed, outputs, timeout)
        except ServingError as exc:
            raise inference.name_the_misfit_input(signature, feed, exc) from None
        if cache is not None and key is not None:
            cache.put(key, result)
        self._log(
            servable,
            lambda: prediction_logs.PredictEntry(
                servable.name, servable.version, signature.name, inputs, output_filter, result
            ),
        )
        return signature, result

    async def _predict_step(
        self,
        call: Call,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str],
        timeout: float | None,
        sequence: SequenceRequest | None,
    ) -> tuple[Signature, dict[str, np.ndarray]]:
        """One request of a sequence of a stateful model, on the version the sequence started on (a promotion or a
        canary since then does not move it), through that version's sequence batcher."""
        if sequence is None:
            raise missing_correlation_id(call.model)
        key = (call.model, sequence.id)
        pinned = self._pinned.get(key)
        if sequence.start:
            self._pinned.pop(key, None)
        elif pinned is not None and pinned != call.version:
            call.switch(ModelSpec(call.model, version=pinned))
        servable = call.servable
        signature = inference.predict_signature(servable, signature_name)
        feed, outputs = inference.prepare_predict(signature, inputs, output_filter)
        batcher = self._sequence_batcher(servable)
        if sequence.start:
            self._pinned[key] = servable.version
        work = asyncio.ensure_future(batcher.run(signature, feed, outputs, sequence))
        call._work = work  # the version stays held until the step ran, even when the caller gave up
        try:
            result = await asyncio.wait_for(asyncio.shield(work), timeout)
        except asyncio.TimeoutError:
            raise deadline_exceeded() from None
        self._log(
            servable,
            lambda: prediction_logs.PredictEntry(
                servable.name, servable.version, signature.name, inputs, output_filter, result
            ),
        )
        return signature, result

    def _sequence_batcher(self, servable: Servable) -> SequenceBatcher:
        key = (servable.name, servable.version)
        batcher = self._sequence_batchers.get(key)
        if batcher is None or batcher.servable is not servable:
            assert servable.sequence is not None
            model = servable.name

            def released(sequence_id: SequenceId) -> None:
                self._pinned.pop((model, sequence_id), None)

            stateful: Any = servable  # a servable with a sequence implements run_step (StatefulServable)
            batcher = SequenceBatcher(stateful, servable.sequence, self._executor, on_release=released)
            self._sequence_batchers[key] = batcher
        return batcher

    def forget_version(self, model: str, version: int) -> None:
        """``version`` of ``model`` unloaded: its sequences end (from any thread)."""
        batcher = self._sequence_batchers.pop((model, version), None)
        if batcher is not None:
            batcher.close_soon()

    async def stream(
        self,
        call: Call,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout: float | None = None,
    ) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """Run a decoupled servable: its responses to one request as they come. A caller that may stop early
        iterates it under ``contextlib.aclosing`` inside its ``with call:``, so that leaving stops the model.

        The model's generator is advanced on a worker thread one response at a time, and only when the caller asks
        for the next: a slow client holds the model back rather than filling a buffer. Each request is its own run
        (never batched). ``timeout`` bounds the whole request (DEADLINE_EXCEEDED). A caller that leaves early (closed,
        cancelled, past its deadline) has the generator closed between two responses, once the step under way
        returns; ``call`` holds the servable until then, so an unload never closes a model under its generator.
        """
        servable = call.servable
        if not servable.decoupled:
            raise ServingError(Code.FAILED_PRECONDITION, f"Model {call.model} is not decoupled: it answers once")
        signature = inference.predict_signature(servable, signature_name)
        feed, outputs = inference.prepare_predict(signature, inputs, output_filter)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        responses = servable.run_decoupled(signature, feed, outputs)
        step: asyncio.Future[Any] | None = None
        over = False  # the generator ended or failed: nothing left to close
        try:
            while True:
                step = loop.run_in_executor(self._executor, next, responses, _END)
                call._work = step  # the servable stays held while a thread runs the model, whatever the caller does
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    result = await asyncio.wait_for(asyncio.shield(step), remaining)
                except asyncio.TimeoutError:
                    raise deadline_exceeded() from None
                except Exception:
                    over = step.done()  # the model's own error ends its generator
                    raise
                if result is _END:
                    over = True
                    return
                yield result
        finally:
            if not over:
                call._work = asyncio.ensure_future(self._close_responses(step, responses))

    async def _close_responses(self, step: asyncio.Future[Any] | None, responses: Iterator[Any]) -> None:
        """Close a decoupled model's generator once its step under way returned (a generator cannot be closed while
        another thread runs it), on a worker thread: its ``finally`` blocks are the model's code. Responses that can
        be told at once (``cancel()``: a Triton Python model's, whose step waits for the model's next send) are, so
        that the step returns and the model hears now, not at its next response."""
        cancel = getattr(responses, "cancel", None)
        if callable(cancel):
            cancel()
        if step is not None and not step.done():
            await asyncio.wait([step])
        close = getattr(responses, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):  # the request is over; platforms log their model's own failure
                await asyncio.get_running_loop().run_in_executor(self._executor, close)

    async def classify(
        self, call: Call, signature_name: str, examples: Sequence[bytes], timeout: float | None = None
    ) -> tuple[str, inference.Classifications]:
        servable = call.servable
        run = inference.classify_call(servable, signature_name, examples)
        result = await self._execute_for(call, run.signature, run.feed, run.outputs, timeout)
        name, labelled = run.signature.name, inference.classify_results(run, result)
        self._log(
            servable,
            lambda: prediction_logs.ClassifyEntry(servable.name, servable.version, name, examples, labelled),
        )
        return name, labelled

    async def regress(
        self, call: Call, signature_name: str, examples: Sequence[bytes], timeout: float | None = None
    ) -> tuple[str, list[float]]:
        servable = call.servable
        run = inference.regress_call(servable, signature_name, examples)
        result = await self._execute_for(call, run.signature, run.feed, run.outputs, timeout)
        name, values = run.signature.name, inference.regress_results(run, result)
        self._log(
            servable, lambda: prediction_logs.RegressEntry(servable.name, servable.version, name, examples, values)
        )
        return name, values

    async def multi_inference(
        self,
        call: Call,
        tasks: Sequence[inference.InferenceTask],
        examples: Sequence[bytes],
        timeout: float | None = None,
    ) -> list[tuple[str, Any]]:
        """Several signatures on one input: run together, unbatched."""
        servable = call.servable
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, inference.multi_inference, servable, tasks, examples)
        results = await self._run(call, work, timeout)
        self._log(
            servable,
            lambda: prediction_logs.MultiInferenceEntry(servable.name, servable.version, tasks, examples, results),
        )
        return results

    def _log(self, servable: Servable, entry: Callable[[], prediction_logs.LogEntry]) -> None:
        """Offer an answered request to request logging (TF Serving's logging_config); failed ones never get here."""
        if self.request_log is not None:
            self.request_log.log(servable.name, entry)

    # ------------------------------------------------------------------------------------ queries
    def model_status(self, name: str, version: int | None = None, label: str | None = None) -> list[VersionStatus]:
        if label is not None:
            version = self.manager.label_version(name, label)
        return self.manager.version_status(name, version)

    def max_batch_size(self, model: str) -> int:
        """The most rows one batch of ``model`` runs (its batching parameters'); 0 when batching is off for it."""
        params = self._batching_for(model)
        return params.max_batch_size if params is not None else 0

    def repository(self) -> list[RepositoryRow]:
        """Every version of every model the server knows, with its state and why it failed (if it did)."""
        rows = []
        for name in self.manager.model_names():
            with contextlib.suppress(ServingError):  # a model with no versions (yet) has no rows
                for status in self.manager.version_status(name):
                    reason = status.error.message if status.error is not None else ""
                    rows.append(RepositoryRow(name, status.version, status.state.name, reason))
        return sorted(rows, key=lambda row: (row.name, row.version))

    def statistics(self, model: str | None = None, version: int | None = None) -> list[ModelStatistics]:
        """Cumulative counts per model version since the server started (every model's without ``model``).

        Read from the server's metrics, so they agree with ``/metrics``; an unknown model or version is NOT_FOUND.
        """
        if model is None:
            versions = [(row.name, row.version) for row in self.repository() if row.version is not None]
        else:
            versions = [(model, status.version) for status in self.manager.version_status(model, version)]
        # The whole server's with --num_workers (workbench.observability.whole_server), so any worker answers for
        # all of them.
        totals = _MetricTotals(self.metrics.statistics_families())
        return [totals.statistics(name, number) for name, number in sorted(versions)]


class _MetricTotals:
    """The server's Prometheus series summed per (model, version), read once for a statistics answer."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._samples: dict[tuple[str, str, str], float] = collections.defaultdict(float)
        self._buckets: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
        for metric in families:
            for sample in metric.samples:
                key = (sample.labels.get("model", ""), sample.labels.get("version", ""))
                if sample.name == "workbench_batch_size_bucket":
                    self._buckets[key].append((float(sample.labels["le"]), sample.value))
                elif sample.name.startswith("workbench_requests") and not sample.name.endswith("_created"):
                    code = "ok" if sample.labels["code"] == "OK" else "fail"
                    self._samples[(*key, f"requests_{code}")] += sample.value
                else:
                    self._samples[(*key, sample.name)] += sample.value

    def _duration(self, key: tuple[str, str], family: str) -> Duration:
        return Duration(int(self._samples[(*key, f"{family}_count")]), self._samples[(*key, f"{family}_sum")])

    def _cache(self, key: tuple[str, str], outcome: str, plural: str) -> Duration:
        """Response cache hits or misses, read from Triton's ``nv_cache_*`` series (durations in µs)."""
        count = int(self._samples[(*key, f"nv_cache_num_{plural}_per_model")])
        return Duration(count, self._samples[(*key, f"nv_cache_{outcome}_duration_per_model")] / 1e6)

    def statistics(self, model: str, version: int) -> ModelStatistics:
        key = (model, str(version))
        # Batch sizes as the batch-size histogram keeps them: a batch counts under the first bucket it fits
        # (1, 2, 4, 8, ...), so a batch of 3 rows is reported as size 4.
        batches, below = {}, 0.0
        for bound, cumulative in sorted(self._buckets[key]):
            if cumulative > below and bound != float("inf"):
                batches[int(bound)] = Duration(int(cumulative - below))
            below = cumulative
        return ModelStatistics(
            name=model,
            version=version,
            inference_count=int(self._samples[(*key, "workbench_batch_size_sum")]),
            execution_count=int(self._samples[(*key, "workbench_batch_size_count")]),
            success=self._duration(key, "workbench_request_latency_seconds"),
            # Failed requests are counted, not timed (the latency histogram keeps answered ones).
            fail=Duration(int(self._samples[(*key, "requests_fail")])),
            queue=self._duration(key, "workbench_queue_seconds"),
            compute_infer=self._duration(key, "workbench_inference_seconds"),
            cache_hit=self._cache(key, "hit", "hits"),
            cache_miss=self._cache(key, "miss", "misses"),
            batches=batches,
        )


class _Members:
    """What composite servables (handlers, pipelines) reach the server's other models through."""

    def __init__(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

    async def predict(
        self, model: str, version: int | None, label: str | None, signature_name: str, inputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        dataplane = self._dataplane
        with dataplane.handle(ModelSpec(model, version, label)) as member:
            signature = inference.predict_signature(member, signature_name)
            feed, outputs = inference.prepare_predict(signature, inputs)
            try:
                return await dataplane.execute(member, signature, feed, outputs)
            except ServingError as exc:
                raise inference.name_the_misfit_input(signature, feed, exc) from None

    async def run(
        self, servable: Servable, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        return await self._dataplane.execute(servable, signature, inputs, outputs)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._dataplane._executor, fn, *args)
