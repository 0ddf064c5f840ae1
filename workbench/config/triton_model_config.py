"""Triton model repositories: ``<model>/config.pbtxt`` read into the description the rest of workbench uses.

A model folder holding ``config.pbtxt`` is a Triton model (:func:`has_config`); the file is parsed with Triton's own
generated protos (``tritonclient.grpc.model_config_pb2``) and ``google.protobuf.text_format``, so what Triton reads
is read the same way, and a file that does not parse fails that model's load with the file and line, never the
server. What workbench takes from it:

- ``name`` (empty, or the folder's name, as Triton requires), ``platform``/``backend`` (checked against the
  :class:`BackendTable` a load hands in, :mod:`workbench.platforms.triton_backends`: any other is a load error saying
  so), ``default_model_filename``;
- ``max_batch_size``: 0, the dims are whole shapes; above 0, every tensor has a batch dimension (-1) before its
  dims, as clients see it in the metadata;
- ``input``/``output``: names, ``data_type``, ``dims``, ``reshape`` (the shape the model sees, clients keep the dims),
  ``optional``;
- ``dynamic_batching``, ``instance_group`` and ``version_policy``, mapped onto workbench's
  :class:`BatchingParameters`, concurrent runs and :class:`VersionPolicy` (see :func:`batching_parameters`);
- ``parameters`` (handed to Python models, as Triton does) and ``response_cache { enable }``;
- ``model_transaction_policy { decoupled }``: 0..n responses per request, for Python backend models (Triton runs
  decoupled models only in its Python backend and custom backends);
- ``sequence_batching``, for every backend: read by :mod:`workbench.config.triton_sequence_config` (strategy, idle
  time, control tensors, implicit state) into :class:`SequenceBatching`, which workbench's sequence batcher runs.

Ensembles are refused (UNIMPLEMENTED); the rest of the file (optimization, warmup, rate limiters) is not acted on.

Why one module of this size: it mirrors one file format. Reading ``config.pbtxt`` into :class:`TritonConfig` (with
every check Triton makes, in Triton's words) and writing the JSON answers back are kept beside the message they
both follow, so a field added to one side is seen on the other.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor, json_format, text_format

from workbench.config.batching_parameters import BatchingParameters
from workbench.config.triton_data_types import DATA_TYPES, data_type_name
from workbench.config.triton_sequence_config import (
    SEQUENCE_IDLE_DEFAULT_MICROSECONDS,
    SequenceBatching,
    read_sequence_batching,
)
from workbench.config.version_policy import VersionPolicy
from workbench.core.errors import Code, ServingError

CONFIG_FILE = "config.pbtxt"  # beside the version folders: a Triton model (workbench.platforms.triton)


@dataclasses.dataclass(frozen=True)
class BackendTable:
    """The backends a server runs, by the workbench platform that loads each: framework facts, which live in
    :mod:`workbench.platforms.triton_backends` and are handed to :func:`read_config`. This floor knows the file
    format; the table says which ``backend``/``platform`` values it may name and what they mean."""

    backends: Mapping[str, str]  # Triton's ``backend`` → workbench platform
    platforms: Mapping[str, str]  # Triton's ``platform`` → workbench platform
    triton_names: Mapping[str, tuple[str, str]]  # workbench platform → (backend, platform) the JSON answer gives
    default_files: Mapping[str, str]  # workbench platform → the file its version folders hold
    decoupled: frozenset[str]  # the workbench platforms that serve decoupled models
    detect: Callable[[Path, str], str | None]  # auto-complete: the platform a model folder's files say, or None


# Triton's queue is unbounded by default (default_queue_policy.max_queue_size 0); workbench's batcher bounds its
# queue by batches. This many batches is "unbounded" for any real load, while a runaway client still hits a wall.
_TRITON_QUEUE_BATCHES = 10_000


@dataclasses.dataclass(frozen=True)
class TritonTensor:
    """One ``input`` or ``output``: ``dims`` as clients send and receive it, ``reshape`` as the model sees it."""

    name: str
    dtype: np.dtype[Any]
    data_type: str  # Triton's name, "TYPE_FP32"
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None  # None: the model sees the dims
    optional: bool = False
    label_filename: str = ""  # an output's class labels, one per line, in the model folder (classification)

    @property
    def model_dims(self) -> tuple[int, ...]:
        return self.dims if self.reshape is None else self.reshape


@dataclasses.dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_microseconds: int


@dataclasses.dataclass(frozen=True)
class TritonConfig:
    """A model's ``config.pbtxt``, read and checked; ``proto`` keeps the file's message for the JSON answer."""

    file: Path
    name: str
    # The workbench platform that runs it, from the BackendTable the config was read with; "" when read without one
    # (this floor's own readings: version policy, response cache, batching), which leave the backend unchecked.
    platform: str
    max_batch_size: int
    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]
    dynamic_batching: DynamicBatching | None
    instance_count: int  # how many runs of the model at once (Triton's instances)
    version_policy: VersionPolicy
    parameters: Mapping[str, str]
    default_model_filename: str  # as the file says ("": the platform's default, model_filename)
    model_filename: str  # the file a version folder holds: default_model_filename, else the platform's default
    triton_names: tuple[str, str]  # (backend, platform) as Triton's config answer names them
    response_cache: bool  # response_cache { enable: true }: read by workbench's response cache
    decoupled: bool
    sequence_batching: SequenceBatching | None  # None: the model is stateless
    proto: Any = dataclasses.field(compare=False, repr=False)

    @property
    def batched(self) -> bool:
        """Whether every tensor has a batch dimension before its dims (Triton's max_batch_size > 0)."""
        return self.max_batch_size > 0

    def model_file(self, version_folder: str | Path) -> Path:
        return Path(version_folder) / self.model_filename


def has_config(base_path: str | Path) -> bool:
    """Whether a model folder is a Triton model (object-store base paths are never: their folder is not local)."""
    return "://" not in str(base_path) and (Path(base_path) / CONFIG_FILE).is_file()


def read_config(
    model_folder: str | Path, backends: BackendTable | None = None, auto_complete: bool = True
) -> TritonConfig:
    """``<model_folder>/config.pbtxt``, parsed and checked; every problem is a ServingError naming the file.

    ``backends``: the backends the config may name (a load reads with them); without it the backend is not
    checked and :attr:`TritonConfig.platform` is "" (what this floor reads needs no framework).

    ``auto_complete`` (Triton's default; ``--disable_auto_complete_config`` turns it off) completes what the file
    leaves out as Triton does: the backend from the model file the version folders hold, and (when the model is
    loaded, :mod:`workbench.platforms.triton`) the inputs and outputs from the model itself. Without it a config
    must name its backend or platform, and declare its inputs and outputs.
    """
    from tritonclient.grpc import model_config_pb2

    file = Path(model_folder) / CONFIG_FILE
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
        raise ServingError(Code.NOT_FOUND, f"Could not read {file}: {reason}") from None
    proto = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as exc:
        # ParseError's own text starts "line:column : "; say it as a person reads it.
        where = f"line {exc.GetLine()}, column {exc.GetColumn()}" if exc.GetLine() else "somewhere"
        detail = str(exc).split(" : ", 1)[-1]
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{file} is not a valid Triton model config ({where}): {detail}"
        ) from None
    return describe(proto, file, backends, auto_complete)


