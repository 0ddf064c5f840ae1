"""A request sent with ``:predictAsync``: queued by the server at once, answered when a consumer gets to it.

:meth:`workbench.Client.predict_async` returns an :class:`AsyncPrediction`, which behaves as a future: ``done()``
asks the server once, ``result(timeout)`` waits (polling ``GET /workbench/v1/async/{id}``, more slowly the longer it
waits) and gives the :class:`~workbench.client.Prediction` a synchronous ``predict`` would have, or raises its error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workbench.client.http import HttpConnection, code_of_status
from workbench.client.prediction import Prediction
from workbench.client.tfs_rest import predict_outputs
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature

FIRST_POLL_SECONDS = 0.02
LAST_POLL_SECONDS = 1.0


class AsyncPrediction:
    """One asynchronous request: its ``id``, and its answer once there is one."""

    def __init__(
        self,
        http: HttpConnection,
        request_id: str,
        url: str,
        model: str,
        signature: Signature,
        output_filter: Sequence[str] = (),
    ) -> None:
        self.id, self.url, self.model = request_id, url, model
        self._http, self._signature, self._output_filter = http, signature, tuple(output_filter)
        self._sent = time.perf_counter()
        self._record: dict[str, Any] | None = None

    def __repr__(self) -> str:
        state = self._record["state"] if self._record is not None else "sent"
        return f"AsyncPrediction({self.model}, id={self.id}, {state})"

    def state(self) -> str:
        """``queued``, ``running``, ``done`` or ``failed``, as the server says now."""
        return str(self._refresh()["state"])

    def done(self) -> bool:
        return self.state() in ("done", "failed")

    def result(self, timeout: float | None = None) -> Prediction:
        """The answer, waiting up to ``timeout`` seconds (None: as long as it takes); TimeoutError if it is not
        there by then; the request's own error (a ServingError with its code) if it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = FIRST_POLL_SECONDS
        while not self.done():
            if deadline is not None and time.monotonic() + wait > deadline:
                raise TimeoutError(f"asynchronous request {self.id} to {self.model} not answered in {timeout} s")
            time.sleep(wait)
            wait = min(wait * 2, LAST_POLL_SECONDS)
        record = self._record
        assert record is not None
        answer, status = record.get("answer") or {}, int(record.get("status") or 500)
        if record["state"] == "failed":
            raise ServingError(code_of_status(status), str(answer.get("error", f"failed with HTTP {status}")))
        outputs = predict_outputs(answer, self._signature, self._output_filter)
        latency = (record["updated"] - record["created"]) * 1000  # queued to answered, as the server counts it
        return Prediction(outputs, model=self.model, version=None, protocol="rest-async", latency_ms=latency)

    def _refresh(self) -> dict[str, Any]:
        if self._record is None or self._record["state"] not in ("done", "failed"):
            record = self._http.json("GET", self.url)
            if not isinstance(record, dict) or "state" not in record:
                raise ServingError(Code.DATA_LOSS, f"GET {self.url} answered no request's state")
            self._record = record
        return self._record
