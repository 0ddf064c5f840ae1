"""Triton's backends, as workbench serves them: which ``backend``/``platform`` a ``config.pbtxt`` may name, the
workbench platform that loads each, the file a version folder holds, and auto-complete's guess from those files.

:mod:`workbench.config.triton_model_config` reads the file format and takes this table from here
(:func:`read_config`), so a backend added to workbench is one entry below and one branch in
:mod:`workbench.platforms.triton`, with no edit on the config floor.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.config import triton_model_config
from workbench.config.triton_model_config import BackendTable, TritonConfig

ONNX, PYTHON, TENSORFLOW, PYTORCH = "onnx", "python", "tensorflow", "pytorch"
# Triton's test backends (src/test/*, the identity and repeat backends), which its QA and example clients use, served
# by stand-ins that do what those backends are documented to do (workbench.platforms.triton_stand_ins). Their
# version folders hold the backend's shared library or nothing; workbench loads no library.
IDENTITY, REPEAT, DYNA_SEQUENCE = "identity", "repeat", "dyna_sequence"
STAND_INS = frozenset({IDENTITY, REPEAT, DYNA_SEQUENCE})

DEFAULT_FILES: Mapping[str, str] = {
    ONNX: "model.onnx",
    PYTHON: "model.py",
    TENSORFLOW: "model.savedmodel",
    PYTORCH: "model.pt",  # TorchScript, as Triton's libtorch backend takes it
}

# What a model file's name says of its framework, for a default_model_filename that is not a platform's default.
_SUFFIXES: Mapping[str, str] = {
    ".onnx": ONNX,
    ".py": PYTHON,
    ".savedmodel": TENSORFLOW,
    ".pt": PYTORCH,
    ".pth": PYTORCH,
}


def detect_platform(model_folder: Path, default_model_filename: str = "") -> str | None:
    """Triton's auto-complete of a config naming no backend: the platform whose model file a version folder holds
    (the newest version first), by ``default_model_filename`` when given, else by each platform's default file."""
    try:
        versions = sorted(
            (entry for entry in model_folder.iterdir() if entry.is_dir() and entry.name.isdigit()),
            key=lambda entry: int(entry.name),
            reverse=True,
        )
    except OSError:
        return None
    for version in versions:
        if default_model_filename:
            if (version / default_model_filename).exists():
                suffix = Path(default_model_filename).suffix
                if suffix in _SUFFIXES:
                    return _SUFFIXES[suffix]
                if (version / default_model_filename / "saved_model.pb").exists():
                    return TENSORFLOW
            continue
        for platform, filename in DEFAULT_FILES.items():
            if (version / filename).exists():
                return platform
    return None


TABLE = BackendTable(
    backends={
        "onnxruntime": ONNX,
        "python": PYTHON,
        "tensorflow": TENSORFLOW,
        "pytorch": PYTORCH,
        **{name: name for name in sorted(STAND_INS)},
    },
    platforms={
        "onnxruntime_onnx": ONNX,
        "tensorflow_savedmodel": TENSORFLOW,
        "pytorch_libtorch": PYTORCH,
    },
    triton_names={
        ONNX: ("onnxruntime", "onnxruntime_onnx"),
        PYTHON: ("python", ""),
        TENSORFLOW: ("tensorflow", "tensorflow_savedmodel"),
        PYTORCH: ("pytorch", "pytorch_libtorch"),
        **{name: (name, "") for name in sorted(STAND_INS)},
    },
    default_files=DEFAULT_FILES,
    # Triton runs decoupled models in its Python backend and custom backends (the repeat test backend is one).
    decoupled=frozenset({PYTHON, REPEAT}),
    detect=detect_platform,
)


def read_config(model_folder: str | Path, auto_complete: bool = True) -> TritonConfig:
    """``<model_folder>/config.pbtxt`` read and checked against the backends workbench serves."""
    return triton_model_config.read_config(model_folder, TABLE, auto_complete)


def config_from_json(document: Mapping[str, Any], file: Path) -> TritonConfig:
    """An auto-completed config given as Triton's JSON, checked as :func:`read_config` checks the file."""
    return triton_model_config.config_from_json(document, file, TABLE)