def config_from_json(document: Mapping[str, Any], file: Path, backends: BackendTable) -> TritonConfig:
    """A config given as Triton's JSON (a Python model's auto-completed one), read and checked as the file is."""
    from tritonclient.grpc import model_config_pb2

    try:
        proto = json_format.ParseDict(document, model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{file}: the auto-completed config is not a model config: {exc}"
        ) from None
    proto.name = ""  # the JSON names the served model; the folder's name is checked against the file's
    return describe(proto, file, backends)


def describe(proto: Any, file: Path, backends: BackendTable | None, auto_complete: bool = True) -> TritonConfig:
    """The checked description of a parsed ``ModelConfig`` read from ``file`` (in ``<model>/config.pbtxt``)."""

    def fail(detail: str, code: Code = Code.INVALID_ARGUMENT) -> ServingError:
        return ServingError(code, f"{file}: {detail}")

    folder = file.parent.name
    if proto.name and proto.name != folder:
        raise fail(f'name "{proto.name}" does not match the model folder "{folder}" (Triton requires them equal)')
    if proto.max_batch_size < 0:
        raise fail(f"max_batch_size must not be negative, got {proto.max_batch_size}")
    if proto.HasField("ensemble_scheduling"):
        raise fail("ensemble_scheduling (an ensemble of models) is not supported by workbench", Code.UNIMPLEMENTED)
    platform = _platform(proto, backends, fail, file.parent if auto_complete else None) if backends else ""
    if not auto_complete and (not proto.input or not proto.output):
        raise fail(
            "declares no inputs or no outputs, and auto-complete is off (--disable_auto_complete_config): declare "
            "every input and output"
        )
    decoupled = proto.model_transaction_policy.decoupled
    if backends and decoupled and platform not in backends.decoupled:
        raise fail(
            f"model_transaction_policy {{ decoupled: true }} is served for Python backend models only: Triton runs "
            "decoupled models only in its Python backend and custom backends, not in "
            f'"{backends.triton_names[platform][0]}"',
            Code.UNIMPLEMENTED,
        )
    inputs = tuple(_tensor(t, "input", fail) for t in proto.input)
    instance_count = _instance_count(proto)
    sequence = None
    if proto.HasField("sequence_batching"):
        declared = frozenset(tensor.name for tensor in inputs)
        sequence = read_sequence_batching(proto, declared, instance_count, file.parent, fail)
    dynamic = None
    if proto.HasField("dynamic_batching"):
        batching = proto.dynamic_batching
        if batching.preferred_batch_size and not proto.max_batch_size:
            raise fail("dynamic_batching needs max_batch_size > 0")
        dynamic = DynamicBatching(
            tuple(sorted(batching.preferred_batch_size)), int(batching.max_queue_delay_microseconds)
        )
    return TritonConfig(
        file=file,
        name=folder,
        platform=platform,
        max_batch_size=proto.max_batch_size,
        inputs=inputs,
        outputs=tuple(_tensor(t, "output", fail) for t in proto.output),
        dynamic_batching=dynamic,
        instance_count=instance_count,
        version_policy=_version_policy(proto, fail),
        parameters={key: value.string_value for key, value in proto.parameters.items()},
        default_model_filename=proto.default_model_filename,
        model_filename=proto.default_model_filename or (backends.default_files.get(platform, "") if backends else ""),
        triton_names=backends.triton_names[platform] if backends else (proto.backend, proto.platform),
        response_cache=proto.response_cache.enable,
        decoupled=decoupled,
        sequence_batching=sequence,
        proto=proto,
    )


