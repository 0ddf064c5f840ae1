"""What an MLflow model folder says of itself, read without importing MLflow: its ``MLmodel`` file (flavors,
signature, input example) and the environment it was logged in (``requirements.txt``, ``conda.yaml``,
``python_env.yaml``).

The MLflow signature becomes the serving signature: a column-based signature one input per column (its name the
alias, ``(-1,)`` its shape), a tensor-based one an input per tensor spec; an unnamed input is ``inputs`` and an
unnamed output ``predictions`` (TF Serving's and MLflow's words for the one tensor of a request and an answer).
Parameters (``params``) are inputs too, scalars with their defaults: a request that sends none is given the
defaults, as MLflow gives them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec

MLMODEL_FILE = "MLmodel"
UNNAMED_INPUT = "inputs"
UNNAMED_OUTPUT = "predictions"

# MLflow's column types (mlflow.types.DataType) as numpy types; strings and bytes are workbench's object arrays.
COLUMN_TYPES: dict[str, np.dtype[Any]] = {
    "boolean": np.dtype(np.bool_),
    "integer": np.dtype(np.int32),
    "long": np.dtype(np.int64),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "string": np.dtype(object),
    "binary": np.dtype(object),
    "datetime": np.dtype(object),
}


@dataclasses.dataclass(frozen=True)
class Column:
    """One input or output of an MLflow signature, or one of its params."""

    name: str  # "" when unnamed
    dtype: np.dtype[Any]
    shape: tuple[int, ...] | None
    required: bool = True
    default: Any = None  # a param's


@dataclasses.dataclass(frozen=True)
class MlflowSignature:
    """An MLflow model signature: ``columns`` says whether its inputs are columns (a DataFrame) or tensors."""

    inputs: tuple[Column, ...]
    outputs: tuple[Column, ...]
    params: tuple[Column, ...]
    columns: bool  # column-based (a DataFrame goes to the model) rather than tensor-based
    output_columns: bool  # the outputs are named columns (MLflow answers records)


@dataclasses.dataclass(frozen=True)
class MlflowModel:
    """An ``MLmodel`` file, read: its flavors (name → the flavor's settings) and signature."""

    folder: Path
    flavors: Mapping[str, Mapping[str, Any]]
    signature: MlflowSignature | None
    document: Mapping[str, Any]

    @property
    def input_example_file(self) -> Path | None:
        """``serving_input_example.json``: the input example as a scoring request, where MLflow wrote one."""
        info = self.document.get("saved_input_example_info")
        name = info.get("serving_input_path") if isinstance(info, dict) else None
        file = self.folder / str(name) if name else None
        return file if file is not None and file.is_file() else None


def read_mlmodel(folder: str | Path) -> MlflowModel:
    import yaml

    path = Path(folder) / MLMODEL_FILE
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"Could not read {path}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("flavors"), dict):
        raise ServingError(Code.INVALID_ARGUMENT, f"{path} names no flavors: is it an MLflow model's MLmodel file?")
    flavors = {str(k): v if isinstance(v, dict) else {} for k, v in document["flavors"].items()}
    raw = document.get("signature")
    signature = read_signature(raw, path) if isinstance(raw, dict) else None
    return MlflowModel(Path(folder), flavors, signature, document)


# --------------------------------------------------------------------------------------------- signature
def read_signature(raw: Mapping[str, Any], where: Path) -> MlflowSignature:
    inputs = _specs(raw.get("inputs"), where)
    outputs = _specs(raw.get("outputs"), where)
    params = tuple(_param(p, where) for p in _json_list(raw.get("params"), where))
    columns = bool(inputs) and all(not _is_tensor(s) for s in _json_list(raw.get("inputs"), where))
    raw_outputs = _json_list(raw.get("outputs"), where)
    output_columns = bool(raw_outputs) and all(not _is_tensor(s) and s.get("name") for s in raw_outputs)
    return MlflowSignature(inputs, outputs, params, columns, output_columns)


def _json_list(value: Any, where: Path) -> list[dict[str, Any]]:
    if value in (None, ""):
        return []
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}'s signature is not valid JSON: {exc}") from None
    if not isinstance(parsed, list) or not all(isinstance(s, dict) for s in parsed):
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}'s signature is not a list of specs: {value!r}")
    return parsed


def _is_tensor(spec: Mapping[str, Any]) -> bool:
    return spec.get("type") == "tensor"


def _specs(value: Any, where: Path) -> tuple[Column, ...]:
    specs = []
    for spec in _json_list(value, where):
        name = str(spec.get("name") or "")
        required = bool(spec.get("required", True))
        if _is_tensor(spec):
            tensor = spec.get("tensor-spec") or {}
            shape = tensor.get("shape")
            specs.append(Column(name, _numpy_type(str(tensor.get("dtype")), where), _shape(shape), required))
        else:
            kind = spec.get("type")
            dtype = COLUMN_TYPES.get(kind, np.dtype(object)) if isinstance(kind, str) else np.dtype(object)
            specs.append(Column(name, dtype, (-1,) if isinstance(kind, str) else None, required))
    return tuple(specs)


def _param(spec: Mapping[str, Any], where: Path) -> Column:
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}'s signature has a param without a name: {spec}")
    kind = spec.get("type")
    dtype = COLUMN_TYPES.get(kind, np.dtype(object)) if isinstance(kind, str) else np.dtype(object)
    shape = spec.get("shape")
    return Column(name, dtype, () if shape is None else _shape(shape), False, spec.get("default"))


