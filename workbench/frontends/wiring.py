"""The frontends, wired once: each gets the data plane, the control plane and its own settings, nothing else.

A server (:mod:`workbench.server`) serves them on its ports; a Ray Serve replica (:mod:`workbench.ray.replica`)
hands Ray's proxies the same REST app and gRPC servicers. Both build them here, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
from starlette.applications import Starlette

from workbench.config.options import ServerOptions
from workbench.frontends.explain import ExplainApi
from workbench.frontends.grpc import ModelService, PredictionService
from workbench.frontends.management import management_routes
from workbench.frontends.mlflow_invocations import MlflowScoring
from workbench.frontends.openai_api import OpenAIApi, OpenAISettings, openai_app
from workbench.frontends.probes import probe_routes
from workbench.frontends.rest import create_app
from workbench.frontends.sequence_routing import SequenceRouter
from workbench.frontends.tf_profiler import TfProfiler
from workbench.frontends.torchserve_api import TorchServeApi
from workbench.frontends.torchserve_grpc import TorchServeInference, TorchServeManagement
from workbench.frontends.torchserve_rest import TorchServeRest, torchserve_routes
from workbench.frontends.v2_grpc import InferenceService
from workbench.frontends.v2_rest import V2Settings, v2_api, v2_routes
from workbench.frontends.v2_shared_memory import SharedMemoryAccess
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane

if TYPE_CHECKING:  # built by the server (workbench.asynchronous stands on this floor's REST API)
    from workbench.asynchronous.service import AsyncInference
    from workbench.frontends.batch_jobs import BatchJobs


@dataclasses.dataclass(frozen=True)
class FrontendSettings:
    """The frontends' own settings: limits, CORS, the Prometheus path, the management token, and the helpers of a
    server with several workers (the sequence router) and of one with shared memory."""

    rest_timeout_ms: int = 30000
    rest_max_request_bytes: int = 256 * 1024 * 1024
    enable_cors: bool = False
    prometheus_path: str | None = None  # TF Serving's monitoring path, beside /metrics (None: /metrics alone)
    management_token: str = ""
    router: SequenceRouter | None = None  # with --num_workers: a sequence's requests go to the worker holding it
    shared_memory: SharedMemoryAccess | None = None  # None: no shared-memory routes or RPCs
    asynchronous: AsyncInference | None = None  # None: no :predictAsync
    batch_jobs: BatchJobs | None = None  # None: no /workbench/v1/batch
    model_store: str = ""  # the model repository: TorchServe's register-by-URL downloads archives into it
    torchserve_allowed_urls: str = ""  # the URLs it may download from ("": TorchServe's default, any http(s))
    profiler: bool = True  # tensorflow.ProfilerService on the gRPC port (--enable_profiler)
    mlflow_scoring_model: str = ""  # the model MLflow's POST /invocations answers with ("": the only one)
    openai_port: int = 0  # OpenAI's endpoints: 0 on the REST port, else on a port of their own (--openai_port)

    @classmethod
    def of(
        cls,
        options: ServerOptions,
        router: SequenceRouter | None = None,
        shared_memory: SharedMemoryAccess | None = None,
        asynchronous: AsyncInference | None = None,
        batch_jobs: BatchJobs | None = None,
    ) -> FrontendSettings:
        monitoring = options.monitoring()
        return cls(
            rest_timeout_ms=options.rest_api_timeout_in_ms,
            rest_max_request_bytes=options.rest_api_max_request_bytes,
            enable_cors=options.rest_api_enable_cors_support,
            prometheus_path=monitoring.prometheus_path if monitoring.prometheus_enabled else None,
            management_token=options.management_token,
            router=router,
            shared_memory=shared_memory,
            asynchronous=asynchronous,
            batch_jobs=batch_jobs,
            model_store=options.model_repository or "",
            torchserve_allowed_urls=options.torchserve_allowed_urls,
            profiler=options.enable_profiler,
            mlflow_scoring_model=options.mlflow_scoring_model,
            openai_port=options.openai_port,
        )


@dataclasses.dataclass(frozen=True)
class GrpcServicers:
    """The gRPC services: TF Serving's PredictionService and ModelService, and v2's GRPCInferenceService."""

    prediction: PredictionService
    model: ModelService
    inference: InferenceService
    # TorchServe's InferenceAPIsService and ManagementAPIsService (frontends/torchserve_grpc.py).
    torchserve_inference: TorchServeInference | None = None
    torchserve_management: TorchServeManagement | None = None
    # TensorFlow's profiler service, as tensorflow_model_server has it on its gRPC port (frontends/tf_profiler.py).
    profiler: TfProfiler | None = None

    def adders(self) -> list[Callable[[grpc.aio.Server], None]]:
        """What adds each to a gRPC server (for :func:`~workbench.frontends.grpc.start_grpc_server`)."""
        optional = (self.torchserve_inference, self.torchserve_management, self.profiler)
        return [self.prediction.add_to, self.model.add_to, self.inference.add_to, *(s.add_to for s in optional if s)]


class Frontends:
    """Every frontend of one server, on its two planes."""

    def __init__(self, dataplane: Dataplane, controlplane: ControlPlane, settings: FrontendSettings) -> None:
        self.dataplane = dataplane
        self.controlplane = controlplane
        self.settings = settings
        # TorchServe's APIs, one for its REST and gRPC transports (a scale request over one shows over the other).
        self.torchserve = TorchServeApi(
            dataplane,
            controlplane,
            settings.management_token,
            settings.model_store,
            allowed_urls=settings.torchserve_allowed_urls,
        )

    def openai(self) -> OpenAIApi:
        """OpenAI's endpoints (frontends/openai_api.py), the management token as their API key."""
        settings = self.settings
        return OpenAIApi(
            self.dataplane,
            OpenAISettings(settings.rest_timeout_ms, settings.rest_max_request_bytes, settings.management_token),
        )

    def openai_app(self) -> Starlette:
        """OpenAI's endpoints on a port of their own (--openai_port)."""
        return openai_app(self.openai())

    def rest_app(self) -> Starlette:
        """The REST API as an ASGI app: TF Serving's /v1, v2, management, stats, probes and metrics, and OpenAI's
        endpoints unless they have a port of their own."""
        dataplane, controlplane, settings = self.dataplane, self.controlplane, self.settings
        asynchronous = settings.asynchronous
        v2 = v2_api(
            dataplane,
            controlplane,
            V2Settings(settings.rest_timeout_ms, settings.rest_max_request_bytes, settings.management_token),
            settings.router,
            settings.shared_memory,
            asynchronous.accept_v2 if asynchronous is not None else None,
        )
        torchserve = TorchServeRest(self.torchserve, settings.rest_timeout_ms, settings.rest_max_request_bytes)
        openai = self.openai() if settings.openai_port == 0 else None  # on this port unless they have their own
        return create_app(
            dataplane,
            # Before TF Serving's /v1, which answers every other path under it; GET /v1/models/{m} stays its.
            first_routes=openai.routes(retrieve=False) if openai is not None else (),
            timeout_ms=settings.rest_timeout_ms,
            max_request_bytes=settings.rest_max_request_bytes,
            enable_cors=settings.enable_cors,
            prometheus_path=settings.prometheus_path,
            extra_routes=[
                *probe_routes(dataplane),
                *management_routes(dataplane, controlplane, settings.management_token),
                *v2_routes(v2),
                *(asynchronous.routes() if asynchronous is not None else []),
                *(settings.batch_jobs.routes() if settings.batch_jobs is not None else []),
                # TorchServe's inference and management APIs (/ping, /predictions, /models) on the same port.
                *torchserve_routes(torchserve),
                # MLflow's scoring protocol (/invocations, /health, /version; /ping is TorchServe's, above).
                *MlflowScoring(
                    dataplane, settings.rest_timeout_ms, settings.rest_max_request_bytes, settings.mlflow_scoring_model
                ).routes(),
            ],
            more_posts=[
                *ExplainApi(dataplane, settings.rest_timeout_ms).posts(),  # :explain
                *(asynchronous.posts() if asynchronous is not None else ()),
            ],
            # v2's …/infer, TorchServe's /predictions and OpenAI's /embeddings, answered before Starlette
            hot_routes=[v2, torchserve, *([openai] if openai is not None else [])],
        )

    def grpc_servicers(self, direct: bool = True) -> GrpcServicers:
        """The gRPC servicers; ``direct=False`` for calls that come through a proxy (Ray Serve's), which tells
        nothing of the client's address: no shared memory (offered only to clients on this host) nor sequence
        routing between workers then."""
        dataplane, controlplane, settings = self.dataplane, self.controlplane, self.settings
        router, shared_memory = (settings.router, settings.shared_memory) if direct else (None, None)
        return GrpcServicers(
            PredictionService(dataplane),
            ModelService(dataplane, controlplane, settings.management_token),
            InferenceService(dataplane, controlplane, settings.management_token, router, shared_memory),
            TorchServeInference(self.torchserve),
            TorchServeManagement(self.torchserve),
            TfProfiler() if settings.profiler else None,
        )
