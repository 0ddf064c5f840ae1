"""The Open Inference Protocol's (v2) descriptive messages, built once for its REST and gRPC frontends.

Each builder returns a dict in the proto3-JSON shape of Triton's message (``inference.*`` in
``grpc_service.proto``, ``inference.ModelConfig`` in ``model_config.proto``) with the protos' own field names: the
REST frontend answers it as JSON, the gRPC frontend turns it into the message with
``google.protobuf.json_format.ParseDict``. Integers stay JSON numbers (what Triton's REST API answers; ParseDict
takes them for int64 fields too).

What a model looks like in v2 is its ``serving_default`` signature's: inputs and outputs by alias, v2 datatypes,
-1 for a dimension of any size. The engine-side facts come in as values the data plane gathers: a
:class:`ModelDescription` (a model's metadata and config, for both frontends), :class:`ModelStatistics` and
:class:`RepositoryRow` rows, so nothing here imports the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature, TensorSpec
from workbench.protocol.v2_types import BYTES, to_datatype

# GET /v2's name. Triton's clients identify the server by it (its own examples check name == "triton"), so
# workbench answers as the server whose protocol it speaks; its own version stays in "version".
SERVER_NAME = "triton"

# Triton's names for the extensions workbench implements (GET /v2 lists them; clients and tools check them).
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "sequence",  # the sequence batcher, for stateful models: batching/sequences.py
    "statistics",
    "system_shared_memory",  # and CUDA's answers, without CUDA: frontends/v2_shared_memory.py
)

# A version's state in the model repository extension: Triton's words for workbench's VersionState names.
REPOSITORY_STATES: Mapping[str, str] = {
    "START": "LOADING",
    "LOADING": "LOADING",
    "AVAILABLE": "READY",
    "UNLOADING": "UNLOADING",
    "END": "UNAVAILABLE",
}
READY = "READY"
LOAD_WARNINGS = "load_warnings"  # metadata's parameter naming what a version's load warned of


def server_metadata() -> dict[str, Any]:
    """``ServerMetadataResponse``: who answers, and which extensions it speaks."""
    from workbench.runtime.version import __version__

    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def _shape(spec: TensorSpec) -> list[int]:
    # v2 has no "any rank": a tensor of unknown rank is described as one dimension of any size.
    return list(spec.shape) if spec.shape is not None else [-1]


def _tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.alias, "datatype": to_datatype(spec.dtype), "shape": _shape(spec)}


@dataclasses.dataclass(frozen=True)
class ModelDescription:
    """What v2's metadata and config say of a model, as the data plane gathers it for one resolved version
    (:meth:`Dataplane.v2_description <workbench.planes.dataplane.Dataplane.v2_description>`).

    ``signature`` is the version's ``serving_default`` (None when it has none: the frontends refuse it, each in
    its own words); ``platform`` the v2 name (:func:`workbench.platforms.v2_name`); ``declared`` the model's own
    config (a Triton model's config.pbtxt, as JSON), None for a config built from the signature.
    """

    name: str
    versions: tuple[int | str, ...]  # the model's AVAILABLE versions, oldest first (or the one version's own name)
    platform: str
    signature: Signature | None
    max_batch_size: int  # the most rows one batch runs (0: batching is off)
    declared: Mapping[str, Any] | None = None
    decoupled: bool = False
    warnings: tuple[str, ...] = ()  # what the version's load warned of: metadata's parameters.load_warnings


def default_signature(model: ModelDescription) -> Signature:
    """The signature v2 describes and runs: ``serving_default``, as every v2 request names no signature."""
    if model.signature is None:
        raise ServingError(Code.FAILED_PRECONDITION, f"Model {model.name} has no serving_default signature")
    return model.signature


def model_metadata(model: ModelDescription, signature: Signature) -> dict[str, Any]:
    """``ModelMetadataResponse``: the model's versions (as strings) and its ``signature``'s tensors; where the
    version's load warned of something, ``parameters.load_warnings`` says it (MLServer's metadata has
    ``parameters``; REST only: the gRPC message has no such field, see :func:`grpc_metadata`)."""
    described: dict[str, Any] = {
        "name": model.name,
        "versions": [str(v) for v in model.versions],
        "platform": model.platform,
        "inputs": [_tensor_metadata(spec) for spec in signature.inputs.values()],
        "outputs": [_tensor_metadata(spec) for spec in signature.outputs.values()],
    }
    if model.warnings:
        described["parameters"] = {LOAD_WARNINGS: "; ".join(model.warnings)}
    return described


def grpc_metadata(described: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`model_metadata` as Triton's ``ModelMetadataResponse`` holds it: without ``parameters``."""
    return {key: value for key, value in described.items() if key != "parameters"}


def _batched(specs: Iterable[TensorSpec]) -> bool:
    """Whether every tensor has a leading dimension of any size: the batch dimension Triton's configs leave out."""
    return all(spec.shape is not None and len(spec.shape) >= 1 and spec.shape[0] == -1 for spec in specs)


