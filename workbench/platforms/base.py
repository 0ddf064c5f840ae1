"""What every platform module shares: the load policy, and the files that say what a version folder holds.

Platform modules import these from here, not from the package, so the package (the registry, which imports a
platform's module only when one of its versions loads) and its modules never import each other.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from workbench.config.triton_model_config import CONFIG_FILE

VERSION_CONFIG = "workbench.json"
HANDLER_FILE = "handler.py"
TRITON_CONFIG = CONFIG_FILE  # beside the version folders: a Triton model (workbench.platforms.triton)


@dataclasses.dataclass(frozen=True)
class LoadPolicy:
    """What a server may execute from a repository, beyond model files that are data.

    Pickles (``model.joblib``, ``model.pkl``) and Python files (``model.py``, ``handler.py``) run code when loaded:
    whoever can write the repository can run anything in the server. They load only when allowed.

    Also where the server places what it loads: the device PyTorch models run on (``--pytorch_device``) and
    PyTorch's threads per call (``--pytorch_threads``; 0, the default outside a server, leaves the process's own).
    """

    allow_pickle: bool = False
    allow_python: bool = False
    pytorch_device: str = "auto"
    pytorch_threads: int = 0
    auto_complete_config: bool = True  # Triton's config auto-complete (--disable_auto_complete_config turns it off)
    prefer_tflite_model: bool = False  # TF Serving's: a folder's model.tflite serves instead of its SavedModel
    tflite_interpreters: int = 1  # TF Lite interpreters per version (each runs one call at a time)
    # Tokens a generator's iteration runs at most (decode steps and a chunk of prompts; 0: the platform's default).
    max_batched_tokens: int = 0


PICKLE_SETTING = "--allow_pickle (Server(allow_pickle=True), %serve start --allow-pickle)"
PYTHON_SETTING = "--allow_python_models (Server(allow_python_models=True), %serve start --allow-python-models)"


def remove_folders_except(store: Path, kept: set[str]) -> None:
    """Remove the folders of ``store`` not named in ``kept``: what a platform unpacked for models that are gone."""
    try:
        entries = list(store.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.is_dir() and entry.name not in kept:
            shutil.rmtree(entry, ignore_errors=True)
