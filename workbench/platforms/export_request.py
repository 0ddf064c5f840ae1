"""What ``workbench.export`` hands a platform's module that writes models itself, and how the module says no.

A platform module that writes a version folder needs at least ``exports(model) -> bool`` and ``write(model,
folder)``: ``workbench.export`` finds the model's platform by asking each module. A module whose models take export
options of their own (PyTorch's ``format`` and ``example_inputs``), or that writes a ``format`` other platforms' models
are converted to (ONNX), also has ``writer(model, request) -> VersionWriter | None``, given an :class:`ExportRequest`;
its :class:`~workbench.platforms.Platform` entry names those formats and options. The generic flow (numbered versions,
the check, atomic publishing) stays in :mod:`workbench.publishing`, which the platforms floor never imports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Writes the model into the empty version folder it is given.
VersionWriter = Callable[[Path], None]


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    """The export's options that a platform may read: ``workbench.export``'s keywords of the same names."""

    format: str | None
    signatures: Mapping[str, Any] | None
    examples: Any
    example_inputs: Any
    # The keywords only some platforms take (a transformers model's ``tokenizer`` and ``task``), those given: a
    # platform entry's ``export_options`` names those its writer reads.
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class ExportRefused(Exception):
    """A platform takes the model (or the format asked for) but cannot write it as asked: ``workbench.export``
    raises an ``ExportError`` with this message."""


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (TensorFlow's run with node dumps over many lines), bounded."""
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) else str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 400 else first[:397] + "..."


def estimated_bytes(writer: VersionWriter) -> int:
    """What ``writer`` writes at least, where it can tell before writing (its ``estimated_bytes()``: a SavedModel's
    variables), else 0: a full disk's message names it."""
    estimate = getattr(writer, "estimated_bytes", None)
    return int(estimate()) if callable(estimate) else 0
