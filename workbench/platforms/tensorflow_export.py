"""A TensorFlow model (Keras 3, ``tf.Module``, a function) traced to serving functions and saved as a SavedModel.

**How models are saved.** Keras 3, ``tf.Module`` and function models all take one route: the serving functions are
traced to concrete functions, and a fresh ``tf.Module`` that tracks exactly the ``tf.Variable``\\ s those functions
capture (plus lookup tables and assets found under the model) is saved with them as signatures. Saving the Keras
model object itself (a ``tf.Module`` attribute holding it, or ``tf.saved_model.save(model)``) does not work for the
server: Keras 3 variables are tracked twice, the checkpoint restores into a second set of handles, and a TF1-style
session load then fails with "Could not find variable ...". ``model.export(format="tf_saved_model")`` and
``keras.export.ExportArchive`` work too (their root also tracks the plain variables), but only for Keras objects
they wrap themselves; the route here, the one ``workbench.demo`` uses, also serves a ``tf.Module`` or a function
that uses a Keras model inside.

**Signature names.** For a Keras model, ``serving_default`` takes one input per Keras input, aliased by the dict
key (dict inputs) or the ``keras.Input`` name; names Keras made up (``keras_tensor_3``, ``input_layer_1``) become
``inputs`` (one input) or ``input_<i>``. Outputs are the dict keys (dict outputs) or the name of the layer that
produces each output (``Dense(10, name="probabilities")`` → ``probabilities``); layers Keras named itself
(``dense_7``, which changes from session to session) become ``output_<i>``, as ``model.export`` names them.
Functions keep TensorFlow's naming: the ``TensorSpec`` names (else the argument names) for inputs, the returned
dict's keys (else ``output_0``, ``output_1``, ...) for outputs.

TensorFlow and Keras are imported inside the functions: importing workbench must stay cheap. This is the TensorFlow
platform's ``writer`` (:mod:`workbench.platforms.export_request`), which ``workbench.export`` asks for what no other
platform takes.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms.export_request import ExportRefused, ExportRequest, one_line

__all__ = ["SavedModelWriter", "save", "serving_functions", "writer"]

log = logging.getLogger(__name__)

# Names Keras invents for unnamed inputs: they change from session to session, so clients must not depend on them.
_KERAS_AUTO_INPUT_RE = re.compile(r"(keras_tensor|input_layer)(_\d+)?")
# When a module has several tf.functions with an input signature, these names say which one serves by default.
_DEFAULT_FUNCTION_NAMES = ("serving_default", "serve", "__call__")


def serving_functions(model: Any, signatures: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[Any]]:
    """The concrete function for each signature name, and the objects whose resources the export must track."""
    import tensorflow as tf

    functions: dict[str, Any] = {}
    for key, fn in (signatures or {}).items():
        if not isinstance(key, str) or not key:
            raise ExportRefused(f"Signature names must be non-empty strings, got {key!r}")
        functions[key] = _concrete(fn, f"signatures[{key!r}]")

    trackables: list[Any] = [model]
    if _is_keras_model(model):
        if not model.built:
            raise ExportRefused(
                f"The Keras model {model.name!r} is not built: call it on a batch or call model.build(input_shape) "
                "before exporting"
            )
        if DEFAULT_SIGNATURE not in functions:
            functions = {DEFAULT_SIGNATURE: _keras_serving_function(model), **functions}
    elif isinstance(model, (tf.types.experimental.ConcreteFunction, tf.types.experimental.PolymorphicFunction)):
        trackables = []
        functions.setdefault(DEFAULT_SIGNATURE, _concrete(model, "model"))
    elif isinstance(model, tf.Module):
        if DEFAULT_SIGNATURE not in functions:
            functions = {DEFAULT_SIGNATURE: _concrete(_module_default_function(model), "model"), **functions}
    else:
        raise ExportRefused(
            f"Cannot export a {type(model).__module__}.{type(model).__qualname__}: pass a built Keras model, a "
            "tf.Module with a tf.function that has an input_signature, a tf.function or a concrete function"
        )
    return functions, trackables


def _is_keras_model(model: Any) -> bool:
    # Without keras imported, nothing can be a Keras model: no need to pay for importing it.
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, keras.Model)


def _concrete(fn: Any, what: str) -> Any:
    """A concrete function for ``fn`` (a concrete function, or a tf.function with an input_signature)."""
    import tensorflow as tf

    if isinstance(fn, tf.types.experimental.ConcreteFunction):
        return fn
    if isinstance(fn, tf.types.experimental.PolymorphicFunction):
        if fn.input_signature is None:
            raise ExportRefused(
                f"{what} is a tf.function without an input_signature: decorate it with "
                "@tf.function(input_signature=[tf.TensorSpec(...), ...]) so its inputs' types and shapes are known"
            )
        try:
            return fn.get_concrete_function()
        except Exception as exc:
            raise ExportRefused(f"Could not trace {what}: {one_line(exc)}") from exc
    raise ExportRefused(f"{what} must be a tf.function with an input_signature or a concrete function, got {fn!r}")


def _module_default_function(module: Any) -> Any:
    """The module's tf.function that becomes ``serving_default``."""
    import tensorflow as tf

    candidates: dict[str, Any] = {}
    seen: set[str] = set()
    # Raw attributes, instance first and then the classes in MRO order (so shadowing works as for getattr);
    # no getattr() over dir(), which would run every property of the module (``variables``, ``submodules``...).
    for namespace in (vars(module), *(vars(cls) for cls in type(module).__mro__)):
        for attr, raw in namespace.items():
            if attr in seen:
                continue
            seen.add(attr)
            if attr.startswith("_") and attr != "__call__":
                continue
            if isinstance(raw, tf.types.experimental.PolymorphicFunction):
                bound = getattr(module, attr)  # binds a decorated method to the module
                if bound.input_signature is not None:
                    candidates[attr] = bound
    for preferred in _DEFAULT_FUNCTION_NAMES:
        if preferred in candidates:
            return candidates[preferred]
    if len(candidates) == 1:
        return next(iter(candidates.values()))
    if not candidates:
        raise ExportRefused(
            f"The tf.Module {type(module).__qualname__} has no tf.function with an input_signature to serve: "
            "decorate one with @tf.function(input_signature=[...]) or pass signatures={'serving_default': fn}"
        )
    raise ExportRefused(
        f"The tf.Module {type(module).__qualname__} has several tf.functions with an input_signature "
        f"({', '.join(sorted(candidates))}) and none is named {' or '.join(_DEFAULT_FUNCTION_NAMES)}: "
        "pass signatures={'serving_default': module.<function>}"
    )


