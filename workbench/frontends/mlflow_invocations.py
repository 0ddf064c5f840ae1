"""MLflow's scoring protocol on the REST port, as ``mlflow models serve`` (and SageMaker's and AzureML's MLflow
containers) answer it: ``POST /invocations``, ``GET /health`` and ``GET /version``.

``GET /ping`` is TorchServe's on the same port (200 while the server is healthy; MLflow's clients read only the
status). ``/invocations`` names no model: it answers with ``--mlflow_scoring_model``, or the server's only model;
a server of several models without that flag refuses with a 400 that names them. A request runs through the data
plane like a TF Serving ``:predict`` (one :meth:`Dataplane.infer <workbench.planes.dataplane.Dataplane.infer>`
call), so batching, metrics, routing and logs apply; the codec is :mod:`workbench.protocol.mlflow_scoring`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Mapping, Sequence

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.frontends import rest_asgi
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import mlflow_scoring

log = logging.getLogger(__name__)

PROTOCOL = "mlflow"


class ScoringBody:
    """A read ``/invocations`` request, laid onto the signature of the version it resolved to."""

    stacks = False  # each request runs as its own task (MLflow's columns are not checked to stack)

    def __init__(self, request: mlflow_scoring.ScoringRequest) -> None:
        self.request = request

    def decode(self, signatures: Mapping[str, Signature]) -> tuple[str, Mapping[str, np.ndarray]]:
        signature = signatures.get(DEFAULT_SIGNATURE)
        if signature is None:
            raise ServingError(Code.FAILED_PRECONDITION, f"This model has no {DEFAULT_SIGNATURE} signature to score")
        return DEFAULT_SIGNATURE, mlflow_scoring.request_inputs(self.request, signature)

    def encode(self, outputs: Mapping[str, np.ndarray]) -> bytes:
        return mlflow_scoring.encode_predictions(outputs)

    @staticmethod
    def decode_together(requests: Sequence[ScoringBody], signatures: Mapping[str, Signature]) -> None:
        """Never called: its requests do not stack."""


class MlflowScoring:
    """The handlers of MLflow's scoring protocol."""

    def __init__(self, dataplane: Dataplane, timeout_ms: int, max_request_bytes: int, model: str = "") -> None:
        self.dataplane = dataplane
        self.timeout = timeout_ms / 1000 if timeout_ms > 0 else None
        self.max_request_bytes = max_request_bytes
        self.model = model

    def routes(self) -> list[Route]:
        return [
            Route("/invocations", self.invocations, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
        ]

    async def invocations(self, request: Request) -> Response:
        try:
            body = await rest_asgi.read_body(request.scope, request.receive, self.max_request_bytes)
            scoring = mlflow_scoring.read_request(body, request.headers.get("content-type"))
            spec = ModelSpec(name=self._model())
            version, answer = await self.dataplane.infer(spec, PROTOCOL, ScoringBody(scoring), self.timeout)
            return Response(answer, 200, media_type=mlflow_scoring.JSON_TYPE)
        except mlflow_scoring.UnsupportedContent as exc:
            return Response(exc.message, 415, media_type="text/plain")
        except ServingError as exc:
            return _error(exc)
        except Exception as exc:  # a bug must still answer MLflow's JSON, and be logged
            log.exception("POST /invocations failed")
            return _error(from_exception(exc))

    def _model(self) -> str:
        if self.model:
            return self.model
        names = sorted(self.dataplane.model_names())
        if len(names) == 1:
            return names[0]
        if not names:
            raise ServingError(Code.UNAVAILABLE, "This server serves no model yet")
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"This server serves several models ({', '.join(names)}) and /invocations names none: start it with "
            "--mlflow_scoring_model=NAME, or use the v2 or TF Serving API, which name the model",
        )

    async def health(self, request: Request) -> Response:
        """MLflow's ``/health`` (its ``/ping``): 200 once the model answers, a newline for a body."""
        try:
            name = self._model()
            ready = bool(self.dataplane.available_versions(name))
        except ServingError:
            ready = False
        return Response("\n", 200 if ready else 404, media_type=mlflow_scoring.JSON_TYPE)

    async def version(self, request: Request) -> Response:
        """The MLflow version this server speaks the protocol of: the installed one's, else the workbench's."""
        try:
            text = importlib.metadata.version("mlflow")
        except importlib.metadata.PackageNotFoundError:
            text = importlib.metadata.version("workbench-serving")
        return Response(text, 200, media_type=mlflow_scoring.JSON_TYPE)


def _error(error: ServingError) -> Response:
    status, body = mlflow_scoring.error_body(error)
    return Response(body, status, media_type=mlflow_scoring.JSON_TYPE)
