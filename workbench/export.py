"""Export a model from the notebook into a served model repository: ``export(model, "digits")``.

The result is ``<model_repository>/<name>/<version>/``: a SavedModel with a ``serving_default`` signature and,
when examples are given, ``assets.extra/tf_serving_warmup_requests``. A server polling ``<model_repository>/<name>``
picks the new version up.

Every export is built in a hidden folder inside ``<model_repository>/<name>`` (the server skips dot-folders), checked
by loading it exactly the way the server will, and only then renamed to its number, so a server never sees a
half-written or broken version, and a failed export leaves nothing behind.

``model_repository`` may also be an object store (``s3://bucket/models``, ``gs://…``, any fsspec URL): the export is
built and checked in a local temporary folder, then uploaded to ``<model_repository>/<name>/<version>/`` with
``saved_model.pb`` last. Object stores have no rename; a server counts a version as present only once its
``saved_model.pb`` exists, so it never sees a half-uploaded one.

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

TensorFlow and Keras are imported inside the functions: importing workbench must stay cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import importlib
import logging
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench import platforms
from workbench.config.vocabulary import renamed_keywords
from workbench.runtime.storage import RemoteFolder, StorageError, is_remote, join, redact
from workbench.runtime.tensorflow_runtime import quiet_tensorflow

if TYPE_CHECKING:  # only for annotations: importing TensorFlow at runtime is slow
    from numpy.typing import ArrayLike

    from workbench.core.signatures import Signature, TensorSpec

__all__ = ["ExportError", "ExportResult", "export"]

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit; the server refuses a version whose file holds more
# A safe folder name on every OS, and never hidden (the server skips dot-folders).
_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
# Names Keras invents for unnamed inputs: they change from session to session, so clients must not depend on them.
_KERAS_AUTO_INPUT_RE = re.compile(r"(keras_tensor|input_layer)(_\d+)?")
# When a module has several tf.functions with an input signature, these names say which one serves by default.
_DEFAULT_FUNCTION_NAMES = ("serving_default", "serve", "__call__")


class ExportError(Exception):
    """An export failed; the message says why in one line and the cause is chained."""


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote: the version folder and its signatures (name → ``(inputs) -> (outputs)``)."""

    name: str
    version: int
    path: Path | str  # a URL (str) for a version exported to an object store
    signatures: dict[str, str]
    warmup_records: int

    def __repr__(self) -> str:
        return (
            f"ExportResult(name={self.name!r}, version={self.version}, path='{self.path}', "
            f"signatures={self.signatures!r}, warmup_records={self.warmup_records})"
        )


