"""Where a request's stickiness key travels (a user's id, a session): under a canary split, every request with the
same key runs on the same version. An HTTP header (TF Serving's REST API and v2's), gRPC metadata (both gRPC APIs),
or a v2 gRPC request parameter; clients and servers alike name them from here."""

from __future__ import annotations

STICKY_HEADER = "X-Workbench-Key"
STICKY_METADATA = "x-workbench-key"
STICKY_PARAMETER = "workbench_key"


def sticky_metadata(key: str | None) -> tuple[tuple[str, str], ...]:
    """A gRPC call's metadata carrying ``key`` (none without one)."""
    return ((STICKY_METADATA, key),) if key is not None else ()
