"""Triton's sequence batcher, for stateful models: a sequence's requests run in order, on one version, with its state.

A client names a sequence with the request parameters ``sequence_id`` (a number or a string), ``sequence_start`` on
its first request and ``sequence_end`` on its last. The batcher keeps, per sequence of a model version, the state the
model returned last (Triton's implicit state), and runs each request of a sequence only after the one before it:

- **Oldest** (the default): every step a batch takes the oldest waiting request of each sequence not running now,
  up to ``max_batch_size`` of them, waiting up to ``max_queue_delay`` for more (not at a preferred batch size):
  batches form across sequences, never two requests of one sequence in a batch.
- **Direct**: each sequence holds one of ``max_batch_size`` slots from its start to its end (or until it idles
  out); a new sequence waits for a free slot, and a batch runs the waiting requests in slot order, at most
  ``run_batch_size`` a run (a model instance's slots), waiting up to the delay for ``min_ready`` of them.

``max_sequences`` bounds the sequences Oldest holds at once (Triton's ``max_candidate_sequences``): a sequence that
starts beyond it waits for one to end or idle out, as Triton keeps it in its backlog (0: no bound).

A sequence idle for longer than ``max_idle_seconds`` is released with its state; so is one whose last request
(``sequence_end``) has run. A request that continues a sequence the batcher does not hold (never started, ended,
released) is refused in Triton's words, which its clients match on. A ``sequence_start`` for a sequence that is still
held starts it afresh, as Triton does.

What runs a step is the servable's ``run_step(signature, inputs, outputs, state, controls)``, which answers the
outputs and the new state, or its ``run_steps(steps)``, which runs a whole batch of steps at once (one run of the
model, as Triton's sequence batcher gives its backends); the control inputs (START, END, READY, CORRID) are given as
Triton gives them to a model that asks for them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import (
    Controls,
    SequenceId,
    SequenceRequest,
    SequenceSettings,
    StatefulServable,
    Step,
    StepResult,
    Strategy,
)
from workbench.core.signatures import Signature


def _not_started(sequence: SequenceId, model: str) -> ServingError:
    return ServingError(
        Code.INVALID_ARGUMENT,
        f"inference request for sequence {sequence} to model '{model}' must specify the START flag on the first "
        "request of the sequence (this sequence was never started, has ended, or was idle longer than the model's "
        "max_sequence_idle_microseconds)",
    )


@dataclasses.dataclass(eq=False)
class _Step:
    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[str]
    signature: Signature
    request: SequenceRequest
    answer: asyncio.Future[dict[str, np.ndarray]]
    queued: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass(eq=False)
class _Sequence:
    id: SequenceId
    slot: int | None = None
    state: Any = None
    waiting: collections.deque[_Step] = dataclasses.field(default_factory=collections.deque)
    running: bool = False
    last_seen: float = dataclasses.field(default_factory=time.monotonic)


class SequenceBatcher:
    """The sequences of one stateful model version, and the batches their requests run in (on the event loop)."""

    def __init__(
        self,
        servable: StatefulServable,
        settings: SequenceSettings,
        executor: Executor,
        clock: Callable[[], float] = time.monotonic,
        on_release: Callable[[SequenceId], None] = lambda sequence_id: None,
    ) -> None:
        """Made on the event loop it serves; ``on_release(id)`` is told of every sequence that ends or idles out."""
        self.servable = servable
        self.settings = settings
        self._executor = executor
        self._clock = clock
        self._on_release = on_release
        self._loop = asyncio.get_running_loop()
        self._sequences: dict[SequenceId, _Sequence] = {}
        self._slot_waiters: collections.deque[tuple[SequenceId, asyncio.Future[None]]] = collections.deque()
        self._scheduled: asyncio.TimerHandle | asyncio.Handle | None = None
        self._delayed = False  # whether the scheduled dispatch waits for the queue delay (uvloop has its own handles)
        self._reaper: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def active(self) -> int:
        """Sequences held now (started, not ended nor idled out)."""
        return len(self._sequences)

    async def run(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        request: SequenceRequest,
    ) -> dict[str, np.ndarray]:
        """Run one request of ``request.id``'s sequence once the requests before it have run; its outputs."""
        if self._closed:
            raise ServingError(Code.UNAVAILABLE, f"Model {self.servable.name} version {self.servable.version} unloaded")
        self._release_idle()
        sequence = self._sequences.get(request.id)
        if request.start:
            if sequence is not None:  # started afresh, as Triton does: the old state goes
                self._drop(sequence)
            sequence = await self._begin(request.id)
        elif sequence is None:
            raise _not_started(request.id, self.servable.name)
        sequence.last_seen = self._clock()
        step = _Step(inputs, outputs, signature, request, asyncio.get_running_loop().create_future())
        sequence.waiting.append(step)
        self._schedule()
        return await step.answer

    # ------------------------------------------------------------------------------------ sequences
    async def _begin(self, sequence_id: SequenceId) -> _Sequence:
        sequence = _Sequence(sequence_id)
        capacity = self._capacity()
        if capacity is not None:
            while (slot := self._free_slot(capacity)) is None:  # every slot holds a sequence: wait for one to end
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._slot_waiters.append((sequence_id, waiter))
                self._arm_reaper()
                await waiter
            sequence.slot = slot
        self._sequences[sequence_id] = sequence
        self._arm_reaper()
        return sequence

    def _capacity(self) -> int | None:
        """How many sequences may be held at once: Direct's slots, Oldest's candidates (None: no bound)."""
        if self.settings.strategy is Strategy.DIRECT:
            return self.settings.max_batch_size
        return self.settings.max_sequences or None

    def _free_slot(self, capacity: int) -> int | None:
        used = {s.slot for s in self._sequences.values()}
        return next((slot for slot in range(capacity) if slot not in used), None)

    def _drop(self, sequence: _Sequence) -> None:
        """Release ``sequence`` and its state; what it still had waiting is refused."""
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
            self._on_release(sequence.id)
        for step in sequence.waiting:
            if not step.answer.done():
                step.answer.set_exception(_not_started(sequence.id, self.servable.name))
        sequence.waiting.clear()
        while self._slot_waiters:  # a slot came free: the oldest sequence waiting for one takes it
            _, waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _release_idle(self) -> None:
        horizon = self._clock() - self.settings.max_idle_seconds
        for sequence in list(self._sequences.values()):
            if not sequence.running and not sequence.waiting and sequence.last_seen < horizon:
                self._drop(sequence)

    def _arm_reaper(self) -> None:
        """Release idle sequences on time even when no request comes (their slots and state are freed)."""
        if self._reaper is None and self._sequences and not self._closed:
            loop = asyncio.get_running_loop()
            self._reaper = loop.call_later(self.settings.max_idle_seconds, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        self._release_idle()
        self._arm_reaper()

    # -------------------------------------------------------------------------------------- batches
    def _schedule(self) -> None:
        """Run the next batch now when it is full enough, else when the strategy's queue delay has passed."""
        loop = asyncio.get_running_loop()
        if self._scheduled is not None:
            if self._delayed and self._full():
                self._scheduled.cancel()  # the batch filled while it waited: it runs now
                self._scheduled, self._delayed = loop.call_soon(self._dispatch), False
            return
        self._delayed = self.settings.max_queue_delay_seconds > 0 and not self._full()
        if self._delayed:
            self._scheduled = loop.call_later(self.settings.max_queue_delay_seconds, self._dispatch)
        else:
            self._scheduled = loop.call_soon(self._dispatch)

    def _full(self) -> bool:
        """Whether the waiting requests make a batch that need not wait for more: Oldest's at the batch limit or a
        preferred size, Direct's at its minimum slot utilization."""
        ready = len(self._ready())
        if self.settings.strategy is Strategy.DIRECT:
            return ready >= max(1, self.settings.min_ready)
        preferred = self.settings.preferred_batch_sizes
        return ready >= self.settings.batch_limit or ready in preferred or bool(preferred and ready >= preferred[-1])

    def _ready(self) -> list[_Sequence]:
        return [s for s in self._sequences.values() if s.waiting and not s.running]

    def _dispatch(self) -> None:
        self._scheduled, self._delayed = None, False
        ready = self._ready()
        if not ready:
            return
        if self.settings.strategy is Strategy.DIRECT:
            ready.sort(key=lambda s: s.slot if s.slot is not None else 0)
        else:
            ready.sort(key=lambda s: s.waiting[0].queued)
        chosen = ready[: self.settings.batch_limit]
        steps = []
        for sequence in chosen:
            sequence.running = True
            steps.append((sequence, sequence.waiting.popleft()))
        work = asyncio.get_running_loop().run_in_executor(self._executor, self._run_batch, steps)
        work.add_done_callback(lambda done: self._finished(steps, done))
        if len(ready) > len(chosen):
            self._schedule()

    def _run_batch(self, steps: list[tuple[_Sequence, _Step]]) -> list[tuple[Any, BaseException | None]]:
        """On an inference thread: the batch's steps, each with its sequence's state; one run of the model for the
        whole batch when the servable has ``run_steps``, else one ``run_step`` each, in the batch's order."""
        batch = [
            Step(
                step.signature,
                step.inputs,
                step.outputs,
                sequence.state,
                Controls(step.request.start, step.request.end, True, sequence.id),
            )
            for sequence, step in steps
        ]
        run_steps = getattr(self.servable, "run_steps", None)
        if run_steps is not None:
            answers: list[StepResult | BaseException] = run_steps(batch)
        else:
            answers = []
            for item in batch:
                try:
                    answers.append(
                        self.servable.run_step(item.signature, item.inputs, item.outputs, item.state, item.controls)
                    )
                except BaseException as exc:  # noqa: BLE001 - the request's error, not the batch's
                    answers.append(exc)
        results: list[tuple[Any, BaseException | None]] = []
        for (sequence, _), answer in zip(steps, answers, strict=True):
            if isinstance(answer, BaseException):
                results.append((None, answer))
            else:
                outputs, sequence.state = answer
                results.append((outputs, None))
        return results

    def _finished(self, steps: list[tuple[_Sequence, _Step]], done: asyncio.Future[Any]) -> None:
        failure = done.exception() if not done.cancelled() else ServingError(Code.CANCELLED, "Cancelled")
        results = done.result() if failure is None else [(None, failure)] * len(steps)
        now = self._clock()
        for (sequence, step), (outputs, error) in zip(steps, results, strict=True):
            sequence.running = False
            sequence.last_seen = now
            if not step.answer.done():
                if error is not None:
                    step.answer.set_exception(error)
                else:
                    step.answer.set_result(outputs)
            if step.request.end:
                self._drop(sequence)
        if self._ready():
            self._schedule()

    def close_soon(self) -> None:
        """:meth:`close`, from any thread."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing runs any more
            self._loop.call_soon_threadsafe(self.close)

    def close(self) -> None:
        """The version unloads: every sequence ends, and what waited is refused."""
        self._closed = True
        for sequence in list(self._sequences.values()):
            self._drop(sequence)
        for _, waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_exception(ServingError(Code.UNAVAILABLE, f"Model {self.servable.name} unloaded"))
        if self._reaper is not None:
            self._reaper.cancel()