@renamed_keywords(repo="model_repository")  # the name before the vocabulary was made one
def export(
    model: Any,
    name: str,
    model_repository: str | os.PathLike[str] = "workbench-models",
    version: int | None = None,
    examples: Mapping[str, ArrayLike] | Sequence[Mapping[str, ArrayLike]] | ArrayLike | None = None,
    signatures: Mapping[str, Any] | None = None,
    format: str | None = None,  # noqa: A002 - the word users know (skl2onnx, Keras' export use it too)
) -> ExportResult:
    """Save ``model`` as version ``version`` (default: the next one) of ``<model_repository>/<name>``; check it serves.

    ``model`` is a built Keras 3 model, a ``tf.Module`` whose ``tf.function`` (``serve``, ``serving_default``,
    ``__call__`` or its only one) has an ``input_signature``, a ``tf.function`` with an ``input_signature``, or
    a concrete function; ``signatures`` adds (or replaces) named signatures with such functions. It may also be a
    scikit-learn estimator or pipeline, an XGBoost or LightGBM model, an ONNX model (``onnx.ModelProto``, bytes or
    a path to a ``.onnx`` file), a :class:`workbench.PythonModel` class, or a pipeline description: each is written
    in its platform's format (see :mod:`workbench.platforms`). ``format="onnx"`` converts a scikit-learn model to
    ONNX with skl2onnx, where the estimator supports it.

    ``examples`` — one dict of input alias → batch, a list of such dicts (one warmup request each, at most
    1000), or a bare batch when ``serving_default`` has one input — are cast to the signature's types, written
    as the version's warmup requests and run through the exported model before it is published.
    """
    _check_name(name)
    store = _store_of(str(model_repository), name) if is_remote(model_repository) else None
    # A store's export is built in a local temporary folder, then uploaded (object stores have no rename).
    base = Path(tempfile.mkdtemp(prefix="workbench-export-")) if store else Path(model_repository).absolute() / name
    if version is not None:
        _check_version(version)
        if store is not None:
            _refuse_existing_in_store(name, store, version)
        else:
            _refuse_existing(name, base, version)
    staging = base / f".tmp-export-{uuid.uuid4().hex}"
    # A model folder this export creates goes again if the export fails: a server polling the repository would
    # otherwise list an empty model.
    creates_base = store is None and not base.exists()
    published = False
    functions: dict[str, Any] = {}
    # What TensorFlow logs while it imports, traces, saves, loads and runs the export ("Assets written to ...",
    # optimizer notices) is about workbench's work, not the user's: the cell shows the result, or the error.
    with quiet_tensorflow():
        try:
            # Understood before mkdir: a model nobody can export makes nothing.
            write = _platform_writer(model, format, signatures, examples)
            if write is None:
                functions, trackables = _serving_functions(model, signatures)
            try:
                base.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ExportError(f"Cannot create the model folder {base}: {exc}") from exc
            if write is None:
                _save(functions, trackables, staging)
            else:
                staging.mkdir()
                write(staging)
            described, records = _write_warmup_and_verify(name, staging, examples)
            if store is not None:
                final_version = _upload(name, store, staging, version)
            else:
                final_version = _publish(name, base, staging, version)
            published = True
        except Exception as exc:
            if _out_of_space(exc):  # TensorFlow's or Python's, raw or already wrapped: one message that says so
                needed = max(_bytes_under(staging), _variables_bytes(functions) + _examples_bytes(examples))
                shutil.rmtree(staging, ignore_errors=True)  # first, so the free space reported is the real one
                raise ExportError(_no_space_message(name, base, needed)) from exc
            if isinstance(exc, ExportError):
                raise
            # A failure nobody foresaw still gets the one-line, cleaned-up treatment.
            raise ExportError(f"Export of {name!r} failed: {_one_line(exc)}") from exc
        finally:
            # Reached with staging still present only when something failed (or was interrupted).
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
            if store is not None:
                shutil.rmtree(base, ignore_errors=True)
            elif creates_base and not published:
                with contextlib.suppress(OSError):  # not empty: another export published meanwhile, keep it
                    base.rmdir()
    return ExportResult(
        name=name,
        version=final_version,
        path=join(store.location, str(final_version)) if store is not None else base / str(final_version),
        signatures=described,
        warmup_records=records,
    )


# ----------------------------------------------------------------------------------------------- the repository
def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ExportError(f"Invalid model name {name!r}: use letters, digits, '_', '-' and '.', not starting with '.'")


def _check_version(version: int) -> None:
    # bool is an int subclass; True as a version number is surely a mistake.
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ExportError(f"Invalid version {version!r}: it must be a non-negative integer")


def _existing_versions(base: Path) -> set[int]:
    """Version numbers of the numbered folders in ``base``, parsed the way the server parses them."""
    from workbench.models.source import parse_version

    if not base.is_dir():
        return set()
    found = set()
    for entry in os.scandir(base):
        number = parse_version(entry.name)
        if number is not None and entry.is_dir():
            found.add(number)
    return found


def _refuse_existing(name: str, base: Path, version: int) -> None:
    if version in _existing_versions(base):
        raise ExportError(f"Version {version} of model {name!r} already exists in {base}")


def _publish(name: str, base: Path, staging: Path, version: int | None) -> int:
    """Rename the checked export to its number; the number is chosen last, so concurrent exports do not clash."""
    for _attempt in range(10):
        number = version if version is not None else max(_existing_versions(base), default=0) + 1
        _refuse_existing(name, base, number)
        target = base / str(number)
        try:
            # One rename(2): a polling server sees no version, then the complete one.
            os.rename(staging, target)
            return number
        except OSError as exc:
            if version is None and target.exists():
                continue  # another export took this number between the scan and the rename
            raise ExportError(f"Could not move the export into place at {target}: {exc}") from exc
    raise ExportError(f"Could not find a free version number in {base}")


