"""What a stateful model and its requests say of sequences (Triton's sequence batching): the contract.

The sequence's settings (Oldest or Direct, idle time, slots), what a request names (``sequence_id``,
``sequence_start``, ``sequence_end``), the control inputs a step is given, and the ``run_step`` a stateful servable
implements. Platforms declare these and frontends parse them; the batcher that runs sequences is
:mod:`workbench.batching.sequence_batcher`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature

SequenceId = int | str


class Strategy(enum.Enum):
    DIRECT = "direct"
    OLDEST = "oldest"


@dataclasses.dataclass(frozen=True)
class SequenceSettings:
    """A stateful model's sequence batching (Triton's ``sequence_batching``)."""

    strategy: Strategy = Strategy.OLDEST
    max_idle_seconds: float = 1.0  # Triton's default max_sequence_idle_microseconds: one second
    max_batch_size: int = 8  # Oldest: requests in one batch; Direct: sequences held at once (slots)
    max_queue_delay_seconds: float = 0.0  # how long a batch waits for more requests (Direct: see min_ready)
    max_sequences: int = 0  # Oldest: sequences held at once (Triton's max_candidate_sequences); 0: no bound
    preferred_batch_sizes: tuple[int, ...] = ()  # Oldest: a batch this size runs at once, without the delay
    run_batch_size: int = 0  # the most requests one run of the model takes (0: max_batch_size)
    min_ready: int = 0  # Direct: a batch waits (up to the delay) until this many slots have a request

    @property
    def batch_limit(self) -> int:
        return self.run_batch_size or self.max_batch_size


@dataclasses.dataclass(frozen=True)
class SequenceRequest:
    """What a request says of its sequence."""

    id: SequenceId
    start: bool = False
    end: bool = False


@dataclasses.dataclass(frozen=True)
class Controls:
    """Triton's sequence control inputs for one request, as values (a model turns them into its tensors)."""

    start: bool
    end: bool
    ready: bool
    correlation_id: SequenceId


class StatefulServable(Protocol):
    """What the sequence batcher runs: one step of one sequence, with its state (None at its start).

    A servable that can run the steps of several sequences in one run of its model also implements
    ``run_steps(steps)`` (:class:`Step` in, one :class:`StepResult` or exception out per step, in order); the batcher
    then hands it each batch whole.
    """

    name: str
    version: int

    def run_step(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        state: Any,
        controls: Controls,
    ) -> tuple[dict[str, np.ndarray], Any]: ...


@dataclasses.dataclass(frozen=True)
class Step:
    """One request of one sequence, as a batch of steps hands it to ``run_steps``."""

    signature: Signature
    inputs: Mapping[str, np.ndarray]
    outputs: Sequence[str]
    state: Any
    controls: Controls


StepResult = tuple[dict[str, np.ndarray], Any]  # the outputs asked for, and the sequence's next state


def sequence_request(parameters: Mapping[str, Any]) -> SequenceRequest | None:
    """The sequence a request's v2 parameters name (None: none), or INVALID_ARGUMENT for values that cannot be."""
    if "sequence_id" not in parameters:
        for flag in ("sequence_start", "sequence_end"):
            if parameters.get(flag):
                raise ServingError(Code.INVALID_ARGUMENT, f"parameters.{flag} needs parameters.sequence_id")
        return None
    raw = parameters["sequence_id"]
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or (isinstance(raw, int) and raw < 0):
        raise ServingError(
            Code.INVALID_ARGUMENT, f"parameters.sequence_id must be an unsigned integer or a string, got {raw!r}"
        )
    flags = {}
    for flag in ("sequence_start", "sequence_end"):
        value = parameters.get(flag, False)
        if not isinstance(value, bool):
            raise ServingError(Code.INVALID_ARGUMENT, f"parameters.{flag} must be true or false, got {value!r}")
        flags[flag] = value
    return SequenceRequest(raw, flags["sequence_start"], flags["sequence_end"])


def missing_correlation_id(model: str) -> ServingError:
    return ServingError(
        Code.INVALID_ARGUMENT,
        f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID",
    )
