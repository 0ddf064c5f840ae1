"""How a data file's columns become a signature's inputs, and which rows cannot.

Decided once per job from the first file's columns (:func:`feeding_for`), in this order:

1. ``columns`` renames file columns first (``{"pixels": "x"}``).
2. A model that names its features (scikit-learn's ``feature_names_in_``) takes them by name, as a columnar REST
   request may send them.
3. Columns named as the signature's inputs feed those inputs (a 2-D column is a row of a matrix input).
4. A signature whose one input is a string takes a TFRecord file's serialized ``tf.Example`` records.
5. A signature with one input takes every other column, stacked in the file's order (a CSV of 64 pixel columns for
   a ``[-1, 64]`` matrix; a ``.npy`` file's one array).

Anything else is refused before a row runs, naming the columns the file has and the inputs the model wants. Rows
are then cast to the input's type one column at a time; a value that does not cast (text in a number column, a
missing value) fails its row alone, with the reason, and the others run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from workbench.batch_prediction.formats import RECORD_COLUMN
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature

RowErrors = dict[int, str]  # row (within the rows given) → why it cannot run


@dataclasses.dataclass(frozen=True)
class Feeding:
    """What each name sent to the model (an input alias or a feature) is made of: one column, or several stacked."""

    sources: dict[str, tuple[str, ...]]
    dtypes: dict[str, np.dtype]
    renames: dict[str, str]

    def feed(self, columns: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RowErrors]:
        """The tensors for the rows that can run (those not in the errors), in their order."""
        renamed = {self.renames.get(name, name): value for name, value in columns.items()}
        rows = len(next(iter(renamed.values()))) if renamed else 0
        errors: RowErrors = {}
        cast: dict[str, np.ndarray] = {}
        for sent, sources in self.sources.items():
            missing = [name for name in sources if name not in renamed]
            if missing:
                raise ServingError(
                    Code.INVALID_ARGUMENT,
                    f"The input has no column {', '.join(missing)} (it has {', '.join(renamed) or 'none'})",
                )
            parts = [_cast(renamed[name], self.dtypes[sent], name, errors) for name in sources]
            cast[sent] = parts[0] if len(parts) == 1 else _side_by_side(parts, rows)
        if errors:
            keep = np.ones(rows, dtype=bool)
            keep[list(errors)] = False
            cast = {name: value[keep] for name, value in cast.items()}
        return cast, errors


def feeding_for(
    signature: Signature, first_rows: Mapping[str, np.ndarray], renames: Mapping[str, str], id_column: str | None
) -> Feeding:
    """How a file's columns (``first_rows``: some of its rows, its columns in order) feed ``signature``; refused
    where they cannot."""
    columns = list(first_rows)
    unknown = [name for name in renames if name not in columns]
    if unknown:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"--columns names {', '.join(unknown)}, which the input does not have (it has {', '.join(columns)})",
        )
    if id_column is not None and id_column not in columns:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"The id column {id_column} is not in the input (it has {', '.join(columns)})"
        )
    renamed = [renames.get(name, name) for name in columns]
    data = [name for name in renamed if name not in (id_column, RECORD_COLUMN)]
    inputs = signature.inputs
    required = [alias for alias in inputs if alias not in signature.defaults]
    features = list(signature.features)
    if features and len(inputs) == 1 and all(f in renamed for f in features):
        (matrix,) = inputs.values()
        return Feeding({f: (f,) for f in features}, {f: matrix.dtype for f in features}, dict(renames))
    if required and all(alias in renamed for alias in required):
        chosen = [alias for alias in inputs if alias in renamed]
        return Feeding({a: (a,) for a in chosen}, {a: inputs[a].dtype for a in chosen}, dict(renames))
    if len(inputs) == 1:
        ((alias, spec),) = inputs.items()
        if spec.dtype.kind == "O" and RECORD_COLUMN in renamed:
            return Feeding({alias: (RECORD_COLUMN,)}, {alias: spec.dtype}, dict(renames))
        if data:
            values = {renames.get(name, name): value for name, value in first_rows.items()}
            width = sum(int(np.prod(values[name].shape[1:], dtype=np.int64)) for name in data)
            takes = spec.shape[-1] if spec.shape is not None and len(spec.shape) == 2 else -1
            if takes < 0 or width == takes:
                return Feeding({alias: tuple(data)}, {alias: spec.dtype}, dict(renames))
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"The input's columns ({', '.join(data)}) make rows of {width} values; {alias} takes {takes}. Name "
                "the columns after the model's inputs, or map them with --columns (file_column=input)",
            )
    wanted = ", ".join(f"{a} ({s.dtype_name}{list(s.shape) if s.shape is not None else ''})" for a, s in inputs.items())
    raise ServingError(
        Code.INVALID_ARGUMENT,
        f"The input's columns ({', '.join(columns)}) do not name the model's inputs: {wanted}. Name columns after "
        "the inputs, or map them with --columns (file_column=input)",
    )


def _side_by_side(parts: list[np.ndarray], rows: int) -> np.ndarray:
    """The columns ``parts`` (1-D, or 2-D: several values a row) as the rows of one matrix.

    Each column is copied whole into a row of a (values, rows) array, and the matrix is its transpose: a view, in
    Fortran order, which numpy's arithmetic and scikit-learn take as it is (a framework that wants C order copies
    one batch at a time, in the cache). ``np.stack(axis=1)`` writes a C-ordered matrix with a stride of one row per
    column, several times slower on a table of 64 columns.
    """
    return np.concatenate([p.reshape(rows, -1).T for p in parts]).T


def _cast(column: np.ndarray, dtype: np.dtype, name: str, errors: RowErrors) -> np.ndarray:
    """``column`` as ``dtype``; a value that does not cast puts its row in ``errors`` (and a placeholder here)."""
    if dtype.kind == "O":  # the model takes strings: bytes, as TensorFlow's string tensors hold them
        return np.array([v.encode() if isinstance(v, str) else v for v in column], dtype=object).reshape(column.shape)
    if column.dtype.kind in "biuf" and not (dtype.kind in "iub" and column.dtype.kind == "f"):
        return column.astype(dtype, copy=False)
    try:
        return _strict(column, dtype)
    except (ValueError, TypeError, OverflowError):
        pass
    # Some value does not cast: find which, row by row (only for the columns that hold one).
    out = np.zeros(column.shape, dtype=dtype)
    for row, value in enumerate(column):
        try:
            out[row] = _strict(np.asarray(value), dtype)
        except (ValueError, TypeError, OverflowError):
            errors.setdefault(row, f"column {name}: {_shown(value)} is not a {np.dtype(dtype).name}")
    return out


def _strict(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast refusing what would change a value: a missing one, text that is no number, a fraction to an integer."""
    if values.dtype.kind == "O":
        if any(v is None or (isinstance(v, float) and np.isnan(v)) for v in values.flat):
            raise ValueError("missing")
        values = np.array(values.tolist(), dtype=np.float64 if dtype.kind == "f" else None)
        if values.dtype.kind in "OUS":
            values = values.astype(np.float64)  # text that is a number casts; any other text raises here
    if dtype.kind in "iub" and values.dtype.kind == "f" and not np.isfinite(values).all():
        raise ValueError("not finite")
    cast = values.astype(dtype)
    if dtype.kind in "iub" and values.dtype.kind == "f" and not np.array_equal(cast, values):
        raise ValueError("not an integer")
    return cast


def _shown(value: object) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "a missing value"
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_column_map(text: str) -> dict[str, str]:
    """``--columns``' text, ``column=input[,column=input...]``, as a mapping; ValueError for anything else."""
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        column, sep, name = item.partition("=")
        if not sep or not column or not name:
            raise ValueError(f"--columns takes column=input pairs, not {item!r}")
        pairs[column] = name
    return pairs
