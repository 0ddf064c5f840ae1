"""Stopping the gRPC port within a drain's grace, without a call left waiting for the whole of it.

``grpc.aio.Server.stop(grace)`` starts gRPC core's shutdown (a GOAWAY to every connection, no new connections) and,
at once, stops asking core for calls. Core can still take a call in after that: one that reached it as the shutdown
began, on a connection it had just accepted, neither rejected nor handed to the application. Nobody answers such a
call; grpc.aio waits for it to the end of the grace and only then cancels it, so one stray call held a drain (and a
rolling update) for all of ``--drain_seconds`` while its client waited out its deadline.

So the drain watches the calls grpc.aio handed to the application (each runs as an asyncio task of the server's
loop). Once the server asks for no more calls and none of them is left, whatever core still holds was never handed
over and never will be: it is cancelled then, and its client gets UNAVAILABLE at once (core's status for a call it
cancels as its server stops, which clients retry elsewhere) instead of its deadline. Every call the application
took runs to its end, within the grace.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

log = logging.getLogger("workbench.server")

# grpc.aio's coroutines, by name: the loop asking core for calls, and the task each handed-over call runs in.
_ASKING_FOR_CALLS = frozenset({"_server_main_loop", "_request_call", "_request_registered_call"})
_RUNNING_A_CALL = frozenset({"_schedule_rpc_coro"})
POLL_SECONDS = 0.05
# How long nothing must be handed over or running before what core still holds is cancelled: loop turns between a
# call's hand-over and its task, on a busy machine.
SETTLE_SECONDS = 0.5
BACKSTOP_SECONDS = 1.0


def calls_held(loop: asyncio.AbstractEventLoop) -> tuple[int, int]:
    """(tasks asking gRPC core for calls, calls handed to the application still running) on ``loop``."""
    asking = running = 0
    for task in asyncio.all_tasks(loop):
        name = getattr(task.get_coro(), "__name__", "")
        if name in _ASKING_FOR_CALLS:
            asking += 1
        elif name in _RUNNING_A_CALL:
            running += 1
    return asking, running


async def stop(server: grpc.aio.Server, grace: float) -> bool:
    """Stop ``server``: calls handed to the application have ``grace`` seconds to finish. True when every call
    ended by itself; False when some were cancelled (still running at the end of the grace, or core's that were
    never handed over)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    # A serving grpc.aio asks for calls: where none is seen, its tasks are not the ones named here (another
    # grpc.aio), and nothing is cancelled before the grace ends.
    watching = calls_held(loop)[0] > 0
    # gRPC's own grace is a backstop a little later than ours (this coroutine cancelled, it still ends the calls):
    # ours tells whether the calls finished or were cancelled.
    stopping = asyncio.ensure_future(server.stop(grace + BACKSTOP_SECONDS))
    idle_since: float | None = None
    while True:
        await asyncio.wait({stopping}, timeout=POLL_SECONDS)
        if stopping.done():
            stopping.result()
            return True
        now = loop.time()
        if now >= deadline:
            break
        if not watching or calls_held(loop) != (0, 0):
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= SETTLE_SECONDS:
            log.warning(
                "gRPC: calls the port took in as the drain began were never handed to the server: cancelled now "
                "instead of at the end of the grace (their clients get UNAVAILABLE, and may retry)"
            )
            break
    await server.stop(None)  # cancels every call left; the first stop returns with it
    await stopping
    return False
