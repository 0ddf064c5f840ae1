"""The REST port on granian (``--http_server=granian``): a Rust HTTP server on workbench's own event loop.

granian's embedded server (``granian.server.embed``) runs its HTTP/1.1 connections (hyper, on tokio) on a Rust thread
and hands each request to the event loop the rest of the server runs on, as a task. It serves the socket
:func:`workbench.server.ports.bind` bound (granian's worker gets a duplicate of it), in its RSGI interface:
:class:`RestRsgi` answers TF Serving's inference routes there (:mod:`workbench.frontends.rest_rsgi`) and hands every
other request to the Starlette app (:mod:`workbench.server.asgi_over_rsgi`).

What it keeps of uvicorn's port: TLS (the same PEM files; TLS 1.2 and 1.3, client certificates with a CA), keep-alive
and HTTP/1.1 pipelining (hyper's), the request-size limit (the app's), the app's headers (granian adds its own
``server`` header where uvicorn adds ``server`` and ``date``).

**Draining** (:meth:`GranianHttp.drain`) takes :mod:`workbench.server.http_drain`'s first steps, then granian's own:

1. new connections' SYNs are dropped at the listening socket (Linux's socket filter), and the TCP handshakes in
   progress are let finish;
2. granian keeps accepting until the kernel's accept queue is empty and has stayed so for :data:`SETTLE_SECONDS`
   (:data:`TLS_SETTLE_SECONDS` over TLS), so every connection a client made is granian's and the requests sent on
   them have reached it;
3. granian's graceful shutdown (hyper's): it stops accepting (the port then refuses connections), and every
   connection with a request in it (its first bytes read, or its answer under way) answers that request with
   ``Connection: close``; a connection with nothing read (new, or idle between keep-alive requests) is closed at
   once;
4. what still runs at the end of the grace is left (the call returns False) and goes with the process.

What uvicorn's drain keeps and this one does not (hyper's graceful shutdown decides, and says nothing of what it has
not read): a connection accepted before the drain whose client has sent nothing when step 3 comes (a pool's
connection opened ahead, a client slower than the settling) is closed without an answer, where uvicorn waits
:data:`~workbench.server.http_drain.FRESH_WAIT_SECONDS` for its request and answers it; the same for a keep-alive
connection whose next request is in the kernel's receive buffer but not yet read by hyper (uvicorn looks there before
closing), and for a TLS handshake granian has not finished (uvicorn waits
:data:`~workbench.server.http_drain.HANDSHAKE_WAIT_SECONDS` for it). Such a client sees its connection closed before
any answer (never a partial one) and may send again elsewhere; one whose request had reached granian is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

from granian._granian import SocketHolder
from granian.constants import HTTPModes, Interfaces, SSLProtocols
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server.embed import Server
from starlette.types import ASGIApp

from workbench.config.options import RestTLS
from workbench.core.errors import Code, ServingError
from workbench.frontends.hot_routes import hot_match
from workbench.frontends.hot_routes_rsgi import answer_rsgi
from workbench.frontends.rest import RestApp
from workbench.frontends.rest_rsgi import RsgiInference
from workbench.server.asgi_over_rsgi import AsgiOverRsgi
from workbench.server.http_drain import TCP_HANDSHAKE_WAIT_SECONDS, handshakes_in_progress, refuse_new_connections

log = logging.getLogger("workbench.server")

BACKLOG = 2048  # ports.bind's listen() backlog; granian's worker takes as many connections at once
# How long the accept queue must stay empty before granian's graceful shutdown, which closes a connection it has read
# nothing from: the connections just accepted have their requests (sent with the connection) read meanwhile. Over
# TLS, their handshakes finish too (a TLS 1.3 client sends its request right after its last handshake message).
SETTLE_SECONDS = 0.05
TLS_SETTLE_SECONDS = 0.2
_TCP_INFO_UNACKED = 24  # struct tcp_info's tcpi_unacked: for a listening socket, its accept queue's length


def accept_queue_length(listener: socket.socket) -> int:
    """Connections in the listening socket's accept queue (Linux's TCP_INFO; 0 where that cannot be told)."""
    try:
        info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError):
        return 0
    (count,) = struct.unpack_from("I", info, _TCP_INFO_UNACKED)
    return int(count)


class RestRsgi:
    """The RSGI callable granian runs: the inference routes of a :class:`RestApp` in RSGI, everything else through
    :class:`AsgiOverRsgi` (every request, for an app without such routes or with CORS on)."""

    def __init__(self, app: ASGIApp) -> None:
        api = app.inference_api if isinstance(app, RestApp) else None
        self._inference = RsgiInference(api) if api is not None else None
        self._hot = app.hot_routes if isinstance(app, RestApp) else ()  # v2's …/infer, TorchServe's /predictions
        self._asgi = AsgiOverRsgi(app)

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        inference = self._inference
        if inference is not None:
            match = inference.match(scope)
            if match is not None:
                await inference.answer(match, scope, proto)
                return
            hot = hot_match(self._hot, scope.method, scope.path) if scope.proto == "http" else None
            if hot is not None:
                await answer_rsgi(*hot, scope, proto)
                return
        await self._asgi(scope, proto)


class EmbeddedServer(Server):  # type: ignore[misc]
    """granian's embedded server on a socket bound before it (``listener``), not one it binds itself."""

    listener: socket.socket

    def _init_shared_socket(self) -> None:
        # The worker's listener owns (and closes) this duplicate; the original stays workbench's, for the drain.
        self._ssp = None
        # (fd, is a Unix socket, backlog): Linux's constructor, which granian's stub leaves out.
        self._shd = SocketHolder(os.dup(self.listener.fileno()), False, BACKLOG)  # type: ignore[call-arg,assignment]


