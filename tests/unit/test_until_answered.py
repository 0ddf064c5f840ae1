"""until_answered: a request's wait for its answer, its deadline armed only once it has to wait."""

from __future__ import annotations

import asyncio
import functools

import pytest

from workbench.batching.interest import Interest
from workbench.core.errors import Code, ServingError
from workbench.planes.calls import expire, until_answered


class _CountingLoop(asyncio.SelectorEventLoop):
    """A loop that counts the timers armed on it (call_later arms through call_at)."""

    timers = 0

    def call_at(self, when, callback, *args, context=None):  # type: ignore[no-untyped-def,override]
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


def test_an_answer_without_waiting_arms_no_deadline_timer() -> None:
    loop = _CountingLoop()

    async def at_once() -> int:
        return 7

    async def a_turn() -> int:
        await asyncio.sleep(0)
        return 8

    async def main() -> None:
        interest = Interest(30.0, loop)
        assert await until_answered(at_once(), interest, interest.deadline, interest.expire) == 7
        assert loop.timers == 0
        assert await until_answered(a_turn(), interest, interest.deadline, interest.expire) == 8
        assert loop.timers == 1  # it waited: its deadline was armed

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_wait_past_its_deadline_is_deadline_exceeded() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        interest = Interest(0.05, loop)
        with pytest.raises(ServingError) as raised:
            await until_answered(answer, interest, interest.deadline, functools.partial(expire, answer))
        assert raised.value.code is Code.DEADLINE_EXCEEDED
        assert interest.error is not None and interest.error.code is Code.DEADLINE_EXCEEDED

    asyncio.run(main())


def test_results_and_errors_reach_the_caller_after_several_waits() -> None:
    async def main() -> None:
        async def steps(fail: bool) -> str:
            for _ in range(3):
                await asyncio.sleep(0)
            await asyncio.sleep(0.005)
            if fail:
                raise ServingError(Code.INVALID_ARGUMENT, "bad")
            return "done"

        loop = asyncio.get_running_loop()
        interest = Interest(30.0, loop)
        assert await until_answered(steps(False), interest, interest.deadline, interest.expire) == "done"
        with pytest.raises(ServingError, match="bad"):
            await until_answered(steps(True), interest, interest.deadline, interest.expire)

    asyncio.run(main())


def test_a_cancelled_caller_cancels_what_it_awaits_and_gives_up() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[str] = []

        async def work() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        interest = Interest(30.0, loop)
        task = asyncio.ensure_future(until_answered(work(), interest, interest.deadline, interest.expire))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled"]
        assert interest.error is not None and interest.error.code is Code.CANCELLED

    asyncio.run(main())