def _numpy_type(name: str, where: Path) -> np.dtype[Any]:
    if name in ("str", "object", "bytes"):
        return np.dtype(object)
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}'s signature names an unknown dtype: {name}") from None
    return np.dtype(object) if dtype.kind in "SU" else dtype


def _shape(shape: Any) -> tuple[int, ...] | None:
    if not isinstance(shape, (list, tuple)):
        return None
    return tuple(int(d) if isinstance(d, int) else -1 for d in shape)


def aliases(columns: Sequence[Column], unnamed: str) -> list[str]:
    """The aliases of ``columns``: their names; an unnamed one ``unnamed``, several ``unnamed_0``, ``unnamed_1``..."""
    if len(columns) == 1 and not columns[0].name:
        return [unnamed]
    return [c.name or f"{unnamed}_{i}" for i, c in enumerate(columns)]


def serving_signature(signature: MlflowSignature, outputs: Mapping[str, TensorSpec]) -> Signature:
    """``serving_default`` for ``signature``; ``outputs`` where the signature declares none (the model's own)."""
    inputs = {
        alias: TensorSpec(alias, column.name or alias, column.dtype, column.shape)
        for alias, column in zip(aliases(signature.inputs, UNNAMED_INPUT), signature.inputs, strict=True)
    }
    defaults: dict[str, np.ndarray] = {}
    for param in signature.params:
        if param.name in inputs:
            raise ServingError(
                Code.INVALID_ARGUMENT, f'The MLflow signature names "{param.name}" both as an input and a param'
            )
        inputs[param.name] = TensorSpec(param.name, param.name, param.dtype, param.shape)
        defaults[param.name] = param_value(param, param.default)
    if signature.outputs:
        outputs = {
            alias: TensorSpec(alias, column.name or alias, column.dtype, column.shape)
            for alias, column in zip(aliases(signature.outputs, UNNAMED_OUTPUT), signature.outputs, strict=True)
        }
    # A request's params apply to all its rows: requests with params of their own must not share a call.
    return Signature(
        DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs, defaults=defaults, batchable=not signature.params
    )


def param_value(param: Column, value: Any) -> np.ndarray:
    """A param's value as the input that carries it (strings as bytes, workbench's strings)."""
    if param.dtype.kind == "O":
        if isinstance(value, str):
            value = value.encode("utf-8")
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    try:
        return np.asarray(value, dtype=param.dtype)
    except (TypeError, ValueError) as exc:
        raise ServingError(
            Code.INVALID_ARGUMENT, f'Param "{param.name}" takes {param.dtype.name} values, not {value!r}: {exc}'
        ) from None


# --------------------------------------------------------------------------------------------- environment
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#,]+)")
# Packages the logged environment pins that serving does not need to equal (the tools of the logging process).
_IGNORED = frozenset({"pip", "setuptools", "wheel"})


def environment_mismatches(folder: str | Path) -> list[str]:
    """Where the installed packages differ from those the model was logged with (``name==version`` pins of its
    ``requirements.txt``, else of ``conda.yaml``'s pip list) and the Python version from ``python_env.yaml``'s;
    one line each, for a warning and the version's status. Nothing is installed."""
    root = Path(folder)
    found: list[str] = []
    for name, pinned in _pins(root):
        key = _normal(name)
        if key in _IGNORED:
            continue
        installed = _installed(name)
        if installed is None:
            found.append(f"{name}=={pinned} (not installed)")
            continue
        if _base(installed) != _base(pinned):
            found.append(f"{name}=={pinned} (installed: {installed})")
    wanted = _python_version(root)
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wanted and ".".join(wanted.split(".")[:2]) != running:
        found.append(f"python {wanted} (running: {sys.version.split()[0]})")
    return found


def _installed(name: str) -> str | None:
    """The installed version of ``name``, or of the distribution that provides its module under another name
    (``xgboost`` from ``xgboost-cpu``)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    for distribution in importlib.metadata.packages_distributions().get(_normal(name).replace("-", "_"), []):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _pins(root: Path) -> list[tuple[str, str]]:
    requirements = root / "requirements.txt"
    lines: list[str] = []
    if requirements.is_file():
        lines = requirements.read_text(errors="replace").splitlines()
    elif (root / "conda.yaml").is_file():
        import yaml

        try:
            conda = yaml.safe_load((root / "conda.yaml").read_text())
        except yaml.YAMLError:
            conda = None
        for entry in (conda or {}).get("dependencies", []) if isinstance(conda, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get("pip"), list):
                lines.extend(str(line) for line in entry["pip"])
    pins = []
    for line in lines:
        match = _REQUIREMENT.match(line)
        if match:
            pins.append((match.group(1), match.group(2)))
    return pins


def _python_version(root: Path) -> str:
    env = root / "python_env.yaml"
    if not env.is_file():
        return ""
    import yaml

    try:
        document = yaml.safe_load(env.read_text())
    except yaml.YAMLError:
        return ""
    return str(document.get("python", "")) if isinstance(document, dict) else ""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _base(version: str) -> str:
    """A version without its local label (``2.13.0+cpu`` → ``2.13.0``): MLflow drops it when it logs a pin."""
    return version.split("+", 1)[0]