def _check_tls(tls: RestTLS) -> None:
    """The certificate, key and client CA, read as granian will (raises INVALID_ARGUMENT, as ports.py for uvicorn)."""
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert_file, tls.key_file or None)
        if tls.client_ca_file:
            context.load_verify_locations(tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(f for f in (tls.cert_file, tls.key_file, tls.client_ca_file) if f)
        raise ServingError(Code.INVALID_ARGUMENT, f"REST TLS cannot use {files}: {exc}") from None


class GranianHttp:
    """``app`` served by granian on ``listener`` (bound and listening), with ``tls`` where given."""

    def __init__(self, app: ASGIApp, listener: socket.socket, tls: RestTLS | None) -> None:
        if tls is not None:
            _check_tls(tls)
        self.listener = listener
        tls_files: dict[str, Any] = {}
        if tls is not None:
            tls_files = {
                "ssl_cert": Path(tls.cert_file),
                "ssl_key": Path(tls.key_file or tls.cert_file),  # a key in the certificate's file: read from there
                "ssl_ca": Path(tls.client_ca_file) if tls.client_ca_file else None,
                "ssl_client_verify": bool(tls.client_ca_file),
            }
        self._server = EmbeddedServer(
            RestRsgi(app),
            interface=Interfaces.RSGI,
            # HTTP/1.1 only, as uvicorn: granian's auto mode reads a connection's first bytes to tell HTTP/2's
            # preface, and a drain drops a connection still in that read (its request with it).
            http=HTTPModes.http1,
            http1_settings=HTTP1Settings(keep_alive=True, pipeline_flush=True),
            websockets=False,
            backlog=BACKLOG,
            ssl_protocol_min=SSLProtocols.tls12,  # uvicorn's (Python's) minimum too
            # granian's log lines go to workbench's log (granian's own configuration prints them to stdout).
            log_level=LogLevels.warning,
            log_dictconfig={"loggers": {"_granian": {"handlers": [], "propagate": True}}},
            **tls_files,
        )
        self._server.listener = listener
        self._serving: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._serving = asyncio.get_running_loop().create_task(self._server.serve())
        await asyncio.sleep(0)  # granian's worker starts (a failure to ends the task)
        if self._serving.done():
            self._serving.result()

    async def drain(self, grace: float) -> bool:
        """Close the port within ``grace`` seconds (see the module's docstring): True when every request finished."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        listener = self.listener
        if refuse_new_connections([listener]):
            port = listener.getsockname()[1]
            settle = loop.time() + min(TCP_HANDSHAKE_WAIT_SECONDS, grace)
            while handshakes_in_progress({port}) and loop.time() < settle:
                await asyncio.sleep(0.002)
            quiet = TLS_SETTLE_SECONDS if self._server.ssl_ctx[0] else SETTLE_SECONDS
            empty_since = None
            while loop.time() < deadline:
                if accept_queue_length(listener):
                    empty_since = None
                elif empty_since is None:
                    empty_since = loop.time()
                if empty_since is not None and loop.time() - empty_since >= quiet:
                    break
                await asyncio.sleep(0.002)
        # granian's graceful shutdown: stop accepting, close idle connections, answer the others' requests.
        # granian waits this long for its worker to finish (asyncio.wait_for, which takes fractions of seconds).
        self._server.workers_kill_timeout = max(deadline - loop.time(), 0.001)  # type: ignore[assignment]
        self._server.stop()
        # granian's listener (a duplicate) closes as its accept loop ends; this one now, so that the port refuses new
        # connections (the queue is empty, and SYNs were dropped meanwhile).
        with contextlib.suppress(OSError):
            listener.close()
        finished = True
        serving, self._serving = self._serving, None
        if serving is not None:
            try:
                await asyncio.wait_for(asyncio.shield(serving), max(deadline - loop.time(), 0.001) + 1)
            except (asyncio.TimeoutError, TimeoutError):
                finished = False
                serving.cancel()
            except Exception:  # granian failed to stop: what it held goes with the process
                log.exception("granian did not stop cleanly")
                finished = False
        return finished
