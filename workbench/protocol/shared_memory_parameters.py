"""Triton's shared-memory parameters on v2 tensors, for both wires (REST's JSON and gRPC's ``InferParameter``).

An input or a requested output whose ``parameters`` hold ``shared_memory_region`` (with ``shared_memory_byte_size``,
and optionally ``shared_memory_offset``) travels through a region the client registered, instead of in the message:
the server reads the input's raw bytes there, or writes the output's raw bytes there and answers the output without
data. Raw bytes are the binary extension's layout (little-endian, row-major; BYTES elements each a 4-byte length
and its bytes), which each codec already reads and writes.

Pure: the codecs parse the parameters here and move bytes through a :class:`SharedMemory` the frontend hands them
(the server's registry, for a client allowed to use it); nothing here maps memory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.protocol.v2_types import BYTES, to_numpy_dtype

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = (REGION, BYTE_SIZE, OFFSET)


@dataclasses.dataclass(frozen=True)
class SharedTensor:
    """Where a tensor's raw bytes are: ``byte_size`` bytes from ``offset`` in the registered region ``region``."""

    region: str
    byte_size: int
    offset: int = 0

    def parameters(self) -> dict[str, Any]:
        """The parameters naming this place, as a response echoes them for an output written there."""
        named: dict[str, Any] = {REGION: self.region, BYTE_SIZE: self.byte_size}
        if self.offset:
            named[OFFSET] = self.offset
        return named


class SharedMemory(Protocol):
    """Registered regions, as the codecs use them; ``what`` ('Input "x"') begins every error message."""

    def read(self, tensor: SharedTensor, what: str) -> bytes:
        """A copy of the bytes ``tensor`` names."""
        ...

    def check(self, tensor: SharedTensor, what: str) -> None:
        """Raise unless ``tensor`` names a window inside a registered region."""
        ...

    def write(self, tensor: SharedTensor, data: bytes, what: str) -> None:
        """Copy ``data`` to where ``tensor`` points (refused when it holds fewer bytes)."""
        ...


def shared_tensor(parameters: Mapping[str, Any], what: str) -> SharedTensor | None:
    """The place a tensor's ``parameters`` (plain values) name, or None when they name none."""
    if REGION not in parameters:
        stray = [key for key in (BYTE_SIZE, OFFSET) if key in parameters]
        if stray:
            raise invalid_argument(f"{what} has {stray[0]} but no {REGION}")
        return None
    region = parameters[REGION]
    if not isinstance(region, str) or not region:
        raise invalid_argument(f"{what}: {REGION} must name a registered region (a non-empty string)")
    if BYTE_SIZE not in parameters:  # Triton requires both
        raise invalid_argument(f"{what} names shared memory region '{region}' without {BYTE_SIZE}: give both")
    byte_size = _count(parameters[BYTE_SIZE], BYTE_SIZE, what)
    return SharedTensor(region, byte_size, _count(parameters.get(OFFSET, 0), OFFSET, what))


def _count(value: Any, key: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise invalid_argument(f"{what}: {key} must be a number of bytes (0 or more), got {value!r}")
    return value


def read_input(
    memory: SharedMemory | None, tensor: SharedTensor, name: str, shape: Sequence[int], datatype: str
) -> bytes:
    """Input ``name``'s raw bytes, copied out of its region; a fixed-size type must fill ``byte_size`` exactly."""
    what = f'Input "{name}"'
    if datatype != BYTES:  # BYTES elements vary in size: their framing is checked as they are read
        expected = math.prod(shape) * to_numpy_dtype(datatype).itemsize
        if tensor.byte_size != expected:
            raise invalid_argument(
                f"{what}: shape {list(shape)} of {datatype} takes {expected} bytes but its {BYTE_SIZE} is "
                f"{tensor.byte_size}"
            )
    return _available(memory, what).read(tensor, what)


def check_output(memory: SharedMemory | None, tensor: SharedTensor, name: str) -> None:
    """Refuse, before the model runs, an output whose region is not registered or too small for its window."""
    what = f'Output "{name}"'
    _available(memory, what).check(tensor, what)


def write_output(memory: SharedMemory | None, tensor: SharedTensor, name: str, data: bytes) -> None:
    """Write output ``name``'s raw bytes into its region (INVALID_ARGUMENT when they do not fit)."""
    what = f'Output "{name}"'
    _available(memory, what).write(tensor, data, what)


def _available(memory: SharedMemory | None, what: str) -> SharedMemory:
    if memory is None:
        raise ServingError(Code.UNIMPLEMENTED, f"{what} asks for shared memory, which this endpoint does not offer")
    return memory
