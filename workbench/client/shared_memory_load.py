"""A load whose inputs travel in system shared memory, as perf_analyzer's ``--shared-memory system`` sends them.

The requests' tensors are written once into one POSIX shared-memory object (Python's ``multiprocessing``), registered
with the server as a region (Triton's system shared-memory extension, over REST or gRPC as the load itself goes);
each request then names its inputs' place in the region instead of carrying them. The region is unregistered and
the object removed when the load ends. Shared memory is for a server on this host (and one that allows it).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from workbench.protocol import v2_client
from workbench.protocol.v2_types import to_datatype

REGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
UNREGISTER = "/inference.GRPCInferenceService/SystemSharedMemoryUnregister"

Placed = dict[str, tuple[np.ndarray, int, int]]  # input name → (its array, offset in the region, bytes)


@contextlib.contextmanager
def shared_inputs(
    target: str, protocol: str, requests: Sequence[Mapping[str, np.ndarray]]
) -> Iterator[tuple[str, list[Placed]]]:
    """The region's name, and where each request's inputs are in it; registered for as long as the block runs."""
    raws = [{name: v2_client.to_raw(np.asarray(value)) for name, value in request.items()} for request in requests]
    size = sum(len(raw) for request in raws for raw in request.values())
    name = f"workbench-load-{uuid.uuid4().hex[:12]}"
    memory = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
    try:
        placed: list[Placed] = []
        offset = 0
        for request, raw in zip(requests, raws, strict=True):
            where: Placed = {}
            buffer = memory.buf
            assert buffer is not None  # open until closed below
            for alias, data in raw.items():
                buffer[offset : offset + len(data)] = data
                where[alias] = (np.asarray(request[alias]), offset, len(data))
                offset += len(data)
            placed.append(where)
        _register(target, protocol, name, f"/{name}", max(size, 1))
        try:
            yield name, placed
        finally:
            _unregister(target, protocol, name)
    finally:
        memory.close()
        memory.unlink()


def rest_body(region: str, placed: Placed) -> bytes:
    """A v2 REST inference request naming its inputs' place in ``region``."""
    inputs = [
        {
            "name": alias,
            "shape": list(array.shape),
            "datatype": to_datatype(array.dtype),
            "parameters": {
                "shared_memory_region": region,
                "shared_memory_offset": offset,
                "shared_memory_byte_size": size,
            },
        }
        for alias, (array, offset, size) in placed.items()
    ]
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


def grpc_message(model: str, region: str, placed: Placed) -> bytes:
    """A v2 ``ModelInferRequest`` naming its inputs' place in ``region``, serialized."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    for alias, (array, offset, size) in placed.items():
        tensor = request.inputs.add(name=alias, datatype=to_datatype(array.dtype), shape=array.shape)
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = size
    return bytes(request.SerializeToString())


def _register(target: str, protocol: str, name: str, key: str, size: int) -> None:
    body = {"key": key, "offset": 0, "byte_size": size}
    if protocol == "v2-grpc":
        from tritonclient.grpc import service_pb2

        _grpc_call(target, REGISTER, service_pb2.SystemSharedMemoryRegisterRequest(name=name, **body))
    else:
        _rest_post(target, f"/v2/systemsharedmemory/region/{name}/register", body)


def _unregister(target: str, protocol: str, name: str) -> None:
    with contextlib.suppress(Exception):  # the server may be gone: the object is removed here regardless
        if protocol == "v2-grpc":
            from tritonclient.grpc import service_pb2

            _grpc_call(target, UNREGISTER, service_pb2.SystemSharedMemoryUnregisterRequest(name=name))
        else:
            _rest_post(target, f"/v2/systemsharedmemory/region/{name}/unregister", {})


def _rest_post(target: str, path: str, body: dict[str, Any]) -> None:
    import requests

    from workbench.core.errors import Code, ServingError

    url = target if "://" in target else f"http://{target}"
    answer = requests.post(url.rstrip("/") + path, json=body, timeout=30)
    if answer.status_code != 200:
        raise ServingError(Code.FAILED_PRECONDITION, f"registering shared memory: {answer.status_code} {answer.text}")


def _grpc_call(target: str, method: str, message: Any) -> None:
    import grpc

    host = urlsplit(f"//{target}").netloc
    with grpc.insecure_channel(host) as channel:
        channel.unary_unary(method)(message.SerializeToString(), timeout=30)
