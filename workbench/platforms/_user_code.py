"""What Python models, handlers and pipelines share: code imported from a repository, and declared signatures.

``model.py`` and ``handler.py`` are imported under a module name of their own per load, so two versions of a
model (or a version loaded again after its files changed) never share module state; the folder is not put on
``sys.path`` for the same reason. Their signatures, and a pipeline's, are declared in one small form::

    {"pixels": ("float32", [-1, 64])}          # alias → (dtype, shape); -1 any size, None any shape

where dtype is TF Serving's name ("float", "double", "string", "int64") or anything ``numpy.dtype`` takes, and
strings are numpy ``object`` arrays of ``bytes``, as everywhere in workbench.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.signatures import PREDICT_METHOD, Signature, TensorSpec, type_name
from workbench.platforms.base import PYTHON_SETTING, LoadPolicy
from workbench.runtime.tensorflow_runtime import import_all_of_tensorflow

# TF Serving's type names that numpy spells differently (numpy's "float" is float64, TensorFlow's is float32).
_TF_NAMES: dict[str, np.dtype[Any]] = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "half": np.dtype(np.float16),
    "string": np.dtype(object),
    "bytes": np.dtype(object),
    "str": np.dtype(object),
    "object": np.dtype(object),
}

_counter = itertools.count(1)
_counter_lock = threading.Lock()


def require_python(policy: LoadPolicy, path: Path) -> None:
    """Refuse to run a repository's Python unless the server allows it (whoever writes the folder runs code)."""
    if not policy.allow_python:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{path} is Python code, which this server does not run from a model repository; "
            f"allow it with {PYTHON_SETTING}",
        )


def import_file(path: Path, kind: str, model: str, version: int) -> ModuleType:
    """Import ``path`` as a module of its own (a fresh name per call); errors become a load error naming the file."""
    with _counter_lock:
        serial = next(_counter)
    safe = re.sub(r"\W", "_", model)
    module_name = f"_workbench_{kind}_{safe}_v{version}_{serial}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ServingError(Code.INVALID_ARGUMENT, f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    import_all_of_tensorflow()  # user code may `import keras`, which a lightly imported TensorFlow cannot take
    # In sys.modules while it runs and while it serves: dataclasses, typing and pickle look a module up there.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if isinstance(exc, ServingError):
            raise
        if not isinstance(exc, Exception):
            raise
        raise ServingError(Code.INVALID_ARGUMENT, f"Importing {path} failed: {type(exc).__name__}: {exc}") from None
    return module


def forget_module(module: ModuleType | None) -> None:
    """Drop a module :func:`import_file` made, once its servable closes."""
    if module is not None and sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]


def parse_dtype(value: Any, where: str) -> np.dtype[Any]:
    """A declared type: TF Serving's name ("float" is float32), numpy's, or a numpy type; strings are object."""
    if isinstance(value, str) and value in _TF_NAMES:
        return _TF_NAMES[value]
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise ServingError(
            Code.INVALID_ARGUMENT, f'{where}: "{value}" is not a type (use e.g. "float32", "int64", "string")'
        ) from None
    if dtype.kind in "SU":
        return np.dtype(object)
    if dtype.kind not in "biufcO":
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}: {dtype} tensors cannot be served")
    return dtype


def parse_shape(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}: the shape must be a list such as [-1, 4], or null")
    dims = tuple(value)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in dims):
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}: shape {list(dims)} must hold sizes >= 0, or -1 for any")
    return dims


