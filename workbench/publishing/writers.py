"""Which platform writes a model, and its writer of the version folder.

Every platform's module says whether a model is its own (``exports``) and writes it (``write``); one that takes
formats or options of its own also has ``writer(model, request)`` (:mod:`workbench.platforms.export_request`), and its
:class:`~workbench.platforms.Platform` entry names them. Nothing here knows a framework: a new platform's models are
exported once its module is registered.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import workbench.platforms as platforms
from workbench.platforms.export_request import ExportRefused, ExportRequest, VersionWriter
from workbench.publishing.export_errors import ExportError

__all__ = ["platform_writer", "write_version"]

# The platform that writes what no other platform's exports() takes: TensorFlow's traces any function or module.
_FALLBACK = "tensorflow"
# Neither is asked in turn: the fallback comes last, and the null platform writes nothing.
_NOT_WRITERS = (_FALLBACK, "workbench_null")


def platform_writer(
    model: Any,
    format: str | None,
    signatures: Mapping[str, Any] | None,
    examples: Any,
    example_inputs: Any = None,
    options: Mapping[str, Any] | None = None,
) -> VersionWriter:
    """How to write ``model``: its platform's writer, else the fallback platform's (TensorFlow's SavedModel route).

    ``example_inputs`` are what a platform that traces its models takes (else it reads ``examples``); ``options``
    the keywords only some platforms take (given ones only: ``tokenizer``, ``task``).
    """
    given = {key: value for key, value in (options or {}).items() if value is not None}
    request = ExportRequest(format, signatures, examples, example_inputs, given)
    try:
        found = _writer(model, request)
        if found is None:
            fallback: VersionWriter = importlib.import_module(platforms.get(_FALLBACK).module).writer(model, request)
            return fallback
        return found
    except ExportRefused as refused:
        raise export_error(refused) from refused.__cause__


def write_version(write: VersionWriter, folder: Path) -> None:
    """Run a platform's writer on the version folder ``folder``; what it refuses is an ExportError."""
    try:
        write(folder)
    except ExportRefused as refused:
        raise export_error(refused) from refused.__cause__


def export_error(refused: ExportRefused) -> ExportError:
    """A platform's refusal as workbench.export's error, with the same message (and the cause the refusal had)."""
    return ExportError(str(refused))


def _writer(model: Any, request: ExportRequest) -> VersionWriter | None:
    writing = _writing_platforms()
    # A platform whose models take options of their own judges its models first (their formats and options).
    for platform, module in writing:
        if platform.export_options and module.exports(model):
            own: VersionWriter | None = module.writer(model, request)
            if own is not None:
                return own
    registry = platforms.registry().values()
    for option in request.options:  # given for a model whose platform does not take it
        takers = [p.name for p in registry if option in p.export_options]
        raise ExportRefused(f"{option}= is for {', '.join(takers) or 'no'} models; this is a {type(model).__name__}")
    asked = next((p for p in registry if request.format and request.format in p.export_formats), None)
    takes_example_inputs = [p for p in registry if "example_inputs" in p.export_options]
    if request.example_inputs is not None and (asked is None or asked not in takes_example_inputs):
        # Given for a model of no platform that takes them: the writers of those that do say why not.
        for platform, module in writing:
            if platform in takes_example_inputs:
                module.writer(model, request)
        raise ExportRefused(f"example_inputs= is for {', '.join(p.name for p in takes_example_inputs)} models")
    if asked is not None and asked.name not in _NOT_WRITERS:
        converted: VersionWriter | None = getattr(_module(asked), "writer", _no_writer)(model, request)
        if converted is not None:
            return converted
    if request.format not in (None, *platforms.get(_FALLBACK).export_formats):
        raise ExportRefused(
            f"format must be {_formats(writing)}, or left out (the model's own platform), not {request.format!r}"
        )
    if request.format is None:
        for platform, module in writing:
            exports = getattr(module, "exports", None)
            if exports is not None and exports(model):
                if request.signatures:
                    raise ExportRefused(
                        f"signatures= is for TensorFlow models; a {platform.name} model declares its own"
                    )
                return functools.partial(module.write, model)
    return None


def _writing_platforms() -> list[tuple[platforms.Platform, ModuleType]]:
    """The platforms whose modules write versions, in the registry's order, with their modules."""
    found = []
    for platform in platforms.registry().values():
        if platform.name in _NOT_WRITERS:
            continue
        module = _module(platform)
        if module is not None:
            found.append((platform, module))
    return found


def _module(platform: platforms.Platform) -> ModuleType | None:
    try:
        return importlib.import_module(platform.module)
    except ImportError:  # a platform plugin whose own module cannot import: it cannot take the model
        return None


def _no_writer(model: Any, request: ExportRequest) -> None:
    return None


def _formats(writing: list[tuple[platforms.Platform, ModuleType]]) -> str:
    """The formats platforms write, for a message: "'onnx', 'pt2' or 'torchscript' (PyTorch modules)"."""
    described = []
    for platform, _ in writing:
        if platform.export_formats:
            quoted = " or ".join(repr(name) for name in platform.export_formats)
            described.append(f"{quoted} ({platform.exported_objects})" if platform.exported_objects else quoted)
    return ", ".join(described)
