"""Small PyTorch networks the PyTorch tests serve, and their inputs; importable without TensorFlow (the GPU machine's
tests, tests/wire/test_pytorch_cuda.py, run where there is none)."""

from __future__ import annotations

import numpy as np
import torch


class DigitsMLP(torch.nn.Module):
    """64 pixels → 10 class probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(64, 32)
        self.out = torch.nn.Linear(32, 10)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.out(torch.relu(self.hidden(pixels))), dim=-1)


class Pair(torch.nn.Module):
    """Two named inputs of two dtypes, a dict of outputs of two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, features: torch.Tensor, counts: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.linear(features) * counts.unsqueeze(-1).to(features.dtype)
        return {"scores": scores, "best": scores.argmax(dim=-1)}


def pair_inputs(rows: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` rows of Pair's inputs, from row ``start`` of a fixed sequence."""
    features = (np.arange(start * 4, (start + rows) * 4, dtype=np.float32).reshape(rows, 4) % 7) / 3
    counts = (np.arange(start, start + rows, dtype=np.int64) % 5) + 1
    return features, counts
