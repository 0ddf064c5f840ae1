"""Decoupled models (0..n responses per request): their responses to one request, streamed as they come."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

import numpy as np

from workbench.batching.scheduler import deadline_exceeded
from workbench.core import inference
from workbench.core.errors import Code, ServingError
from workbench.planes.calls import RequestInFlight

T = TypeVar("T")
U = TypeVar("U")
_END = object()  # what next() answers once a decoupled model's generator is over


class Begun(AsyncIterator[T], Generic[T]):
    """Responses to a request whose run has begun (a generation already submitted to its model's batch), read as
    an async generator ``events`` is. ``aclose()`` ends the run even where nothing was read, as a stream whose
    response never started (its client gone first) is: ``events`` closed, then ``end``, which must tolerate being
    called twice (none: a run that begins only when read, which closing ``events`` ends). Iterate under
    ``contextlib.aclosing``."""

    __slots__ = ("_end", "_events")

    def __init__(self, events: AsyncGenerator[T, None], end: Callable[[], Awaitable[None]] | None = None) -> None:
        self._events, self._end = events, end

    def __aiter__(self) -> Begun[T]:
        return self

    def __anext__(self) -> Awaitable[T]:
        return self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            if self._end is not None:
                await self._end()

    def passed_through(self, events: AsyncGenerator[U, None]) -> Begun[U]:
        """``events``, which read these responses, as responses whose run has begun: closing them ends the run."""
        return Begun(events, self.aclose)


def stream(
    call: RequestInFlight,
    executor: Executor,
    signature_name: str,
    inputs: Mapping[str, np.ndarray],
    output_filter: Sequence[str] = (),
    timeout: float | None = None,
) -> Begun[dict[str, np.ndarray]]:
    """Run a decoupled servable: its responses to one request as they come. The run begins now, not at the first
    read: a generation joins its model's batch while its request's handler runs, so a burst's first prompt is
    prefilled while the others are still arriving; a refusal (a full queue, bad inputs) is raised here, before any
    answer is sent. A caller that may stop early reads it under ``contextlib.aclosing`` inside its ``with call:``,
    so that leaving stops the model.

    The model's generator is advanced on a worker thread one response at a time, and only when the caller asks
    for the next: a slow client holds the model back rather than filling a buffer. Responses that can be awaited
    (an async iterator, as a generation's: its steps run on a thread of their own) are awaited on the loop
    instead, with no worker thread waiting for each. Each request is its own run
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
    run = _Run(call, executor, servable.run_decoupled(signature, feed, outputs))
    return Begun(run.responses(loop, deadline), run.end)


class _Run:
    """One request's run of a decoupled model, from its start to its close."""

    def __init__(self, call: RequestInFlight, executor: Executor, responses: Iterator[Any]) -> None:
        self.call, self.executor, self.model = call, executor, responses
        self.step: asyncio.Future[Any] | None = None  # the step a worker thread runs now, if any
        self.over = False  # the generator ended, failed or was closed: nothing left to close

    async def responses(
        self, loop: asyncio.AbstractEventLoop, deadline: float | None
    ) -> AsyncGenerator[dict[str, np.ndarray], None]:
        call, model = self.call, self.model
        awaited = model if isinstance(model, AsyncIterator) else None
        try:
            while True:
                if awaited is not None:  # no thread runs the model for it (step stays None): leaving ends the wait
                    waiting: Awaitable[Any] = _next_awaited(awaited)
                else:
                    step = self.step = loop.run_in_executor(self.executor, next, model, _END)
                    call.hold_until_done(step)  # held while a thread runs the model, whatever the caller does
                    waiting = asyncio.shield(step)
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    result = await asyncio.wait_for(waiting, remaining)
                except asyncio.TimeoutError:
                    raise deadline_exceeded() from None
                except Exception:
                    self.over = self.step is None or self.step.done()  # the model's own error ends its responses
                    raise
                if result is _END:
                    self.over = True
                    return
                yield result
        finally:
            self._close()

    async def end(self) -> None:
        self._close()

    def _close(self) -> None:
        """Close the model's generator, unless it is over (or closing)."""
        if self.over:
            return
        self.over = True
        closing = asyncio.ensure_future(_close_responses(self.step, self.model, self.executor))
        self.call.hold_until_done(closing)


async def _next_awaited(responses: AsyncIterator[Any]) -> Any:
    """The next of awaitable responses, or :data:`_END`."""
    try:
        return await responses.__anext__()
    except StopAsyncIteration:
        return _END


async def _close_responses(step: asyncio.Future[Any] | None, responses: Iterator[Any], executor: Executor) -> None:
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
            await asyncio.get_running_loop().run_in_executor(executor, close)


def joined(responses: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A decoupled request's responses as one answer, for its request log and its shadow's comparison: each output
    its responses' values joined along the first dimension (a generator's text pieces, in order), for the outputs
    every response has."""
    if not responses:
        return {}
    shared = [alias for alias in responses[0] if all(alias in r for r in responses)]
    return {alias: np.concatenate([np.atleast_1d(np.asarray(r[alias])) for r in responses]) for alias in shared}
