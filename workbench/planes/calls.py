"""One request in flight through the data plane: what it names (:class:`ModelSpec`), the servable it holds and how it
is counted (:class:`RequestInFlight`), what a wire format hands the plane's one-call predict (:class:`WireRequest`),
and how its answer meets its deadline (:func:`until_answered`, :func:`answering`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from workbench.batching.interest import Interest, deadline_exceeded
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Servable
from workbench.core.signatures import Signature
from workbench.models.harness import Harness
from workbench.observability import tracing as _tracing
from workbench.observability.metrics import ServingMetrics
from workbench.observability.stats import RollingStats
from workbench.planes.one_client import GRPC_PROTOCOLS, OneClient

T = TypeVar("T")
A = TypeVar("A", covariant=True)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a request names: a model and at most one of a version or a label."""

    name: str
    version: int | None = None
    label: str | None = None
    signature_name: str = ""
    # The request's stickiness key (workbench.core.sticky): under a canary split, one key lands on one version.
    key: str | None = None


class WireRequest(Protocol[A]):
    """A request body in a wire format, as :meth:`Dataplane.infer <workbench.planes.dataplane.Dataplane.infer>` runs
    it: decoded against the signatures of the servable the request resolved to (a format whose decoding needs the
    inputs' types, as TF Serving's REST JSON does), and its outputs encoded into the answer ``A``.

    ``stacks``: its inputs may run stacked with other requests' (:mod:`workbench.planes.coalescing`), its answer
    encoded from its own rows of the outputs, as it would be from a run of its own."""

    stacks: bool

    @staticmethod
    def decode_together(requests: Sequence[Any], signatures: Mapping[str, Signature]) -> None:
        """Decode a group's requests (``stacks`` ones, all of this type) in one pass where the format can, so that
        each one's :meth:`decode` returns its part; or do nothing, and each decodes alone."""
        ...

    def decode(self, signatures: Mapping[str, Signature]) -> tuple[str, Mapping[str, np.ndarray]]:
        """The signature name the request names and its inputs."""
        ...

    def encode(self, outputs: Mapping[str, np.ndarray]) -> A: ...


class CallSite(Protocol):
    """What a :class:`RequestInFlight` needs of the data plane."""

    metrics: ServingMetrics
    stats: RollingStats
    one_client: OneClient

    def resolve(self, spec: ModelSpec) -> Harness: ...


class RequestInFlight:
    """One request in flight: ``with dataplane.request(spec, api, protocol) as call:``.

    Entering resolves ``spec`` and holds the servable (``call.servable``); leaving counts the request once, by its
    final status, in the metrics and the rolling stats. The hold outlives the answer when it must: a request
    answered early (its deadline passed, its client cancelled) while a worker thread still runs its servable
    releases the servable only when that thread returns, so an unload never closes a model under a running
    ``run()``. A plain ``with``, not ``async with``: nothing here awaits, and this runs on every request.
    """

    __slots__ = (
        "_dataplane", "_harness", "_started", "_work", "_interest", "_grpc_calls", "servable", "model", "api",
        "protocol", "default", "trace",
    )  # fmt: skip

    def __init__(
        self, dataplane: CallSite, spec: ModelSpec, api: str, protocol: str, harness: Harness | None = None
    ) -> None:
        """``harness``: the servable ``spec`` names, already acquired (a version loaded on demand for the request);
        None: resolved here."""
        self._dataplane = dataplane
        self.model, self.api, self.protocol = spec.name, api, protocol
        self.default = spec.version is None and spec.label is None  # default traffic (a shadow may copy it)
        self._started = time.perf_counter()
        self._work: asyncio.Future[Any] | None = None  # a composite's run, as a task of its own
        self._interest: Interest | None = None  # a plain servable's run: its batch tasks, awaited by the request
        tracing = _tracing.active  # None unless OTEL_TRACES_EXPORTER asked for spans: nothing more is done then
        self.trace = tracing.start_request(spec.name, api, protocol, spec.signature_name) if tracing else None
        try:
            # The harness itself, not a ServableHandle around it: one object less on every request.
            self._harness = harness if harness is not None else dataplane.resolve(spec)
        except BaseException as exc:  # an unknown model or version is a request too: count it
            self._count(exc, None)
            raise
        self.servable: Servable = self._harness.servable
        if self.trace is not None:
            self.trace.resolved(self.servable.version)
        # A gRPC call in flight: meanwhile the server has no one client (see workbench.planes.one_client).
        self._grpc_calls: OneClient | None = None
        if protocol in GRPC_PROTOCOLS:
            self._grpc_calls = dataplane.one_client
            self._grpc_calls.grpc_calls += 1

    @property
    def version(self) -> int:
        return self.servable.version

    @property
    def elapsed_seconds(self) -> float:
        return time.perf_counter() - self._started

    def switch(self, spec: ModelSpec) -> None:
        """Run on the servable ``spec`` names instead (the version a sequence started on): held, the other released."""
        harness = self._dataplane.resolve(spec)
        self._harness.release()
        self._harness, self.servable = harness, harness.servable
        if self.trace is not None:
            self.trace.resolved(self.servable.version)

    def hold_for(self, interest: Interest) -> None:
        """The request's batch tasks are ``interest``'s: once answered, the servable stays held until they ran."""
        self._interest = interest

    def hold_until_done(self, work: asyncio.Future[Any]) -> None:
        """``work`` runs the servable for the request (on a thread, or as a task of its own): once answered, the
        servable stays held until ``work`` is done, whatever the caller did meanwhile."""
        self._work = work

    def __enter__(self) -> RequestInFlight:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._grpc_calls is not None:
            self._grpc_calls.grpc_calls -= 1
            self._grpc_calls = None
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
        if self.trace is not None:
            self.trace.end(exc)


