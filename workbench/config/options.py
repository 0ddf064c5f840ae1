"""Server options and the text-proto config files TF Serving reads.

The model config and monitoring config are parsed with TF Serving's own protos (shipped in the
``tensorflow-serving-api`` wheel) and ``google.protobuf.text_format``, so a file that works with
``tensorflow_model_server`` works here, and a malformed one fails with the same words.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from workbench.config.batching_parameters import BatchingParameters, read_batching_parameters_file
from workbench.config.mlserver_settings import environment_model_serves, holds_model_settings
from workbench.config.request_logging import RequestLogConfig, request_log_config_from_proto
from workbench.config.text_config import parse_text_config
from workbench.config.version_policy import VersionPolicy
from workbench.core.errors import Code, ServingError
from workbench.runtime import mlflow_uris
from workbench.runtime.mlflow_uris import is_mlflow_uri
from workbench.runtime.storage import RemoteFolder, is_remote, state_dir

log = logging.getLogger(__name__)

# The platforms a model config may name: ``workbench.platforms.names``, given by the floors above.
PlatformNames = Callable[[], Sequence[str]]


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A model a repository root holds in a platform's own files: the folder of its numbered versions, and the
    version labels its files name (MLServer's version strings, "v0.1.0" → 1)."""

    folder: str
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Its versions stand for files the platform reads at load (MLServer's model-settings.json): a version whose
    # files change while it serves loads again and replaces itself (ModelConfig.reload_changed).
    reload_changed: bool = False


# Models a repository root holds packed in a platform's own files (TorchServe's .mar archives, MLServer's
# model-settings.json), given by the floors above (``workbench.platforms.packaged_models``): (root, is a model name)
# → model name → where its versions are.
PackagedModels = Callable[[Path, Callable[[str], bool]], Mapping[str, PackagedModel]]


# "workbench_null" serves a SavedModel's signatures without running it (zeros of the right types): the
# frontends' own ceiling, for benchmarks.
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One model of the server: where its versions live, which to serve, and its version labels."""

    name: str
    base_path: str
    policy: VersionPolicy = VersionPolicy()
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    platform: str = ""  # model_platform; "" lets each version folder say (workbench.platforms.detect)
    logging: RequestLogConfig | None = None  # the config file's logging_config (request logging)
    # A version whose files change while it serves is loaded again, and the new load replaces it once it serves
    # (MLServer reloads a model whose settings changed); TF Serving's versions never reload (False).
    reload_changed: bool = False


@dataclasses.dataclass(frozen=True)
class MonitoringOptions:
    prometheus_enabled: bool = False
    prometheus_path: str = "/monitoring/prometheus/metrics"


@dataclasses.dataclass(frozen=True)
class GrpcTLS:
    """``--ssl_config_file``, read: TLS on the gRPC port (TF Serving's SSLConfig, with the PEM texts it holds)."""

    server_key: bytes
    server_cert: bytes  # the certificate chain, leaf first
    # PEM roots that client certificates must chain to; None: gRPC's default roots (see parse_ssl_config_file)
    custom_ca: bytes | None
    client_verify: bool  # mutual TLS: a client without a certificate signed by custom_ca is refused


@dataclasses.dataclass(frozen=True)
class RestTLS:
    """TLS on the REST port: workbench's own ``--rest_api_ssl_*`` flags (TF Serving's REST API has no TLS)."""

    cert_file: str
    key_file: str  # "": the key is in cert_file
    client_ca_file: str  # "": no client certificates asked for; else required, and checked against this CA


# --http_server's choices, the default first; the variable that chooses one for every server a process starts (and
# its children) where --http_server is not given (a test run under granian: tests/conftest.py's --http-server).
HTTP_SERVERS = ("uvicorn", "granian")
HTTP_SERVER_ENV = "WORKBENCH_HTTP_SERVER"


@dataclasses.dataclass
class ServerOptions:
    """Everything ``workbench serve`` was asked for; field names are tensorflow_model_server's flag names."""

    port: int = 8500
    grpc_socket_path: str = ""
    rest_api_port: int = 0
    # OpenAI's endpoints (frontends/openai_api.py): 0 on the REST port; else a port of their own (-1: a free one).
    openai_port: int = 0
    rest_api_host: str = "127.0.0.1"
    grpc_host: str = "127.0.0.1"
    rest_api_timeout_in_ms: int = 30000
    rest_api_enable_cors_support: bool = False
    rest_api_max_request_bytes: int = 256 * 1024 * 1024
    grpc_max_message_bytes: int = 256 * 1024 * 1024
    grpc_channel_arguments: str = ""
    ssl_config_file: str = ""  # TF Serving's SSLConfig text proto: TLS (and mutual TLS) on gRPC
    # workbench's own: TLS on REST (PEM files; the client CA turns on mutual TLS)
    rest_api_ssl_cert_file: str = ""
    rest_api_ssl_key_file: str = ""
    rest_api_ssl_client_ca_file: str = ""
    # The HTTP server under the REST port (and --openai_port): "uvicorn", or "granian" (Rust; its RSGI interface
    # answers the inference routes, everything else reaches the same Starlette app through it); "": $HTTP_SERVER_ENV,
    # else uvicorn (chosen_http_server()).
    http_server: str = ""
    model_name: str = "default"
    model_base_path: str = ""
    model_config_file: str = ""
    model_config_file_poll_wait_seconds: float = 0.0
    file_system_poll_wait_seconds: float = 1.0
    enable_model_warmup: bool = True
    monitoring_config_file: str = ""
    allow_version_labels_for_unavailable_models: bool = False
    num_inference_threads: int = 0
    # A native model's calls that prove cheap run on the event loop, not on a thread (RunCost); off for a model
    # whose calls may wait on I/O, which would hold the loop meanwhile.
    inline_cheap_calls: bool = True
    num_load_threads: int = 2
    # PyTorch models (workbench.platforms.pytorch): the device they run on ("auto": the first CUDA GPU PyTorch sees,
    # else the CPU; "cpu", "cuda", "cuda:N") and the intra-op threads of each call (1, as ONNX Runtime's sessions:
    # the server already runs --num_inference_threads calls at once; 0: PyTorch's default, one per core).
    pytorch_device: str = "auto"
    pytorch_threads: int = 1
    # Text generators (Hugging Face): the tokens one iteration of a model's continuous batching runs
    # (0: 160 on a CPU, 512 on a GPU).
    max_batched_tokens: int = 0
    # How long a request for a model whose first load is under way waits for it (0: answered at once, NOT_FOUND).
    wait_for_model_load_seconds: float = 60.0
    # Many models in bounded memory (docs/memory-budget.md): the budget ("": none; bytes, a share of memory, gpu:...),
    # versions loaded when first asked for, unloaded after this many idle seconds (0: never), never evicted (--pin).
    memory_budget: str = ""
    load_on_demand: bool = False
    unload_after_idle: float = 0.0
    pin: tuple[str, ...] = ()
    # Triton's model control: "" (workbench's own: versions), "none", "poll" or "explicit"; --load_model's names.
    model_control_mode: str = ""
    load_model: tuple[str, ...] = ()
    # Triton's response cache: its bound for the whole server (0: off) and the models that opt in by flag.
    response_cache_bytes: int = 0
    response_cache_models: tuple[str, ...] = ()
    enable_batching: bool = False
    batching_parameters_file: str = ""
    # workbench's own: a model repository root (every sub-folder is a model), version management, handles
    model_repository: str = ""
    model_cache_dir: str = ""  # where versions from object stores are downloaded ("": the XDG cache or temp dir)
    management_state_file: str = ""
    # MLflow as a model source (models:/, runs:/ base paths): its tracking server ("": MLflow's own choice,
    # $MLFLOW_TRACKING_URI or its default), the aliases that are a registered model's stable and canary versions, and
    # whether workbench's routing changes may move them (off: the registry alone routes, and changes are refused).
    mlflow_tracking_uri: str = ""
    mlflow_stable_alias: str = "champion"
    mlflow_canary_alias: str = "challenger"
    mlflow_write_aliases: bool = False
    # Never shown: not in this dataclass's repr (logs, tracebacks, a notebook printing the options).
    management_token: str = dataclasses.field(default="", repr=False)
    torchserve_allowed_urls: str = ""  # TorchServe's allowed_urls: the archive URLs a registration may name
    mlflow_scoring_model: str = ""  # the model POST /invocations answers with ("": the server's only model)
    server_name: str = ""  # shown by the Jupyter sidebar; a notebook handle passes its own name
    drain_seconds: float = 30.0  # on SIGTERM/SIGINT: the whole shutdown's budget (Kubernetes' default grace)
    drain_delay_seconds: float = 0.0  # of which: not ready, but still taking new connections
    ready_file: str = ""
    parent_pid: int = 0
    # One of --num_workers processes (workbench.deploy.workers): its index, and the supervisor's run folder, where the
    # workers find each other to answer for the whole server ("": a server of one process).
    num_workers: int = 1
    # Model runners the workers hand requests to (workbench.runners): 0, each worker loads and batches on its own.
    model_runners: int = 0
    worker_index: int = 0
    worker_dir: str = ""
    # Model files that run code when loaded (pickles; model.py and handler.py) load only when allowed.
    allow_pickle: bool = False
    allow_python_models: bool = False
    # Triton's configs are completed from their model files unless set (Triton's --disable-auto-complete-config).
    disable_auto_complete_config: bool = False
    # TF Serving's: serve a version folder's model.tflite (LiteRT) instead of its SavedModel; interpreters per version.
    prefer_tflite_model: bool = False
    # TF Serving's: tensorflow.ProfilerService on the gRPC port (TensorFlow's own profiler, started when first asked).
    enable_profiler: bool = True
    tflite_interpreters: int = 1
    # Triton's system shared memory: the most bytes all registered regions may span (4 GiB; 0: none), and whether
    # clients on other hosts may use it (by default only loopback and Unix-socket clients may).
    shared_memory_max_bytes: int = 4 << 30
    allow_remote_shared_memory: bool = False
    # Asynchronous inference (:predictAsync): the queue ("": an SQLite file of this server's own, see
    # async_queue_path), requests answered at once by each process, claims before a request is taken again,
    # claims before it fails, and how long answers are kept.
    async_queue: str = ""
    async_concurrency: int = 4
    async_visibility_seconds: float = 60.0
    async_max_attempts: int = 3
    async_results_seconds: float = 86400.0
    async_notify_url: str = ""  # a webhook told of each answered request
    # `workbench consume`: no ports, the asynchronous queue's consumer alone; each answer also written under this URI.
    consume_only: bool = False
    async_output: str = ""
    # Request logs (docs/request-logs-and-drift.md): how long Parquet rows wait before their file is written.
    request_log_flush_seconds: float = 10.0
    # Drift: the rolling window of served rows per version, a reference of the first N rows served (0: only
    # references given at export), and when a feature drifts.
    drift_window: int = 1000
    drift_reference_rows: int = 0
    drift_thresholds: str = "psi=0.2,p_value=0.001"

    def async_queue_uri(self) -> str:
        """Where asynchronous requests wait: ``--async_queue`` (``sqlite:///PATH``, ``redis://HOST:PORT/DB``), else
        an SQLite file in workbench's state folder named after what this server serves (its repository, config file
        or base path), so that every process of the server, and the server started again with the same flags,
        share it."""
        if self.async_queue:
            return self.async_queue
        source = self.model_repository or self.model_config_file or self.model_base_path or f"port {self.port}"
        if not is_remote(source) and not source.startswith("port "):
            source = os.path.abspath(source)
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        return f"sqlite://{state_dir() / 'async' / f'{key}.sqlite'}"

    def routing_state_path(self) -> str:
        """An older workbench's routing state file (in a model repository: ``.workbench/routing.json``).

        Routing now lives in each model's base path (``routing.json``); this file is only read, as the starting
        routing of models whose base path has none, and the first change moves it there.
        """
        if self.management_state_file:
            return self.management_state_file
        if self.model_repository and not is_remote(self.model_repository):
            return os.path.join(self.model_repository, ".workbench", "routing.json")
        return ""

    def initial_models(
        self, platform_names: PlatformNames | None = None, packaged: PackagedModels | None = None
    ) -> list[ModelConfig]:
        """The models to serve at start-up: the config file's, or the one-model shorthand."""
        if self.model_config_file:
            return parse_model_config_file(self.model_config_file, platform_names)
        if self.model_repository:
            return discover_models(self.model_repository, packaged)
        if self.model_base_path:
            base_path = self.model_base_path
            base_path = base_path if is_remote(base_path) else os.path.abspath(base_path)
            return [ModelConfig(name=self.model_name, base_path=checked_base_path(base_path))]
        return []

    def batching_parameters(self) -> BatchingParameters | None:
        """The server-wide batching parameters (None: batching off unless a model has its own file)."""
        if self.batching_parameters_file and not self.enable_batching:
            raise ServingError(Code.INVALID_ARGUMENT, "--batching_parameters_file was given without --enable_batching")
        if not self.enable_batching:
            return None
        if self.batching_parameters_file:
            return read_batching_parameters_file(self.batching_parameters_file)
        return BatchingParameters()

    def grpc_arguments(self) -> tuple[tuple[str, int | str], ...]:
        """``--grpc_channel_arguments``: TF Serving's comma-separated ``key=value`` list."""
        return parse_channel_arguments(self.grpc_channel_arguments)

    def drain_timing(self) -> tuple[float, float]:
        """(delay, budget) of a drain: how long to keep taking new connections once not ready, and how long the
        whole shutdown may take, delay included (so a Kubernetes grace period of ``drain_seconds`` covers it)."""
        if self.drain_seconds < 0 or self.drain_delay_seconds < 0:
            raise ServingError(Code.INVALID_ARGUMENT, "--drain_seconds and --drain_delay_seconds cannot be negative")
        if self.drain_delay_seconds and self.drain_delay_seconds >= self.drain_seconds:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"--drain_delay_seconds ({self.drain_delay_seconds:g}) must be shorter than --drain_seconds "
                f"({self.drain_seconds:g}), which it is part of: accepted requests need time to finish",
            )
        return self.drain_delay_seconds, self.drain_seconds

    def chosen_http_server(self) -> str:
        """``--http_server``, else ``$WORKBENCH_HTTP_SERVER``, else uvicorn; one of :data:`HTTP_SERVERS`."""
        name = self.http_server or os.environ.get(HTTP_SERVER_ENV, "") or HTTP_SERVERS[0]
        if name not in HTTP_SERVERS:
            given = f"--http_server={name}" if self.http_server else f"${HTTP_SERVER_ENV}={name}"
            raise ServingError(Code.INVALID_ARGUMENT, f"{given}: expected {' or '.join(HTTP_SERVERS)}")
        return name

    def grpc_tls(self) -> GrpcTLS | None:
        """``--ssl_config_file``, read and checked (None: plaintext gRPC, TF Serving's default)."""
        return parse_ssl_config_file(self.ssl_config_file) if self.ssl_config_file else None

    def rest_tls(self) -> RestTLS | None:
        """The ``--rest_api_ssl_*`` flags, checked (None: plain HTTP, TF Serving's only REST)."""
        cert, key, client_ca = self.rest_api_ssl_cert_file, self.rest_api_ssl_key_file, self.rest_api_ssl_client_ca_file
        if not cert:
            if key or client_ca:
                given = "--rest_api_ssl_key_file" if key else "--rest_api_ssl_client_ca_file"
                raise ServingError(Code.INVALID_ARGUMENT, f"{given} was given without --rest_api_ssl_cert_file")
            return None
        for flag, path in [
            ("--rest_api_ssl_cert_file", cert),
            ("--rest_api_ssl_key_file", key),
            ("--rest_api_ssl_client_ca_file", client_ca),
        ]:
            if path and not os.path.isfile(path):
                raise ServingError(Code.NOT_FOUND, f"{flag}={path}: no such file")
        return RestTLS(os.path.abspath(cert), os.path.abspath(key) if key else "", client_ca)

    def monitoring(self) -> MonitoringOptions:
        if not self.monitoring_config_file:
            return MonitoringOptions()
        return parse_monitoring_config_file(self.monitoring_config_file)


def parse_model_config_file(
    path: str | os.PathLike[str], platform_names: PlatformNames | None = None
) -> list[ModelConfig]:
    """Read a ``ModelServerConfig`` text proto; relative base paths are taken from the file's folder."""
    from tensorflow_serving.config import model_server_config_pb2

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"Could not read model config file {path}: {exc.strerror}") from None
    config = parse_text_config(text, model_server_config_pb2.ModelServerConfig(), path)
    if config.WhichOneof("config") == "custom_model_config":
        raise ServingError(Code.UNIMPLEMENTED, "custom_model_config is not supported; use model_config_list")
    return model_configs_from_proto(config.model_config_list, Path(path).resolve().parent, platform_names)


