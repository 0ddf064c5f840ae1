"""Triton's classification extension: an output answered as its top classes instead of its values.

A request asks for it per output (``"parameters": {"classification": N}``); the output comes back as a BYTES tensor
of ``"<value>:<index>[:<label>]"`` strings, the N highest-valued elements, highest first: ``[batch, N]`` for a model
with a batch dimension (each row's elements ranked on their own), ``[N]`` without one. ``<value>`` is written as
Triton writes it (C++'s ``std::to_string``: six decimals for floating point), ``<label>`` is the line of the model's
label file for that index (a Triton config's ``label_filename``) when it has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import DEFAULT_SIGNATURE


def classify(outputs: dict[str, np.ndarray], counts: Mapping[str, int], servable: Servable) -> dict[str, np.ndarray]:
    """``outputs`` of ``servable``'s default signature, each output named in ``counts`` replaced by its top classes
    (labelled with the servable's labels; ranked per row when its signature has a batch dimension)."""
    if not counts:
        return outputs
    signature = servable.signatures.get(DEFAULT_SIGNATURE)
    batched = signature is not None and signature.batchable
    answered = dict(outputs)
    for name, count in counts.items():
        if name in answered:
            answered[name] = top_classes(answered[name], count, servable.labels.get(name, ()), batched, name)
    return answered


def top_classes(value: np.ndarray, count: int, labels: Sequence[str], batched: bool, name: str) -> np.ndarray:
    if value.dtype == np.dtype(object) or value.dtype.kind not in "biuf":
        raise ServingError(
            Code.INVALID_ARGUMENT, f'Output "{name}" holds {value.dtype} values, which cannot be ranked as classes'
        )
    rows = value.reshape(len(value), -1) if batched and value.ndim else value.reshape(1, -1)
    count = min(count, rows.shape[1])
    # A stable sort of the negated values: equal values keep their index order, as Triton's ranking does.
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :count]
    classes = np.empty(order.shape, dtype=object)
    for row, indices in enumerate(order):
        for column, index in enumerate(indices):
            text = f"{_number(rows[row, index])}:{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            classes[row, column] = text.encode()
    return classes if batched and value.ndim else classes[0]


def _number(value: np.generic) -> str:
    if isinstance(value, np.floating):
        return f"{float(value):f}"
    return str(int(value))


def requested_count(value: object, name: str) -> int:
    """A request's ``classification`` parameter of output ``name``, checked: a positive whole number."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'The classification parameter of output "{name}" must be a positive number of classes, got {value!r}',
        )
    return value
