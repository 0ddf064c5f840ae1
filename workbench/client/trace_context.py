"""The caller's trace context on the client's requests: a traced notebook call shows the server's time in its trace.

When the notebook has a current OpenTelemetry span, each request of the :class:`~workbench.client.Client` carries
its context (``traceparent``, ``tracestate`` and whatever else the notebook's configured propagators write: REST
headers, gRPC metadata), so the server's spans for it join the notebook's trace. Without OpenTelemetry, or without a
current span, nothing is added and nothing is imported: OpenTelemetry is looked for in ``sys.modules`` only, since a
span can be current only once the notebook imported it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def trace_headers() -> dict[str, str]:
    """The current span's context as headers (empty when there is no current, valid span)."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)  # the notebook's propagators (OTEL_PROPAGATORS; W3C trace context by default)
    return carrier


def with_trace_headers(headers: dict[str, str] | None) -> dict[str, str] | None:
    """``headers`` plus the current span's context (``headers`` itself when there is none to add)."""
    traced = trace_headers()
    if not traced:
        return headers
    return {**traced, **headers} if headers else traced


def with_trace_metadata(metadata: Sequence[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """gRPC call metadata plus the current span's context (None for none at all, as gRPC takes it)."""
    traced = trace_headers()
    together = [*metadata, *((key.lower(), value) for key, value in traced.items())]
    return together or None