def _snake_case(name: str) -> str:
    """Keras' own conversion of a class name to the default name of its instances (``Conv2D`` → ``conv2d``)."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _keras_output_names(model: Any) -> list[str] | None:
    """The name of the layer producing each output, with Keras-invented names replaced by ``output_<i>``."""
    names = []
    for i, tensor in enumerate(getattr(model, "outputs", None) or []):
        history = getattr(tensor, "_keras_history", None)
        operation = history[0] if history else None
        op_name = getattr(operation, "name", None)
        auto = op_name is None or re.fullmatch(re.escape(_snake_case(type(operation).__name__)) + r"(_\d+)?", op_name)
        names.append(f"output_{i}" if auto else str(op_name))
    if not names or len(set(names)) != len(names):
        return None
    return names


def _keras_serving_function(model: Any) -> Any:
    """``serving_default`` for a Keras model: named flat inputs → a dict of named outputs, inference mode."""
    import tensorflow as tf

    try:
        structure: Any = model.input  # functional: the dict, list or single tensor the model was built with
    except (AttributeError, ValueError):
        inputs = getattr(model, "inputs", None)  # Sequential has only the flat list
        try:
            structure = inputs[0] if inputs and len(inputs) == 1 else inputs
        except Exception:  # noqa: BLE001 - a model whose inputs cannot be read is refused below
            structure = None
    if structure is None or (isinstance(structure, (list, tuple, Mapping)) and not structure):
        raise ExportRefused(
            f"The Keras model {model.name!r} has no known inputs (a subclassed model?): pass "
            "signatures={'serving_default': tf.function(lambda x: model(x), input_signature=[tf.TensorSpec(...)])}"
        )

    if isinstance(structure, Mapping):
        keys: list[Any] = list(structure)
        tensors = [structure[k] for k in keys]
        aliases = [str(k) for k in keys]
    else:
        keys = []
        tensors = list(structure) if isinstance(structure, (list, tuple)) else [structure]
        aliases = [str(t.name) for t in tensors]
        if any(_KERAS_AUTO_INPUT_RE.fullmatch(a) for a in aliases):
            aliases = ["inputs"] if len(tensors) == 1 else [f"input_{i}" for i in range(len(tensors))]
    specs = []
    for alias, tensor in zip(aliases, tensors, strict=True):
        if getattr(tensor, "sparse", False) or getattr(tensor, "ragged", False):
            raise ExportRefused(f"Input {alias!r} of the Keras model is sparse or ragged, which is not supported")
        shape = (None, *tuple(tensor.shape)[1:]) if tensor.shape else ()  # any batch size
        specs.append(tf.TensorSpec(shape, tf.as_dtype(tensor.dtype), name=alias))
    output_names = _keras_output_names(model)

    def serve(*args: tf.Tensor) -> dict[str, tf.Tensor]:
        if keys:
            call_inputs: Any = dict(zip(keys, args, strict=True))
        elif isinstance(structure, (list, tuple)):
            call_inputs = list(args)
        else:
            (call_inputs,) = args
        outputs = model(call_inputs, training=False)
        if isinstance(outputs, Mapping):
            return {str(k): v for k, v in outputs.items()}
        flat = tf.nest.flatten(outputs)
        names = output_names if output_names and len(output_names) == len(flat) else None
        return {(names[i] if names else f"output_{i}"): t for i, t in enumerate(flat)}

    try:
        return tf.function(serve, input_signature=specs, autograph=False).get_concrete_function()
    except Exception as exc:
        raise ExportRefused(f"Could not trace the Keras model {model.name!r}: {one_line(exc)}") from exc


def _tracked_resources(trackables: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Lookup tables (and other resources) and assets reachable from ``trackables``, which functions may use."""
    import tensorflow as tf
    from tensorflow.saved_model.experimental import TrackableResource

    resources: list[Any] = []
    assets: list[Any] = []
    for root in trackables:
        try:
            descendants = tf.train.TrackableView(root).descendants()
        except Exception:  # an object graph TF cannot walk: its functions may still need nothing from it
            log.debug("Could not walk the objects of %r", root, exc_info=True)
            continue
        for obj in descendants:
            if isinstance(obj, TrackableResource):
                resources.append(obj)
            elif isinstance(obj, tf.saved_model.Asset):
                assets.append(obj)
    return resources, assets