def _platform(proto: Any, table: BackendTable, fail: Any, completing: Path | None) -> str:
    """The workbench platform that serves the config: its backend or platform, or (``completing``: the model folder,
    when auto-complete is on) the one whose model file the version folders hold."""
    backend, platform = proto.backend, proto.platform
    if not backend and not platform:
        found = table.detect(completing, proto.default_model_filename) if completing is not None else None
        if found is not None:
            return found
        files = ", ".join(table.default_files.values())
        how = (
            f"and no version folder holds a model file that tells it ({files})"
            if completing is not None
            else "(auto-complete is off: --disable_auto_complete_config)"
        )
        *others, last = (f'"{table.triton_names[p][0]}"' for p in table.default_files)
        raise fail(f"names no backend {how}: set backend: {', '.join(others)} or {last} (or a platform)")
    known = table.backends, table.platforms
    chosen = {known[0].get(backend, "?") if backend else "", known[1].get(platform, "?") if platform else ""} - {""}
    if "?" in chosen:
        unknown = ", ".join(
            f'{field} "{value}"'
            for field, value, names in [("backend", backend, known[0]), ("platform", platform, known[1])]
            if value and value not in names
        )
        supported = ", ".join([*(f'backend "{b}"' for b in known[0]), *(f'platform "{p}"' for p in known[1])])
        raise fail(f"{unknown} is not supported by workbench (it serves {supported})", Code.UNIMPLEMENTED)
    if len(chosen) > 1:
        raise fail(f'backend "{backend}" and platform "{platform}" name different frameworks')
    return chosen.pop()


