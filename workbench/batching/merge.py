"""Requests merged into one batch along dimension 0, and the batch's outputs split back: pure functions on numpy.

Requests merge when their inputs have the same aliases, dtypes and trailing dimensions (:func:`batch_key`; with
``pad_variable_length_inputs``, the same ranks, shorter ones padded). ``allowed_batch_sizes`` pads a batch up with
copies of its last row, cut off again when the outputs are split; an output whose dimension 0 is not the batch's
cannot be split and is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import OMITTED

Feed = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]


def batch_key(feed: Feed, pad: bool) -> tuple[Any, ...] | None:
    """Tasks with equal keys can be concatenated along dimension 0; None: this one cannot batch at all."""
    rows = None
    key: list[tuple[str, str, Any]] = []
    for alias in sorted(feed):
        value = feed[alias]
        if value is OMITTED:  # an optional input left out: merges only with requests that left it out too
            key.append((alias, "omitted", ()))
            continue
        if value.ndim == 0:
            return None
        if rows is None:
            rows = value.shape[0]
        elif value.shape[0] != rows:
            return None
        key.append((alias, value.dtype.str, value.ndim if pad else value.shape[1:]))
    return tuple(key) if rows else None


def _pad_to(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if value.shape[1:] == shape:
        return value
    widths = [(0, 0)] + [(0, target - have) for have, target in zip(value.shape[1:], shape, strict=True)]
    fill: Any = b"" if value.dtype.kind == "O" else 0
    return np.pad(value, widths, constant_values=fill)


def merge(feeds: Sequence[Feed], pad_variable_length: bool, padded_rows: int) -> dict[str, np.ndarray]:
    """Concatenate the tasks' inputs along dimension 0 (padding as asked) up to ``padded_rows`` rows."""
    merged: dict[str, np.ndarray] = {}
    for alias in feeds[0]:
        parts = [feed[alias] for feed in feeds]
        if parts[0] is OMITTED:  # left out by every one of them (batch_key)
            merged[alias] = OMITTED
            continue
        if pad_variable_length:
            shape = tuple(max(dims) for dims in zip(*(p.shape[1:] for p in parts), strict=True))
            parts = [_pad_to(p, shape) for p in parts]
        value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        extra = padded_rows - value.shape[0]
        if extra > 0:  # allowed_batch_sizes: repeat the last row; its results are cut off again
            value = np.concatenate([value, np.repeat(value[-1:], extra, axis=0)], axis=0)
        merged[alias] = value
    return merged


def check_batched_outputs(outputs: Outputs, padded_rows: int) -> None:
    """Refuse outputs whose dimension 0 is not the batch's (a batch of one too: it must not depend on the load)."""
    for alias, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != padded_rows:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Batched output tensor {alias} has shape {list(value.shape)}: its 0th dimension does not equal "
                f"the {padded_rows} rows of the batched inputs, so results cannot be split between requests "
                "(turn batching off for this model)",
            )


def split(outputs: Outputs, sizes: Sequence[int], padded_rows: int) -> list[Outputs]:
    """Each task's own rows of every output."""
    check_batched_outputs(outputs, padded_rows)
    results: list[Outputs] = []
    start = 0
    for size in sizes:
        results.append({alias: value[start : start + size] for alias, value in outputs.items()})
        start += size
    return results


def padded_size(rows: int, allowed: Sequence[int]) -> int:
    for size in allowed:
        if size >= rows:
            return size
    return rows