def model_configs_from_proto(
    config_list: object, base_dir: Path | None = None, platform_names: PlatformNames | None = None
) -> list[ModelConfig]:
    """Validate a ``ModelConfigList`` proto and turn it into ModelConfigs (also used by gRPC's reload).

    ``platform_names`` gives the platforms a ``model_platform`` may name (``workbench.platforms.names``, passed in by
    the floors above: the platforms stand on this one); without it any name passes here and fails at load.
    """
    models: list[ModelConfig] = []
    seen: set[str] = set()
    for entry in config_list.config:  # type: ignore[attr-defined]
        if not entry.name:
            raise ServingError(Code.INVALID_ARGUMENT, "Every model in the config must have a name")
        if not is_config_model_name(entry.name):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Model name {entry.name!r} cannot name a model: it must be one folder name (not '.' or '..', no '/', "
                "'\\', NUL or control characters)",
            )
        if entry.name in seen:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"Illegal to list model {entry.name} multiple times in config list"
            )
        seen.add(entry.name)
        platform = entry.model_platform
        if platform and platform_names is not None and platform not in platform_names():
            raise ServingError(
                Code.UNIMPLEMENTED,
                f'Model {entry.name}: model_platform "{entry.model_platform}" is not supported '
                f"(supported: {', '.join(platform_names())})",
            )
        if not entry.base_path:
            raise ServingError(Code.INVALID_ARGUMENT, f"Model {entry.name} has no base_path")
        base_path = entry.base_path
        if base_dir is not None and not os.path.isabs(base_path) and not is_remote(base_path):
            base_path = str((base_dir / base_path).resolve())
        models.append(
            ModelConfig(
                name=entry.name,
                base_path=checked_base_path(base_path),
                policy=_policy_from_proto(entry)
                if entry.HasField("model_version_policy")
                else _folder_policy(base_path),
                labels=dict(entry.version_labels),
                platform=platform,
                logging=request_log_config_from_proto(entry.logging_config, f"model {entry.name}", base_dir)
                if entry.HasField("logging_config")
                else None,
            )
        )
    return models


