"""Which platform writes a model, and its writer of the version folder (None: the SavedModel route).

Every platform's module says whether a model is its own (``exports``) and writes it (``write``); one that takes
formats or options of its own also has ``writer(model, request)`` (:mod:`workbench.platforms.export_request`), and its
:class:`~workbench.platforms.Platform` entry names them. Nothing here knows a framework: a new platform's models are
exported once its module is registered.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from workbench import platforms
from workbench.platforms.export_request import ExportRefused, ExportRequest, VersionWriter
from workbench.publishing.errors import ExportError

__all__ = ["platform_writer"]

# The SavedModel route is workbench.publishing.saved_model's; the null platform writes nothing.
_NOT_WRITERS = ("tensorflow", "workbench_null")


def platform_writer(
    model: Any, format: str | None, signatures: Mapping[str, Any] | None, examples: Any, example_inputs: Any = None
) -> VersionWriter | None:
    """How to write ``model`` if a platform other than TensorFlow's takes it (None: the SavedModel route).

    ``example_inputs`` are what a platform that traces its models takes (PyTorch's; else ``examples``).
    """
    try:
        return _writer(model, ExportRequest(format, signatures, examples, example_inputs))
    except ExportRefused as refused:
        raise ExportError(str(refused)) from None


def _writer(model: Any, request: ExportRequest) -> VersionWriter | None:
    writing = _writing_platforms()
    # A platform whose models take options of their own judges its models first (their formats and options).
    for platform, module in writing:
        if platform.export_options and module.exports(model):
            own: VersionWriter | None = module.writer(model, request)
            if own is not None:
                return own
    registry = platforms.registry().values()
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
    if request.format not in (None, *platforms.get("tensorflow").export_formats):
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
