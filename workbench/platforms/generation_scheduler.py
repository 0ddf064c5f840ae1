"""Iteration-level (continuous) batching of text generations: which sequences share the next forward pass.

A generator's requests do not wait for each other: a request joins the running batch between two decode steps and
leaves it when it finishes or its client goes. One thread per loaded model runs the iterations; each is

1. one decode step for every sequence past its prompt (one token each), then
2. a chunk of prompt (prefill) for the sequences admitted last, sized to what the token budget has left,

so a long prompt costs the running sequences a bounded delay per step instead of a stall, and what the thread runs
per iteration stays within ``max_batched_tokens`` (a prefill chunk of at least one column always runs, so a prompt
wider than the budget still ends). New requests are admitted, oldest first, only when no prefill is under way,
as many as fit the budget together (their prompts are padded to the widest). A full queue refuses a request at once
(RESOURCE_EXHAUSTED: HTTP 429) rather than letting waits grow without bound.

**An admission hold, so that arrivals may share a prefill pass** (off by default). On a small model a forward pass
costs mostly its fixed overhead (a prompt of 27 tokens alone costs about 1.5 decode steps of 16 rows, two prompts
together about 2), and under sustained load requests arrive one at a time, one every few steps, each costing a pass
of its own. With ``hold_steps`` set, while sequences are decoding, admission waits up to that many iterations after
the oldest waiting request arrived, unless ``admit_together`` requests already wait or they fill the free sequences:
arrivals within the hold are prefilled together. The running sequences decode at every iteration of the hold (it
delays only the arrivals' first tokens, by at most ``hold_steps`` steps); with nothing decoding there is nothing to
overlap, and a request is admitted at once. Why 0 by default: under a closed load (16 streams, each sending its next
request when its answer ends) holds of 2 to 8 steps measured no less CPU a token than none, in-process, because a
held request does not decode, so the batch is narrower by about as much as the shared pass saves, and the first
token came 2-3x later.

This module knows no framework: the tensors are the :class:`StepEngine`'s (``huggingface_decoding.py``), the text
and the client's stream are the job's (``generation_requests.py``); the unit tests drive it with a fake engine.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Collection, Sequence
from typing import Any, Generic, Protocol, TypeVar

from workbench.core.errors import Code, ServingError

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCHED_TOKENS = 512
DEFAULT_MAX_SEQUENCES = 64
DEFAULT_HOLD_STEPS = 0
DEFAULT_ADMIT_TOGETHER = 4


class GenerationJob(Protocol):
    """One request's generation, as the scheduler sees it."""

    @property
    def prompt_tokens(self) -> int:
        """Tokens its prompt costs to prefill."""

    def accept(self, step: Any) -> bool:
        """Take the next token the engine drew for it (on the scheduler's thread); True once it is finished."""

    def fail(self, error: ServingError) -> None:
        """End it with ``error`` (the scheduler stopped, or a step failed)."""


J = TypeVar("J", bound=GenerationJob)


class StepEngine(Protocol[J]):
    """The model side: holds the sequences it was handed (their caches), runs their steps, forgets them."""

    def decoding(self) -> int:
        """How many sequences are past their prompt (each costs one token per decode step)."""

    def prefill_rows(self) -> int:
        """How many sequences the prefill under way holds (0: none); each column of it costs that many tokens."""

    def begin_prefill(self, jobs: Sequence[J]) -> None:
        """Start prefilling ``jobs`` together."""

    def prefill(self, columns: int) -> list[tuple[J, Any]]:
        """Run up to ``columns`` more prompt columns; the jobs whose prompts are done get their first token (and
        decode from the next step on)."""

    def decode(self) -> list[tuple[J, Any]]:
        """One step of every decoding sequence: each job's next token."""

    def release(self, jobs: Collection[J]) -> None:
        """Forget ``jobs`` (finished or cancelled), wherever they are: their rows leave before the next step."""

    def reset(self) -> None:
        """Forget everything (after a step failed)."""


