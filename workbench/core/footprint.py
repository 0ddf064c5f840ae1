"""Bytes of host memory and of GPU memory: what a memory budget charges a version, and what a version may say it holds.

On the ground floor so that a servable (:meth:`~workbench.core.servable.Servable.memory_held`) can answer in the
budget's own terms without the config floor above it (:mod:`workbench.config.memory_budget` bounds footprints).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes of host memory and of GPU memory (all devices together)."""

    host: int = 0
    gpu: int = 0

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.host + other.host, self.gpu + other.gpu)

    def __sub__(self, other: Footprint) -> Footprint:
        return Footprint(self.host - other.host, self.gpu - other.gpu)

    def describe(self) -> str:
        return format_bytes(self.host) + (f" (+{format_bytes(self.gpu)} on GPUs)" if self.gpu else "")


def format_bytes(count: int) -> str:
    """``123456789`` → ``117.7 MiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop always returns
