"""Batching parameters: TF Serving's ``BatchingParameters`` text proto, with its fields and defaults.

Parsed with protobuf's ``text_format`` into the message declared in :mod:`workbench.config.tf_serving_protos`, then
validated with messages that say which field is wrong.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from workbench.config.text_config import parse_text_config
from workbench.config.tf_serving_protos import BatchingParameters as BatchingParametersProto
from workbench.core.errors import Code, ServingError

BATCHING_FILE_NAME = "batching_parameters.txt"


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching knobs with its defaults (``num_batch_threads``: the number of cores)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = 0  # 0: max_batch_size

    @property
    def execution_batch_size(self) -> int:
        """The most rows one TensorFlow call runs on."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size:
            return self.max_execution_batch_size
        return self.max_batch_size

    @property
    def max_enqueued_rows(self) -> int:
        return self.max_enqueued_batches * self.execution_batch_size

    def validate(self, where: str) -> BatchingParameters:
        def fail(detail: str) -> ServingError:
            return ServingError(Code.INVALID_ARGUMENT, f"Invalid batching parameters in {where}: {detail}")

        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) <= 0:
                raise fail(f"{name} must be positive, got {getattr(self, name)}")
        if self.batch_timeout_micros < 0:
            raise fail("batch_timeout_micros must not be negative")
        if self.max_execution_batch_size < 0:
            raise fail("max_execution_batch_size must not be negative")
        if self.max_execution_batch_size and not self.enable_large_batch_splitting:
            raise fail("max_execution_batch_size needs enable_large_batch_splitting { value: true }")
        if self.allowed_batch_sizes:
            sizes = self.allowed_batch_sizes
            if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)) or sizes[0] <= 0:
                raise fail(f"allowed_batch_sizes must be positive and increasing, got {list(sizes)}")
            if sizes[-1] != self.execution_batch_size:
                raise fail(
                    f"the last entry of allowed_batch_sizes ({sizes[-1]}) must equal "
                    f"{'max_execution_batch_size' if self.max_execution_batch_size else 'max_batch_size'} "
                    f"({self.execution_batch_size})"
                )
        return self


def parse_batching_parameters(text: str, where: str = "batching parameters") -> BatchingParameters:
    proto = parse_text_config(text, BatchingParametersProto(), where)
    defaults = BatchingParameters()
    values: dict[str, Any] = {}
    for field in (
        "max_batch_size",
        "batch_timeout_micros",
        "max_enqueued_batches",
        "num_batch_threads",
        "pad_variable_length_inputs",
        "enable_large_batch_splitting",
        "max_execution_batch_size",
    ):
        if proto.HasField(field):
            values[field] = getattr(proto, field).value
    values["allowed_batch_sizes"] = tuple(proto.allowed_batch_sizes)
    return dataclasses.replace(defaults, **values).validate(where)


def read_batching_parameters_file(path: str | os.PathLike[str]) -> BatchingParameters:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"Could not read batching parameters file {path}: {exc.strerror}") from None
    return parse_batching_parameters(text, str(path))


def model_batching_parameters(base_path: str) -> BatchingParameters | None:
    """Per-model parameters from ``<base_path>/batching_parameters.txt``, if the model has that file."""
    path = Path(base_path, BATCHING_FILE_NAME)
    return read_batching_parameters_file(path) if path.is_file() else None
