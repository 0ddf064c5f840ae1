"""Requests for one model that arrive together, run as one call: the data plane's work done once per group.

Under load, a small model's request costs the event loop more than its model: each one is admitted, decoded,
validated, queued as a batch task with its own future, deadline and interest, and counted, and the batcher then merges
those tasks into the batch it would have formed anyway. :class:`Coalescer` takes the requests of one model that
arrive in the same turn of the event loop (the requests its connections delivered together) as one *group*, which the
request that opened it (its leader) runs in the next turn: admitted once, its bodies decoded in one pass where their
format can (:meth:`WireRequest.decode_together <workbench.planes.calls.WireRequest.decode_together>`), validated and
queued as one batch task, and each member answered with its own rows of the outputs, encoded in its own format. A
member costs the loop a list entry, a future and its count in the metrics; the batch's record counts it as a request
(its size, its queue time), as it would have counted it alone.

What a member sees is what it would have seen alone, because anything that could tell the two apart sends the
request the usual way (:meth:`Dataplane.infer <workbench.planes.dataplane.Dataplane.infer>` decides, per request and
per group):

- only a request naming no version, label or stickiness key joins, to a model that batches (a group is one more way
  of batching, never batching a model that does not), whose requests all go to one version (no canary's split, which
  counts every request), with no response cache, request log, shadow or trace to feed per request (drift monitoring
  is offered each member's inputs and rows), and loaded (no first load or on-demand load to wait for);
- a group of one, a member whose body does not decode, a member whose inputs do not stack with the others' (another
  signature, dtype or row shape), and every member of a group whose stacked inputs the signature refuses, are run
  alone: their answers and errors are the usual ones, word for word, and nothing ran for them before;
- a run that fails fails each of its members with its error, as a batch that fails does; the deadline is the
  request's, the same for every member (they arrived in the same turn, with the same timeout);
- a cancelled leader (its client gone) sends the members it has not answered the usual way.

A model that answers each request on its own (Triton's Python backend, Hugging Face's tasks: a
:class:`~workbench.core.servable.PerRequestServable`) and a version a model runner serves (the runner merges what it
is sent itself) take no group.

A request joins only while another request for the same model is in flight: one client's requests never wait for a
turn's end, and its latency is what it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np

from workbench.batching.interest import Interest
from workbench.batching.merge import batch_key, merge
from workbench.core import inference
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Servable
from workbench.core.signatures import Signature
from workbench.observability.metrics import ServingMetrics
from workbench.observability.stats import RollingStats
from workbench.planes.calls import CallSite, ModelSpec, RequestInFlight, WireRequest

log = logging.getLogger(__name__)

A = TypeVar("A")
API = "predict"
Alone = Callable[[ModelSpec, str, WireRequest[A], "float | None"], Awaitable[tuple[int, A]]]


class CoalescingSite(CallSite, Protocol):
    """What a :class:`Coalescer` needs of the data plane."""

    def coalescable(self, model: str) -> bool:
        """Whether ``model``'s requests naming no version may run as a group now (see the module's rules)."""
        ...

    def merges(self, servable: Servable) -> int:
        """The most rows one group's run of ``servable`` may stack (its batching's largest call); 0: none."""
        ...

    async def run_group(
        self,
        call: RequestInFlight,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: list[str],
        timeout: float | None,
        requests: int,
    ) -> dict[str, np.ndarray]:
        """Run a validated feed, the rows of ``requests`` requests, for ``call``, as a predict runs one request's (the
        batcher, the deadline)."""
        ...

    def answered(
        self,
        call: RequestInFlight,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: dict[str, np.ndarray],
    ) -> None:
        """A member answered with ``outputs`` (its rows), to be offered where a predict's answer is (drift)."""
        ...


class _GroupCall(RequestInFlight):
    """One group's admission: resolved and held once, until every run it made has returned (a run its deadline
    answered early may still be on a thread); its members count themselves, each by its own outcome."""

    __slots__ = ("_interests",)

    def __init__(self, site: CallSite, spec: ModelSpec, protocol: str) -> None:
        self._interests: list[Interest] = []
        super().__init__(site, spec, API, protocol)

    def hold_for(self, interest: Interest) -> None:
        self._interests.append(interest)  # one a run: a group may run its members in several parts

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._grpc_calls is not None:
            self._grpc_calls.grpc_calls -= 1
            self._grpc_calls = None
        running = [interest for interest in self._interests if interest.running]
        if not running:
            self._harness.release()
            return
        left = [len(running)]

        def one_idle() -> None:
            left[0] -= 1
            if not left[0]:
                self._harness.release()

        for interest in running:
            interest.when_idle(one_idle)

    def _count(self, exc: BaseException | None, version: int | None) -> None:
        pass


