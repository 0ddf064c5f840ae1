"""The management token check, once for every frontend that changes what is served.

REST's management API and v2's repository load/unload (REST and gRPC) take the server's token as a bearer token;
the comparison is constant-time (:func:`hmac.compare_digest`), so an attacker timing answers learns nothing of it.
"""

from __future__ import annotations

import hmac


def bearer_matches(authorization: str, token: str) -> bool:
    """Whether an ``Authorization`` header (or gRPC metadata) value carries ``token`` as its bearer token."""
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
