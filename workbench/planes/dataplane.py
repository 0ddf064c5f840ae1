"""The one place a request is resolved and executed, and what the server serves is read, for every frontend.

Frontends decode their wire format, then call here: model/version/label resolution, signature lookup, the
run itself (on worker threads, never on the event loop), deadlines and metrics all live once, so REST and
gRPC cannot drift apart. The frontends read the server here too (its models, their versions and labels, its
readiness, health and stats); what changes the server is the control plane's (:mod:`workbench.planes.controlplane`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from workbench.batching.interest import Interest
from workbench.batching.scheduler import Batcher
from workbench.batching.threads import InferenceThreads
from workbench.config.batching_parameters import BatchingParameters
from workbench.core import inference
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import SequenceRequest
from workbench.core.servable import Composite, PerRequestServable, Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature, TensorSpec
from workbench.core.whole_requests import WholeRequest, WholeRequestServable, WholeResponse
from workbench.models.harness import Harness
from workbench.models.manager import Manager, ServableHandle, VersionState, VersionStatus
from workbench.models.readiness import Readiness
from workbench.observability import prediction_logs
from workbench.observability import tracing as _tracing
from workbench.observability.drift_monitor import DriftMonitor
from workbench.observability.metrics import ServingMetrics
from workbench.observability.request_logger import RequestLogger
from workbench.observability.stats import RollingStats
from workbench.planes import decoupled, generation_watch
from workbench.planes.calls import ModelSpec, RequestInFlight, WireRequest, answering, expire, until_answered
from workbench.planes.coalescing import Coalescer
from workbench.planes.first_load_waits import FirstLoadWaits
from workbench.planes.on_demand import hold_on_demand
from workbench.planes.one_client import OneClient
from workbench.planes.response_cache import ResponseCache, request_digest
from workbench.planes.sequence_pinning import Sequences
from workbench.planes.shadowing import DEFAULT_MAX_PENDING, ShadowTraffic
from workbench.planes.statistics import MetricTotals
from workbench.platforms import v2_name
from workbench.protocol.v2_dialects import dialect_of
from workbench.protocol.v2_models import ModelDescription, ModelStatistics, RepositoryRow

__all__ = ["RequestInFlight", "Dataplane", "ModelSpec", "ServerStatus"]

if TYPE_CHECKING:  # imported when an explanation is asked for: a server that explains nothing never loads them
    from workbench.explain.explaining import Answer as Explained
    from workbench.protocol.attributions import Parameters

# An explanation's time when its request has no deadline (a gRPC call without one, REST with its timeout off).
EXPLAIN_SECONDS = 60.0

T = TypeVar("T")
A = TypeVar("A")


@dataclasses.dataclass(frozen=True)
class ServerStatus:
    """What the server says of itself, read by the frontends through :class:`Dataplane`."""

    readiness: Callable[[], Readiness]  # what /readyz and gRPC health answer
    health: Callable[[], dict[str, object]]  # GET /workbench/v1/health
    stats: Callable[[], dict[str, object]]  # GET /workbench/v1/stats
    stopped: asyncio.Event  # set once the ports close: live stat streams end


def _alone() -> ServerStatus:
    """The status of a data plane with no server around it (tests): ready, healthy, no stats."""
    return ServerStatus(lambda: Readiness(True, "ready"), lambda: {"status": "ok"}, dict, asyncio.Event())


class Dataplane:
    def __init__(
        self,
        manager: Manager,
        metrics: ServingMetrics,
        stats: RollingStats,
        executor: Executor,
        scheduler: Batcher,
        request_log: RequestLogger | None = None,
        batching_for: Callable[[str], BatchingParameters | None] = lambda model: None,
        first_load_wait: float = 60.0,
        cache: ResponseCache | None = None,
        status: ServerStatus | None = None,
    ) -> None:
        """``first_load_wait``: how long a request for a model whose first load is under way waits for it
        (--wait_for_model_load_seconds; 0: not at all); ``status``: the server's own views."""
        self._models = manager.served  # what requests resolve against, and every question on the models
        self._budgeted_loads = manager.budgeted_loads  # versions that load when a request asks for them
        self._status = status or _alone()
        self._first_load_waits = FirstLoadWaits(manager.served, first_load_wait)
        self.cache = cache  # Triton's response cache, for the models that opt in (None: none do)
        # Stateful models: a sequence batcher per version, and the version each sequence started on.
        self._sequences = Sequences(executor)
        self.metrics = metrics
        self.stats = stats
        self.scheduler = scheduler
        # Whether a request is the server's one client's (the ports count their connections into it).
        self.one_client = OneClient()
        self.request_log = request_log
        self.drift: DriftMonitor | None = None  # set by the server: served inputs against a reference
        self._executor = executor
        self._batching_for = batching_for
        self._members = _MemberAccess(self)
        # Copies of default traffic to a shadow version. A copy holds an inference thread for as long as the shadow
        # takes: copies never run more than half of them at once, so the clients' own calls always find one.
        threads = executor.threads if isinstance(executor, InferenceThreads) else 2 * DEFAULT_MAX_PENDING
        self.shadows = ShadowTraffic(self, manager.served.shadow_of, max_running=max(1, threads // 2))
        # Requests for one model that arrive together, answered as one call (planes/coalescing.py).
        self._coalescer = Coalescer(self)

    @property
    def first_load_wait(self) -> float:
        """How long a request waits for its model's first load (--wait_for_model_load_seconds; 0: not at all)."""
        return self._first_load_waits.first_load_wait

    @first_load_wait.setter
    def first_load_wait(self, seconds: float) -> None:
        self._first_load_waits.first_load_wait = seconds

    # --------------------------------------------------------------------------------- resolution
    def request(self, spec: ModelSpec, api: str, protocol: str) -> RequestInFlight:
        """The one entry of an inference request: resolved, held and counted (see :class:`RequestInFlight`).

        ``api`` and ``protocol`` label its metrics ("predict", "rest"). Raises (already counted) when ``spec``
        names no servable.
        """
        return RequestInFlight(self, spec, api, protocol)

    async def admit(self, spec: ModelSpec, api: str, protocol: str, timeout: float | None = None) -> RequestInFlight:
        """:meth:`request`, once the model's first load is over (see :meth:`loaded`); what waits longer than
        ``timeout`` seconds is answered DEADLINE_EXCEEDED and counted as refused."""
        if self._models.loading_first(spec.name) or self._version_loading_first(spec) is not None:
            try:
                await self._first_loads(spec.name, spec, timeout)
            except ServingError as exc:
                self.refused(spec.name, api, protocol, exc)
                raise
        if self._budgeted_loads.on_demand:  # versions leave memory: one not there now loads for the request (it waits)
            try:
                harness = await self.hold(spec, timeout)
            except ServingError as exc:
                self.refused(spec.name, api, protocol, exc)
                raise
            return RequestInFlight(self, spec, api, protocol, harness)
        return RequestInFlight(self, spec, api, protocol)

    async def loaded(self, name: str, timeout: float | None = None, spec: ModelSpec | None = None) -> None:
        """Return once ``name``'s first load is over, at once when it is not under way (nearly always).

        TF Serving opens its ports only after the initial models load, so scripts written for it send requests the
        moment a port answers; workbench opens them earlier (liveness and readiness answer during a long start-up),
        and a request for a model the config or repository names waits for that model's first load rather than
        being told it does not exist. The wait is bounded by ``timeout`` (the request's deadline) and
        :attr:`first_load_wait`; a model nobody named is not waited for. So does a request whose ``spec`` names a
        version (or a label of one) of the model's first listing still in its first load, once another version
        serves. With versions loaded on demand, the version ``spec`` names is loaded too (a metadata request for an
        evicted version), within the same bounds.
        """
        await self._first_loads(name, spec, timeout)
        if spec is not None:
            harness = await self.hold(spec, timeout)
            if harness is not None:
                harness.release()  # loaded, and the most recently used: the caller's handle() finds it

    def waits(self, name: str, spec: ModelSpec | None = None) -> bool:
        """Whether :meth:`loaded` of ``name`` (and ``spec``) may have to wait or load; False (nearly always): it
        would return at once, and a frontend may skip it."""
        if self._models.loading_first(name) or self._budgeted_loads.on_demand:
            return True
        return spec is not None and self._version_loading_first(spec) is not None

    def _version_loading_first(self, spec: ModelSpec) -> int | None:
        """The version ``spec`` names when it is still in its first load (see :meth:`Manager.version_loading_first
        <workbench.models.served.ServedModels.version_loading_first>`); a request naming none never waits for one."""
        if spec.version is None and spec.label is None:
            return None
        return self._models.version_loading_first(spec.name, spec.version, spec.label)

    async def _first_loads(self, name: str, spec: ModelSpec | None, timeout: float | None) -> None:
        """Wait for ``name``'s first load, then for the version ``spec`` names if that one's is not over, the two
        within ``timeout`` together."""
        if self._models.loading_first(name):
            loop = asyncio.get_running_loop()
            started = loop.time()
            await self._first_load_waits.wait(name, timeout)
            if timeout is not None:
                timeout = max(0.0, timeout - (loop.time() - started))
        version = self._version_loading_first(spec) if spec is not None else None
        if version is not None:
            await self._first_load_waits.wait(name, timeout, version)

    async def hold(self, spec: ModelSpec, timeout: float | None = None) -> Harness | None:
        """With versions loaded on demand: the version ``spec`` names, loaded for the caller if it must be (waiting
        within ``timeout`` and --wait_for_model_load_seconds) and acquired; None without, or when ``spec`` names
        nothing that could load (resolution answers then)."""
        if not self._budgeted_loads.on_demand:
            return None
        return await hold_on_demand(self._budgeted_loads, spec, timeout, self.first_load_wait)

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
        return self._models.resolve(spec.name, spec.version, spec.label, spec.key)

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
        call: RequestInFlight,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        timeout: float | None,
        requests: int = 1,
    ) -> dict[str, np.ndarray]:
        """:meth:`execute` for ``call``, answered DEADLINE_EXCEEDED once ``timeout`` seconds pass; ``requests``: how
        many requests ``feed``'s rows are (a group's).

        A plain servable's request awaits its own batch tasks: the deadline answers them early
        (``Interest.answer_early``) and ``call`` keeps the servable held until their runs return. A composite's
        run awaits other models and code of its own, so it runs as a task of its own (:meth:`_run`).
        """
        servable = call.servable
        one_client = self.one_client.alone(call.protocol)  # a call cheap enough may run on the loop then
        if isinstance(servable, Composite):
            result = await self._run(call, servable.run_with(self._members, signature, feed, outputs), timeout)
        elif (
            call.trace is None
            and (now := self.scheduler.run_now(servable, signature, feed, outputs, one_client)) is not None
        ):
            return now  # a cheap unbatched call, answered on the loop: nothing to wait for, so no deadline to arm
        else:
            loop = asyncio.get_running_loop()
            interest = Interest(timeout, loop)
            interest.trace = call.trace
            call.hold_for(interest)
            waiting = self.scheduler.run(servable, signature, feed, outputs, interest, one_client, requests)
            result = await until_answered(waiting, interest, interest.deadline, interest.expire)
        if call.trace is not None:
            call.trace.ran(signature.name)  # the answer's encoding starts
        return result

    @staticmethod
    async def _run(call: RequestInFlight, work: Awaitable[T], timeout: float | None) -> T:
        """Await ``work`` for ``call`` until ``timeout`` seconds pass (DEADLINE_EXCEEDED).

        ``work`` runs as a task of its own that neither the deadline nor a cancelled caller cancels: once it has
        reached a worker thread nothing can stop that thread, so ``call`` keeps the servable held until the task
        (and with it the thread) is done. What ``work`` still has queued for a batch when the caller gives up
        leaves its queue unrun (the batcher's Interest).

        The caller waits on ``answer``, a plain future the task fills as its last step (see :func:`answering`),
        not on a shield of the task under ``wait_for``: a cancelled caller cancels only ``answer``, the deadline
        is one timer, and the answer arrives in the loop turn after the work ends, as if awaited directly.
        """
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        interest = Interest(timeout, loop)  # what it still has queued for a batch when the caller gives up never runs
        interest.trace = call.trace  # member requests' batches link to the request's span
        call.hold_until_done(interest.start(answering(work, answer)))
        return await until_answered(answer, interest, interest.deadline, functools.partial(expire, answer))

    async def infer(
        self, spec: ModelSpec, protocol: str, request: WireRequest[A], timeout: float | None = None
    ) -> tuple[int, A]:
        """A predict in one call, for a wire format whose decoding needs the servable's signatures: admitted (see
        :meth:`admit`), ``request`` decoded against the resolved servable's signatures, run (:meth:`predict`) and its
        outputs encoded, all while the servable is held and the request counted. Returns the version that answered
        and the encoded answer.

        The order is the wire API's order of checks: an unknown model or version is refused before the body is read
        as JSON, a body that does not decode before anything runs. Requests for one model that arrive together may
        be answered as one group, each as it would be alone (:mod:`workbench.planes.coalescing`).
        """
        if request.stacks and spec.version is None and spec.label is None and spec.key is None:
            return await self._coalescer.infer(spec, protocol, request, timeout, self._infer_alone)
        return await self._infer_alone(spec, protocol, request, timeout)

    async def _infer_alone(
        self, spec: ModelSpec, protocol: str, request: WireRequest[A], timeout: float | None
    ) -> tuple[int, A]:
        with await self.admit(spec, "predict", protocol, timeout) as call:
            signature_name, inputs = request.decode(call.servable.signatures)
            _, outputs = await self.predict(call, signature_name, inputs, timeout=timeout)
            return call.version, request.encode(outputs)

    def coalescable(self, model: str) -> bool:
        """Whether ``model``'s requests naming no version may be answered as a group now: nothing that a group would
        change is on for it (a canary's split, the response cache, request logging, a shadow, tracing), and it is
        loaded (no first load or load on demand to wait for). Asked on every such request."""
        cache, request_log = self.cache, self.request_log
        return (
            _tracing.active is None
            and not self._budgeted_loads.on_demand
            and self._models.routed_one_way(model)
            and (cache is None or not cache.enabled(model))
            and (request_log is None or not request_log.configured(model))
            and not self.shadows.shadowed(model)
        )

    def merges(self, servable: Servable) -> int:
        """The most rows a group's run of ``servable`` may stack: its batches' (0 when it does not batch, or runs
        otherwise: a composite, a stateful model, one that answers each request on its own, whose batches hand it
        the requests one by one)."""
        if isinstance(servable, (Composite, PerRequestServable)) or servable.sequence is not None:
            return 0
        return self.scheduler.largest_batch(servable)

    async def run_group(
        self,
        call: RequestInFlight,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: list[str],
        timeout: float | None,
        requests: int,
    ) -> dict[str, np.ndarray]:
        """A group's validated feed, the rows of ``requests`` requests, run for ``call``
        (:mod:`workbench.planes.coalescing`) as :meth:`predict` runs one request's."""
        return await self._execute_for(call, signature, feed, outputs, timeout, requests)

    def answered(
        self,
        call: RequestInFlight,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: dict[str, np.ndarray],
    ) -> None:
        """A group's member answered with ``outputs``, its rows: offered to drift monitoring as a predict is."""
        servable = call.servable
        self._log(
            call,
            lambda: prediction_logs.PredictEntry(servable.name, servable.version, signature.name, inputs, (), outputs),
        )

    async def predict(
        self,
        call: RequestInFlight,
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
            call,
            lambda: prediction_logs.PredictEntry(
                servable.name, servable.version, signature.name, inputs, output_filter, result
            ),
        )
        if call.default:
            self.shadows.mirror(call, signature_name, inputs, output_filter, result)
        return signature, result

    async def _predict_step(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str],
        timeout: float | None,
        sequence: SequenceRequest | None,
    ) -> tuple[Signature, dict[str, np.ndarray]]:
        """One request of a sequence of a stateful model (see :meth:`Sequences.step
        <workbench.planes.sequence_pinning.Sequences.step>`), logged once answered."""
        signature, result = await self._sequences.step(call, signature_name, inputs, output_filter, timeout, sequence)
        servable = call.servable
        self._log(
            call,
            lambda: prediction_logs.PredictEntry(
                servable.name, servable.version, signature.name, inputs, output_filter, result
            ),
        )
        return signature, result

    async def answer_whole(
        self, call: RequestInFlight, request: WholeRequest, timeout: float | None = None
    ) -> WholeResponse:
        """A whole v2 request answered by a servable that takes them (MLServer's runtimes), within ``timeout``: never
        batched across requests; the servable stays held until its answer is made, even past the deadline."""
        servable = call.servable
        if not isinstance(servable, WholeRequestServable):
            raise ServingError(Code.INTERNAL, f"{call.model} does not answer whole requests")
        return await self._run(call, servable.answer(request), timeout)

    def default_version(self, model: str) -> int | None:
        """Where ``model``'s requests naming no version go (before a canary's share)."""
        return self._models.default_version(model)

    def forget_version(self, model: str, version: int) -> None:
        """``version`` of ``model`` unloaded: its sequences end (from any thread)."""
        self._sequences.forget_version(model, version)

    def stream(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout: float | None = None,
        arrived: float | None = None,
    ) -> decoupled.Begun[dict[str, np.ndarray]]:
        """Run a decoupled servable: its responses to one request as they come; its run begins now (see
        :func:`workbench.planes.decoupled.stream`).

        A text generation is recorded here, once for every frontend (:mod:`workbench.planes.generation_watch`), its
        time to first token counted from ``arrived`` (``time.perf_counter()``; None: when ``call`` began).
        A stream that ends (not one its caller left) is logged as a predict is and mirrored to the model's shadow,
        its answer being its responses' outputs joined (:func:`workbench.planes.decoupled.joined`); its responses
        are kept for that only where the model is logged or shadowed."""
        responses = decoupled.stream(call, self._executor, signature_name, inputs, output_filter, timeout)
        servable = call.servable
        if generation_watch.is_generation(servable, signature_name):
            started = arrived if arrived is not None else time.perf_counter() - call.elapsed_seconds
            generation = self.metrics.generation
            watched = generation_watch.watched(responses, servable, inputs, started, generation, self.stats)
            responses = responses.passed_through(watched)
        logged = self.request_log is not None and self.request_log.configured(servable.name)
        mirrored = call.default and self.shadows.shadowed(call.model)
        if not (logged or mirrored):
            return responses
        recorded = self._recorded(call, signature_name, inputs, output_filter, responses, logged, mirrored)
        return responses.passed_through(recorded)

    async def _recorded(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str],
        responses: decoupled.Begun[dict[str, np.ndarray]],
        logged: bool,
        mirrored: bool,
    ) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """``responses`` passed on, then, once they ended, the stream logged and mirrored."""
        seen = []
        async with contextlib.aclosing(responses):
            async for response in responses:
                seen.append(response)
                yield response
        answer = decoupled.joined(seen)
        servable = call.servable
        if logged and self.request_log is not None:
            name = inference.predict_signature(servable, signature_name).name
            self.request_log.log(
                servable.name,
                lambda: prediction_logs.PredictEntry(
                    servable.name, servable.version, name, inputs, output_filter, answer
                ),
                call.protocol,
                call.elapsed_seconds,
            )
        if mirrored:
            self.shadows.mirror(call, signature_name, inputs, output_filter, answer)

    async def classify(
        self, call: RequestInFlight, signature_name: str, examples: Sequence[bytes], timeout: float | None = None
    ) -> tuple[str, inference.Classifications]:
        servable = call.servable
        run = inference.classify_call(servable, signature_name, examples)
        result = await self._execute_for(call, run.signature, run.feed, run.outputs, timeout)
        name, labelled = run.signature.name, inference.classify_results(run, result)
        self._log(
            call,
            lambda: prediction_logs.ClassifyEntry(servable.name, servable.version, name, examples, labelled),
        )
        return name, labelled

    async def regress(
        self, call: RequestInFlight, signature_name: str, examples: Sequence[bytes], timeout: float | None = None
    ) -> tuple[str, list[float]]:
        servable = call.servable
        run = inference.regress_call(servable, signature_name, examples)
        result = await self._execute_for(call, run.signature, run.feed, run.outputs, timeout)
        name, values = run.signature.name, inference.regress_results(run, result)
        self._log(call, lambda: prediction_logs.RegressEntry(servable.name, servable.version, name, examples, values))
        return name, values

    async def explain(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        parameters: Parameters,
        timeout: float | None = None,
    ) -> Explained:
        """Explain a predict's rows (:mod:`workbench.explain`) on a worker thread, unbatched: an explanation runs
        the model many times over. Bounded by ``timeout``, else :data:`EXPLAIN_SECONDS`: its explainer sizes its
        work to that and stops there; the request is answered DEADLINE_EXCEEDED then in any case."""
        from workbench.explain import explaining
        from workbench.protocol.attributions import Budget

        servable = call.servable
        signature = inference.predict_signature(servable, signature_name)
        feed, _ = inference.prepare_predict(signature, inputs)
        seconds = timeout if timeout is not None else EXPLAIN_SECONDS
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(
            self._executor, explaining.explain, servable, signature, feed, parameters, Budget(seconds)
        )
        return await self._run(call, work, seconds)

    async def multi_inference(
        self,
        call: RequestInFlight,
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
            call,
            lambda: prediction_logs.MultiInferenceEntry(servable.name, servable.version, tasks, examples, results),
        )
        return results

    def _log(self, call: RequestInFlight, entry: Callable[[], prediction_logs.LogEntry]) -> None:
        """Offer an answered request to request logging (TF Serving's logging_config) and to drift monitoring;
        failed ones never get here."""
        if self.request_log is not None:
            self.request_log.log(call.servable.name, entry, call.protocol, call.elapsed_seconds)
        if self.drift is not None:
            self.drift.offer(call.servable, entry)

    # ------------------------------------------------------------------------------------ queries
    def knows(self, name: str) -> bool:
        """Whether ``name`` is one of the server's models (lock-free: asked on every v2 request)."""
        return self._models.knows(name)

    def model_names(self) -> list[str]:
        return self._models.model_names()

    def emptied(self, name: str) -> bool:
        """Whether ``name`` serves nothing because its last version was removed on request (TorchServe's
        unregister, Triton's unload): to those APIs the model is gone."""
        return self._models.emptied(name)

    def labels(self, name: str) -> dict[str, int]:
        """Every version label of ``name`` (the config's and the routing's)."""
        return self._models.labels(name)

    def label_version(self, name: str, label: str) -> int:
        return self._models.label_version(name, label)

    def available_versions(self, name: str) -> list[int]:
        """``name``'s AVAILABLE versions, oldest first (NOT_FOUND when it has none at all)."""
        return sorted(s.version for s in self._models.version_status(name) if s.state == VersionState.AVAILABLE)

    def dependents(self, name: str) -> set[str]:
        """The models that run on ``name`` (its pipelines and handlers)."""
        return self._models.dependents(name)

    def describe(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every model (or one) with its versions, states, labels, traffic shares and routing, JSON-ready."""
        return self._models.describe(name)

    def readiness(self) -> Readiness:
        return self._status.readiness()

    def health(self) -> dict[str, object]:
        return self._status.health()

    def stats_snapshot(self) -> dict[str, object]:
        return self._status.stats()

    def metrics_exposition(self) -> bytes:
        """The server's metrics in Prometheus' text format (the whole server's with --num_workers)."""
        return self.metrics.exposition()

    @property
    def stopped(self) -> asyncio.Event:
        """Set once the server's ports close."""
        return self._status.stopped

    def model_status(self, name: str, version: int | None = None, label: str | None = None) -> list[VersionStatus]:
        if label is not None:
            version = self._models.label_version(name, label)
        return self._models.version_status(name, version)

    def max_batch_size(self, model: str) -> int:
        """The most rows one batch of ``model`` runs (its batching parameters'); 0 when batching is off for it."""
        params = self._batching_for(model)
        return params.max_batch_size if params is not None else 0

    def v2_description(self, spec: ModelSpec) -> ModelDescription:
        """What v2's metadata and config say of the version ``spec`` names (held while it is read): its
        ``serving_default`` signature, the model's available versions, its platform's v2 name, batching, and the
        config it declares. Both v2 frontends encode this one description."""
        with self.handle(spec) as servable:
            # A version its own server names (MLServer's "v0.1.0") is described by that name, as that server does.
            dialect = dialect_of(servable)
            named = (dialect.version_name,) if dialect is not None and dialect.version_name else None
            return ModelDescription(
                name=spec.name,
                versions=named or tuple(self.available_versions(spec.name)),
                platform=v2_name(servable.platform),
                signature=servable.signatures.get(DEFAULT_SIGNATURE),
                max_batch_size=self.max_batch_size(spec.name),
                declared=servable.model_config,
                decoupled=servable.decoupled,
                warnings=servable.load_warnings,
            )

    def repository(self) -> list[RepositoryRow]:
        """Every version of every model the server knows, with its state and why it failed (if it did)."""
        rows = []
        for name in self._models.model_names():
            with contextlib.suppress(ServingError):  # a model with no versions (yet) has no rows
                for status in self._models.version_status(name):
                    # why it failed, else what its load warned of (an MLflow model's environment mismatches)
                    reason = status.error.message if status.error is not None else "; ".join(status.warnings)
                    rows.append(RepositoryRow(name, status.version, status.state.name, reason))
        return sorted(rows, key=lambda row: (row.name, row.version))

    def statistics(self, model: str | None = None, version: int | None = None) -> list[ModelStatistics]:
        """Cumulative counts per model version since the server started (every model's without ``model``).

        Read from the server's metrics, so they agree with ``/metrics``; an unknown model or version is NOT_FOUND.
        """
        if model is None:
            versions = [(row.name, row.version) for row in self.repository() if isinstance(row.version, int)]
        else:
            versions = [(model, status.version) for status in self._models.version_status(model, version)]
        # The whole server's with --num_workers (workbench.observability.whole_server), so any worker answers for
        # all of them.
        totals = MetricTotals(self.metrics.statistics_families())
        return [totals.statistics(name, number) for name, number in sorted(versions)]


class _MemberAccess:
    """What composite servables (handlers, pipelines) reach the server's other models through."""

    def __init__(self, dataplane: Dataplane) -> None:
        self._dataplane = dataplane

    async def predict(
        self, model: str, version: int | None, label: str | None, signature_name: str, inputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        dataplane = self._dataplane
        spec = ModelSpec(model, version, label)
        held = await dataplane.hold(spec)  # a member evicted under a memory budget loads again for the pipeline
        with ServableHandle(held) if held is not None else dataplane.handle(spec) as member:
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
        return await asyncio.get_running_loop().run_in_executor(self._dataplane._executor, fn, *args)  # noqa: SLF001 - the data plane's own executor
