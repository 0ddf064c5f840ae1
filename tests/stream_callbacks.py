"""What ``tritonclient.grpc``'s stream callback receives, for the streaming tests."""

from __future__ import annotations

import queue
from typing import Any


class Collected:
    """The callback given to ``start_stream``; read what it received with a timeout (a hang fails the test, not the
    run)."""

    def __init__(self) -> None:
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.items.put((result, error))

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.items.get(timeout=20) for _ in range(count)]


def is_final(result: Any) -> bool:
    """Whether a streamed response carries Triton's ``triton_final_response`` flag, true."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param
