"""The request log's CloudEvents collector: each logged request and its response POSTed as KServe's logger sends them.

KServe's inference logger (``pkg/logger/worker.go``) sends two CloudEvents per request in binary content mode: the
body is the request's (then the response's) JSON, and the event's attributes are ``ce-*`` headers —
``ce-specversion: 1.0``, ``ce-id`` (the request id, the same on both), ``ce-type``
(``org.kubeflow.serving.inference.request`` / ``.response``), ``ce-source``, ``ce-time``, and the extensions
``ce-inferenceservicename`` (the model), ``ce-namespace``, ``ce-component`` (``predictor``) and ``ce-endpoint``
(``default``). A receiver written for KServe's logger (Knative's ``event_display``, a broker, a CloudEvents SDK
server) reads these unchanged; workbench adds ``ce-modelversion`` and ``ce-protocol``.

Sending is a background thread per URL with a bounded queue: a slow or absent receiver costs dropped (and
counted) records, never a waiting request. A failed POST (no connection, a timeout, a 5xx, a 429) is tried again
at most ``attempts`` times in all with a short back-off; a 4xx other than 429 is not retried.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from workbench.observability.log_records import LoggedCall, request_body, response_body
from workbench.observability.prediction_logs import LogEntry

log = logging.getLogger(__name__)

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
MAX_QUEUED = 1000  # logged requests waiting to be sent (two events each)
ATTEMPTS = 3
TIMEOUT_SECONDS = 5.0
_BACKOFF_SECONDS = 0.2  # doubled after each failed attempt

# (model, version, sent) once a request's events are delivered (True) or given up on (False); and a failed POST.
Counted = Callable[[str, int, bool], None]
Failed = Callable[[str], None]
_STOP = object()


def source() -> str:
    """``ce-source``: which server sent the event (KServe sends the logger's own URL; there is none here)."""
    return f"workbench://{os.uname().nodename}/{os.getpid()}"


def event_headers(kind: str, entry: LogEntry, call: LoggedCall, namespace: str = "") -> dict[str, str]:
    when = datetime.datetime.fromtimestamp(call.timestamp, datetime.timezone.utc)
    return {
        "Content-Type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": call.request_id,
        "ce-type": kind,
        "ce-source": source(),
        "ce-time": when.isoformat().replace("+00:00", "Z"),
        "ce-inferenceservicename": entry.model,
        "ce-namespace": namespace,
        "ce-component": "predictor",
        "ce-endpoint": "default",
        "ce-modelversion": str(entry.version),
        "ce-protocol": call.protocol,
    }


class CloudEventsSink:
    """POSTs logged requests to one URL from a thread of its own."""

    def __init__(
        self,
        url: str,
        counted: Counted,
        failed: Failed,
        max_queued: int = MAX_QUEUED,
        attempts: int = ATTEMPTS,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        self.url = url
        self._counted, self._failed = counted, failed
        self._attempts, self._timeout = max(1, attempts), timeout
        self._queue: queue.Queue[Any] = queue.Queue(max_queued)
        self._namespace = os.environ.get("POD_NAMESPACE", "")
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="workbench-cloudevents", daemon=True)
        self._thread.start()

    def offer(self, entry: LogEntry, call: LoggedCall) -> None:
        """Queue one logged request (from the request log's writer thread); a full queue drops and counts it."""
        try:
            self._queue.put_nowait((entry, call))
        except queue.Full:
            self._counted(entry.model, entry.version, False)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (within ``timeout``), then stop."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    log.error("CloudEvents to %s did not keep up: events still queued at shutdown are lost", self.url)
                    return
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        import requests

        with requests.Session() as session:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                entry, call = item
                try:
                    events = [
                        (REQUEST_TYPE, request_body(entry, call)),
                        (RESPONSE_TYPE, response_body(entry, call)),
                    ]
                    sent = all(self._send(session, kind, body, entry, call) for kind, body in events)
                except Exception as exc:  # noqa: BLE001 - a tensor JSON cannot hold: that record is lost, not the thread
                    log.error("Could not encode request %s as a CloudEvent: %s", call.request_id, exc)
                    sent = False
                self._counted(entry.model, entry.version, sent)

    def _send(self, session: Any, kind: str, body: dict[str, Any], entry: LogEntry, call: LoggedCall) -> bool:
        import requests

        data = json.dumps(body, separators=(",", ":")).encode()
        headers = event_headers(kind, entry, call, self._namespace)
        delay = _BACKOFF_SECONDS
        for attempt in range(1, self._attempts + 1):
            problem = ""
            retry = True
            try:
                reply = session.post(self.url, data=data, headers=headers, timeout=self._timeout)
                if 200 <= reply.status_code < 300:
                    if self._failing:
                        log.info("CloudEvents to %s are delivered again", self.url)
                    self._failing = False
                    return True
                problem = f"HTTP {reply.status_code}"
                retry = reply.status_code >= 500 or reply.status_code == 429
            except requests.RequestException as exc:
                problem = type(exc).__name__
            self._failed(entry.model)
            if not self._failing:  # said once until one is delivered again
                log.error("Could not deliver a CloudEvent to %s: %s (attempt %d)", self.url, problem, attempt)
                self._failing = True
            if not retry or attempt == self._attempts:
                return False
            time.sleep(delay)
            delay *= 2
        return False