class Expired(Exception):
    """A request's deadline passed before its answer came (set on the answer future by its timer)."""


def expire(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.set_exception(Expired())


async def until_answered(
    waiting: Awaitable[T], interest: Interest, deadline: float | None, on_deadline: Callable[[], object]
) -> T:
    """What a request awaits, until it is answered: a cancelled caller gives up the work still queued for it, and
    at ``deadline`` (the loop's clock; None: none) ``on_deadline`` runs (:func:`expire`, ``Interest.expire``), an
    expired answer being DEADLINE_EXCEEDED.

    The deadline's timer is armed only once ``waiting`` has to wait: a call answered in its first step (a cheap
    model's call run on the loop) cannot be overtaken by a timer, which could not fire before it returns, and a
    timer armed and cancelled costs uvloop about 6 µs, as much as the rest of the request's way to its model.
    """
    expiry: asyncio.TimerHandle | None = None
    try:
        steps = waiting.__await__()
        try:
            first = steps.send(None)
        except StopIteration as done:  # answered without waiting
            return cast(T, done.value)
        if deadline is not None:
            expiry = asyncio.get_running_loop().call_at(deadline, on_deadline)
        return await _Resumed(steps, first)
    except Expired:
        interest.give_up(deadline_exceeded())
        raise deadline_exceeded() from None
    except asyncio.CancelledError:
        interest.give_up(ServingError(Code.CANCELLED, "Cancelled"))
        raise
    finally:
        if expiry is not None:
            expiry.cancel()


class _Resumed:
    """An awaitable already stepped once (it yielded ``first``), awaited as if it had not been: ``first`` goes to
    the task first, and everything after (results sent, exceptions thrown in) goes on to ``steps``."""

    __slots__ = ("_steps", "_first", "_started")

    def __init__(self, steps: Generator[Any, Any, Any], first: Any) -> None:
        self._steps, self._first, self._started = steps, first, False

    def __await__(self) -> _Resumed:
        return self

    def __iter__(self) -> _Resumed:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            first, self._first = self._first, None
            return first
        return self._steps.send(value)

    def throw(self, kind: Any, value: Any = None, traceback: Any = None) -> Any:
        error = value if value is not None else (kind() if isinstance(kind, type) else kind)
        return self._steps.throw(error)

    def close(self) -> None:
        self._steps.close()


async def answering(work: Awaitable[T], answer: asyncio.Future[T]) -> None:
    """Await ``work`` and hand its outcome to ``answer``, unless nobody waits for it any more.

    Run as the request's task: setting ``answer`` is the task's last step, so by the time the caller resumes the
    task is done (and ``RequestInFlight`` releases the servable at once). An outcome nobody waits for (the caller's
    deadline passed, it cancelled) is dropped here, never left unretrieved.
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