def checked_base_path(base_path: str) -> str:
    """``base_path``, refused (INVALID_ARGUMENT) where it is an MLflow URI naming nothing MLflow can find."""
    if is_mlflow_uri(base_path):
        try:
            mlflow_uris.parse(base_path)
        except ValueError as exc:
            raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
    return base_path


def _folder_policy(base_path: str) -> VersionPolicy:
    """A model without a configured policy: its Triton config.pbtxt's ``version_policy``, else latest(1)."""
    from workbench.config.triton_model_config import version_policy  # protos of tritonclient, only when needed

    return version_policy(base_path) or VersionPolicy()


def _policy_from_proto(entry: object) -> VersionPolicy:
    if not entry.HasField("model_version_policy"):  # type: ignore[attr-defined]
        return VersionPolicy()
    policy = entry.model_version_policy  # type: ignore[attr-defined]
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy(kind="all")
    if which == "specific":
        if not policy.specific.versions:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Model {entry.name}: the specific version policy needs at least one version",  # type: ignore[attr-defined]
            )
        return VersionPolicy(kind="specific", versions=frozenset(policy.specific.versions))
    num = policy.latest.num_versions if which == "latest" else 1
    return VersionPolicy(kind="latest", num_versions=num or 1)


def parse_ssl_config_file(path: str | os.PathLike[str]) -> GrpcTLS:
    """Read TF Serving's ``SSLConfig`` text proto, as tensorflow_model_server does, with a clear error where it would
    fail (or, for a key that is missing, start a server no client can reach).

    As in TF Serving, the fields hold the PEM texts themselves, and ``client_verify`` without ``custom_ca`` checks
    client certificates against gRPC's default roots (``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, else the public CAs
    bundled with gRPC): any certificate a public CA issued is let in, so that is logged as a warning.
    """
    from workbench.config.tf_serving_protos import SSLConfig

    where = f"--ssl_config_file={path}"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a text file"
        raise ServingError(Code.NOT_FOUND, f"Could not read SSL config file {path}: {reason}") from None
    config = parse_text_config(text, SSLConfig(), path)
    for field, marker, what in [
        ("server_key", "PRIVATE KEY-----", "private key"),
        ("server_cert", "-----BEGIN CERTIFICATE-----", "certificate"),
    ]:
        value = getattr(config, field)
        if not value.strip():
            raise ServingError(Code.INVALID_ARGUMENT, f"{where}: {field} is missing (TLS needs a key and certificate)")
        if marker not in value:
            # TF Serving users most often write a file name here: say that the field takes the PEM text.
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{where}: {field} is not a PEM {what} (the field holds the PEM text itself, not a file name)",
            )
    if config.custom_ca and "-----BEGIN CERTIFICATE-----" not in config.custom_ca:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}: custom_ca is not a PEM certificate")
    custom_ca = config.custom_ca.encode() if config.custom_ca else None
    if config.client_verify and custom_ca is None:
        custom_ca = _grpc_default_roots()
        log.warning(
            "%s: client_verify without custom_ca checks client certificates against gRPC's default roots (public "
            "CAs), as TF Serving does: set custom_ca to the CA that issues your clients' certificates",
            where,
        )
    return GrpcTLS(config.server_key.encode(), config.server_cert.encode(), custom_ca, config.client_verify)


