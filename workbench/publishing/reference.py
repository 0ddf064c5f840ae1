"""The drift reference an export stores beside a version: the training inputs served traffic is compared with.

``export(model, "m", reference=X_train)`` writes ``assets.extra/drift_reference.npz`` in the version folder (the
folder of warmup requests, which every platform's loader leaves alone): one array per input alias, rows first, or
one array under ``"*"`` for a bare batch (the signature's only input, whatever its alias). A DataFrame is its
values (the columns in order). The server's drift monitor (:mod:`workbench.observability.drift_monitor`) reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workbench.observability.drift_monitor import ONLY_INPUT, REFERENCE_FILE
from workbench.publishing.export_errors import ExportError, one_line

MAX_ROWS = 100_000  # more rows would only be subsampled by the server


def write_reference(version_dir: Path, reference: Any) -> None:
    arrays = _arrays(reference)
    for alias, array in arrays.items():
        if array.ndim == 0 or len(array) == 0:
            raise ExportError(f"reference[{alias!r}] must hold rows (a batch), got shape {list(array.shape)}")
        if array.dtype.kind == "O":
            arrays[alias] = array.astype(str)  # npz holds no Python objects (they would need pickle to read)
    rows = {len(a) for a in arrays.values()}
    if len(rows) > 1:
        raise ExportError(f"reference's inputs have different numbers of rows: {sorted(rows)}")
    path = version_dir / REFERENCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    kept: dict[str, Any] = {alias: a[:MAX_ROWS] for alias, a in arrays.items()}
    np.savez_compressed(path, **kept)


def _arrays(reference: Any) -> dict[str, np.ndarray]:
    try:
        if isinstance(reference, Mapping):
            if not reference:
                raise ExportError("reference is an empty dict: pass input name → rows, or one batch")
            return {str(alias): np.asarray(value) for alias, value in reference.items()}
        if hasattr(reference, "to_numpy"):  # a pandas DataFrame or Series
            return {ONLY_INPUT: np.asarray(reference.to_numpy())}
        return {ONLY_INPUT: np.asarray(reference)}
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"reference is not an array or a dict of arrays: {one_line(exc)}") from exc
