"""The client's gRPC channels to one server, shared by TF Serving's services and v2's, and their stubs in turn.

Several channels, so calls from several threads spread over a multi-worker server: one HTTP/2 connection stays on
one worker of a ``--num_workers`` server. Channels open on the first call (``grpc`` is imported then, not before),
and TF Serving's stubs come from its generated protos, never ``tensorflow/__init__``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from workbench.client.tls import ClientTLS
from workbench.client.trace_context import with_trace_metadata
from workbench.core.errors import Code, ServingError

# gRPC connections a Client opens: several, so calls from several threads spread over a multi-worker server.
GRPC_CHANNELS = 4


def serving_error(exc: Any) -> ServingError:
    """A ``grpc.RpcError`` as a ServingError with the server's code and message."""
    return ServingError(Code[exc.code().name], exc.details() or "")


class GrpcChannels:
    """``count`` channels to ``target`` (TLS when ``tls`` is given), opened lazily and used in turn."""

    def __init__(self, target: str | None, *, tls: ClientTLS | None, count: int, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self._tls = tls
        self._count = count
        self._channels: list[Any] = []
        self._stubs: dict[str, list[Any]] = {}
        self._turn = itertools.count()

    def stub(self, service: str) -> Any:
        """A stub of ``service`` ("predict", "model": TF Serving's; "v2": the v2 service), the channels in turn."""
        if service not in self._stubs:
            import grpc

            if not self._channels:
                options = [
                    ("grpc.max_receive_message_length", -1),
                    ("grpc.max_send_message_length", -1),
                    # Channels of one process share a connection unless told not to: each its own connection.
                    ("grpc.use_local_subchannel_pool", 1),
                    # A server restarted from the notebook (handle.restart()) is back in seconds: reconnect within
                    # 2 s of it rather than after gRPC's default backoff, which grows to 120 s during an outage.
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ]
                credentials = self._tls.grpc_credentials() if self._tls is not None else None
                self._channels = [
                    grpc.secure_channel(self.target, credentials, options=options)
                    if credentials is not None
                    else grpc.insecure_channel(self.target, options=options)
                    for _ in range(self._count)
                ]
            if service == "v2":
                from tritonclient.grpc import service_pb2_grpc

                stub = service_pb2_grpc.GRPCInferenceServiceStub
            else:
                import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
                from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

                module = prediction_service_pb2_grpc if service == "predict" else model_service_pb2_grpc
                stub = module.PredictionServiceStub if service == "predict" else module.ModelServiceStub
            self._stubs[service] = [stub(channel) for channel in self._channels]
        stubs = self._stubs[service]
        return stubs[next(self._turn) % len(stubs)]

    def call(self, service: str, method: str, request: Any, metadata: Sequence[tuple[str, str]] = ()) -> Any:
        """One unary call (with ``metadata``); a failed one is a ServingError with the server's code."""
        import grpc

        try:
            # The notebook's current span, if any, travels with the call (workbench.client.trace_context).
            traced = with_trace_metadata(metadata)
            return getattr(self.stub(service), method)(request, timeout=self.timeout, metadata=traced)
        except grpc.RpcError as exc:
            raise serving_error(exc) from None

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels, self._stubs = [], {}
