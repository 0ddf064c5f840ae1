"""What the analyzer sweeps: batching parameters (TF Serving's names), the number of worker processes, and the model
runners they hand their batches to (``--model_runners``: "in_process", each worker on its own; "auto"; or a count).

A candidate with ``max_batch_size`` 1 is a server without batching (each request one call); any other is served
with those parameters, written as the model's own ``batching_parameters.txt``, which is also what the winner is
written as.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration the analyzer serves the model with."""

    max_batch_size: int = 1  # 1: no batching
    batch_timeout_micros: int = 0
    num_batch_threads: int = 1
    max_enqueued_batches: int = 100
    num_workers: int = 1
    model_runners: str = "auto"  # workbench serve's --model_runners: auto, in_process, or a count

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 1

    @property
    def name(self) -> str:
        workers = f", {self.num_workers} workers" if self.num_workers > 1 else ""
        if self.model_runners != "auto":
            workers += f", runners {self.model_runners}"
        if not self.batching:
            return f"no batching{workers}"
        return (
            f"batch {self.max_batch_size}, {self.batch_timeout_micros} µs, {self.num_batch_threads} "
            f"thread{'s' if self.num_batch_threads > 1 else ''}{workers}"
        )

    def batching_parameters_text(self) -> str:
        """TF Serving's batching parameters file (text protobuf) for this candidate."""
        return (
            f"max_batch_size {{ value: {self.max_batch_size} }}\n"
            f"batch_timeout_micros {{ value: {self.batch_timeout_micros} }}\n"
            f"max_enqueued_batches {{ value: {self.max_enqueued_batches} }}\n"
            f"num_batch_threads {{ value: {self.num_batch_threads} }}\n"
        )

    def serve_flags(self) -> list[str]:
        """The ``workbench serve`` flags this candidate needs beside the model's batching file."""
        flags = ["--enable_batching"] if self.batching else []
        if self.num_workers > 1:
            flags.append(f"--num_workers={self.num_workers}")
        if self.model_runners != "auto":
            flags.append(f"--model_runners={self.model_runners}")
        return flags


def grid(
    max_batch_size: Sequence[int] = (1, 8, 32),
    batch_timeout_micros: Sequence[int] = (0, 2000),
    num_batch_threads: Sequence[int] = (1,),
    max_enqueued_batches: Sequence[int] = (100,),
    num_workers: Sequence[int] = (1,),
    model_runners: Sequence[str] = ("auto",),
) -> list[Candidate]:
    """Every combination (brute force), without repeats: a size of 1 takes no other batching setting."""
    found: dict[Candidate, None] = {}
    for size, timeout, threads, enqueued, workers, runners in itertools.product(
        max_batch_size, batch_timeout_micros, num_batch_threads, max_enqueued_batches, num_workers, model_runners
    ):
        if min(size, threads, enqueued, workers) < 1 or timeout < 0:
            raise ValueError("batch sizes, threads, enqueued batches and workers are at least 1; timeouts at least 0")
        if runners not in ("auto", "in_process") and not (runners.isdigit() and int(runners) >= 1):
            raise ValueError(f"model runners are auto, in_process or a count, not {runners!r}")
        batching = (size, timeout, threads, enqueued) if size > 1 else (1, 0, 1, 100)
        found[Candidate(*batching, workers, runners)] = None
    return list(found)
