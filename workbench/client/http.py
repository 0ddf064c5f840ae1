"""One HTTP session to a server's REST port: requests with the client's token and TLS settings, and the server's
errors as :class:`~workbench.core.errors.ServingError` with the code its HTTP status stands for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from workbench.client.trace_context import with_trace_headers
from workbench.core.errors import Code, ServingError

_HTTP_CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.ABORTED,
    429: Code.RESOURCE_EXHAUSTED,
    499: Code.CANCELLED,
    501: Code.UNIMPLEMENTED,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}


def code_of_status(status: int) -> Code:
    """The canonical code an HTTP error status stands for."""
    return _HTTP_CODES.get(status, Code.INTERNAL if status >= 500 else Code.UNKNOWN)


class HttpConnection:
    """REST calls to ``url`` (None: the client has no REST url, and a call is a programming error)."""

    def __init__(self, url: str | None, *, timeout: float, token: str | None, tls_options: dict[str, Any]) -> None:
        self.url = url
        self.timeout = timeout
        # Passed with each request, not set on the session: requests lets $REQUESTS_CA_BUNDLE override a session's.
        self._tls_options = tls_options
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def open_stream(self, path: str, params: Mapping[str, Any], timeout: tuple[float, float]) -> requests.Response:
        """``GET path`` as a stream (server-sent events), with this client's TLS settings and token."""
        assert self.url is not None
        return self._session.get(self.url + path, params=params, stream=True, timeout=timeout, **self._tls_options)

    def post_stream(self, path: str, body: Any, headers: Mapping[str, str] | None = None) -> requests.Response:
        """``POST path`` with a JSON body, its answer read as a stream (server-sent events); any status is returned.
        The read timeout bounds each wait for the next bytes, not the whole stream."""
        assert self.url is not None
        try:
            return self._session.post(
                self.url + path,
                json=body,
                headers=with_trace_headers(dict(headers) if headers else None),
                stream=True,
                timeout=self.timeout,
                **self._tls_options,
            )
        except requests.RequestException as exc:
            raise ServingError(Code.UNAVAILABLE, f"Could not reach {self.url}: {exc}") from None

    def json(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON document of a successful answer (a ServingError otherwise)."""
        return self.json_answer(method, path, body)[0]

    def json_answer(
        self,
        method: str,
        path: str,
        body: Any = None,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
    ) -> tuple[Any, Mapping[str, str]]:
        """The JSON document and the headers of a successful answer (``ok``: its statuses; a ServingError else)."""
        response = self.send(method, path, json=body, ok=ok, **({"headers": headers} if headers else {}))
        try:
            return response.json(), response.headers
        except ValueError:
            raise ServingError(Code.DATA_LOSS, f"{method} {path} answered no JSON: {response.text[:200]!r}") from None

    def send(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> requests.Response:
        """A successful answer to ``method path`` (``json=``, or ``data=`` and ``headers=``); a ServingError else."""
        assert self.url is not None
        headers = with_trace_headers(kwargs.pop("headers", None))  # the notebook's current span, if any
        if headers:
            kwargs["headers"] = headers
        try:
            response = self._session.request(
                method, self.url + path, timeout=self.timeout, **self._tls_options, **kwargs
            )
        except requests.RequestException as exc:
            raise ServingError(Code.UNAVAILABLE, f"Could not reach {self.url}: {exc}") from None
        if response.status_code not in ok:
            try:
                doc = response.json()
            except ValueError:
                doc = {"error": response.text[:500]}
            raise ServingError(
                code_of_status(response.status_code),
                doc.get("error", response.reason) if isinstance(doc, dict) else response.reason,
            )
        return response

    def close(self) -> None:
        self._session.close()
