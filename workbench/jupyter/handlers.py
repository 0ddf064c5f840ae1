"""The extension's HTTP handlers: the server listing and the REST proxy.

Both sit behind Jupyter's authentication and authorization (``auth_resource = "workbench"``). The proxy is not
an open proxy: the target host and port come from the registry record named in the URL, never from the request,
and only loopback targets are forwarded to, so a Jupyter user reaches exactly the model servers running on this
machine, as the browser could not on a remote Jupyter.

Streaming endpoints (``/workbench/v1/stats/stream``, server-sent events that never end) are refused with 400:
the proxy buffers whole responses. Poll ``/workbench/v1/stats`` through it instead.

A server whose REST API is https (``--rest_api_ssl_cert_file``) is reached over TLS, trusting exactly the
certificate the server serves (read from the file its record names): no CA file to configure, and a name check is
not needed where the certificate itself is pinned (the server may hold a certificate for its public name while the
proxy reaches it on loopback). A server that requires client certificates is listed but not queried or proxied:
the proxy has no certificate to show.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import os
import ssl
from typing import Any
from urllib.parse import quote

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError

from workbench.jupyter.server_records import ServerRecord, get_server, list_servers

#: Seconds the listing waits for each server's model list (servers are asked concurrently).
LIST_TIMEOUT = 2.0
#: Seconds a proxied request may take: above the servers' own default REST timeout (30 s) so they answer first.
PROXY_TIMEOUT = 60.0
PROXY_CONNECT_TIMEOUT = 5.0
#: The header a client puts a server's management token in; sent upstream as ``Authorization: Bearer``.
TOKEN_HEADER = "X-Workbench-Token"
# Paths that stream without end; a buffering proxy would hold them until its timeout.
_STREAMING_PATHS = frozenset({"workbench/v1/stats/stream"})
# Request headers that describe the body; everything else (cookies, Jupyter's Authorization, XSRF) stays here.
_FORWARDED_REQUEST_HEADERS = ("Content-Type", "Accept")
# Characters left as they are when the decoded URL path is quoted again (TF Serving's ``:predict`` included).
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def upstream_base(record: ServerRecord) -> str | None:
    """``http://host:port`` of a record's REST API, or None if it has none or it is not on this machine.

    A wildcard bind (``0.0.0.0``, ``::``) also answers on loopback, so it is reached there. Host names other than
    ``localhost`` are refused rather than resolved: a name could resolve anywhere.
    """
    if record.rest_port is None or record.tls_client_auth:
        return None
    host = record.rest_host.strip().strip("[]")
    if host in ("", "0.0.0.0", "localhost"):
        connect = "127.0.0.1"
    elif host == "::":
        connect = "::1"
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
        if not address.is_loopback:
            return None
        connect = str(address)
    netloc = f"[{connect}]" if ":" in connect else connect
    return f"{'https' if record.tls else 'http'}://{netloc}:{record.rest_port}"


def upstream_tls(record: ServerRecord) -> ssl.SSLContext | None:
    """The TLS context that reaches ``record``'s https REST API (None for plain http): its own certificate pinned.

    Raises OSError or ssl.SSLError when the certificate cannot be read.
    """
    if not record.tls:
        return None
    path = record.tls_cert_file
    return _pinned_context(path, os.stat(path).st_mtime_ns)  # a renewed certificate is read again


@functools.lru_cache(maxsize=16)
def _pinned_context(path: str, mtime_ns: int) -> ssl.SSLContext:
    with open(path) as f:
        text = f.read()
    end = "-----END CERTIFICATE-----"
    if end not in text:
        raise ssl.SSLError(f"no PEM certificate in {path}")
    leaf = text[text.index("-----BEGIN CERTIFICATE-----") : text.index(end) + len(end)]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the certificate itself is pinned; see the module's docstring
    # The server's own (leaf) certificate as the one trust anchor: nothing else the CA issued passes.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.load_verify_locations(cadata=leaf)
    return context


class WorkbenchHandler(APIHandler):
    """Base of the extension's handlers: Jupyter's authorization resource and JSON answers."""

    auth_resource = "workbench"

    def reply(self, status: int, doc: dict[str, Any]) -> None:
        self.set_status(status)
        self.finish(json.dumps(doc))


class ServersHandler(WorkbenchHandler):
    """``GET workbench/api/servers``: the running servers, each with its models or why they are missing."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        records = await asyncio.get_running_loop().run_in_executor(None, list_servers)  # file I/O off the loop
        servers = await asyncio.gather(*(self._describe(record) for record in records))
        self.reply(200, {"servers": servers})

    async def _describe(self, record: ServerRecord) -> dict[str, Any]:
        doc = record.to_json()
        base = upstream_base(record)
        doc["proxy_url"] = url_path_join(self.base_url, "workbench/proxy", record.id) + "/" if base else None
        if record.rest_port is None:
            doc["error"] = "REST API is off: nothing to list or proxy"
            return doc
        if record.tls_client_auth:
            doc["error"] = "REST API requires client certificates (mutual TLS): not queried or proxied"
            return doc
        if base is None:
            doc["error"] = f"REST host {record.rest_host} is not a loopback address: not queried or proxied"
            return doc
        try:
            request = HTTPRequest(
                f"{base}/workbench/v1/models",
                connect_timeout=LIST_TIMEOUT,
                request_timeout=LIST_TIMEOUT,
                ssl_options=upstream_tls(record),
            )
            response = await AsyncHTTPClient().fetch(request)
            doc["models"] = json.loads(response.body)["models"]
        except HTTPClientError as exc:  # 599 is tornado's code for "no HTTP answer" (a timeout here)
            doc["error"] = f"no answer in {LIST_TIMEOUT:g} s" if exc.code == 599 else f"answered HTTP {exc.code}"
        # One server that is starting, stopping or not a workbench server must not break the whole listing.
        except OSError as exc:  # ssl.SSLError included: a certificate that does not match the pinned one
            doc["error"] = f"did not answer: {exc}"
        except (ValueError, KeyError, TypeError):
            doc["error"] = "answered something other than a workbench model list"
        return doc


