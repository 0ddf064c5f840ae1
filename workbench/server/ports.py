"""The server's ports: binding the REST socket, running uvicorn (or granian) on it, starting gRPC, and closing both at
once.

Nothing here decides what the ports answer (that is :mod:`workbench.frontends.wiring`'s): only how they open, with
which TLS, and how they close within a drain's grace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import uvicorn
from starlette.applications import Starlette

from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.frontends.grpc import ReadinessHealth, start_grpc_server
from workbench.planes.one_client import OneClient
from workbench.server.grpc_drain import stop as drain_grpc
from workbench.server.http_drain import DrainingHttpProtocol, drain

if TYPE_CHECKING:  # imported where --http_server=granian asks for it
    from workbench.server.granian_http import GranianHttp

log = logging.getLogger("workbench.server")  # the server's log lines, whichever of its modules writes them


def host_for_grpc(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # one of --num_workers: the kernel spreads new connections among the workers' sockets
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServingError(Code.UNAVAILABLE, f"Could not bind the REST port {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Ports:
    """A server's open ports: gRPC (TF Serving's services and v2's, on one port), REST, and OpenAI's endpoints when
    they have a port of their own (``--openai_port``), which takes REST's TLS."""

    def __init__(self, options: ServerOptions, one_client: OneClient | None = None) -> None:
        """``one_client``: where the HTTP ports' open connections are counted (see
        :mod:`workbench.planes.one_client`)."""
        self._options = options
        self._one_client = one_client
        self.rest_port: int | None = None
        self.grpc_port: int | None = None
        self.openai_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._http: list[tuple[uvicorn.Server, list[socket.socket]]] = []  # REST's, then OpenAI's (uvicorn)
        self._granian: list[GranianHttp] = []  # the same under --http_server=granian

    async def open(
        self,
        services: Sequence[Callable[[grpc.aio.Server], None]],
        health: ReadinessHealth,
        rest_app: Callable[[], Starlette],
        private_socket: str = "",
        openai_app: Callable[[], Starlette] | None = None,
    ) -> None:
        """Open gRPC with ``services`` and ``health`` then, unless it is off, REST with ``rest_app()``, then
        ``openai_app()`` on ``--openai_port`` where it is not 0; ``private_socket``: a worker's own socket, where its
        siblings hand it the requests of its sequences."""
        options = self._options
        options.chosen_http_server()  # raises on an unknown server, before binding
        grpc_tls = options.grpc_tls()  # raises on a bad --ssl_config_file or --rest_api_ssl_* flag, before binding
        options.rest_tls()
        self._grpc, self.grpc_port = await start_grpc_server(
            address=f"{host_for_grpc(options.grpc_host)}:{options.port}",
            socket_path=options.grpc_socket_path,
            max_message_bytes=options.grpc_max_message_bytes,
            channel_arguments=options.grpc_arguments(),
            health=health,
            reuse_port=bool(options.worker_dir),
            services=services,
            private_socket=private_socket,
            tls=grpc_tls,
        )
        tls_note = ""
        if grpc_tls is not None:
            tls_note = " with TLS, client certificates required" if grpc_tls.client_verify else " with TLS"
        log.info("Running gRPC ModelServer at %s:%d%s", options.grpc_host, self.grpc_port, tls_note)
        if options.rest_api_port != 0:  # 0 is off, as in TF Serving; -1 picks a free port
            self.rest_port = await self._start_http(rest_app(), max(options.rest_api_port, 0), "REST API")
        if options.openai_port != 0 and openai_app is not None:  # 0: on the REST port; -1 picks a free port
            self.openai_port = await self._start_http(openai_app(), max(options.openai_port, 0), "OpenAI API")

    async def _start_http(self, app: Starlette, port: int, what: str) -> int:
        """Serve ``app`` on ``port`` of the REST host, with REST's TLS; the port it bound."""
        options = self._options
        sock = bind(options.rest_api_host, port, reuse_port=bool(options.worker_dir))
        bound: int = sock.getsockname()[1]
        tls = options.rest_tls()
        scheme = "HTTPS" if tls is not None else "HTTP"
        if options.chosen_http_server() == "granian":
            from workbench.server.granian_http import GranianHttp

            try:
                granian = GranianHttp(app, sock, tls)
            except BaseException:
                sock.close()
                raise
            await granian.start()
            self._granian.append(granian)
            if self._one_client is not None:
                self._one_client.watch(None)  # granian does not say how many connections it holds
            log.info("Exporting %s/%s at %s:%d (granian)", scheme, what, options.rest_api_host, bound)
            return bound
        ssl_options: dict[str, Any] = {}
        if tls is not None:
            ssl_options = {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file or None}
            if tls.client_ca_file:  # mutual TLS: no certificate issued by this CA, no connection
                ssl_options.update(ssl_ca_certs=tls.client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http=DrainingHttpProtocol,
            loop="none",
            timeout_keep_alive=30,
            **ssl_options,
        )
        try:
            config.load()  # builds the SSL context: reads the certificate, key and client CA
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            files = ", ".join(f"{k}={v}" for k, v in ssl_options.items() if isinstance(v, str))
            raise ServingError(Code.INVALID_ARGUMENT, f"REST TLS cannot use {files}: {exc}") from None
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._http.append((server, [sock]))
        if self._one_client is not None:
            # uvicorn keeps each open connection's protocol in this set, from its accept to its close.
            self._one_client.watch(functools.partial(len, server.server_state.connections))
        log.info("Exporting %s/%s at %s:%d", scheme, what, options.rest_api_host, bound)
        return bound

    async def close(self, grace: float) -> bool:
        """Stop accepting on both ports at once; wait up to ``grace`` seconds for accepted requests to finish. True
        when every one finished; False when some were cancelled.

        gRPC refuses new RPCs, and cancels what still runs at the end of the grace
        (:func:`workbench.server.grpc_drain.stop`). REST takes in
        the connections waiting to be accepted, closes its listening socket and the keep-alive connections that
        are idle, answers every other accepted connection's request with ``Connection: close``, and cancels what
        still runs at the end of the grace (:func:`workbench.server.http_drain.drain`); under granian, see
        :meth:`workbench.server.granian_http.GranianHttp.drain`.
        """
        closing = []
        if self._grpc is not None:
            closing.append(drain_grpc(self._grpc, grace))
            self._grpc = None
        for server, sockets in self._http:
            closing.append(drain(server, sockets, grace))
        self._http = []
        closing.extend(granian.drain(grace) for granian in self._granian)
        self._granian = []
        return all(await asyncio.gather(*closing))
