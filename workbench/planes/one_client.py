"""Whether the server has one client only: one HTTP connection open, and no gRPC call in flight.

Why: a call handed to an inference thread costs two hand-offs, to the thread and back to the event loop, with their
wake-ups and the interpreter lock changing hands, and one client waiting for each answer before it sends the next
pays them on every request. For a model call of a fraction of a millisecond that was much of the server's time:
the logistic regression of ``benchmarks/front_door.py``, one connection, batching off, over TF Serving REST, cost
0.96 ms of server CPU a request with its calls on the loop against 1.28 ms on a thread, and answered in 1.05 ms at
the median against 1.32 ms (over v2 REST: 0.94 against 1.47 ms; Triton's 0.95 ms). Under many clients the threads
are what let the loop take in the next requests while a call runs, so only a server with one client runs such
calls on the loop (:meth:`RunCost.runs_for_one_client
<workbench.batching.run_cost.RunCost.runs_for_one_client>`).

One client is exact on HTTP/1.1: a connection carries one request at a time (pipelined requests are answered in
turn anyway), so a server holding one connection cannot have another request waiting unread. A gRPC connection
multiplexes any number of calls, and calls the event loop has yet to start are not seen anywhere, so a gRPC call
never counts as one client's, and none runs on the loop for it: while a gRPC call is in flight, HTTP requests go
to the threads too. An HTTP server that cannot count its connections (granian) makes the server never one
client's.
"""

from __future__ import annotations

from collections.abc import Callable

# The data plane's protocol labels of the requests that come over gRPC (the others come over HTTP).
GRPC_PROTOCOLS = frozenset({"grpc", "v2-grpc", "torchserve-grpc"})


class OneClient:
    """The open HTTP connections of a server's ports and its gRPC calls in flight, counted as they change."""

    __slots__ = ("_connections", "_blind", "grpc_calls")

    def __init__(self) -> None:
        self._connections: list[Callable[[], int]] = []
        self._blind = False  # an HTTP server whose connections are not counted: never one client
        self.grpc_calls = 0  # gRPC requests between their admission and their answer (the data plane's count)

    def watch(self, open_connections: Callable[[], int] | None) -> None:
        """Count an HTTP server's connections through ``open_connections``; None: that server cannot say, and the
        server is never taken for one client's."""
        if open_connections is None:
            self._blind = True
        else:
            self._connections.append(open_connections)

    def open_connections(self) -> int:
        """The HTTP connections open on the counted ports, together."""
        return sum(count() for count in self._connections)

    def alone(self, protocol: str) -> bool:
        """Whether a request that came over ``protocol`` is the server's one client's: over HTTP, the only
        connection open on every HTTP port, with no gRPC call in flight."""
        if self.grpc_calls or self._blind or protocol in GRPC_PROTOCOLS or not self._connections:
            return False
        return self.open_connections() <= 1