def _store_of(model_repository: str, name: str) -> RemoteFolder:
    try:
        return RemoteFolder(join(model_repository, name))
    except StorageError as exc:
        raise ExportError(f"Cannot export to {redact(model_repository)}: {exc}") from None


def _store_versions(store: RemoteFolder) -> set[int]:
    """Numbered folders in the store, complete or still uploading (either number is taken)."""
    from workbench.models.source import parse_version

    try:
        names = store.list_folders()
    except StorageError as exc:
        raise ExportError(f"Cannot list {store.location}: {exc}") from None
    return {n for n in map(parse_version, names) if n is not None}


def _refuse_existing_in_store(name: str, store: RemoteFolder, version: int) -> None:
    if version in _store_versions(store):
        raise ExportError(f"Version {version} of model {name!r} already exists in {store.location}")


def _upload(name: str, store: RemoteFolder, staging: Path, version: int | None) -> int:
    """Upload the checked export to ``<store>/<number>/``, ``saved_model.pb`` last.

    Object stores have no rename: servers treat a version as present only once its ``saved_model.pb`` exists, so
    writing that file last publishes the version in one step. Two exports racing for the same next number to one
    store are not told apart: name the version (``version=``) when several writers export at once.
    """
    number = version if version is not None else max(_store_versions(store), default=0) + 1
    _refuse_existing_in_store(name, store, number)
    try:
        # The model file goes last: a server polling the store counts the version only once it is there.
        model_file = next((f for f in platforms.model_files() if (staging / f).is_file()), "")
        store.upload(staging, str(number), last=model_file)
    except StorageError as exc:
        raise ExportError(f"Could not upload version {number} of model {name!r}: {exc}") from None
    return number