def _config_tensor(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    datatype = to_datatype(spec.dtype)
    dims = _shape(spec)[1:] if batched else _shape(spec)
    tensor: dict[str, Any] = {
        "name": spec.alias,
        "data_type": "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}",
        "dims": dims or [1],
    }
    if not dims:  # one scalar per row: Triton's idiom is dims [1] reshaped to no dims
        tensor["reshape"] = {"shape": []}
    return tensor


def model_config(model: ModelDescription, signature: Signature) -> dict[str, Any]:
    """``ModelConfig``: enough of Triton's model configuration for its clients and perf tools.

    With ``max_batch_size`` > 0 (the model is batched) dims leave the batch dimension out, as in Triton; a signature
    whose tensors do not all lead with a dimension of any size cannot batch, and says ``max_batch_size`` 0. A model
    ``declared`` with a config of its own (a Triton model's config.pbtxt, as JSON) answers that config, as Triton does.
    A ``decoupled`` model says so in Triton's ``model_transaction_policy``, which tools read to know they must stream.
    """
    if model.declared is not None:
        return dict(model.declared)
    name, platform, max_batch_size, decoupled = model.name, model.platform, model.max_batch_size, model.decoupled
    tensors = [*signature.inputs.values(), *signature.outputs.values()]
    batched = max_batch_size > 0 and signature.batchable and _batched(tensors)
    config: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "max_batch_size": max_batch_size if batched else 0,
        "input": [_config_tensor(spec, batched) for spec in signature.inputs.values()],
        "output": [_config_tensor(spec, batched) for spec in signature.outputs.values()],
    }
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return config


@dataclasses.dataclass(frozen=True)
class Duration:
    """How many things took how long in all (Triton's ``StatisticDuration``)."""

    count: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": round(self.seconds * 1e9)}


@dataclasses.dataclass(frozen=True)
class ModelStatistics:
    """One model version's cumulative counts since the server started, for ``ModelStatistics``.

    ``inference_count`` counts rows inferred, ``execution_count`` model runs (a merged batch is one); ``batches``
    maps a batch size to the runs of that size and their compute time.
    """

    name: str
    version: int
    last_inference_ms: int = 0  # Unix time of the last answered request, in milliseconds; 0: none yet
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_infer: Duration = Duration()
    cache_hit: Duration = Duration()
    cache_miss: Duration = Duration()
    batches: Mapping[int, Duration] = dataclasses.field(default_factory=dict)


def _untimed(timed: Duration) -> dict[str, int]:
    """A stage workbench does not time apart (input and output handling are inside ``compute_infer``): ``timed``'s
    count with no time. perf_analyzer stops ("Server side statistics compute counts must be the same") unless
    compute_input, compute_infer and compute_output count alike."""
    return Duration(timed.count).as_json()


def _statistics_json(row: ModelStatistics) -> dict[str, Any]:
    return {
        "name": row.name,
        "version": str(row.version),
        "last_inference": row.last_inference_ms,
        "inference_count": row.inference_count,
        "execution_count": row.execution_count,
        "inference_stats": {
            "success": row.success.as_json(),
            "fail": row.fail.as_json(),
            "queue": row.queue.as_json(),
            # workbench times a model run as a whole: input and output handling are inside compute_infer.
            "compute_input": _untimed(row.compute_infer),
            "compute_infer": row.compute_infer.as_json(),
            "compute_output": _untimed(row.compute_infer),
            "cache_hit": row.cache_hit.as_json(),
            "cache_miss": row.cache_miss.as_json(),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _untimed(runs),
                "compute_infer": runs.as_json(),
                "compute_output": _untimed(runs),
            }
            for size, runs in sorted(row.batches.items())
        ],
    }


def model_statistics(rows: Iterable[ModelStatistics]) -> dict[str, Any]:
    """``ModelStatisticsResponse``: one entry per model version."""
    return {"model_stats": [_statistics_json(row) for row in rows]}


@dataclasses.dataclass(frozen=True)
class RepositoryRow:
    """One version of a model in the repository index; ``state`` is workbench's VersionState name.

    A model of the repository that is not loaded has no version and no state (``None``, ``""``), as in Triton's
    index; one unloaded by request has no version and the state ``END`` with its reason."""

    name: str
    version: int | str | None  # str: a version as its own server names it (MLServer's "v0.1.0")
    state: str
    reason: str = ""

    @property
    def v2_state(self) -> str:
        return REPOSITORY_STATES.get(self.state, "UNAVAILABLE") if self.state else ""


def repository_index(rows: Iterable[RepositoryRow], ready_only: bool = False) -> dict[str, Any]:
    """``RepositoryIndexResponse``: every model version and its state (only the READY ones with ``ready_only``)."""
    models = [
        {
            "name": row.name,
            "version": "" if row.version is None else str(row.version),
            "state": row.v2_state,
            "reason": row.reason,
        }
        for row in rows
        if not ready_only or row.v2_state == READY
    ]
    return {"models": models}


def parse_version(text: str) -> tuple[int | None, str | None]:
    """``(version, label)`` a request's ``model_version`` names: all digits is a version, other text a label.

    An empty string names neither: the model's default traffic (its promotion and canary apply).
    """
    if not text:
        return None, None
    if text.isascii() and text.isdigit():
        return int(text), None
    return None, text