def save(functions: Mapping[str, Any], trackables: Sequence[Any], path: Path) -> None:
    """Save ``functions`` as the signatures of a fresh module that tracks only what they use."""
    import tensorflow as tf

    root = tf.Module(name="workbench_export")
    seen: set[int] = set()
    variables = []
    for fn in functions.values():
        for variable in fn.variables:  # the plain tf.Variables, also for Keras 3 (see the module docstring)
            if id(variable) not in seen:
                seen.add(id(variable))
                variables.append(variable)
    root.signature_variables = variables
    root.signature_resources, root.signature_assets = _tracked_resources(trackables)
    try:
        tf.saved_model.save(root, str(path), signatures=dict(functions))
    except Exception as exc:
        raise ExportRefused(f"Could not save the model as a SavedModel: {one_line(exc)}") from exc


class SavedModelWriter:
    """Writes the traced serving functions as a SavedModel; traced when made, so a model that cannot be traced fails
    before anything is written."""

    def __init__(self, model: Any, signatures: Mapping[str, Any] | None) -> None:
        self._functions, self._trackables = serving_functions(model, signatures)

    def __call__(self, folder: Path) -> None:
        save(self._functions, self._trackables, folder)

    def estimated_bytes(self) -> int:
        """The size of the variables the SavedModel holds (0 when nothing is known)."""
        seen: set[int] = set()
        total = 0
        for fn in self._functions.values():
            for variable in getattr(fn, "variables", ()):
                if id(variable) not in seen:
                    seen.add(id(variable))
                    with contextlib.suppress(Exception):  # an unknown shape: no estimate from it
                        total += int(variable.shape.num_elements()) * variable.dtype.size
        return total


def writer(model: Any, request: ExportRequest) -> SavedModelWriter:
    """How ``workbench.export`` writes a TensorFlow model (a Keras model, a ``tf.Module``, a function)."""
    return SavedModelWriter(model, request.signatures)