def _tensor(proto: Any, kind: str, fail: Any) -> TritonTensor:
    data_type = data_type_name(proto.data_type)
    if not proto.name:
        raise fail(f"every {kind} needs a name")
    if data_type not in DATA_TYPES:
        raise fail(f'{kind} "{proto.name}" has data_type {data_type}, which workbench cannot serve', Code.UNIMPLEMENTED)
    dims = tuple(int(d) for d in proto.dims)
    if any(d < -1 for d in dims):
        raise fail(f'{kind} "{proto.name}": dims {list(dims)} must be sizes, or -1 for any')
    reshape = tuple(int(d) for d in proto.reshape.shape) if proto.HasField("reshape") else None
    if reshape is not None and (-1 not in dims and -1 not in reshape) and np.prod(dims) != np.prod(reshape):
        raise fail(
            f'{kind} "{proto.name}": reshape {list(reshape)} does not hold the {int(np.prod(dims))} elements of '
            f"dims {list(dims)}"
        )
    return TritonTensor(
        proto.name,
        DATA_TYPES[data_type],
        data_type,
        dims,
        reshape,
        optional=kind == "input" and proto.optional,
        label_filename=proto.label_filename if kind == "output" else "",
    )


def _instance_count(proto: Any) -> int:
    """Triton runs one request (or batch) at a time per instance: the instances are the model's concurrency.

    A group's ``count`` is per GPU it lists (``gpus``); a group without ``count`` has one; no group at all is one
    instance. workbench runs every instance in this process on the devices its platform picks.
    """
    if not proto.instance_group:
        return 1
    return sum(max(group.count, 1) * max(len(group.gpus), 1) for group in proto.instance_group)


def _version_policy(proto: Any, fail: Any) -> VersionPolicy:
    if not proto.HasField("version_policy"):
        return VersionPolicy()  # Triton's default too: latest { num_versions: 1 }
    which = proto.version_policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy(kind="all")
    if which == "specific":
        versions = frozenset(int(v) for v in proto.version_policy.specific.versions)
        if not versions:
            raise fail("version_policy specific needs at least one version")
        return VersionPolicy(kind="specific", versions=versions)
    return VersionPolicy(kind="latest", num_versions=proto.version_policy.latest.num_versions or 1)


# ------------------------------------------------------------------------------- mapped onto workbench
def version_policy(base_path: str) -> VersionPolicy | None:
    """The version policy of a Triton model folder; None when it is not one, or its config cannot be read (its
    versions then fail to load with the config's error, which is where a user looks)."""
    if not has_config(base_path):
        return None
    try:
        return read_config(base_path).version_policy
    except ServingError:
        return None


def response_cache_enabled(base_path: str) -> bool:
    """Whether the folder is a Triton model whose config turns the response cache on (unreadable: no)."""
    if not has_config(base_path):
        return False
    try:
        return read_config(base_path).response_cache
    except ServingError:
        return False


def batching_parameters(base_path: str, default: BatchingParameters | None) -> BatchingParameters | None:
    """How a model batches: ``default`` (the server's) unless the folder is a Triton model, whose config decides.

    ``dynamic_batching`` is TF Serving-style batching with:

    - ``max_batch_size`` the config's: Triton's dynamic batcher never forms a batch larger than it;
    - ``batch_timeout_micros`` = ``max_queue_delay_microseconds``: both are how long the oldest request waits for
      more to join before its batch runs anyway (0: it runs at once, which is Triton's default too);
    - ``num_batch_threads`` = the instance count: Triton runs one batch per instance at a time;
    - ``allowed_batch_sizes`` = the preferred sizes only when the largest is ``max_batch_size``. workbench pads a
      batch up to the next allowed size (with copies of its last row, whose results are cut off) so that the model
      only ever runs those sizes, which is why configs name preferred sizes (engines built for them); Triton instead
      dispatches at a preferred size without padding. Answers are the same for models whose rows are independent
      (which dynamic batching already assumes), and the batcher requires the largest allowed size to be
      ``max_batch_size``; otherwise the preferred sizes are not mapped and batches run at whatever size formed.
      Python models get their requests as they came, never padded (see ``triton_python``).

    No ``dynamic_batching``: no server-side batching, as in Triton (a client may still send batches). An unreadable
    config gives ``default``; the model's load reports the error.
    """
    if not has_config(base_path):
        return default
    try:
        config = read_config(base_path)
    except ServingError:
        return default
    return config_batching(config)