def _grpc_default_roots() -> bytes:
    """The roots gRPC verifies peers with when given none: ``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, else its own."""
    override = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    if override:
        return Path(override).read_bytes()
    from importlib.resources import files

    return files("grpc").joinpath("_cython/_credentials/roots.pem").read_bytes()


def parse_monitoring_config_file(path: str | os.PathLike[str]) -> MonitoringOptions:
    from workbench.config.tf_serving_protos import MonitoringConfig

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"Could not read monitoring config file {path}: {exc.strerror}") from None
    config = parse_text_config(text, MonitoringConfig(), path)
    prometheus = config.prometheus_config
    metrics_path = prometheus.path or "/monitoring/prometheus/metrics"
    if not metrics_path.startswith("/"):
        metrics_path = "/" + metrics_path
    return MonitoringOptions(prometheus_enabled=prometheus.enable, prometheus_path=metrics_path)


def parse_channel_arguments(text: str) -> tuple[tuple[str, int | str], ...]:
    arguments: list[tuple[str, int | str]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ServingError(
                Code.INVALID_ARGUMENT, f"Malformed --grpc_channel_arguments entry {item!r}: want key=value"
            )
        value = value.strip()
        arguments.append((key.strip(), int(value) if value.lstrip("-").isdigit() else value))
    return tuple(arguments)


def discover_models(root: str | os.PathLike[str], packaged: PackagedModels | None = None) -> list[ModelConfig]:
    """A model repository root: every sub-folder whose name is a valid model name is a model (latest policy), and
    every model ``packaged`` finds packed in a platform's files (all its versions).

    Hidden folders (``.workbench``, an export's temporary folder) are skipped. A missing root is created, so a
    server can start on an empty repository and pick up models as they are exported into it. A root in an object
    store is listed by prefix (raises :class:`~workbench.runtime.storage.StorageError` when it cannot be).

    A root laid out for MLServer (a ``model-settings.json`` at any depth) is MLServer's: its models are those files'
    (found by ``packaged``) and nothing else, as ``mlserver start`` serves it, so its ``models/``, ``mlruns/`` or
    ``tests/`` folders are not served as models of their own. So is a root when MLServer's environment names a model
    (``MLSERVER_MODEL_IMPLEMENTATION``) and the root holds no TF Serving-style model (numbered version folders):
    KServe's ``/mnt/models`` holds that model's files.
    """
    if is_remote(root):
        url = str(root).rstrip("/")
        return [
            ModelConfig(name=name, base_path=f"{url}/{name}")
            for name in RemoteFolder(url).list_folders()
            if is_model_name(name)
        ]
    base = Path(root).resolve()
    base.mkdir(parents=True, exist_ok=True)
    # MLSERVER_MODEL_IMPLEMENTATION makes a folder MLServer's too (it holds the environment's one model), unless it
    # is laid out for TF Serving: a pod's variable does not turn a repository of numbered versions into one model.
    mlserver_layout = holds_model_settings(base) or environment_model_serves(base)
    models = [
        ModelConfig(name=entry.name, base_path=str(entry), policy=_folder_policy(str(entry)))
        for entry in sorted(base.iterdir())
        if entry.is_dir() and is_model_name(entry.name) and not mlserver_layout
    ]
    if packaged is None:
        return models
    # A TorchServe model store (each model of its .mar files) or an MLServer folder (each model of its
    # model-settings.json files): every version it has serves, as in those servers.
    folders = {model.name for model in models}
    for name, found in packaged(base, is_model_name).items():
        if name in folders:
            log.error("Model %s is both a folder and a packaged model in %s; the folder is served", name, base)
            continue
        models.append(
            ModelConfig(
                name=name,
                base_path=found.folder,
                policy=VersionPolicy(kind="all"),
                labels=dict(found.labels),
                reload_changed=found.reload_changed,
            )
        )
    return models


def is_config_model_name(name: str) -> bool:
    """A model config's name (a file's or a gRPC reload's): one folder name, as a model cache uses it.

    Looser than :func:`is_model_name` (TF Serving's configs name models with any text), but never a path: no
    separator, no ``.`` or ``..``, no NUL or control character. REST cannot even address a name with a ``/``.
    """
    if not name or name in (".", ".."):
        return False
    return not any(c in "/\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in name)


def is_model_name(name: str) -> bool:
    """Letters, digits, ``_``, ``-`` and ``.``, not starting with ``.``: safe as a folder and in a URL path."""
    return bool(name) and not name.startswith(".") and all(c.isalnum() or c in "_-." for c in name) and name.isascii()
