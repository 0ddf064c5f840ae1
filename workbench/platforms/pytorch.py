"""The PyTorch platform: ``model.pt2`` (a ``torch.export`` program) or ``model.pt`` (TorchScript), run by PyTorch.

A version folder holds one of:

- ``model.pt2``, written by ``torch.export.save``: loaded with ``torch.export.load`` and run as
  ``program.module()``. The program carries its signature: the inputs are ``forward()``'s tensor parameters by
  name, with their dtypes and shapes (a symbolic dimension is -1); the outputs are named after the structure
  ``forward()`` returns (see :func:`named_leaves`: a dict's keys, else ``output_0``, ``output_1`` ...).
- ``model.pt``, TorchScript (``torch.jit.save``): it records its parameters' names but not their dtypes or shapes,
  so ``workbench.json`` beside it declares them, as :func:`write` does::

      {"platform": "pytorch",
       "inputs": [{"name": "pixels", "dtype": "float32", "shape": [-1, 64]}],
       "outputs": [{"name": "output_0", "dtype": "float32", "shape": [-1, 10]}]}

  ``inputs`` are in ``forward()``'s order; an output's name is where :func:`named_leaves` finds it in what
  ``forward()`` returns. A Triton model's ``config.pbtxt`` declares the same for ``model.pt`` (``INPUT__0`` ...).

The signature, ``serving_default``, is batchable when dimension 0 of every input and output is the one batch
dimension (the same symbol in a ``torch.export`` program; -1 everywhere in a declaration).

Each version is placed once, at load, on the device the server's ``--pytorch_device`` names (``auto``: the first
CUDA GPU PyTorch sees, else the CPU; see :func:`resolve_device`); each call moves its inputs there (zero-copy on the
CPU: ``torch.from_numpy``), runs under ``torch.inference_mode()``, and brings its outputs back as numpy arrays.

``torch.export.load`` unpickles what an archive stores as pickles (``weights_only=False``): a crafted ``model.pt2``
could run code. Before loading, every pickle the loader would read is vetted with PyTorch's own restricted
unpickler (:func:`vet_exported_archive`); one that holds more than tensors loads only with ``--allow_pickle``.
TorchScript archives are read by TorchScript's own unpickler, which builds no arbitrary Python objects.

torch is imported inside the functions: a server of other models never imports it. Helpers meant for other
modules (TorchServe archives, benchmarks) are the public functions: :func:`resolve_device`,
:func:`configure_threads`, :func:`load_exported`, :func:`load_torchscript`, :func:`to_tensor`, :func:`to_numpy`,
:func:`named_leaves`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import itertools
import json
import logging
import re
import threading
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.differentiable import Gradients
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.footprint import Footprint
from workbench.core.servable import Servable
from workbench.core.signatures import (
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    Signature,
    TensorSpec,
    describe_array,
    input_error,
)
from workbench.platforms.base import PICKLE_SETTING, LoadPolicy
from workbench.platforms.export_request import ExportRefused, ExportRequest, VersionWriter
from workbench.platforms.tabular import model_file, version_config, write_version_config

if TYPE_CHECKING:  # annotations only: importing torch at runtime is what load/write do
    import torch

log = logging.getLogger(__name__)

PLATFORM = "pytorch"
EXPORTED_FILE = "model.pt2"
TORCHSCRIPT_FILE = "model.pt"
MODEL_FILES = (EXPORTED_FILE, TORCHSCRIPT_FILE)
FORMATS = {"pt2": EXPORTED_FILE, "torchscript": TORCHSCRIPT_FILE}  # workbench.export(..., format=...)
AUTO_DEVICE = "auto"
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")

# numpy's names of the element types both libraries have. bfloat16, the float8 types and complex numbers have no
# numpy type a request can be decoded into (or none the wire protocols carry), so tensors of them are not served.
_NUMPY_NAMES = (
    "float32 float64 float16 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool".split()  # noqa: SIM905
)


# ================================================================================================ torch helpers
def numpy_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    """The numpy type of a torch dtype (``torch.float32`` → float32); None for the types numpy lacks."""
    name = str(dtype).removeprefix("torch.")
    return np.dtype(name) if name in _NUMPY_NAMES else None


def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    import torch

    result: torch.dtype = getattr(torch, dtype.name)
    return result


def resolve_device(requested: str = AUTO_DEVICE) -> torch.device:
    """The device ``--pytorch_device`` names: ``auto`` (the first CUDA GPU PyTorch sees, else the CPU), ``cpu``,
    ``cuda`` or ``cuda:N``; FAILED_PRECONDITION when it names a GPU this process cannot use.

    ``auto`` is the default because it is what every other GPU-capable platform of workbench does (ONNX Runtime puts
    CUDA first when it has it) and because model runners give each process one GPU (CUDA_VISIBLE_DEVICES), which is
    then ``cuda:0`` to it.
    """
    import torch

    if not DEVICE_PATTERN.fullmatch(requested):
        raise ServingError(
            Code.INVALID_ARGUMENT, f"--pytorch_device={requested}: expected auto, cpu, cuda or cuda:N (a GPU's index)"
        )
    if requested == AUTO_DEVICE:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
            raise ServingError(
                Code.FAILED_PRECONDITION, f"--pytorch_device={requested} but PyTorch sees no CUDA GPU ({build})"
            )
        if device.index is not None and device.index >= count:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"--pytorch_device={requested} but PyTorch sees {count} CUDA GPU(s) (cuda:0 to cuda:{count - 1})",
            )
    return device


def places_on_gpu(policy: LoadPolicy) -> bool:
    """Whether ``--pytorch_device`` puts models on a GPU, without importing PyTorch (a memory budget asks before a
    first load): ``cuda``/``cuda:N``, or ``auto`` on a machine with a GPU."""
    from workbench.runtime.memory import gpu_seen

    device = policy.pytorch_device
    return device.startswith("cuda") or (device == AUTO_DEVICE and gpu_seen())


_threads_lock = threading.Lock()
_threads_set: int | None = None


def configure_threads(intra_op: int) -> None:
    """Size PyTorch's CPU thread pools for this process, once: ``intra_op`` threads per call (0: leave PyTorch's
    defaults, one per core) and one inter-op thread.

    The pools are the process's, not a model's, so the server sizes them (``--pytorch_threads``, 1 by default, as
    ONNX Runtime's sessions are): it already runs up to ``--num_inference_threads`` calls at once and the batcher
    turns concurrent requests into one call, so a pool of one thread per core for every call would put cores x
    calls threads on the CPU under load. An export's check in a notebook leaves the kernel's settings alone.
    """
    global _threads_set
    if intra_op <= 0:
        return
    import torch

    with _threads_lock:
        if _threads_set == intra_op:
            return
        torch.set_num_threads(intra_op)
        if _threads_set is None:
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # only settable before the first inter-op work of the process
                log.debug("PyTorch's inter-op threads were already started; left as they are")
        _threads_set = intra_op


def tensors_held(tensors: Iterable[torch.Tensor]) -> Footprint:
    """The bytes ``tensors`` hold, on the host and on CUDA GPUs: each storage once (tied weights, views), its whole
    size; tensors on PyTorch's ``meta`` device hold nothing."""
    seen: set[tuple[str, int]] = set()
    host = gpu = 0
    for tensor in tensors:
        device = tensor.device
        if device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        key = (str(device), storage.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        if device.type == "cuda":
            gpu += storage.nbytes()
        else:
            host += storage.nbytes()
    return Footprint(host, gpu)


def module_held(module: torch.nn.Module) -> Footprint:
    """What a module's parameters and buffers hold, per kind of memory (:func:`tensors_held`)."""
    return tensors_held(itertools.chain(module.parameters(), module.buffers()))


def to_tensor(value: np.ndarray, device: torch.device) -> torch.Tensor:
    """A request's array as a tensor on ``device``: the array's own memory on the CPU when it may be shared.

    A read-only array (a view of a request's bytes) or one numpy lays out backwards is copied first: a model may
    write into its inputs, and ``torch.from_numpy`` takes neither.
    """
    import torch

    if not value.flags.writeable or any(stride < 0 for stride in value.strides):
        value = np.array(value, order="C")
    tensor = torch.from_numpy(value)
    return tensor if device.type == "cpu" else tensor.to(device)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """An output as a numpy array (on the CPU: the tensor's own memory)."""
    return tensor.detach().cpu().numpy()


def named_leaves(result: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """What ``forward()`` returned, as (name, leaf) pairs in order: a dict's values under its keys, a tuple's or
    list's under ``output_0``, ``output_1`` ..., one tensor as ``output_0``; nested ones joined by "_"
    (``{"a": (x, y)}`` → ``a_0``, ``a_1``)."""
    if isinstance(result, Mapping):
        pairs: list[tuple[str, Any]] = []
        for key, value in result.items():
            pairs += named_leaves(value, f"{prefix}{key}_") if _is_structure(value) else [(f"{prefix}{key}", value)]
        return pairs
    if isinstance(result, (tuple, list)):
        stem = prefix or "output_"
        pairs = []
        for i, value in enumerate(result):
            pairs += named_leaves(value, f"{stem}{i}_") if _is_structure(value) else [(f"{stem}{i}", value)]
        return pairs
    return [(f"{prefix}0" if prefix else "output_0", result)]


def _is_structure(value: Any) -> bool:
    return isinstance(value, (Mapping, tuple, list))


# ====================================================================================================== loading
def vet_exported_archive(path: Path) -> str:
    """Why loading ``path`` (a ``torch.export`` archive) would unpickle more than tensors; "" when it would not.

    ``torch.export.load`` reads weights and constants marked ``use_pickle``, and every nested ``torch.save`` file
    (example inputs, older formats' state dicts), with ``torch.load``, falling back to ``weights_only=False``.
    Each of them is loaded here first with ``weights_only=True``: when that succeeds the real load builds the same
    tensors and containers and nothing else. Raises DATA_LOSS for a file that is not a zip archive.
    """
    import torch

    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ServingError(
            Code.DATA_LOSS, f"{path} is not a PyTorch archive (torch.export.save's zip): {exc}"
        ) from None
    with archive:
        names = archive.namelist()
        pickled: set[str] = set()
        for name in names:
            if name.endswith((".pt", ".pkl")):
                pickled.add(name)
            elif name.endswith("_config.json"):  # weights' and constants' configs: which payloads are pickles
                try:
                    config = json.loads(archive.read(name)).get("config", {})
                except (ValueError, AttributeError, zipfile.BadZipFile) as exc:
                    raise ServingError(Code.DATA_LOSS, f"{path}: {name} is not valid JSON: {exc}") from None
                folder = name.rpartition("/")[0]
                for entry in config.values() if isinstance(config, dict) else ():
                    if isinstance(entry, dict) and entry.get("use_pickle"):
                        pickled.add(f"{folder}/{entry.get('path_name')}")
        for name in names:
            if name not in pickled and archive.read(name)[:4] == b"PK\x03\x04":  # a torch.save file inside
                pickled.add(name)
        for name in sorted(pickled):
            try:
                data = archive.read(name)
            except KeyError:
                return f"it names {name}, which it does not hold"
            except (zipfile.BadZipFile, OSError) as exc:
                raise ServingError(Code.DATA_LOSS, f"{path}: {name} cannot be read: {exc}") from None
            if not data:  # an empty artifact (no example inputs) is read as {} without unpickling
                continue
            try:
                torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
            except Exception as exc:  # noqa: BLE001 - any refusal means the full unpickler would do more
                return f"{name} is not plain tensors ({_first_line(exc)})"
    return ""


# torch.export.load keeps the archive it is reading in a global (_CURRENT_DESERIALIZER): two at once fail.
_export_load_lock = threading.Lock()


def load_exported(path: str | Path, device: torch.device, allow_pickle: bool = False) -> torch.export.ExportedProgram:
    """A ``torch.export`` archive, vetted (see :func:`vet_exported_archive`) and moved to ``device``."""
    import torch

    path = Path(path)
    unsafe = vet_exported_archive(path)
    if unsafe and not allow_pickle:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{path} holds pickled objects: {unsafe}. torch.export.load would unpickle them, which runs code; "
            f"load it only if you trust it, with {PICKLE_SETTING}",
        )
    try:
        with _export_load_lock:
            program = torch.export.load(str(path))
        if device.type != "cpu":
            try:
                from torch.export.passes import move_to_device_pass
            except ImportError:  # PyTorch before 2.5: TorchServable moves the module itself (module().to)
                pass
            else:  # also rewrites the devices the graph names (a tensor made on the CPU inside forward())
                program = move_to_device_pass(program, device)
    except ServingError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt or incompatible archive fails this version alone
        raise ServingError(Code.DATA_LOSS, f"PyTorch cannot load {path}: {_first_line(exc)}") from None
    return program


def load_torchscript(path: str | Path, device: torch.device) -> torch.jit.ScriptModule:
    """A TorchScript archive on ``device``, in eval mode."""
    import torch

    try:
        module = torch.jit.load(str(path), map_location=device)
    except Exception as exc:  # noqa: BLE001 - a corrupt file or one that is not TorchScript fails this version alone
        raise ServingError(Code.DATA_LOSS, f"PyTorch cannot load {path} as TorchScript: {_first_line(exc)}") from None
    module.eval()
    return module


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


# =================================================================================================== signatures
@dataclasses.dataclass(frozen=True)
class Declared:
    """A TorchScript model's declaration (``workbench.json`` or a Triton config): forward()'s inputs in order (each
    spec's ``name``) and the outputs, each found by its ``name`` in :func:`named_leaves`, else at its position in
    ``positions`` (a Triton config's outputs, in order, when forward() returns a tuple or one tensor)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    positions: Mapping[str, int] = dataclasses.field(default_factory=dict)


_TRITON_INDEXED = re.compile(r".*__(\d+)")


def triton_declaration(
    inputs: Sequence[Any], outputs: Sequence[Any], batched: bool, forward_names: Sequence[str]
) -> Declared:
    """A Triton config's tensors (``TritonTensor``s) as a TorchScript model's declaration, as Triton's libtorch
    backend pairs them: inputs named ``NAME__i`` are forward()'s i-th, inputs named as forward()'s parameters are
    those, the rest go in the config's order; outputs named ``NAME__i`` are the i-th returned, the others are found
    by name in a returned dict, else by their order in the config."""
    if not inputs or not outputs:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            "config.pbtxt: a pytorch_libtorch model declares its inputs and outputs (TorchScript records no types)",
        )

    def shape(tensor: Any) -> tuple[int, ...]:
        dims = tuple(tensor.model_dims)
        return (-1, *dims) if batched else dims

    def index(name: str) -> int | None:
        match = _TRITON_INDEXED.fullmatch(name)
        return int(match.group(1)) if match else None

    indexed = [index(t.name) for t in inputs]
    if all(i is not None for i in indexed) and sorted(indexed) == list(range(len(inputs))):  # type: ignore[type-var]
        order = sorted(range(len(inputs)), key=lambda k: indexed[k] or 0)
    elif {t.name for t in inputs} <= set(forward_names):
        order = sorted(range(len(inputs)), key=lambda k: list(forward_names).index(inputs[k].name))
    else:
        order = list(range(len(inputs)))
    parameters = [*forward_names, *(f"INPUT__{i}" for i in range(len(forward_names), len(inputs)))]
    declared_inputs = tuple(
        TensorSpec(inputs[k].name, parameters[position], inputs[k].dtype, shape(inputs[k]))
        for position, k in enumerate(order)
    )
    declared_outputs = []
    positions = {}
    for position, tensor in enumerate(outputs):
        i = index(tensor.name)
        leaf = f"output_{i}" if i is not None else tensor.name
        positions[leaf] = i if i is not None else position
        declared_outputs.append(TensorSpec(tensor.name, leaf, tensor.dtype, shape(tensor)))
    return Declared(declared_inputs, tuple(declared_outputs), positions)


def _shape(dims: Sequence[Any]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in dims)


def _program_spec(path: Path, kind: str, name: str, value: Any) -> TensorSpec:
    import torch

    if not isinstance(value, torch.Tensor):
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{path}: {kind} {name!r} is {type(value).__name__}, not a tensor; workbench serves programs whose "
            "inputs and outputs are tensors",
        )
    dtype = numpy_dtype(value.dtype)
    if dtype is None:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{path}: {kind} {name!r} is {value.dtype}, which numpy and the wire protocols lack; serve "
            f"{', '.join(_NUMPY_NAMES)} (cast it in forward())",
        )
    return TensorSpec(alias=name, name=name, dtype=dtype, shape=_shape(value.shape))


def _batch_symbol(values: Sequence[Any]) -> bool:
    """Whether dimension 0 of every tensor is one and the same symbol (the program's dynamic batch)."""
    import torch

    symbols = {str(v.shape[0]) if v.dim() > 0 and isinstance(v.shape[0], torch.SymInt) else None for v in values}
    return len(symbols) == 1 and None not in symbols


def program_signature(program: torch.export.ExportedProgram, path: Path) -> tuple[Signature, list[str]]:
    """A ``torch.export`` program's ``serving_default``, and its outputs' names in the order it returns them."""
    import torch.utils._pytree as pytree

    placeholders = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    input_names = list(program.graph_signature.user_inputs)
    input_values = [placeholders[name] for name in input_names]
    inputs = {
        name: _program_spec(path, "input", name, value) for name, value in zip(input_names, input_values, strict=True)
    }
    (output_node,) = [n for n in program.graph.nodes if n.op == "output"]
    by_name = {getattr(node, "name", None): node for node in output_node.args[0]}
    output_values = [  # None for an output that is a constant, not a tensor the graph computes
        getattr(by_name.get(name), "meta", {}).get("val") for name in program.graph_signature.user_outputs
    ]
    structure = pytree.tree_unflatten(list(range(len(output_values))), program.call_spec.out_spec)
    names = [name for name, _ in named_leaves(structure)]
    outputs = {
        name: _program_spec(path, "output", name, value) for name, value in zip(names, output_values, strict=True)
    }
    signature = Signature(
        name=DEFAULT_SIGNATURE,
        method_name=PREDICT_METHOD,
        inputs=inputs,
        outputs=outputs,
        batchable=bool(input_values) and _batch_symbol([*input_values, *output_values]),
    )
    return signature, names


def _declared_specs(config: Path, kind: str, entries: Any) -> tuple[TensorSpec, ...]:
    if not isinstance(entries, list) or not entries:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'{config}: "{kind}" must list the model\'s {kind}, each {{"name": ..., "dtype": ..., "shape": [...]}}',
        )
    specs = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or dtype not in _NUMPY_NAMES:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{config}: {kind} entry {entry!r} needs a name and a dtype of {', '.join(_NUMPY_NAMES)}",
            )
        if shape is not None and not (isinstance(shape, list) and all(isinstance(d, int) for d in shape)):
            raise ServingError(Code.INVALID_ARGUMENT, f"{config}: {kind} {name!r} has shape {shape!r}: a list of ints")
        specs.append(TensorSpec(name, name, np.dtype(dtype), None if shape is None else _shape(shape)))
    return tuple(specs)


def declared_in_folder(folder: Path) -> Declared:
    """The declaration in a TorchScript version's ``workbench.json``; FAILED_PRECONDITION naming the fix without."""
    document = version_config(folder)
    config = folder / "workbench.json"
    if "inputs" not in document or "outputs" not in document:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{folder / TORCHSCRIPT_FILE} is TorchScript, which does not record its inputs' types and shapes: declare "
            f'them in {config} ({{"platform": "pytorch", "inputs": [{{"name": "x", "dtype": "float32", "shape": '
            '[-1, 4]}], "outputs": [...]}), export the module with workbench.export, or save it with torch.export',
        )
    return Declared(
        _declared_specs(config, "inputs", document["inputs"]), _declared_specs(config, "outputs", document["outputs"])
    )


