"""``mlserver.types``: the Open Inference Protocol's messages as pydantic v2 models, as MLServer's runtimes use them.

Field names, optionality and defaults are the protocol's (and MLServer's documented ones): ``data`` is a
:class:`TensorData` whose ``root`` is what was sent (a flat or nested list, ``bytes`` or ``str`` for BYTES);
``parameters`` is open (``content_type`` and ``headers`` named, anything else kept). ``datatype`` is a
:class:`Datatype`, a ``str`` enum, so ``datatype == "BYTES"`` holds.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

# Runtimes name models' fields ``model_name``, ``model_version``: pydantic's protected "model_" namespace is off.
_OPEN = ConfigDict(extra="allow", protected_namespaces=(), arbitrary_types_allowed=True)
_CLOSED = ConfigDict(protected_namespaces=(), arbitrary_types_allowed=True)


class Datatype(str, enum.Enum):
    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"

    def __str__(self) -> str:  # "BYTES", as the wire writes it (an f-string of a str enum would say Datatype.BYTES)
        return self.value


class Parameters(BaseModel):
    """Open parameters: ``content_type`` and ``headers`` by name, any other key kept as sent."""

    model_config = _OPEN

    content_type: str | None = None
    headers: dict[str, Any] | None = None


class TensorData(RootModel[Any]):
    """A tensor's elements as sent; iterable and indexable like the list it holds."""

    root: Any = Field(default_factory=list)

    def __iter__(self) -> Any:  # type: ignore[override]  # iterates its root, as MLServer's does
        return iter(self.root if isinstance(self.root, (list, tuple)) else [self.root])

    def __getitem__(self, index: int) -> Any:
        return self.root[index]

    def __len__(self) -> int:
        return len(self.root) if isinstance(self.root, (list, tuple)) else 1


class RequestInput(BaseModel):
    model_config = _CLOSED

    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: TensorData


class RequestOutput(BaseModel):
    model_config = _CLOSED

    name: str
    parameters: Parameters | None = None


class ResponseOutput(BaseModel):
    model_config = _CLOSED

    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: TensorData


class InferenceRequest(BaseModel):
    model_config = _CLOSED

    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class InferenceResponse(BaseModel):
    model_config = _CLOSED

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class MetadataTensor(BaseModel):
    model_config = _CLOSED

    name: str
    datatype: Datatype
    shape: list[int]
    parameters: Parameters | None = None


class MetadataModelResponse(BaseModel):
    model_config = _CLOSED

    name: str
    versions: list[str] | None = None
    platform: str
    inputs: list[MetadataTensor] | None = None
    outputs: list[MetadataTensor] | None = None
    parameters: Parameters | None = None


class MetadataServerResponse(BaseModel):
    model_config = _CLOSED

    name: str
    version: str
    extensions: list[str]


class MetadataModelErrorResponse(BaseModel):
    error: str


class InferenceErrorResponse(BaseModel):
    error: str | None = None


__all__ = [
    "Datatype",
    "InferenceErrorResponse",
    "InferenceRequest",
    "InferenceResponse",
    "MetadataModelErrorResponse",
    "MetadataModelResponse",
    "MetadataServerResponse",
    "MetadataTensor",
    "Parameters",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "TensorData",
]
