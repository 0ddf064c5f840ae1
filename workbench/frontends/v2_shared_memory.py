"""Triton's system and CUDA shared-memory extensions for both v2 frontends: who may use them, what they answer, and
the REST routes (``/v2/systemsharedmemory/…``, ``/v2/cudasharedmemory/…``; the gRPC RPCs are in
:mod:`workbench.frontends.v2_grpc`).

Regions live in the server's :class:`~workbench.planes.shared_memory.SharedMemoryRegistry`, one for both frontends.
Shared memory is for clients on this host: a region maps memory of this machine, and a client that can name one can
have the server read or overwrite it. So every shared-memory call, and every inference request naming a region, from
an address that is not loopback (or a Unix socket) is PERMISSION_DENIED, unless the server was started with
``--allow_remote_shared_memory``; with that flag and a management token, registering and unregistering need the
token, as repository load and unload do.

This server has no CUDA: CUDA shared memory registers nothing (UNIMPLEMENTED, which REST answers 501: the server
lacks what the request needs, which is no fault of the request), while its status answers no regions and its
unregister succeeds, because Triton's clients unregister everything when they start.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from starlette.requests import Request
from starlette.responses import Response

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.frontends.auth import bearer_matches, is_local_peer
from workbench.frontends.rest import json_response
from workbench.planes.shared_memory import RegionStatus, SharedMemoryRegistry
from workbench.protocol.json_tensor import dumps, parse_body
from workbench.protocol.shared_memory_parameters import SharedMemory, SharedTensor

Handler = Callable[[Request], Awaitable[Response]]

# Whether a peer is on this host, once per peer address (a REST client's host, a gRPC connection's peer): every
# inference request asks, and parsing the address took as long as decoding a small request.
_is_local = functools.lru_cache(maxsize=4096)(is_local_peer)


class SharedMemoryAccess:
    """The server's registry, behind the rule of who may use it; one for both v2 frontends."""

    def __init__(self, registry: SharedMemoryRegistry, allow_remote: bool = False, management_token: str = "") -> None:
        """``allow_remote``: clients on other hosts may use shared memory too (``--allow_remote_shared_memory``);
        ``management_token``: with it, registering and unregistering need the token."""
        self.registry = registry
        self.allow_remote = allow_remote
        self._token = management_token

    def for_peer(self, peer: str) -> SharedMemory:
        """What an inference request from ``peer`` reads and writes regions through (refusals, for a remote one)."""
        if self.allow_remote or _is_local(peer):
            return self.registry
        return _Refused(_remote(peer))

    def authorize(self, peer: str, authorization: str = "", changes: bool = False) -> None:
        """Refuse a shared-memory call from ``peer``; ``changes``: it registers or unregisters."""
        if not (self.allow_remote or _is_local(peer)):
            raise _remote(peer)
        if changes and self.allow_remote and self._token and not bearer_matches(authorization, self._token):
            raise ServingError(
                Code.UNAUTHENTICATED,
                "Registering and unregistering shared memory need the server's management token "
                "(--allow_remote_shared_memory lets other hosts reach them)",
            )

    # ---------------------------------------------------------------------------------- system
    def status(self, peer: str, name: str) -> list[RegionStatus]:
        self.authorize(peer)
        return self.registry.status(name)

    def register(self, peer: str, authorization: str, name: str, key: str, offset: int, byte_size: int) -> None:
        self.authorize(peer, authorization, changes=True)
        if not name:  # Triton's words
            raise invalid_argument("'region name' is necessary to register system shared memory region")
        self.registry.register(name, key, offset, byte_size)

    def unregister(self, peer: str, authorization: str, name: str) -> None:
        """Region ``name``, or every region when it is empty."""
        self.authorize(peer, authorization, changes=True)
        if name:
            self.registry.unregister(name)
        else:
            self.registry.unregister_all()

    # ------------------------------------------------------------------------------------ CUDA
    def cuda_status(self, peer: str, name: str) -> list[dict[str, Any]]:
        """No CUDA region is ever registered: none, or NOT_FOUND for a name (in Triton's words)."""
        self.authorize(peer)
        if not name:
            return []
        if any(region.name == name for region in self.registry.status()):
            message = f"The region named '{name}' is registered as system shared memory, not CUDA shared memory"
        else:
            message = f"Unable to find cuda shared memory region: '{name}'"
        raise ServingError(Code.NOT_FOUND, message)

    def cuda_register(self, peer: str, authorization: str, name: str) -> NoReturn:
        self.authorize(peer, authorization, changes=True)
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"failed to register CUDA shared memory region '{name}': this server has no CUDA; register the tensors' "
            "memory as system shared memory instead (tritonclient.utils.shared_memory)",
        )

    def cuda_unregister(self, peer: str, authorization: str, name: str) -> None:
        """Nothing is registered: unregistering one or all succeeds, as Triton's does for an unknown name."""
        self.authorize(peer, authorization, changes=True)


