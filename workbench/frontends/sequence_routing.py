"""With ``--num_workers N``, every request of a sequence reaches the one worker that holds the sequence's state.

The kernel spreads connections among the workers (SO_REUSEPORT), so the requests of one sequence, sent over several
connections, land on any of them. Each sequence id has one owner, ``crc32(id) % N`` (the same in every process,
unlike Python's salted ``hash``); a worker that receives a sequence request it does not own hands the request, as a
v2 ``ModelInferRequest``, to the owner's private gRPC socket in the supervisor's run folder (a folder only this
server's user can open) and answers with the owner's answer, errors included. The owner runs it as any request:
batching, the sequence batcher, metrics and request logs all happen there, once.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import grpc

from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import SequenceId

_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def private_socket(run_dir: str | os.PathLike[str], index: int) -> Path:
    """Where worker ``index`` takes the requests its siblings hand it."""
    return Path(run_dir) / f"worker-{index}-grpc.sock"


def owner_of(sequence_id: SequenceId, workers: int) -> int:
    """The worker that holds sequence ``sequence_id`` (an int and its digits name the same sequence: Triton's ids
    are numbers or strings, and a client may send either)."""
    return zlib.crc32(str(sequence_id).encode()) % workers


class SequenceRouter:
    """Hands a sequence's requests to the worker that owns the sequence."""

    def __init__(self, run_dir: str, index: int, workers: int) -> None:
        self.run_dir, self.index, self.workers = run_dir, index, workers
        self._stubs: dict[int, Any] = {}
        self._channels: list[grpc.aio.Channel] = []

    def owner(self, sequence_id: SequenceId) -> int | None:
        """The worker to hand a request of ``sequence_id`` to; None when it is this one."""
        owner = owner_of(sequence_id, self.workers)
        return None if owner == self.index else owner

    async def infer(self, owner: int, request: Any, timeout: float | None) -> Any:
        """``request`` (a ``ModelInferRequest``) answered by worker ``owner``; its failure as the owner's status."""
        call = self._stubs.get(owner)
        if call is None:
            from tritonclient.grpc import service_pb2

            channel = grpc.aio.insecure_channel(f"unix:{private_socket(self.run_dir, owner)}")
            self._channels.append(channel)
            call = self._stubs[owner] = channel.unary_unary(
                _METHOD,
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )
        try:
            return await call(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = Code[exc.code().name] if exc.code().name in Code.__members__ else Code.UNAVAILABLE
            if exc.code() is grpc.StatusCode.UNAVAILABLE:  # the owner is restarting: its sequences are gone anyway
                raise ServingError(
                    Code.UNAVAILABLE, f"Worker {owner}, which holds this sequence, does not answer: {exc.details()}"
                ) from None
            raise ServingError(code, exc.details() or code.name) from None

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