def completed_batching(file_config: TritonConfig, served: TritonConfig) -> BatchingParameters | None:
    """The batching a config completed at load asks for, where the file alone asked for none (the server read the
    file's batching before the model loaded); None otherwise."""
    if config_batching(file_config) is not None:
        return None
    return config_batching(served)


def config_batching(config: TritonConfig) -> BatchingParameters | None:
    """The batching a read config asks for (see :func:`batching_parameters`); None: it does not batch."""
    if config.dynamic_batching is None or not config.batched or config.decoupled:
        return None  # a decoupled model's requests each run alone (see triton_python)
    preferred = config.dynamic_batching.preferred_batch_sizes
    allowed = preferred if preferred and preferred[-1] == config.max_batch_size else ()
    return BatchingParameters(
        max_batch_size=config.max_batch_size,
        batch_timeout_micros=config.dynamic_batching.max_queue_delay_microseconds,
        max_enqueued_batches=_TRITON_QUEUE_BATCHES,
        num_batch_threads=config.instance_count,
        allowed_batch_sizes=allowed,
    ).validate(str(config.file))


# ------------------------------------------------------------------------------------ the JSON answer
def config_json(
    config: TritonConfig,
    served_name: str,
    inputs: tuple[TritonTensor, ...] = (),
    outputs: tuple[TritonTensor, ...] = (),
) -> dict[str, Any]:
    """The config as Triton answers ``GET /v2/models/{m}/config``: the file's fields, with what Triton fills in
    (name, backend and platform, version policy, instance group, model file name, and tensors it completed from
    the model: ``inputs``/``outputs`` where the file declares none). Integers are JSON numbers, as Triton's are."""
    from tritonclient.grpc import model_config_pb2

    proto = model_config_pb2.ModelConfig()
    proto.CopyFrom(config.proto)
    proto.name = served_name
    proto.backend, platform = config.triton_names
    if platform and not proto.platform:
        proto.platform = platform
    if not proto.HasField("version_policy"):
        proto.version_policy.latest.num_versions = 1
    if not proto.instance_group:
        proto.instance_group.add(name=served_name, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    for group in proto.instance_group:
        group.count = group.count or 1
    proto.default_model_filename = config.model_filename
    if proto.HasField("sequence_batching"):  # Triton's normalized config: the idle time it applies
        batching = proto.sequence_batching
        batching.max_sequence_idle_microseconds = (
            batching.max_sequence_idle_microseconds or SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        )
    for target, completed in [(proto.input, inputs), (proto.output, outputs)]:
        if not target:
            for tensor in completed:
                entry = target.add(name=tensor.name, data_type=model_config_pb2.DataType.Value(tensor.data_type))
                entry.dims.extend(tensor.dims)
    document = json_format.MessageToDict(
        proto, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(document, proto.DESCRIPTOR)


def parameters_json(config: TritonConfig, served_name: str) -> str:
    """The ``model_config`` a Python model's ``initialize`` gets: the same JSON text Triton hands it."""
    return json.dumps(config_json(config, served_name))


_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def _numbers(document: Any, message: Any) -> Any:
    """proto3 JSON writes 64-bit integers as strings; Triton's config answer (and its clients) have numbers."""
    for field in message.fields:
        if field.name not in document:
            continue
        value = document[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if entry.message_type is not None:
                document[field.name] = {k: _numbers(v, entry.message_type) for k, v in value.items()}
            elif entry.type in _INT64_TYPES:
                document[field.name] = {k: int(v) for k, v in value.items()}
        elif field.message_type is not None:
            if isinstance(value, list):
                document[field.name] = [_numbers(v, field.message_type) for v in value]
            else:
                document[field.name] = _numbers(value, field.message_type)
        elif field.type in _INT64_TYPES:
            document[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return document