def tensor_spec(alias: str, declared: Any, where: str) -> TensorSpec:
    """``(dtype, shape)``, ``{"dtype": ..., "shape": ...}`` or a TensorSpec, as a TensorSpec named ``alias``."""
    if isinstance(declared, TensorSpec):
        return TensorSpec(alias, alias, declared.dtype, declared.shape)
    if isinstance(declared, Mapping):
        unknown = set(declared) - {"dtype", "shape"}
        if unknown or "dtype" not in declared:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{where}: a tensor is {{dtype: ..., shape: [...]}}; got {dict(declared)}"
            )
        dtype, shape = declared["dtype"], declared.get("shape")
    elif isinstance(declared, (tuple, list)) and len(declared) == 2:
        dtype, shape = declared
    else:
        raise ServingError(
            Code.INVALID_ARGUMENT, f'{where}: a tensor is (dtype, shape), e.g. ("float32", [-1, 4]); got {declared!r}'
        )
    return TensorSpec(alias, alias, parse_dtype(dtype, where), parse_shape(shape, where))


def tensor_specs(declared: Any, where: str) -> dict[str, TensorSpec]:
    if not isinstance(declared, Mapping) or not declared:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where} must map at least one tensor name to (dtype, shape)")
    specs = {}
    for alias, spec in declared.items():
        if not isinstance(alias, str) or not alias:
            raise ServingError(Code.INVALID_ARGUMENT, f"{where}: tensor names are non-empty strings; got {alias!r}")
        specs[alias] = tensor_spec(alias, spec, f"{where}.{alias}")
    return specs


def declared_signature(
    name: str, declared: Any, where: str, batchable: bool = True, method_name: str = PREDICT_METHOD
) -> Signature:
    """A signature declared as ``{"inputs": {...}, "outputs": {...}}`` (or a Signature, kept as it is)."""
    if isinstance(declared, Signature):
        return declared
    if not isinstance(declared, Mapping) or "inputs" not in declared or "outputs" not in declared:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'{where}: a signature is {{"inputs": {{...}}, "outputs": {{...}}}}; got {declared!r}',
        )
    unknown = set(declared) - {"inputs", "outputs", "method_name", "batchable"}
    if unknown:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}: unknown keys {sorted(unknown)}")
    return Signature(
        name=name,
        method_name=str(declared.get("method_name", method_name)),
        inputs=tensor_specs(declared["inputs"], f"{where}.inputs"),
        outputs=tensor_specs(declared["outputs"], f"{where}.outputs"),
        batchable=bool(declared.get("batchable", batchable)),
    )


def conform_outputs(signature: Signature, result: Any, outputs: Sequence[str], who: str) -> dict[str, np.ndarray]:
    """The ``outputs`` of ``result`` as the signature declares them: numbers cast, text as bytes, else an error."""
    if not isinstance(result, Mapping):
        raise ServingError(
            Code.INTERNAL, f"{who} returned {type(result).__name__}; it must return a dict of output name → array"
        )
    conformed = {}
    for alias in outputs:
        if alias not in result:
            raise ServingError(
                Code.INTERNAL,
                f'{who} returned no output "{alias}" (it returned {", ".join(sorted(map(str, result))) or "nothing"})',
            )
        conformed[alias] = conform(signature.outputs[alias], result[alias], who)
    return conformed


def conform(spec: TensorSpec, value: Any, who: str) -> np.ndarray:
    array = np.asarray(value)
    if spec.dtype.kind == "O":
        if array.dtype.kind == "U":
            return np.char.encode(array, "utf-8").astype(object)
        if array.dtype.kind in "SO":
            return array.astype(object)
    elif array.dtype == spec.dtype:
        return array
    elif array.dtype.kind in "biuf" and spec.dtype.kind in "biufc":
        return array.astype(spec.dtype)
    raise ServingError(
        Code.INTERNAL,
        f'{who} returned {type_name(array.dtype)} for output "{spec.alias}", which is declared {spec.describe()}',
    )


def call_user(fn: Callable[..., Any], who: str, *args: Any) -> Any:
    """Run repository code: ValueError/TypeError mean a bad request (400), anything else is the code's fault (500)."""
    try:
        return fn(*args)
    except ServingError:
        raise
    except (ValueError, TypeError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{who}: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises is an answer, not a crash
        error = from_exception(exc)
        raise ServingError(error.code, f"{who}: {error.message}") from None
