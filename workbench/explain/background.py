"""The background data set of a model version: rows SHAP compares an explained row with.

Stored beside the version's model as ``explain_background.npy`` (numpy's format, read without pickle), written by
``workbench.export(model, name, background=X_train[:100])`` or by hand. LinearExplainer takes its mean as the
reference; KernelExplainer runs the model on it (at most :data:`~workbench.explain.shapley.MAX_BACKGROUND` rows, a
sample when there are more). TreeExplainer and integrated gradients need none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError

BACKGROUND_FILE = "explain_background.npy"


def write_background(folder: str | Path, rows: Any) -> Path:
    """Write ``rows`` (anything numpy reads as a numeric array, a DataFrame's values included) into ``folder``."""
    values = np.asarray(getattr(rows, "values", rows))
    if values.dtype.kind not in "biuf" or values.ndim < 2 or len(values) == 0:
        raise ValueError(
            f"background must be a non-empty numeric array of rows (shape [rows, ...]); got {values.dtype} "
            f"{values.shape}"
        )
    path = Path(folder) / BACKGROUND_FILE
    np.save(path, values, allow_pickle=False)
    return path


def read_background(folder: str | Path) -> np.ndarray | None:
    """The version's background rows, or None when it has none."""
    path = Path(folder) / BACKGROUND_FILE
    if not path.is_file():
        return None
    try:
        return np.load(path, allow_pickle=False)  # type: ignore[no-any-return]
    except (OSError, ValueError) as exc:
        raise ServingError(Code.DATA_LOSS, f"Could not read the background data set {path}: {exc}") from None