class _Refused:
    """The shared memory of a request from a client that may not use it: every use is refused."""

    def __init__(self, error: ServingError) -> None:
        self._error = error

    def read(self, tensor: SharedTensor, what: str) -> bytes:
        raise self._error

    def check(self, tensor: SharedTensor, what: str) -> None:
        raise self._error

    def write(self, tensor: SharedTensor, data: bytes, what: str) -> None:
        raise self._error


def _remote(peer: str) -> ServingError:
    return ServingError(
        Code.PERMISSION_DENIED,
        f"Shared memory is for clients on this server's host, and {peer or 'this client'} is not one "
        "(workbench serve --allow_remote_shared_memory lets other hosts use it)",
    )


# ------------------------------------------------------------------------------------------------- REST
def rest_peer(request: Request) -> str:
    """The REST client's address ("" when the server does not know it)."""
    return request.client.host if request.client is not None else ""


class SharedMemoryRest:
    """The REST handlers of both extensions; :func:`shared_memory_routes` lists them."""

    def __init__(self, access: SharedMemoryAccess) -> None:
        self.access = access

    async def status(self, request: Request) -> Response:
        regions = self.access.status(rest_peer(request), request.path_params.get("name", ""))
        return json_response(dumps([_region_json(region) for region in regions]))  # Triton answers the bare list

    async def register(self, request: Request) -> Response:
        doc = parse_body(await _small_body(request))
        key = doc.get("key")
        if key is None:  # Triton's words
            raise invalid_argument("Shared memory register request has no 'key' field")
        if not isinstance(key, str):
            raise invalid_argument(f"'key' must be the shared memory's name, a string; got {key!r}")
        if "byte_size" not in doc:
            raise invalid_argument("Shared memory register request has no 'byte_size' field")
        offset, byte_size = _byte_count(doc.get("offset", 0), "offset"), _byte_count(doc["byte_size"], "byte_size")
        authorization = request.headers.get("authorization", "")
        self.access.register(rest_peer(request), authorization, request.path_params["name"], key, offset, byte_size)
        return Response(status_code=200)

    async def unregister(self, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        self.access.unregister(rest_peer(request), authorization, request.path_params.get("name", ""))
        return Response(status_code=200)

    async def cuda_status(self, request: Request) -> Response:
        return json_response(dumps(self.access.cuda_status(rest_peer(request), request.path_params.get("name", ""))))

    async def cuda_register(self, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        self.access.cuda_register(rest_peer(request), authorization, request.path_params["name"])

    async def cuda_unregister(self, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        self.access.cuda_unregister(rest_peer(request), authorization, request.path_params.get("name", ""))
        return Response(status_code=200)


def shared_memory_routes(access: SharedMemoryAccess) -> list[tuple[str, Handler, str]]:
    """(path, handler, method) of Triton's shared-memory URLs, for :func:`workbench.frontends.v2_rest.v2_routes`."""
    api = SharedMemoryRest(access)
    table: list[tuple[str, Handler, str]] = []
    for kind, status, register, unregister in [
        ("system", api.status, api.register, api.unregister),
        ("cuda", api.cuda_status, api.cuda_register, api.cuda_unregister),
    ]:
        base = f"/v2/{kind}sharedmemory"
        region = f"{base}/region/{{name:str}}"
        table += [
            (f"{base}/status", status, "GET"),
            (f"{region}/status", status, "GET"),
            (f"{region}/register", register, "POST"),
            (f"{base}/unregister", unregister, "POST"),
            (f"{region}/unregister", unregister, "POST"),
        ]
    return table


async def _small_body(request: Request, limit: int = 64 * 1024) -> bytes:
    """A register request's body: a small JSON object, read no further than ``limit`` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise invalid_argument(f"A shared memory register request is a small JSON object, not over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _region_json(region: RegionStatus) -> dict[str, Any]:
    return {"name": region.name, "key": region.key, "offset": region.offset, "byte_size": region.byte_size}


def _byte_count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise invalid_argument(f"'{field}' must be a number of bytes (0 or more); got {value!r}")
    return value