def declared_signature(declared: Declared) -> Signature:
    specs = [*declared.inputs, *declared.outputs]
    return Signature(
        name=DEFAULT_SIGNATURE,
        method_name=PREDICT_METHOD,
        inputs={s.alias: s for s in declared.inputs},
        outputs={s.alias: s for s in declared.outputs},
        batchable=all(s.shape is not None and len(s.shape) > 0 and s.shape[0] == -1 for s in specs),
    )


# ====================================================================================================== serving
class TorchServable(Servable):
    """A PyTorch model on one device. Its module may be called from several threads at once: inference under
    ``torch.inference_mode`` keeps no state between calls."""

    def __init__(
        self,
        name: str,
        version: int,
        path: str,
        policy: LoadPolicy = LoadPolicy(),
        file: str = "",
        declare: Callable[[Sequence[str]], Declared] | None = None,
    ) -> None:
        """Load ``file`` of version folder ``path`` (default: the one of :data:`MODEL_FILES` it holds).

        ``declare`` describes a TorchScript model's tensors, given forward()'s parameter names, where a Triton config
        does (:func:`triton_declaration`); else its ``workbench.json`` does.
        """
        self.name, self.version, self.path = name, version, path
        folder = Path(path)
        model = folder / file if file else model_file(folder, PLATFORM, MODEL_FILES)
        if not model.is_file():
            raise ServingError(Code.NOT_FOUND, f"No {model.name} in {path}")
        configure_threads(policy.pytorch_threads)
        self._threads = policy.pytorch_threads
        self.device = resolve_device(policy.pytorch_device)
        self._in_spec: Any = None
        self._positions: Mapping[str, int] = {}
        if model.suffix == ".pt2":
            program = load_exported(model, self.device, policy.allow_pickle)
            signature, _ = program_signature(program, model)
            self._in_spec = program.call_spec.in_spec
            self._module: Any = program.module()
            if self.device.type != "cpu":
                self._module.to(self.device)
        else:
            self._module = load_torchscript(model, self.device)
            parameters = [a.name for a in self._module.forward.schema.arguments[1:]]  # after self
            declared = declare(parameters) if declare is not None else declared_in_folder(folder)
            signature = declared_signature(declared)
            self._positions = declared.positions
        self._input_names = [spec.name for spec in signature.inputs.values()]
        self.signatures = {DEFAULT_SIGNATURE: signature}

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        import torch
        import torch.utils._pytree as pytree

        module = self._module
        if module is None:
            raise ServingError(Code.UNAVAILABLE, f"{self.name} version {self.version} is unloaded")
        for alias, value in inputs.items():
            spec = signature.inputs[alias]
            if not spec.admits_shape(value.shape):  # the program's guards would say so in graph terms
                raise input_error(spec, describe_array(value))
        by_name = {signature.inputs[alias].name: value for alias, value in inputs.items()}
        if self._threads > 0 and torch.get_num_threads() != self._threads:
            # OpenMP keeps the count per thread: a thread that ran PyTorch before configure_threads keeps its own.
            torch.set_num_threads(self._threads)
        try:
            with torch.inference_mode():
                tensors = [to_tensor(by_name[name], self.device) for name in self._input_names]
                if self._in_spec is not None:
                    args, kwargs = pytree.tree_unflatten(tensors, self._in_spec)
                    result = module(*args, **kwargs)
                else:
                    result = module(*tensors)
                found = dict(named_leaves(result))
                answer = {}
                for alias in outputs:
                    spec = signature.outputs[alias]
                    answer[alias] = self._output(spec, found)
        except ServingError:
            raise
        except torch.cuda.OutOfMemoryError as exc:
            raise ServingError(Code.RESOURCE_EXHAUSTED, f"PyTorch: {_first_line(exc)}") from None
        except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as exc:
            # An op refusing the data it was given (sizes that do not broadcast, an index out of range): the
            # request's fault, as ONNX Runtime's and TensorFlow's op errors are INVALID_ARGUMENT.
            raise ServingError(Code.INVALID_ARGUMENT, f"PyTorch: {_first_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - anything else is the model's fault, reported as such
            raise from_exception(exc) from None
        return answer

    def _output(self, spec: TensorSpec, found: Mapping[str, Any]) -> np.ndarray:
        import torch

        value = found.get(spec.name)
        position = self._positions.get(spec.name)
        if spec.name not in found and position is not None and position < len(found):
            value = list(found.values())[position]  # a Triton config's output, by its order
        if not isinstance(value, torch.Tensor):
            what = "nothing" if spec.name not in found else type(value).__name__
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{self.name} version {self.version}: output {spec.name!r} is {what}; forward() returned "
                f"{', '.join(found) or 'no tensors'}",
            )
        array = to_numpy(value)
        if array.dtype != spec.dtype:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{self.name} version {self.version}: output {spec.name!r} is declared {spec.dtype_name} but "
                f"forward() returned {describe_array(array)}",
            )
        return array

    def gradients(self, signature: Signature, input_alias: str, output_alias: str) -> Gradients:
        """Integrated gradients' view of ``signature`` (:class:`~workbench.core.differentiable.Differentiable`):
        the module and the argument structure of its forward() that :meth:`run` calls, so an explanation
        differentiates exactly the served model."""
        from workbench.platforms.pytorch_gradients import ModuleGradients

        module, in_spec = self._module, self._in_spec
        if module is None:
            raise ServingError(Code.UNAVAILABLE, f"Model {self.name} version {self.version} is unloaded")
        leaf = signature.outputs[output_alias].name

        def call(x: Any) -> Any:
            if in_spec is not None:
                import torch.utils._pytree as pytree

                args, kwargs = pytree.tree_unflatten([x], in_spec)
                return module(*args, **kwargs)
            return module(x)

        def pick(result: Any) -> Any:
            return dict(named_leaves(result))[leaf]

        return ModuleGradients(call, pick, output_alias, self.device)

    def close(self) -> None:
        import torch

        module, self._module = self._module, None
        if module is not None and not isinstance(module, torch.jit.ScriptModule):
            # An exported program's module is a GraphModule, whose graph and nodes refer back to it: a cycle, which
            # only the cyclic collector frees, whenever it next runs (a full collection costs 0.2 s in a process
            # holding PyTorch and TensorFlow: too much for every unload). Its tensors are what matters, and nothing
            # else holds them: let go of them here, and they are freed now (a memory budget that evicted this version
            # counts its memory free at once, and the next version may need it).
            for part in module.modules():
                part._parameters.clear()  # noqa: SLF001 - torch has no public way to drop them
                part._buffers.clear()  # noqa: SLF001
                for name in [name for name, value in vars(part).items() if isinstance(value, torch.Tensor)]:
                    delattr(part, name)  # constants lifted out of the graph, kept as plain attributes
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the cached blocks, back to the driver: for other processes and frameworks


