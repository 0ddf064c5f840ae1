"""What a load sends: one request's inputs typed in, real data from a file, or random tensors of given shapes.

- ``--inputs '{"x": [[1.0]]}'``: one request, sent again and again.
- ``--input_data FILE``: several requests, sent in turn. A ``.json`` file in perf_analyzer's form,
  ``{"data": [{"x": [..]}, {"x": {"content": [..], "shape": [2, 3]}}, ...]}`` (one object a request, an input's value
  a nested list, or flat ``content`` with its ``shape``); a ``.npy`` file (the model's one input) or ``.npz`` file
  (an array per input, by name), cut into requests of ``rows_per_request`` rows each.
- ``--shape x:1,28,28``: random values of each input's type (``[0, 1)`` for floats, ``0..9`` for integers), of the
  shape given, for every input the signature has (perf_analyzer's ``--shape``).

Values are typed as the model's signature says (``dtypes``), so JSON numbers go as the model takes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

Inputs = dict[str, np.ndarray]


def typed(values: Mapping[str, Any], dtypes: Mapping[str, np.dtype[Any]]) -> Inputs:
    """``values`` as arrays of the signature's types; a name the signature lacks is refused."""
    unknown = sorted(set(values) - set(dtypes))
    if unknown:
        raise ValueError(f"the signature has no input {', '.join(unknown)} (it has {', '.join(sorted(dtypes))})")
    return {name: np.asarray(value, dtype=dtypes[name]) for name, value in values.items()}


def from_file(path: str, dtypes: Mapping[str, np.dtype[Any]], rows_per_request: int = 1) -> list[Inputs]:
    """The requests of an ``--input_data`` file (see the module's docstring)."""
    if rows_per_request < 1:
        raise ValueError("rows a request must be at least 1")
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return _from_json(path, dtypes)
    if suffix in (".npy", ".npz"):
        if suffix == ".npy":
            if len(dtypes) != 1:
                raise ValueError(f"a .npy file feeds a model of one input; this one has {', '.join(sorted(dtypes))}")
            arrays = {next(iter(dtypes)): np.load(path, allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        rows = {len(array) for array in arrays.values()}
        if len(rows) != 1 or 0 in rows:
            raise ValueError(f"{path}: its arrays must have the same number of rows, at least one")
        count = rows.pop()
        return [
            typed({name: array[start : start + rows_per_request] for name, array in arrays.items()}, dtypes)
            for start in range(0, count, rows_per_request)
        ]
    raise ValueError(f"{path}: --input_data is a .json, .npy or .npz file")


def _from_json(path: str, dtypes: Mapping[str, np.dtype[Any]]) -> list[Inputs]:
    doc = json.loads(Path(path).read_text())
    entries = doc.get("data") if isinstance(doc, dict) and "data" in doc else doc
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries or not all(isinstance(entry, dict) for entry in entries):
        raise ValueError(f'{path}: expected {{"data": [{{input: value, ...}}, ...]}}, as perf_analyzer reads')
    requests = []
    for entry in entries:
        values = {}
        for name, value in entry.items():
            if isinstance(value, dict) and "content" in value:  # flat values and their shape
                values[name] = np.asarray(value["content"]).reshape(value.get("shape", [-1]))
            else:
                values[name] = value
        requests.append(typed(values, dtypes))
    return requests


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``--shape NAME:D1,D2,...`` items as shapes by input name."""
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        try:
            shape = tuple(int(dim) for dim in dims.split(",")) if sep and name else ()
        except ValueError:
            shape = ()
        if not shape or any(dim < 1 for dim in shape):
            raise ValueError(f"--shape is NAME:D1[,D2...] of positive sizes, not {item!r}")
        shapes[name] = shape
    return shapes


def random_inputs(shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, np.dtype[Any]], seed: int = 0) -> Inputs:
    """Random values of every input of the signature, of the shapes given (each input needs one)."""
    missing = sorted(set(dtypes) - set(shapes))
    if missing:
        raise ValueError(f"--shape is needed for every input: {', '.join(missing)} has none")
    rng = np.random.default_rng(seed)
    values: dict[str, Any] = {}
    for name, shape in shapes.items():
        dtype = dtypes.get(name)
        if dtype is None:
            raise ValueError(f"the signature has no input {name} (it has {', '.join(sorted(dtypes))})")
        if dtype.kind == "f":
            values[name] = rng.random(shape)
        elif dtype.kind in "iu":
            values[name] = rng.integers(0, 10, shape)
        elif dtype.kind == "b":
            values[name] = rng.random(shape) < 0.5
        else:
            values[name] = np.full(shape, b"x", dtype=object)
    return typed(values, dtypes)


def rows_of(inputs: Inputs) -> int:
    """Rows in a request (its inputs' first dimension; 1 for scalars): perf_analyzer's inferences a request."""
    firsts = {value.shape[0] for value in inputs.values() if value.ndim}
    return max(firsts) if firsts else 1
