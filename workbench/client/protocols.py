"""The protocols a client speaks, by the names every front end uses (``--protocol`` of ``workbench bench`` and
``%serve``): TF Serving's REST and gRPC APIs and the Open Inference Protocol's (v2); "v2" is short for "v2-rest"."""

from __future__ import annotations

PROTOCOLS = ("rest", "grpc", "v2-rest", "v2-grpc")
_PROTOCOL_ALIASES = {"v2": "v2-rest"}
GRPC_PROTOCOLS = ("grpc", "v2-grpc")
V2_PROTOCOLS = ("v2-rest", "v2-grpc")


def canonical_protocol(protocol: str) -> str:
    """A protocol's name as :data:`PROTOCOLS` spells it ("v2" is "v2-rest"); a ValueError for an unknown one."""
    chosen = _PROTOCOL_ALIASES.get(protocol, protocol)
    if chosen not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)} or v2, not {protocol!r}")
    return chosen
