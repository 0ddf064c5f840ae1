"""Status and metadata answers as TF Serving's protos; REST prints them as proto3 JSON, gRPC sends them.

Building the protos once for both frontends keeps the two answers identical field for field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from google.protobuf import json_format

from workbench.core.errors import Code, ServingError


class VersionStatus(Protocol):
    """One version's state as the status APIs report it (the engine's snapshot has these fields)."""

    @property
    def version(self) -> int: ...

    @property
    def state(self) -> int: ...  # ModelVersionStatus.State's numbers (AVAILABLE = 30)

    @property
    def error(self) -> ServingError | None: ...


def model_spec_proto(name: str, version: int | None, signature_name: str | None = None) -> Any:
    from tensorflow_serving.apis import model_pb2

    spec = model_pb2.ModelSpec(name=name)
    if version is not None:
        spec.version.value = version
    if signature_name is not None:
        spec.signature_name = signature_name
    return spec


def model_status_proto(statuses: Sequence[VersionStatus]) -> Any:
    from tensorflow_serving.apis import get_model_status_pb2

    response = get_model_status_pb2.GetModelStatusResponse()
    for status in statuses:
        entry = response.model_version_status.add()
        entry.version = status.version
        entry.state = int(status.state)
        if status.error is not None:
            entry.status.error_code = int(status.error.code)
            entry.status.error_message = status.error.message
        else:
            entry.status.error_code = int(Code.OK)
    return response


def to_json_dict(message: Any) -> dict[str, Any]:
    """proto3 JSON with proto field names and every default printed, as TF Serving's REST API writes it."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
