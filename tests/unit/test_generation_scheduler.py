"""The continuous-batching scheduler on a fake engine: joins and leaves between steps, the token budget, chunked
prefill beside decoding, cancellation, back-pressure, closing, and a failed step."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any

import pytest

from tests.waiting import wait_until
from workbench.core.errors import Code, ServingError
from workbench.platforms.generation_scheduler import GenerationScheduler

ENDLESS = 10**9


class Job:
    def __init__(self, name: str, prompt: int, tokens: int) -> None:
        self.name, self._prompt, self.wanted = name, prompt, tokens
        self.got: list[Any] = []
        self.error: ServingError | None = None
        self.done = threading.Event()

    @property
    def prompt_tokens(self) -> int:
        return self._prompt

    def accept(self, step: Any) -> bool:
        self.got.append(step)
        if len(self.got) >= self.wanted:
            self.done.set()
            return True
        return False

    def fail(self, error: ServingError) -> None:
        self.error = error
        self.done.set()

    def __repr__(self) -> str:
        return self.name


class FakeEngine:
    """Records what each iteration ran; a gate holds the steps where a test wants them held."""

    def __init__(self) -> None:
        self.decoding_jobs: list[Job] = []
        self.group: list[Job] = []
        self.group_left = 0  # prompt columns the group still has to run
        self.log: list[dict[str, Any]] = []  # per iteration: decoded rows, prefill rows x columns
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()  # the scheduler waits at the closed gate
        self.fail_next = False
        self.released: list[Job] = []

    def decoding(self) -> int:
        return len(self.decoding_jobs)

    def prefill_rows(self) -> int:
        return len(self.group)

    def begin_prefill(self, jobs: Sequence[Job]) -> None:
        self.group = list(jobs)
        self.group_left = max(j.prompt_tokens for j in jobs)

    def prefill(self, columns: int) -> list[tuple[Job, Any]]:
        self._through_gate()
        ran = min(columns, self.group_left)
        self.log.append({"prefill": (len(self.group), ran), "decode": 0})
        self.group_left -= ran
        if self.group_left:
            return []
        joined, self.group = self.group, []
        self.decoding_jobs += joined
        return [(j, "first") for j in joined]

    def decode(self) -> list[tuple[Job, Any]]:
        self._through_gate()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the device fell over")
        self.log.append({"decode": len(self.decoding_jobs), "prefill": None})
        return [(j, len(j.got)) for j in self.decoding_jobs]

    def _through_gate(self) -> None:
        while not self.gate.wait(0.01):  # the gate may close between a check and the wait: say so while waiting
            self.blocked.set()
        self.blocked.clear()

    def release(self, jobs: Collection[Job]) -> None:
        self.released += jobs
        self.decoding_jobs = [j for j in self.decoding_jobs if j not in jobs]
        self.group = [j for j in self.group if j not in jobs]

    def reset(self) -> None:
        self.decoding_jobs, self.group = [], []


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def scheduler(engine: FakeEngine, **settings: Any) -> GenerationScheduler[Job]:
    return GenerationScheduler(engine, "Model fake version 1", **settings)  # type: ignore[arg-type]


def test_requests_join_between_steps_and_leave_when_finished(engine: FakeEngine) -> None:
    running = scheduler(engine, max_batched_tokens=64)
    try:
        first = Job("first", 4, ENDLESS)
        running.submit(first)
        wait_until(lambda: len(first.got) >= 5)
        second = Job("second", 4, 3)
        running.submit(second)
        assert second.done.wait(30)
        assert first.got[0] == "first" and second.got[0] == "first" and len(second.got) == 3
        wait_until(lambda: len(engine.log) > 3 and engine.log[-1]["decode"] == 1)
        decode_widths = [entry["decode"] for entry in engine.log if entry["decode"]]
        assert 2 in decode_widths  # they shared decode steps, and the first went on alone once the second left
        running.cancel(first)
        wait_until(lambda: running.active == 0)
    finally:
        running.close()


def test_a_long_prompt_is_prefilled_in_chunks_beside_the_decoding_sequences(engine: FakeEngine) -> None:
    running = scheduler(engine, max_batched_tokens=8)
    try:
        short = Job("short", 2, ENDLESS)
        running.submit(short)
        wait_until(lambda: len(short.got) >= 2)
        long = Job("long", 50, 1)
        running.submit(long)
        assert long.done.wait(30)
        chunks = [entry["prefill"] for entry in engine.log if entry["prefill"] and entry["prefill"][1] > 2]
        assert len(chunks) >= 7  # 50 columns at most 7 a step (the budget less the decoding sequence)
        # every iteration stays within the budget: one token per decoding sequence plus the chunk
        steps: list[int] = []
        for entry in engine.log:
            if entry["decode"]:
                steps.append(entry["decode"])
            elif steps and entry["prefill"]:
                steps[-1] += entry["prefill"][0] * entry["prefill"][1]
        assert max(steps) <= 8
        # the short sequence kept decoding while the long prompt was prefilled
        first_chunk = next(i for i, e in enumerate(engine.log) if e["prefill"] and e["prefill"][1] > 2)
        last_chunk = max(i for i, e in enumerate(engine.log) if e["prefill"] and e["prefill"][1] > 0)
        assert sum(1 for e in engine.log[first_chunk:last_chunk] if e["decode"]) >= 6
        running.cancel(short)
    finally:
        running.close()


def test_admission_fills_the_budget_with_prompts_padded_to_the_widest(engine: FakeEngine) -> None:
    engine.gate.clear()
    running = scheduler(engine, max_batched_tokens=40)
    try:
        blocker = Job("blocker", 1, 1)
        running.submit(blocker)
        wait_until(lambda: running.active == 1)
        jobs = [Job(f"j{i}", 10, 1) for i in range(6)]
        for job in jobs:
            running.submit(job)
        engine.gate.set()
        assert all(job.done.wait(30) for job in jobs)
        groups = [e["prefill"] for e in engine.log if e["prefill"]][1:]
        assert groups[0] == (4, 10)  # four prompts of 10 fill a budget of 40
        assert groups[1] == (2, 10)
    finally:
        running.close()


def test_a_cancelled_sequence_leaves_at_the_next_step(engine: FakeEngine) -> None:
    running = scheduler(engine)
    try:
        job = Job("long", 3, ENDLESS)  # never done by its tokens, however many steps a busy machine runs first
        running.submit(job)
        wait_until(lambda: len(job.got) > 3)
        running.cancel(job)
        wait_until(lambda: running.active == 0)
        assert job in engine.released and not job.done.is_set()
        after = Job("after", 3, 2)
        running.submit(after)
        assert after.done.wait(30) and after.error is None
    finally:
        running.close()


def test_a_full_queue_refuses_at_once(engine: FakeEngine) -> None:
    engine.gate.clear()
    running = scheduler(engine, max_sequences=1, max_queued=1)
    try:
        running.submit(Job("running", 1, 1))
        wait_until(lambda: running.active == 1)
        queued = Job("queued", 1, 1)
        running.submit(queued)
        with pytest.raises(ServingError) as refused:
            running.submit(Job("refused", 1, 1))
        assert refused.value.code == Code.RESOURCE_EXHAUSTED
        running.cancel(queued)  # a queued job is dropped at once, which makes room
        assert running.waiting == 0
        running.submit(Job("now", 1, 1))
    finally:
        engine.gate.set()
        running.close()


def test_closing_fails_what_is_queued_and_running(engine: FakeEngine) -> None:
    engine.gate.clear()
    running = scheduler(engine, max_sequences=1)
    held, queued = Job("held", 1, 5), Job("queued", 1, 5)
    running.submit(held)
    running.submit(queued)
    wait_until(lambda: running.active == 1)
    closer = threading.Thread(target=running.close)
    closer.start()
    engine.gate.set()
    closer.join(30)
    for job in (held, queued):
        assert job.done.wait(30)
        assert job.error is not None and job.error.code == Code.UNAVAILABLE
    with pytest.raises(ServingError) as refused:
        running.submit(Job("late", 1, 1))
    assert refused.value.code == Code.UNAVAILABLE


def test_a_failed_step_fails_its_sequences_and_the_scheduler_goes_on(engine: FakeEngine) -> None:
    running = scheduler(engine)
    try:
        doomed = Job("doomed", 1, ENDLESS)
        running.submit(doomed)
        wait_until(lambda: len(doomed.got) > 1)
        engine.fail_next = True
        assert doomed.done.wait(30)
        assert doomed.error is not None and doomed.error.code == Code.INTERNAL
        assert "fell over" in doomed.error.message
        fine = Job("fine", 1, 3)
        running.submit(fine)
        assert fine.done.wait(30) and fine.error is None
    finally:
        running.close()


def test_arrivals_within_the_hold_are_prefilled_together_while_the_running_sequence_decodes(
    engine: FakeEngine,
) -> None:
    running = scheduler(engine, hold_steps=10**9, admit_together=2)
    try:
        busy = Job("busy", 1, ENDLESS)
        running.submit(busy)  # nothing decodes yet: admitted at once, however long the hold
        wait_until(lambda: len(busy.got) >= 2)
        first = Job("first", 3, 1)
        running.submit(first)
        got = len(busy.got)
        wait_until(lambda: len(busy.got) >= got + 20)  # the hold never stops the running sequence's steps
        assert running.waiting == 1 and not first.got  # a lone arrival is held (for a second to come)
        second = Job("second", 5, 1)
        running.submit(second)
        assert first.done.wait(30) and second.done.wait(30)
        groups = [e["prefill"] for e in engine.log if e["prefill"]]
        assert groups[-1] == (2, 5)  # the two prompts in one prefill pass, padded to the wider
        running.cancel(busy)
    finally:
        running.close()


def test_a_lone_arrival_is_held_no_longer_than_the_bound(engine: FakeEngine) -> None:
    running = scheduler(engine, hold_steps=5, admit_together=4)
    try:
        busy = Job("busy", 1, ENDLESS)
        running.submit(busy)
        wait_until(lambda: len(busy.got) >= 2)
        engine.gate.clear()
        wait_until(engine.blocked.is_set)  # the scheduler stopped within an iteration's decode, before its log entry
        arrived = len(engine.log)
        lone = Job("lone", 3, 1)
        running.submit(lone)
        engine.gate.set()
        assert lone.done.wait(30)
        after = engine.log[arrived:]
        prefilled = next(i for i, e in enumerate(after) if e["prefill"])
        # the iteration under way when it came, then hold_steps more, and it is admitted at the last of them
        assert 5 <= sum(1 for e in after[:prefilled] if e["decode"]) <= 6
        running.cancel(busy)
    finally:
        running.close()


def test_with_nothing_decoding_an_arrival_is_not_held(engine: FakeEngine) -> None:
    running = scheduler(engine, hold_steps=10**9, admit_together=8)
    try:
        alone = Job("alone", 3, 2)
        running.submit(alone)
        assert alone.done.wait(30) and alone.error is None
        several = [Job(f"j{i}", 3, 2) for i in range(3)]  # fewer than admit_together, the scheduler idle
        for job in several:
            running.submit(job)
        assert all(job.done.wait(30) for job in several)
    finally:
        running.close()


def test_hold_settings_are_checked(engine: FakeEngine) -> None:
    with pytest.raises(ValueError, match="hold_steps"):
        scheduler(engine, hold_steps=-1)
    with pytest.raises(ValueError, match="admit_together"):
        scheduler(engine, admit_together=0)