class ProxyHandler(WorkbenchHandler):
    """``workbench/proxy/<server-id>/<path>``: forward a request to a registered server's REST API."""

    @web.authenticated
    @authorized
    async def get(self, server_id: str, path: str | None) -> None:
        await self._forward(server_id, path or "")

    @web.authenticated
    @authorized
    async def post(self, server_id: str, path: str | None) -> None:
        await self._forward(server_id, path or "")

    @web.authenticated
    @authorized
    async def put(self, server_id: str, path: str | None) -> None:
        await self._forward(server_id, path or "")

    @web.authenticated
    @authorized
    async def delete(self, server_id: str, path: str | None) -> None:
        await self._forward(server_id, path or "")

    async def _forward(self, server_id: str, path: str) -> None:
        record = await asyncio.get_running_loop().run_in_executor(None, get_server, server_id)
        base = upstream_base(record) if record is not None else None
        if base is None:  # unknown, stale, REST off or not on loopback: all the same to the client
            self.reply(404, {"error": f"unknown workbench server {server_id}"})
            return
        if path.strip("/") in _STREAMING_PATHS:
            self.reply(400, {"error": f"/{path} streams and is not proxied; poll /workbench/v1/stats instead"})
            return
        # Tornado decoded the path; quote it again so that %2F, ? or # in it cannot change the upstream URL.
        url = f"{base}/{quote(path, safe=_PATH_SAFE)}"
        if self.request.query:
            url += f"?{self.request.query}"
        headers = {
            name: self.request.headers[name] for name in _FORWARDED_REQUEST_HEADERS if name in self.request.headers
        }
        token = self.request.headers.get(TOKEN_HEADER)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        method = self.request.method or "GET"
        body: bytes | None = self.request.body
        if method in ("POST", "PUT"):
            body = body or b""  # tornado's client wants a body with these methods
        elif not body:
            body = None
        assert record is not None  # base is None otherwise
        try:
            tls = upstream_tls(record)
        except OSError as exc:  # ssl.SSLError included: the certificate it serves cannot be read to pin it
            self.reply(502, {"error": f"workbench server {server_id}: its TLS certificate cannot be read: {exc}"})
            return
        request = HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=body,
            allow_nonstandard_methods=True,  # a DELETE with a body
            follow_redirects=False,  # a redirect would lead elsewhere than the registered server
            connect_timeout=PROXY_CONNECT_TIMEOUT,
            request_timeout=PROXY_TIMEOUT,
            ssl_options=tls,
        )
        try:
            # raise_error=False answers with upstream's 4xx/5xx; no HTTP answer at all still raises.
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except HTTPTimeoutError:
            self.reply(504, {"error": f"workbench server {server_id} did not answer in time"})
            return
        except (OSError, HTTPClientError) as exc:  # refused, reset, closed: the server is gone or going
            self.reply(502, {"error": f"workbench server {server_id} did not answer: {exc}"})
            return
        self.set_status(response.code, response.reason)
        content_type = response.headers.get("Content-Type", "application/octet-stream")
        if response.body and response.code not in (204, 304):
            self.write(response.body)
        self.finish(set_content_type=content_type)


def handlers(base_url: str) -> list[tuple[str, type[WorkbenchHandler]]]:
    """The extension's routes under Jupyter's ``base_url``."""
    return [
        (url_path_join(base_url, "workbench/api/servers"), ServersHandler),
        (url_path_join(base_url, r"workbench/proxy/([^/]+)(?:/(.*))?"), ProxyHandler),
    ]
