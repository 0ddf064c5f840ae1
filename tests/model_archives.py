"""TorchServe model archives (.mar) written in the tests: a zip of ``MAR-INF/MANIFEST.json`` and the model's files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path


def write_mar(path: Path, model: dict[str, object], files: dict[str, str | bytes]) -> None:
    """An archive of a Python handler model: ``model`` is the manifest's ``model`` section (modelName, modelVersion,
    handler, ...), ``files`` what the archive holds beside the manifest (the handler's source among them)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": model}))
        for name, data in files.items():
            archive.writestr(name, data)
