"""The Open Inference Protocol (v2) over REST: JSON, and Triton's binary tensor extension for large tensors (what
:mod:`workbench.protocol.v2_client` builds; ``binary_data`` chooses, as the :class:`~workbench.client.Client` says)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.client.http import HttpConnection
from workbench.client.transport import Answer
from workbench.client.v2_transport import V2Transport
from workbench.core.signatures import Signature
from workbench.core.sticky import STICKY_HEADER
from workbench.protocol import v2_client as v2


class V2RestTransport(V2Transport):
    name = "v2-rest"

    def __init__(self, http: HttpConnection, binary_data: bool | None) -> None:
        self._http = http
        self.binary_data = binary_data

    def metadata(self, model: str, version: int | None, label: str | None) -> Any:
        return self._http.json("GET", v2.version_path(model, version, label))

    def index_rows(self) -> list[dict[str, Any]]:
        index = self._http.json("POST", "/v2/repository/index", {})
        return index["models"] if isinstance(index, dict) else index  # Triton answers the bare list

    def label_version(self, model: str, label: str) -> int:
        doc = self._http.json("GET", v2.version_path(model, None, label) + "/stats")
        (row,) = doc["model_stats"]
        return int(row["version"])

    def predict(
        self,
        model: str,
        signature: Signature,
        feeds: Mapping[str, np.ndarray],
        *,
        signature_name: str,
        output_filter: Sequence[str],
        version: int | None,
        label: str | None,
        parameters: Mapping[str, bool | int | str] | None,
        key: str | None = None,
    ) -> Answer:
        started = time.perf_counter()
        request = v2.rest_infer_request(feeds, output_filter, binary_data=self.binary_data, parameters=parameters)
        path = v2.version_path(model, version, label) + "/infer"
        headers = {**request.headers, STICKY_HEADER: key} if key is not None else request.headers
        response = self._http.send("POST", path, data=request.body, headers=headers)
        answer = v2.rest_infer_answer(response.content, response.headers.get(v2.HEADER_LENGTH))
        return Answer(answer.outputs, answer.model_version, (time.perf_counter() - started) * 1000)
