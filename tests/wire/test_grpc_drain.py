"""The gRPC port's drain (:mod:`workbench.server.grpc_drain`) on a real grpc.aio server and client.

A call the server took finishes within the grace; one still running at its end is cancelled, and the drain says
so. The drain sees grpc.aio's own tasks (the loop asking core for calls, a task per call handed over): that is how
it tells a call it must wait for from one core took in and will never hand over, so grpc.aio's names are checked
here, against the grpc.aio installed.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from workbench.server import grpc_drain


class HeldCheck(health_aio.HealthServicer):
    """Health ``Check`` answers once the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def Check(self, request, context):  # noqa: N802
        self.entered.set()
        await self.release.wait()
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def serving() -> tuple[grpc.aio.Server, HeldCheck, str]:
    server = grpc.aio.server()
    servicer = HeldCheck()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, f"127.0.0.1:{port}"


def test_grpc_aio_tasks_are_told_apart_asking_for_calls_and_running_one() -> None:
    async def scenario() -> list[tuple[int, int]]:
        loop = asyncio.get_running_loop()
        seen = [grpc_drain.calls_held(loop)]
        server, servicer, target = await serving()
        seen.append(grpc_drain.calls_held(loop))
        async with grpc.aio.insecure_channel(target) as channel:
            call = asyncio.ensure_future(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()))
            await servicer.entered.wait()
            seen.append(grpc_drain.calls_held(loop))
            servicer.release.set()
            await call
        assert await grpc_drain.stop(server, 30) is True
        seen.append(grpc_drain.calls_held(loop))
        return seen

    before, started, running, stopped = asyncio.run(scenario())
    assert before == (0, 0)
    assert started[0] >= 1 and started[1] == 0, started  # asking for calls, none running
    assert running[0] >= 1 and running[1] == 1, running  # still asking; the call handed over runs
    assert stopped == (0, 0)


def test_a_call_handed_over_finishes_within_the_grace() -> None:
    async def scenario() -> tuple[bool, int]:
        server, servicer, target = await serving()
        async with grpc.aio.insecure_channel(target) as channel:
            call = asyncio.ensure_future(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()))
            await servicer.entered.wait()
            stopping = asyncio.ensure_future(grpc_drain.stop(server, 60))
            await asyncio.sleep(1.0)  # twice the settle time: a running call is waited for, not cancelled
            assert not stopping.done()
            servicer.release.set()
            answer = await call
            return await stopping, answer.status

    finished, status = asyncio.run(scenario())
    assert finished is True
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_a_call_still_running_at_the_end_of_the_grace_is_cancelled_and_the_drain_says_so() -> None:
    async def scenario() -> tuple[bool, grpc.StatusCode, str]:
        server, servicer, target = await serving()
        async with grpc.aio.insecure_channel(target) as channel:
            call = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=120)
            waiting = asyncio.ensure_future(call)
            await servicer.entered.wait()
            finished = await grpc_drain.stop(server, 0.5)
            try:
                await waiting
            except grpc.aio.AioRpcError as exc:
                return finished, exc.code(), exc.details() or ""
            raise AssertionError("a call past the grace was answered")

    finished, code, details = asyncio.run(scenario())
    assert finished is False
    # gRPC core's words for a call it cancelled as the server stopped: UNAVAILABLE, which a client may retry
    assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
