"""``:explain`` over REST: TF Serving's model paths with KServe v1's explain verb.

``POST /v1/models/<model>[/versions/<n> | /labels/<label>]:explain`` takes a ``:predict`` body (``instances`` or
``inputs``, an optional ``signature_name``) and an optional ``parameters`` object (:class:`~workbench.explain.
results.Parameters`), and answers KServe v1's ``{"predictions": [...], "explanations": [...]}``: the predictions
are what ``:predict`` answers for the same body (``outputs`` for a columnar request), the explanations one object
per row, beside an ``explainer`` object saying which explainer ran on which output (see docs/explanations.md).

There is no gRPC explain: neither TF Serving's PredictionService, KServe's v1 protocol (REST only) nor the Open
Inference Protocol's GRPCInferenceService defines one, and a workbench-only RPC would be reachable by no peer's
client. The REST path is the one KServe's and Seldon's explainer clients call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from workbench.core.errors import Code, ServingError
from workbench.core.sticky import STICKY_HEADER
from workbench.frontends.rest import PostHandler, answered_by, json_response
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import json_tensor
from workbench.protocol.attributions import Parameters

EXPLAIN_PATH = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:explain", re.IGNORECASE)
_MAX_INT64 = (1 << 63) - 1


class ExplainApi:
    """The ``:explain`` handler, given to the REST app as one of its extra POSTs."""

    def __init__(self, dataplane: Dataplane, timeout_ms: int) -> None:
        self.dataplane = dataplane
        self.timeout = timeout_ms / 1000 if timeout_ms > 0 else None

    def posts(self) -> list[tuple[re.Pattern[str], PostHandler]]:
        return [(EXPLAIN_PATH, self.explain)]

    async def explain(self, match: re.Match[str], path: str, body: bytes, headers: Mapping[str, str]) -> Response:
        name, version, label = match.groups()
        if version is not None and int(version) > _MAX_INT64:
            raise ServingError(Code.INVALID_ARGUMENT, f"Failed to convert version: {version} to numeric.")
        spec = ModelSpec(
            name=name, version=int(version) if version else None, label=label, key=headers.get(STICKY_HEADER)
        )
        dataplane = self.dataplane
        with await dataplane.admit(spec, "explain", "rest", self.timeout) as call:
            servable = call.servable
            request = json_tensor.PredictBody(body)
            signature_name, inputs = request.decode(servable.signatures)
            parameters = Parameters.of(json_tensor.parse_body(body).get("parameters"))
            answer = await dataplane.explain(call, signature_name, inputs, parameters, self.timeout)
            document: dict[str, Any] = json.loads(request.encode(answer.predictions))
            document.update(answer.explanation.to_json())
            return json_response(json_tensor.dumps(document), 200, answered_by(name, servable.version))
