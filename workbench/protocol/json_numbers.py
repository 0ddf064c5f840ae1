"""numpy outputs written by orjson, where its bytes are exactly those of :func:`workbench.protocol.json_tensor.dumps`.

TF Serving's REST answers print floats in their shortest round-trip form, float32 as float32 ("0.1", not
0.10000000149011612), with ``NaN`` and ``Infinity`` tokens. :mod:`~workbench.protocol.json_tensor` gets that from
Python's ``repr`` through ``json.dumps``, after turning each float32 into the float64 of its shortest decimal:
about a microsecond an element, in Python. orjson writes numpy arrays in C with the same shortest digits, but not
always in the same notation: it writes 1e-05 as ``0.00001`` and switches to exponents at 1e13 (float32) or 1e16,
and it writes NaN as ``null``. So it is used only where the two agree digit for digit, checked here per array: a
float array whose every value is 0 or has a magnitude in [1e-4, 1e12), every integer and boolean array, keys that
need no escaping. Anything else (bytes and strings, float16, NaN, 1e-7, a non-contiguous view) returns None, and
the caller writes it as before. ``tests/unit/test_json_numbers.py`` holds the two writers to the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

# Where orjson's and repr's notations agree (both positional); checked on millions of values each side of both ends.
_SMALLEST = 1e-4  # repr writes 1e-05 below it, orjson 0.00001
_LARGEST = 1e12  # orjson writes float32 as 1e+13 from there (float64 from 1e16); a margin below it
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# JSON keys both writers leave as they are: printable ASCII without the quote and the backslash.
_PLAIN_KEY = re.compile(r"[ !#-\[\]-~]*")
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def fits(array: np.ndarray) -> bool:
    """Whether orjson writes ``array`` exactly as :func:`json_tensor.to_json_value` and ``dumps`` would."""
    kind = array.dtype.kind
    if kind in "iub":
        return array.ndim > 0 and array.flags.c_contiguous
    if array.dtype not in _FLOATS or array.ndim == 0 or not array.flags.c_contiguous:
        return False
    if array.size <= 8:  # a few values: Python compares them faster than numpy starts a reduction
        return all(v == 0.0 or _SMALLEST <= abs(v) < _LARGEST for v in array.ravel().tolist())
    magnitude = np.abs(array)
    if not magnitude.max() < _LARGEST:  # NaN fails this too
        return False
    if magnitude.min() >= _SMALLEST:
        return True
    nonzero = magnitude[magnitude != 0]
    return nonzero.size == 0 or bool(nonzero.min() >= _SMALLEST)


def plain_keys(names: Iterable[str]) -> bool:
    return all(_PLAIN_KEY.fullmatch(name) for name in names)


def dumps(doc: Any) -> bytes:
    """``doc`` (dicts, lists, arrays that :func:`fits` and plain keys) as compact JSON."""
    return orjson.dumps(doc, option=_OPTIONS)
