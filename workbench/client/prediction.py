"""What a predict answers: the outputs as numpy arrays, with where they came from and how long it took."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class Prediction(dict):  # type: ignore[type-arg]
    """Output name → numpy array, with where it ran and how long the call took."""

    def __init__(
        self, outputs: Mapping[str, np.ndarray], *, model: str, version: int | None, protocol: str, latency_ms: float
    ) -> None:
        super().__init__(outputs)
        self.model, self.version, self.protocol, self.latency_ms = model, version, protocol, latency_ms

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in sorted(self.items()))
        where = f"{self.model}" + (f" v{self.version}" if self.version is not None else "")
        return f"Prediction({where} over {self.protocol}, {self.latency_ms:.2f} ms; {shapes})"
