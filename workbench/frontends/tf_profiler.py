"""TensorFlow's profiler service on the gRPC port, as tensorflow_model_server has it (``tensorflow.ProfilerService``).

``tf.profiler.experimental.client.trace('grpc://host:port', logdir, duration_ms)`` and TensorBoard's "capture
profile" ask the model server's own port for a trace. TensorFlow's profiler server does the work: on the first
call it is started in this process (``_pywrap_profiler.start_server``, on a port of its own), and each call to the
service on the gRPC port is handed to it as it came, bytes in and bytes out, so the trace is TensorFlow's own
XSpace of this process (written by it to the ``repository_root`` the client names, where TensorBoard's profile
plugin reads it), and the answers and errors are TensorFlow's. A server without TensorFlow installed answers
UNIMPLEMENTED, saying so.

TensorFlow's profiler server listens on all interfaces (its API takes a port only): the port is an ephemeral one
no client is told of; clients reach the service through the gRPC port and its TLS and address settings.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from workbench.core.errors import Code, ServingError

log = logging.getLogger(__name__)

SERVICE = "tensorflow.ProfilerService"
METHODS = ("Profile", "Terminate", "Monitor")


class TfProfiler:
    """The profiler service of the gRPC port, handed to TensorFlow's profiler server (started when first asked).
    The channel to it lives as long as the process, as TensorFlow's profiler server does."""

    def __init__(self) -> None:
        self._channel: grpc.aio.Channel | None = None
        self._starting = asyncio.Lock()

    def add_to(self, server: grpc.aio.Server) -> None:
        handlers = {method: grpc.unary_unary_rpc_method_handler(self._forwarder(method)) for method in METHODS}
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])

    def _forwarder(self, method: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
        async def forward(request: bytes, context: Any) -> bytes:
            try:
                channel = await self._server()
            except ServingError as exc:
                await context.abort(grpc.StatusCode[exc.code.name], exc.message)
            call = channel.unary_unary(f"/{SERVICE}/{method}")  # no (de)serializers: the bytes as they came
            try:
                answer: bytes = await call(request, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or exc.code().name)
            return answer

        return forward

    async def _server(self) -> grpc.aio.Channel:
        async with self._starting:
            if self._channel is None:
                port = await asyncio.get_running_loop().run_in_executor(None, _start_tensorflow_profiler)
                self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            return self._channel


_started_lock = threading.Lock()
_started_port: int | None = None  # TensorFlow's profiler is the process's: one server, however many frontends


def _start_tensorflow_profiler() -> int:
    """Start TensorFlow's profiler server in this process on a free port (once); its port."""
    global _started_port
    with _started_lock:
        if _started_port is None:
            _started_port = _start_on_a_free_port()
        return _started_port


def _start_on_a_free_port() -> int:
    from workbench.runtime.tensorflow_runtime import start_profiler_server

    with socket.socket() as probe:  # a port free now; TensorFlow binds it at once
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    try:
        start_profiler_server(port)
    except ImportError as exc:
        raise ServingError(
            Code.UNIMPLEMENTED, f"tensorflow.ProfilerService needs TensorFlow's profiler, which is missing ({exc})"
        ) from None
    log.info("TensorFlow's profiler server started (port %d), answering tensorflow.ProfilerService", port)
    return port