# What a member's future is given: the version that answered (None: not resolved), its answer or its error. An answer
# of ALONE sends the member the usual way.
Outcome = tuple["int | None", Any, "ServingError | None"]
ALONE: Any = object()


class _Member:
    __slots__ = ("request", "future", "inputs", "rows")

    def __init__(self, request: WireRequest[Any], future: asyncio.Future[Outcome]) -> None:
        self.request, self.future = request, future
        self.inputs: Mapping[str, np.ndarray] = {}
        self.rows = 0

    def tell(self, outcome: Outcome) -> None:
        if not self.future.done():  # its caller may have gone (cancelled) meanwhile
            self.future.set_result(outcome)


class Coalescer:
    """The groups of one data plane (one event loop)."""

    def __init__(self, site: CoalescingSite) -> None:
        self._site = site
        self._in_flight: dict[str, int] = {}  # requests naming no version in flight, by model
        self._open: dict[tuple[str, str, float | None], list[_Member]] = {}  # groups of this loop turn

    async def infer(
        self, spec: ModelSpec, protocol: str, request: WireRequest[A], timeout: float | None, alone: Alone[A]
    ) -> tuple[int, A]:
        """``request`` answered: in a group when it may join one, else by ``alone`` (the usual way)."""
        name = spec.name
        busy = self._in_flight.get(name, 0)
        self._in_flight[name] = busy + 1
        try:
            if busy == 0 or not self._site.coalescable(name):
                return await alone(spec, protocol, request, timeout)
            started = time.perf_counter()
            key = (name, protocol, timeout)
            member = _Member(request, asyncio.get_running_loop().create_future())
            group = self._open.get(key)
            if group is not None:
                group.append(member)
            else:  # this request leads the group: it runs it once the requests of this turn have joined
                group = self._open[key] = [member]
                try:
                    await self._lead(spec, protocol, key, group)
                except asyncio.CancelledError:
                    self._count(name, None, protocol, Code.CANCELLED.name, started)
                    raise
            return await self._answered(spec, protocol, member, timeout, alone, started)
        finally:
            left = self._in_flight[name] - 1
            if left:
                self._in_flight[name] = left
            else:
                del self._in_flight[name]

    async def _lead(
        self, spec: ModelSpec, protocol: str, key: tuple[str, str, float | None], group: list[_Member]
    ) -> None:
        """Run ``group`` in the turn after this one, which every request of this turn has joined by then.

        Run here, not as a task of its own: a task costs a turn more before it starts. Should the leader be
        cancelled (its client gone), every member not answered yet is sent the usual way: the run it was part of
        is given up with the leader's interest.
        """
        try:
            await _next_turn()
            del self._open[key]
            if len(group) == 1:
                group[0].tell((None, ALONE, None))
            else:
                await self._run(spec, protocol, group, key[2])
        except asyncio.CancelledError:
            if self._open.get(key) is group:
                del self._open[key]
            for member in group:
                member.tell((None, ALONE, None))
            raise

    async def _answered(
        self,
        spec: ModelSpec,
        protocol: str,
        member: _Member,
        timeout: float | None,
        alone: Alone[A],
        started: float,
    ) -> tuple[int, A]:
        version: int | None = None
        try:
            version, answer, error = await member.future
        except asyncio.CancelledError:
            self._count(spec.name, version, protocol, Code.CANCELLED.name, started)
            raise
        if answer is ALONE:
            return await alone(spec, protocol, member.request, timeout)
        self._count(spec.name, version, protocol, "OK" if error is None else error.code.name, started)
        if error is not None:
            raise error
        assert version is not None
        return version, answer

    def _count(self, model: str, version: int | None, protocol: str, code: str, started: float) -> None:
        seconds = time.perf_counter() - started
        metrics: ServingMetrics = self._site.metrics
        stats: RollingStats = self._site.stats
        metrics.observe_request(model, version, API, protocol, code, seconds)
        stats.record_request(model, version, seconds, code == "OK")

    async def _run(self, spec: ModelSpec, protocol: str, group: list[_Member], timeout: float | None) -> None:
        """Answer every member of ``group`` (nothing raises: a bug fails the members with INTERNAL, logged)."""
        try:
            call = _GroupCall(self._site, spec, protocol)
        except ServingError as exc:
            for member in group:
                member.tell((None, None, exc))
            return
        except Exception as exc:  # a bug must still answer the members, and be logged
            log.exception("resolving a group of %s failed", spec.name)
            error = from_exception(exc)
            for member in group:
                member.tell((None, None, error))
            return
        with call:
            try:
                await self._run_held(call, group, timeout)
            except Exception as exc:  # as above
                log.exception("a group of %s failed", spec.name)
                error = from_exception(exc)
                for member in group:
                    member.tell((call.version, None, error))

    async def _run_held(self, call: RequestInFlight, group: list[_Member], timeout: float | None) -> None:
        servable, version = call.servable, call.version
        most_rows = self._site.merges(servable)
        if not most_rows:
            for member in group:
                member.tell((None, ALONE, None))
            return
        type(group[0].request).decode_together([member.request for member in group], servable.signatures)
        stacks: dict[tuple[Any, ...], list[_Member]] = {}
        for member in group:
            try:
                signature_name, inputs = member.request.decode(servable.signatures)
            except ServingError as exc:
                member.tell((version, None, exc))
                continue
            except Exception as exc:  # a bug must still answer the member, and be logged
                log.exception("decoding a request to %s failed", servable.name)
                member.tell((version, None, from_exception(exc)))
                continue
            shapes = batch_key(inputs, False)  # what the batcher merges on: names, dtypes, row shapes
            if shapes is None:
                member.tell((None, ALONE, None))
                continue
            key = (inference.signature_name_or_default(signature_name), shapes)
            member.inputs, member.rows = inputs, next(iter(inputs.values())).shape[0]
            stacks.setdefault(key, []).append(member)
        for (signature_name, _), members in stacks.items():
            await self._run_stack(call, signature_name, members, most_rows, timeout)

    async def _run_stack(
        self, call: RequestInFlight, signature_name: str, members: list[_Member], most_rows: int, timeout: float | None
    ) -> None:
        """Members whose inputs stack: one run for as many of them as fit in ``most_rows``, in arrival order."""
        try:
            signature = inference.predict_signature(call.servable, signature_name)
        except ServingError:
            signature = None
        if signature is None or not signature.batchable:
            for member in members:
                member.tell((None, ALONE, None))
            return
        while members:
            taken, rows = 0, 0
            while taken < len(members) and rows + members[taken].rows <= most_rows:
                rows += members[taken].rows
                taken += 1
            if taken <= 1:  # one member (one over the limit, too): the usual way says what it must
                members.pop(0).tell((None, ALONE, None))
                continue
            part, members = members[:taken], members[taken:]
            await self._run_part(call, signature, part, timeout)

    async def _run_part(
        self, call: RequestInFlight, signature: Signature, part: list[_Member], timeout: float | None
    ) -> None:
        stacked = merge([m.inputs for m in part], False, sum(m.rows for m in part))
        try:
            feed, outputs = inference.prepare_predict(signature, stacked)
        except ServingError:  # each member alone hears its own words for it
            for member in part:
                member.tell((None, ALONE, None))
            return
        version = call.version
        try:
            result = await self._site.run_group(call, signature, feed, outputs, timeout, len(part))
        except ServingError as exc:  # as a failed batch fails its requests, each named by its own inputs
            for member in part:
                member.tell((version, None, inference.name_the_misfit_input(signature, member.inputs, exc)))
            return
        start = 0
        for member in part:
            end = start + member.rows
            rows = {alias: value[start:end] for alias, value in result.items()}
            start = end
            self._site.answered(call, signature, member.inputs, rows)
            try:
                member.tell((version, member.request.encode(rows), None))
            except ServingError as exc:  # an answer its format cannot say (the usual way fails the same)
                member.tell((version, None, exc))


async def _next_turn() -> None:
    """Return in the event loop's next turn, once the callbacks already due in this one (the requests it took in)
    have run: a future the loop sets, which any coroutine runner awaits alike (uvicorn's tasks, granian's own)."""
    loop = asyncio.get_running_loop()
    turned = loop.create_future()
    loop.call_soon(turned.set_result, None)
    await turned
