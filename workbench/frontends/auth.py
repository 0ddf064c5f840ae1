"""Who may do what, once for every frontend: the management token check, and whether a client is on this host.

REST's management API and v2's repository load/unload (REST and gRPC) take the server's token as a bearer token;
the comparison is constant-time (:func:`hmac.compare_digest`), so an attacker timing answers learns nothing of it.
Shared memory is for clients on the server's host only (:mod:`workbench.frontends.v2_shared_memory`).
"""

from __future__ import annotations

import hmac
import ipaddress
import urllib.parse


def bearer_matches(authorization: str, token: str) -> bool:
    """Whether an ``Authorization`` header (or gRPC metadata) value carries ``token`` as its bearer token."""
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def is_local_peer(peer: str) -> bool:
    """Whether a client is on this host: it came over a Unix socket, or from a loopback address.

    ``peer`` is gRPC's ``context.peer()`` (``ipv4:127.0.0.1:5000``, ``ipv6:%5B::1%5D:5000``, ``unix:/path``) or
    REST's client host (``127.0.0.1``, ``::1``); anything else (a host name, "") is not local.
    """
    if peer.startswith(("unix:", "unix-abstract:")):
        return True
    host = peer
    scheme, colon, rest = peer.partition(":")
    if colon and scheme in ("ipv4", "ipv6"):
        # gRPC percent-encodes the brackets of an IPv6 address; the port follows the last colon
        host = urllib.parse.unquote(rest).rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # without an IPv6 zone ("fe80::1%eth0")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1, as a dual-stack socket reports an IPv4 client
    return address.is_loopback