# ---------------------------------------------------------------------------------------- what gets saved
def _serving_functions(model: Any, signatures: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[Any]]:
    """The concrete function for each signature name, and the objects whose resources the export must track."""
    import tensorflow as tf

    functions: dict[str, Any] = {}
    for key, fn in (signatures or {}).items():
        if not isinstance(key, str) or not key:
            raise ExportError(f"Signature names must be non-empty strings, got {key!r}")
        functions[key] = _concrete(fn, f"signatures[{key!r}]")

    trackables: list[Any] = [model]
    if _is_keras_model(model):
        if not model.built:
            raise ExportError(
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
        raise ExportError(
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
            raise ExportError(
                f"{what} is a tf.function without an input_signature: decorate it with "
                "@tf.function(input_signature=[tf.TensorSpec(...), ...]) so its inputs' types and shapes are known"
            )
        try:
            return fn.get_concrete_function()
        except Exception as exc:
            raise ExportError(f"Could not trace {what}: {_one_line(exc)}") from exc
    raise ExportError(f"{what} must be a tf.function with an input_signature or a concrete function, got {fn!r}")


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
        raise ExportError(
            f"The tf.Module {type(module).__qualname__} has no tf.function with an input_signature to serve: "
            "decorate one with @tf.function(input_signature=[...]) or pass signatures={'serving_default': fn}"
        )
    raise ExportError(
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
        except Exception:
            structure = None
    if structure is None or (isinstance(structure, (list, tuple, Mapping)) and not structure):
        raise ExportError(
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
            raise ExportError(f"Input {alias!r} of the Keras model is sparse or ragged, which is not supported")
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
        raise ExportError(f"Could not trace the Keras model {model.name!r}: {_one_line(exc)}") from exc


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


def _save(functions: Mapping[str, Any], trackables: Sequence[Any], path: Path) -> None:
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
        raise ExportError(f"Could not save the model as a SavedModel: {_one_line(exc)}") from exc


# ----------------------------------------------------------------------------------------- other platforms
def _platform_writer(
    model: Any, format: str | None, signatures: Mapping[str, Any] | None, examples: Any
) -> Callable[[Path], None] | None:
    """How to write ``model`` if a platform other than TensorFlow's takes it (None: the SavedModel route)."""
    if format == "onnx":
        onnx_platform = importlib.import_module("workbench.platforms.onnx")

        if not onnx_platform.exports(model):
            model = onnx_platform.convert_sklearn(model, _sample_rows(examples))
        return functools.partial(onnx_platform.write, model)
    if format not in (None, "saved_model", "tensorflow"):
        raise ExportError(f"format must be 'onnx' or left out (the model's own platform), not {format!r}")
    if format is None:
        for platform in platforms.registry().values():
            if platform.name in ("tensorflow", "workbench_null"):
                continue
            try:
                module = importlib.import_module(platform.module)
            except ImportError:  # a platform plugin whose own module cannot import: it cannot take the model
                continue
            exports = getattr(module, "exports", None)
            if exports is not None and exports(model):
                if signatures:
                    raise ExportError(f"signatures= is for TensorFlow models; a {platform.name} model declares its own")
                return functools.partial(module.write, model)
    return None


def _sample_rows(examples: Any) -> Any:
    """Rows that show skl2onnx the input's width and type (the one input's batch, from ``examples``)."""
    if examples is None:
        raise ExportError("format='onnx' needs examples= (a batch of inputs) to know the model's input shape")
    if isinstance(examples, Mapping):
        if len(examples) != 1:
            raise ExportError("format='onnx' takes examples= as one batch (or a dict with one input)")
        return np.asarray(next(iter(examples.values())))
    return np.asarray(examples)


# ------------------------------------------------------------------------------------------ warmup and checks
def _write_warmup_and_verify(name: str, path: Path, examples: Any) -> tuple[dict[str, str], int]:
    """Load the export as the server will, write the warmup file, run it (or a zero batch); describe signatures."""
    from workbench.core import inference
    from workbench.core.errors import Code, ServingError
    from workbench.core.servable import Composite
    from workbench.models import warmup

    # Loaded as the server will; the user's own kernel wrote any Python here, so the check may import it.
    loader = platforms.Loader(platforms.LoadPolicy(allow_pickle=False, allow_python=True))
    try:
        servable = loader(name, 0, str(path))
    except Exception as exc:
        raise ExportError(f"The exported model failed its check: it does not load: {_one_line(exc)}") from exc
    try:
        signature = servable.signatures.get(DEFAULT_SIGNATURE)
        if signature is None:
            raise ExportError(f"The exported model failed its check: it has no {DEFAULT_SIGNATURE} signature")
        described = {key: _describe(sig) for key, sig in servable.signatures.items() if not key.startswith("__")}
        if isinstance(servable, Composite) and servable.members():
            return described, 0  # its steps run on other models: only a server has them
        if servable.sequence is not None or servable.decoupled:  # run apart from batches: nothing replays
            _check_unbatched(servable, signature, examples)
            return described, 0
        if examples is None:
            batch = _zero_example(signature)
            try:
                inference.predict(servable, signature, batch)
            except ServingError as exc:
                # Made-up zeros may be data the model rightly rejects (a tf.Example parser, a minimum size): that
                # says nothing about the export. Anything else (e.g. a variable the session cannot find) does.
                if exc.code != Code.INVALID_ARGUMENT:
                    raise ExportError(f"The exported model failed its check: {_one_line(exc)}") from exc
                log.warning(
                    "A zero-filled example for %s was rejected (%s); pass examples= to check it", name, _one_line(exc)
                )
            return described, 0
        requests = _example_requests(examples, signature)
        _write_warmup(name, path, requests, signature)
        try:
            warmup.warm_up(servable)  # replays the very file the server will replay
        except Exception as exc:
            raise ExportError(f"The exported model failed its check: {_one_line(exc)}") from exc
        return described, len(requests)
    finally:
        servable.close()


def _check_unbatched(servable: Any, signature: Signature, examples: Any) -> None:
    """Run a stateful model's examples (or zeros), each as the one request of a sequence of its own; a decoupled
    model's, each to its last response.

    No warmup file is written: the server's warmup replays plain requests, which neither kind of model takes.
    """
    from workbench.batching.sequences import Controls
    from workbench.core.errors import Code, ServingError

    batches = [_zero_example(signature)] if examples is None else _example_requests(examples, signature)
    for number, batch in enumerate(batches):
        try:
            if servable.decoupled:
                for _ in servable.run_decoupled(signature, batch, list(signature.outputs)):
                    pass
            else:
                controls = Controls(True, True, True, number)
                servable.run_step(signature, batch, list(signature.outputs), None, controls)
        except ServingError as exc:
            if examples is None and exc.code == Code.INVALID_ARGUMENT:  # made-up zeros, rightly refused
                log.warning(
                    "A zero-filled example for %s was rejected (%s); pass examples= to check it",
                    servable.name,
                    _one_line(exc),
                )
                return
            raise ExportError(f"The exported model failed its check: {_one_line(exc)}") from exc


def _describe(signature: Signature) -> str:
    """``(pixels: float32[?, 64]) -> (probabilities: float32[?, 10])``."""

    def one(spec: TensorSpec) -> str:
        dims = "..." if spec.shape is None else ", ".join("?" if d < 0 else str(d) for d in spec.shape)
        dtype = "string" if spec.dtype.kind == "O" else spec.dtype.name  # float32 rather than TF's "float"
        return f"{spec.alias}: {dtype}[{dims}]"

    inputs = ", ".join(one(s) for s in signature.inputs.values())
    outputs = ", ".join(one(s) for s in signature.outputs.values())
    return f"({inputs}) -> ({outputs})"


def _zero_example(signature: Signature) -> dict[str, np.ndarray]:
    """One zero (or empty-string) batch that fits the signature, unknown dimensions taken as 1."""
    batch = {}
    for alias, spec in signature.inputs.items():
        shape = (1,) if spec.shape is None else tuple(1 if d < 0 else d for d in spec.shape)
        batch[alias] = np.full(shape, b"", dtype=object) if spec.dtype.kind == "O" else np.zeros(shape, spec.dtype)
    return batch


def _example_requests(examples: Any, signature: Signature) -> list[dict[str, np.ndarray]]:
    """``examples`` as a list of requests, each cast and checked against the signature."""
    if isinstance(examples, Mapping):
        raw: list[Any] = [examples]
    elif isinstance(examples, (list, tuple)) and examples and all(isinstance(e, Mapping) for e in examples):
        raw = list(examples)
    elif isinstance(examples, (list, tuple)) and any(isinstance(e, Mapping) for e in examples):
        raise ExportError("examples mixes dicts with other values: pass one dict per warmup request")
    else:
        if len(signature.inputs) != 1:
            raise ExportError(
                f"examples is a bare array but {DEFAULT_SIGNATURE} has {len(signature.inputs)} inputs "
                f"({', '.join(signature.inputs)}): pass a dict of input name → batch"
            )
        raw = [{next(iter(signature.inputs)): examples}]
    if not raw or (len(raw) == 1 and not raw[0]):
        raise ExportError("examples is empty")
    if len(raw) > MAX_WARMUP_RECORDS:
        raise ExportError(f"{len(raw)} examples given; a version may hold at most {MAX_WARMUP_RECORDS} warmup requests")
    return [_coerce_request(i, request, signature) for i, request in enumerate(raw)]


def _coerce_request(index: int, request: Mapping[str, Any], signature: Signature) -> dict[str, np.ndarray]:
    where = f"example {index}" if index else "examples"
    unknown = [str(alias) for alias in request if alias not in signature.inputs]
    if unknown:
        raise ExportError(
            f"{where} has input {unknown[0]!r}, which {DEFAULT_SIGNATURE} does not take "
            f"(its inputs: {', '.join(signature.inputs)})"
        )
    missing = [alias for alias in signature.inputs if alias not in request and alias not in signature.defaults]
    if missing:
        raise ExportError(f"{where} lacks input {missing[0]!r} of {DEFAULT_SIGNATURE}")
    return {alias: _coerce(where, alias, value, signature.inputs[alias]) for alias, value in request.items()}


def _coerce(where: str, alias: str, value: Any, spec: TensorSpec) -> np.ndarray:
    """``value`` as an array of the input's dtype, or an ExportError naming the input."""
    try:
        array = np.asarray(value)
    except Exception as exc:  # e.g. ragged nested lists
        raise ExportError(f"{where}: input {alias!r} is not an array: {_one_line(exc)}") from exc
    if spec.dtype.kind == "O":  # a string input: str or bytes, encoded by make_tensor_proto
        if array.dtype.kind not in "OSU":
            raise ExportError(f"{where}: input {alias!r} must hold strings, got {array.dtype}")
        array = array.astype(object)
    else:
        # "same_kind" lets float64 become float32 and ints become floats, but never floats become ints.
        if array.dtype.kind in "OSUV" or not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
            raise ExportError(f"{where}: input {alias!r} has type {array.dtype}, which cannot become {spec.dtype_name}")
        array = array.astype(spec.dtype)
    if spec.shape is not None:
        fits = array.ndim == len(spec.shape) and all(
            d < 0 or d == n for d, n in zip(spec.shape, array.shape, strict=False)
        )
        if not fits:
            expected = "[" + ", ".join("?" if d < 0 else str(d) for d in spec.shape) + "]"
            raise ExportError(
                f"{where}: input {alias!r} has shape {list(array.shape)}, but {DEFAULT_SIGNATURE} takes {expected}"
            )
    return array


def _write_warmup(name: str, path: Path, requests: Sequence[Mapping[str, np.ndarray]], signature: Signature) -> None:
    """``assets.extra/tf_serving_warmup_requests``: one PredictionLog (a PredictRequest) per request.

    Written for every platform: the server replays the file whatever the version holds.
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    from workbench.models.warmup import WARMUP_FILE
    from workbench.protocol.tensor_proto import from_numpy
    from workbench.protocol.tfrecord import encode_record

    target = path / WARMUP_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as records:
        for inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=name, signature_name=DEFAULT_SIGNATURE)
            )
            for alias, array in inputs.items():
                from_numpy(array, request.inputs[alias])
            log_record = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            records.write(encode_record(log_record.SerializeToString()))


def _out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it was raised from is a full disk or an exhausted quota.

    Python raises OSError(ENOSPC); TensorFlow's file writes raise its own errors (ResourceExhaustedError from
    SaveV2, a plain error from GFile) whose only trace of the cause is the OS's message.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(current)
        if os.strerror(errno.ENOSPC) in text or os.strerror(errno.EDQUOT) in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def _bytes_under(folder: Path) -> int:
    """The size of the files under ``folder`` (0 if it is gone): what an export had written when it stopped."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, file)).st_size
    return total


def _variables_bytes(functions: Mapping[str, Any]) -> int:
    """The size of the variables a SavedModel of ``functions`` holds (0 when nothing is known)."""
    seen: set[int] = set()
    total = 0
    for fn in functions.values():
        for variable in getattr(fn, "variables", ()):
            if id(variable) not in seen:
                seen.add(id(variable))
                with contextlib.suppress(Exception):  # an unknown shape: no estimate from it
                    total += int(variable.shape.num_elements()) * variable.dtype.size
    return total


def _examples_bytes(examples: Any) -> int:
    """The raw size of the warmup examples, which their file holds at least (0 when there are none)."""
    if examples is None:
        return 0
    requests = (
        examples
        if isinstance(examples, (list, tuple)) and all(isinstance(e, Mapping) for e in examples)
        else [examples]
    )
    total = 0
    for request in requests:
        for value in request.values() if isinstance(request, Mapping) else [request]:
            with contextlib.suppress(Exception):  # not an array: the export's own check says so
                total += np.asarray(value).nbytes
    return total


def _no_space_message(name: str, base: Path, needed: int) -> str:
    """Why an export stopped on a full disk: where, at least how much it needed, how much is free."""
    place = next((p for p in (base, *base.parents) if p.exists()), base)
    try:
        usage = shutil.disk_usage(place)
        free = f"{_size(usage.free)} free of {_size(usage.total)}"
    except OSError:
        free = "free space unknown"
    return (
        f"Export of {name!r} failed: no space left on the device holding {base} (the export needs at least "
        f"{_size(needed)}; {free}). Nothing was published: free some space or export to another repository"
    )


def _size(count: int) -> str:
    """``512 B``, ``4.0 MiB``: a byte count as people read it."""
    if count < 1024:
        return f"{count} B"
    amount = count / 1024
    for unit in ("KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"


def _one_line(exc: BaseException) -> str:
    """The first line of an error's message (TensorFlow's run with node dumps over many lines), bounded."""
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) else str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 400 else first[:397] + "..."