@functools.cache
def warm_up() -> None:
    """Export and load a one-layer program, once a process. PyTorch's first ``torch.export.load`` imports and builds
    about 100 MiB of its own (sympy, torch._dynamo, torch._inductor...) that every later load shares: run ahead of a
    measured load (:meth:`workbench.platforms.Platform.import_framework`), a memory budget charges it to no model."""
    import torch

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(torch.nn.Linear(1, 1), (torch.ones(2, 1),)), buffer)
    buffer.seek(0)
    with _export_load_lock:
        torch.export.load(buffer).module()


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    """The platform's loader (see the module's docstring for what a version folder holds)."""
    return TorchServable(name, version, path, policy)


# ================================================================================================= export side
def exports(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` (or an ``ExportedProgram``); decided without importing torch."""
    import sys

    if "torch" not in sys.modules:  # not imported: obj cannot be a module
        return False
    import torch

    return isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram))


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"example input {name!r} is {array.dtype}; PyTorch models are served with tensor inputs")
    return torch.from_numpy(np.array(array, order="C"))


def _forward_parameters(module: Any) -> list[str]:
    """forward()'s positional parameters' names, in order."""
    target = getattr(module, "forward", module)
    return [
        p.name
        for p in inspect.signature(target).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def _forward_names(module: Any, count: int) -> list[str]:
    """The names of ``count`` positional inputs: forward()'s, else Triton's (``INPUT__0`` ...) for a forward(*args)."""
    parameters = _forward_parameters(module)
    return parameters[:count] if len(parameters) >= count else [f"INPUT__{i}" for i in range(count)]


def example_arguments(module: Any, example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example_inputs`` as forward()'s (args, kwargs) of tensors: a tuple or list of positional inputs, a dict
    of inputs by parameter name, or one batch (a tensor or an array) for a forward() of one input."""
    if example_inputs is None:
        raise TypeError("A PyTorch module is exported with example_inputs= (a batch of inputs to trace it with)")
    if isinstance(example_inputs, Mapping):
        return (), {str(k): _as_tensor(str(k), v) for k, v in example_inputs.items()}
    items = list(example_inputs) if isinstance(example_inputs, (tuple, list)) else [example_inputs]
    if isinstance(example_inputs, list) and not any(_is_tensorlike(i) for i in items):
        items = [example_inputs]  # a nested list of numbers: one batch
    names = _forward_names(module, len(items))
    return tuple(_as_tensor(n, v) for n, v in zip(names, items, strict=True)), {}


def _is_tensorlike(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _two_rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A batch of one row doubled: PyTorch specializes a dimension of size 1, which would fix the batch at 1."""
    import torch

    def double(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t]) if t.dim() > 0 and t.shape[0] == 1 else t

    return tuple(double(a) for a in args), {k: double(v) for k, v in kwargs.items()}


def export_program(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.export.ExportedProgram:
    """``torch.export.export`` with dimension 0 of every input one dynamic batch dimension."""
    import torch

    batch = torch.export.Dim("batch")
    names = _forward_names(module, len(args))
    dynamic: dict[str, Any] = {n: {0: batch} if a.dim() > 0 else None for n, a in zip(names, args, strict=True)}
    dynamic |= {k: {0: batch} if v.dim() > 0 else None for k, v in kwargs.items()}
    args, kwargs = _two_rows(args, kwargs)
    training = module.training
    try:
        return torch.export.export(module.eval(), args, kwargs, dynamic_shapes=dynamic)
    except Exception as exc:
        raise ValueError(
            f"torch.export could not export the module with a dynamic batch dimension (dimension 0 of every "
            f"input): {_first_line(exc)}"
        ) from exc
    finally:
        module.train(training)  # the notebook's module is left as it was (exported in eval mode)


def _specs_of(named: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    specs = []
    for name, value in named:
        dtype = numpy_dtype(value.dtype) if hasattr(value, "dtype") else None
        if dtype is None:
            raise TypeError(f"{name} is {getattr(value, 'dtype', type(value).__name__)}; served tensors are of "
                            f"{', '.join(_NUMPY_NAMES)}")  # fmt: skip
        specs.append({"name": name, "dtype": dtype.name, "shape": [-1, *value.shape[1:]] if value.dim() else []})
    return specs


def write_torchscript(module: Any, folder: Path, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``model.pt`` traced with ``torch.jit.trace`` and ``workbench.json`` declaring its tensors."""
    import torch

    if kwargs:
        order = [n for n in _forward_parameters(module) if n in kwargs]
        if set(order) != set(kwargs):
            raise TypeError(f"example_inputs names {sorted(set(kwargs) - set(order))}, which forward() does not take")
        args, kwargs = tuple(kwargs[n] for n in order), {}
    args, _ = _two_rows(args, {})
    training = module.training
    try:
        with torch.no_grad():
            traced = torch.jit.trace(module.eval(), args, strict=False)
            result = traced(*args)
    finally:
        module.train(training)  # the notebook's module is left as it was (traced in eval mode)
    names = _forward_names(module, len(args))
    outputs = named_leaves(result)
    torch.jit.save(traced, str(folder / TORCHSCRIPT_FILE))
    write_version_config(
        folder, PLATFORM, inputs=_specs_of(list(zip(names, args, strict=True))), outputs=_specs_of(outputs)
    )


def write(obj: Any, folder: Path, example_inputs: Any = None, format: str | None = None) -> None:
    """Write ``obj`` into the empty version folder ``folder``: ``model.pt2`` (``format`` "pt2", the default) or
    TorchScript ``model.pt`` with its declaration (``format`` "torchscript"); never a pickle.

    ``obj`` is a ``torch.nn.Module`` (exported with ``example_inputs``, see :func:`example_arguments`) or an
    ``ExportedProgram`` (written as it is).
    """
    import torch

    chosen = format or "pt2"
    if chosen not in FORMATS:
        raise ValueError(f"PyTorch models are written as {' or '.join(FORMATS)}, not {format!r}")
    folder = Path(folder)
    if isinstance(obj, torch.export.ExportedProgram):
        if chosen != "pt2":
            raise ValueError("An ExportedProgram is written as model.pt2 (format='pt2')")
        torch.export.save(obj, str(folder / EXPORTED_FILE))
        return
    if not isinstance(obj, torch.nn.Module):
        raise TypeError(f"Cannot write a {type(obj).__name__} as a PyTorch model: give a torch.nn.Module")
    args, kwargs = example_arguments(obj, example_inputs)
    if chosen == "torchscript":
        write_torchscript(obj, folder, args, kwargs)
    else:
        program = export_program(obj, args, kwargs)
        # torch.export.save would pickle the example inputs (with torch.save) into the archive; without them it
        # holds no pickle at all, only the graph as JSON and the weights as raw bytes.
        program.example_inputs = None
        torch.export.save(program, str(folder / EXPORTED_FILE))


def writer(model: Any, request: ExportRequest) -> VersionWriter | None:
    """How ``workbench.export`` writes ``model``: a ``torch.nn.Module`` (or ``ExportedProgram``) as ``model.pt2`` or
    TorchScript; None for anything else, which is refused PyTorch's formats and ``example_inputs``."""
    if not exports(model):
        if request.format in FORMATS:
            raise ExportRefused(f"format={request.format!r} is for PyTorch modules; this is a {type(model).__name__}")
        if request.example_inputs is not None:
            raise ExportRefused("example_inputs= is for PyTorch modules (what torch.export traces them with)")
        return None
    if request.format not in (None, *FORMATS):
        raise ExportRefused(
            f"A PyTorch module is written as 'pt2' (the default) or 'torchscript', not {request.format!r}"
        )
    if request.signatures:
        raise ExportRefused("signatures= is for TensorFlow models; a PyTorch module's signature is its forward()")
    example_inputs = request.example_inputs
    if example_inputs is None and request.examples is not None:
        # The warmup requests show the inputs too: one batch (a single input) or a dict of inputs by name.
        examples = request.examples
        example_inputs = (
            examples[0]
            if isinstance(examples, (list, tuple)) and examples and isinstance(examples[0], Mapping)
            else examples
        )
    return functools.partial(write, model, example_inputs=example_inputs, format=request.format)
