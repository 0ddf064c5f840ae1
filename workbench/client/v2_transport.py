"""What the Open Inference Protocol's (v2) two wires share: one signature read from the model's metadata, the
versions' states from the model repository extension's index, and no classify or regress API.

The requests themselves are built and read by :mod:`workbench.protocol.v2_client`;
:mod:`workbench.client.v2_rest_transport` and :mod:`workbench.client.v2_grpc_transport` send them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.client.transport import Transport
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.protocol import v2_client as v2

# The model repository extension's states (Triton's), in TF Serving's words.
_V2_STATES = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNLOADING": "UNLOADING", "UNAVAILABLE": "END"}


class V2Transport(Transport):
    """A v2 wire: it reads the metadata, the repository's index and a label's version; the rest is common."""

    @abc.abstractmethod
    def index_rows(self) -> list[dict[str, Any]]:
        """The model repository extension's index: a row per model version (``name``, ``version``, ``state``)."""

    @abc.abstractmethod
    def label_version(self, model: str, label: str) -> int:
        """The version a label names: v2 says it only in the statistics of ``…/versions/<label>`` (workbench's)."""

    def signatures(self, model: str, version: int | None, label: str | None) -> dict[str, Signature]:
        return {DEFAULT_SIGNATURE: v2.signature_from_metadata(self.metadata(model, version, label))}

    def status(self, model: str, version: int | None, label: str | None) -> list[dict[str, Any]]:
        rows = self.index_rows()
        versions = {int(r["version"]): r for r in rows if r.get("name") == model and str(r.get("version")).isdigit()}
        if not versions:
            raise ServingError(Code.NOT_FOUND, f"Model {model!r} is not in the server's repository")
        wanted = sorted(versions, reverse=True)
        if version is not None:
            wanted = [int(version)]
        elif label is not None:
            wanted = [self.label_version(model, label)]
        if not set(wanted) & set(versions):
            raise ServingError(Code.NOT_FOUND, f"Model {model!r} has no version {wanted[0]}")
        return [
            {
                "version": v,
                "state": _V2_STATES.get(versions[v].get("state", ""), "UNKNOWN"),
                "error_code": "UNKNOWN" if versions[v].get("reason") else "OK",
                "error_message": versions[v].get("reason", ""),
            }
            for v in wanted
            if v in versions
        ]

    def examples(
        self,
        kind: str,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        version: int | None,
        label: str | None,
        signature_name: str,
    ) -> tuple[Any, float]:
        raise ValueError(f"the v2 protocol has no {kind} API: use TF Serving's (protocol 'rest' or 'grpc')")
