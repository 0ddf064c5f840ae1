"""Running a server: ``workbench serve`` in the main thread (:func:`run`, signals and exit codes), or on a background
thread for tests and in-process use (:class:`ServerThread`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from typing import Any

from workbench.config.options import ServerOptions
from workbench.models.manager import VersionState
from workbench.runtime.heap import LongLivedHeap
from workbench.runtime.loop import new_event_loop
from workbench.runtime.process import hand_over_the_gil_quickly
from workbench.server.model_server import ModelServer

log = logging.getLogger("workbench.server")  # the server's log lines, whichever of its modules writes them

# A version loaded or unloaded: what the server holds for good has changed (see LongLivedHeap).
_HEAP_CHANGES = frozenset({VersionState.AVAILABLE, VersionState.END})


def run(options: ServerOptions) -> int:
    """``workbench serve``: serve until SIGTERM or SIGINT, then drain; returns the process exit code (0).

    A second signal exits at once with 128 + its number (143 for SIGTERM, 130 for SIGINT), as a shell reports a
    process the signal killed. A signal while the initial models load exits at once with 0: nothing was ready,
    so no load balancer sent anything to finish, and a load in progress cannot be interrupted.
    """
    delay, _ = options.drain_timing()
    hand_over_the_gil_quickly()  # its own process: the loop and the inference threads hand work back and forth
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    server = ModelServer(options)
    heap = LongLivedHeap()
    signalled: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if not signalled.done():
            signalled.set_result(sig)
            return
        code = 128 + sig.value
        log.warning("Second %s: exiting at once with status %d; requests still running are lost", sig.name, code)
        _exit_now(code)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    async def main() -> None:
        starting = asyncio.ensure_future(server.start(open_ports=not options.consume_only))
        either: list[asyncio.Future[Any]] = [starting, signalled]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.warning("%s while loading models at start-up: exiting now", signalled.result().name)
            _exit_now(0)
        starting.result()  # a start-up failure raises here
        # This process serves and nothing else: its libraries and models leave the collector's full collections
        # (not for a server on a thread of someone else's process, whose heap is not the server's to freeze).
        heap.settle()
        server.manager.add_listener(
            lambda model, version, state: heap.settle_soon() if state in _HEAP_CHANGES else None
        )
        sig = await signalled
        heap.stop()
        await server.stop(delay=delay, cause=sig.name)

    try:
        loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return 0


def _exit_now(code: int) -> None:
    """End the process without waiting for anything (threads loading models, requests running)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ServerThread:
    """A ModelServer on its own loop in a background thread (tests, in-process use)."""

    def __init__(self, options: ServerOptions) -> None:
        self.server = ModelServer(options)
        self._loop = new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="workbench-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            try:
                self._loop.run_until_complete(self.server.start())
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that called start()
                self._error = exc
                return
            finally:
                self._ready.set()
            self._loop.run_forever()
        finally:
            # run_in_executor(None, ...) started the loop's default executor: end its thread too.
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    def start(self, timeout: float = 120) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("server did not start in time")
        if self._error is not None:
            raise self._error
        return self

    @property
    def rest_url(self) -> str:
        scheme = "https" if self.server.options.rest_api_ssl_cert_file else "http"
        return f"{scheme}://{self.server.options.rest_api_host}:{self.server.rest_port}"

    @property
    def openai_url(self) -> str:
        """The base URL of OpenAI's endpoints (an OpenAI client's ``base_url``): ``/v1`` on their own port, else
        ``/openai/v1`` on the REST port (where ``/v1/models/{m}`` is TF Serving's)."""
        own = self.server.openai_port
        scheme = "https" if self.server.options.rest_api_ssl_cert_file else "http"
        host = self.server.options.rest_api_host
        return f"{scheme}://{host}:{own}/v1" if own else f"{scheme}://{host}:{self.server.rest_port}/openai/v1"

    @property
    def grpc_target(self) -> str:
        return f"{self.server.options.grpc_host}:{self.server.grpc_port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        budget = self.server.options.drain_seconds
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=budget + 60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