class GenerationScheduler(Generic[J]):
    """Runs a model's generations on one thread, batched per iteration; ``close`` stops it."""

    def __init__(
        self,
        engine: StepEngine[J],
        label: str,
        *,
        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        max_queued: int | None = None,
        hold_steps: int = DEFAULT_HOLD_STEPS,
        admit_together: int = DEFAULT_ADMIT_TOGETHER,
    ) -> None:
        if max_batched_tokens < 1 or max_sequences < 1 or admit_together < 1:
            raise ValueError("max_batched_tokens, max_sequences and admit_together must be at least 1")
        if hold_steps < 0:
            raise ValueError("hold_steps must be at least 0")
        self.engine = engine
        self.label = label
        self.max_batched_tokens = max_batched_tokens
        self.max_sequences = max_sequences
        self.hold_steps = hold_steps
        self.admit_together = admit_together
        # Enough to keep the batch full while the queue drains, few enough that a queued request is answered soon.
        self.max_queued = 4 * max_sequences if max_queued is None else max_queued
        self._changed = threading.Condition()
        self._waiting: collections.deque[J] = collections.deque()
        self._arrived: dict[J, int] = {}  # each waiting job's arrival: the iterations run (``steps``) by then
        self._held: set[J] = set()  # handed to the engine, not yet released
        self._cancelled: set[J] = set()
        self._closed = False
        self.steps = 0  # iterations run, for tests and stats
        self._thread = threading.Thread(target=self._run, name=f"generation {label}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> int:
        """Sequences held by the engine (prefilling or decoding)."""
        with self._changed:
            return len(self._held)

    @property
    def waiting(self) -> int:
        with self._changed:
            return len(self._waiting)

    def submit(self, job: J) -> None:
        """Queue ``job``; RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once the model is closing."""
        with self._changed:
            if self._closed:
                raise ServingError(Code.UNAVAILABLE, f"{self.label} is unloading")
            if len(self._waiting) >= self.max_queued:
                raise ServingError(
                    Code.RESOURCE_EXHAUSTED,
                    f"{self.label} has {len(self._waiting)} generations queued (at most {self.max_queued}) beside "
                    f"{len(self._held)} running: try again later",
                )
            self._waiting.append(job)
            self._arrived[job] = self.steps
            self._changed.notify_all()

    def cancel(self, job: J) -> None:
        """The client left: a queued job is dropped now, a running one leaves the batch before the next step."""
        with self._changed:
            try:
                self._waiting.remove(job)
                del self._arrived[job]
            except ValueError:
                if job in self._held:
                    self._cancelled.add(job)
                    self._changed.notify_all()

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread after its step under way; every job still queued or running fails UNAVAILABLE."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while self._iterate():
                pass
        finally:
            with self._changed:
                left = [*self._waiting, *self._held]
                self._waiting.clear()
                self._arrived.clear()
                self._held.clear()
            gone = ServingError(Code.UNAVAILABLE, f"{self.label} unloaded before the generation finished")
            for job in left:
                _fail(job, gone)
            self.engine.reset()

    def _iterate(self) -> bool:
        """One iteration; False once closed."""
        with self._changed:
            while not self._closed and not self._waiting and not self._held:
                self._changed.wait()
            if self._closed:
                return False
            leaving = set(self._cancelled)
            self._cancelled.clear()
            self._held -= leaving
        try:
            if leaving:
                self.engine.release(leaving)
            self._step()
        except Exception as exc:  # a failed step ends the sequences in it, not the model
            log.exception("%s: a generation step failed", self.label)
            with self._changed:
                failed = list(self._held)
                self._held.clear()
            self.engine.reset()
            error = exc if isinstance(exc, ServingError) else ServingError(Code.INTERNAL, f"{self.label}: {exc}")
            for job in failed:
                _fail(job, error)
        self.steps += 1
        return True

    def _step(self) -> None:
        budget = self.max_batched_tokens
        finished: list[J] = []
        if self.engine.decoding():
            drawn = self.engine.decode()
            budget -= len(drawn)
            finished += self._deliver(drawn)
        if not self.engine.prefill_rows():
            admitted = self._admit(budget)
            if admitted:
                self.engine.begin_prefill(admitted)
        rows = self.engine.prefill_rows()
        if rows:
            finished += self._deliver(self.engine.prefill(max(1, budget // rows)))
        if finished:
            self.engine.release(finished)
            with self._changed:
                self._held.difference_update(finished)

    def _admit(self, budget: int) -> list[J]:
        """The oldest waiting jobs that fit the free sequences and, padded to the widest prompt, the budget; at
        least one while a sequence is free (its prompt is then prefilled in chunks); none while they are held."""
        with self._changed:
            room = self.max_sequences - len(self._held)
            if self._holding(room):
                return []
            admitted: list[J] = []
            widest = 0
            while self._waiting and len(admitted) < room:
                width = max(widest, self._waiting[0].prompt_tokens)
                if admitted and (len(admitted) + 1) * width > budget:
                    break
                admitted.append(self._waiting.popleft())
                del self._arrived[admitted[-1]]
                widest = width
            self._held.update(admitted)
            return admitted

    def _holding(self, room: int) -> bool:
        """Whether the waiting jobs wait for others to share their prefill pass (under the lock): only while
        sequences decode, fewer than ``admit_together`` wait and they leave seats free, until the oldest arrived
        ``hold_steps`` iterations ago."""
        waiting = len(self._waiting)
        if not waiting or waiting >= min(self.admit_together, room) or not self.engine.decoding():
            return False
        return self.steps - self._arrived[self._waiting[0]] < self.hold_steps

    def _deliver(self, drawn: list[tuple[J, Any]]) -> list[J]:
        finished = []
        for job, step in drawn:
            try:
                done = job.accept(step)
            except Exception as exc:  # the job's own failure (its text) ends it alone
                log.exception("%s: a generation failed", self.label)
                _fail(job, ServingError(Code.INTERNAL, f"{self.label}: {exc}"))
                done = True
            if done:
                finished.append(job)
        return finished


def _fail(job: GenerationJob, error: ServingError) -> None:
    try:
        job.fail(error)
    except Exception:  # telling one client must not stop telling the others
        log.exception("failing a generation raised")
