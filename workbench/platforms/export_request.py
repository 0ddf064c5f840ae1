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


class ExportRefused(Exception):
    """A platform takes the model (or the format asked for) but cannot write it as asked: ``workbench.export``
    raises an ``ExportError`` with this message."""
