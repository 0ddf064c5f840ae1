"""``workbench serve``'s flags, each declared once: name, help, metavar, and where it differs from the option it
sets, its default and how its value becomes that option.

Types and defaults are :class:`~workbench.config.options.ServerOptions`' own (a flag is typed by its option's
default; a boolean takes TF Serving's forms), so a flag and its option cannot drift apart. From the declaration
come the argparse flags of ``workbench serve`` (:func:`add_serve_flags`), the options of a parsed command line
(:mod:`workbench.config.serve_options`, which checks them), the command line of a child server
(:func:`serve_flag_words`: the notebook's handles, Ray's replicas) and the types of ``%serve start``'s options
(:meth:`ServeFlag.argument`).
Earlier spellings of the flags (``--rest_port``, ``--repo`` ...) are the vocabulary's aliases
(:data:`workbench.config.vocabulary.OPTION_ALIASES`, :attr:`ServeFlag.aliases`): they name an option in every
parser that has it, so they are declared there, once, by the name they stand for.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from workbench.config.options import ServerOptions
from workbench.config.vocabulary import OPTION_ALIASES, Argument, BoolFlag, VocabularyParser

# The management token's other source: an environment variable keeps the secret out of `ps` and shell histories.
MANAGEMENT_TOKEN_ENV = "WORKBENCH_MANAGEMENT_TOKEN"
NO_TOKEN = "none"  # --management_token=none: no token, on purpose (e.g. a private network, a proxy in front)

# tensorflow_model_server flags that workbench does not implement (yet): refused with a clear message.
UNSUPPORTED_TF_SERVING_FLAGS = {
    "platform_config_file": "each version folder says its platform (model_platform, workbench.json, its model file)",
    "tensorflow_session_parallelism": "TensorFlow thread pools are not configurable yet",
    "tensorflow_intra_op_parallelism": "TensorFlow thread pools are not configurable yet",
    "tensorflow_inter_op_parallelism": "TensorFlow thread pools are not configurable yet",
    "per_process_gpu_memory_fraction": "GPU memory grows on demand (allow_growth) instead",
    "saved_model_tags": "only the 'serve' tag-set is served",
    "max_num_load_retries": "a failed version is retried when its files change instead",
    "load_retry_interval_micros": "a failed version is retried when its files change instead",
    "num_unload_threads": "unloads share the load threads",
    "rest_api_num_threads": "the REST frontend is asynchronous; see --num_inference_threads",
    "enable_signature_method_name_check": "method names are checked per API",
    "xla_cpu_compilation_enabled": "XLA is not configurable",
    "remove_unused_fields_from_bundle_metagraph": "not applicable",
    "flush_filesystem_caches": "not applicable",
    "mixed_precision": "not supported",
    "thread_pool_factory_config_file": "not supported",
    "version": "use `workbench --version`",
}

# Command lines shown under --help. tests/wire/test_vocabulary.py parses every one, so they stay true.
SERVE_EXAMPLES = """\
examples:
  workbench serve --model_name=half_plus_two --model_base_path=/models/half_plus_two --rest_api_port=8501
  workbench serve --model_config_file=models.config --port=8500 --rest_api_port=8501 --enable_batching
  workbench serve --model_repository=workbench-models --rest_api_port=8501 --server_name=experiments
  workbench serve --model_repository=workbench-models --ssl_config_file=ssl.config \\
      --rest_api_port=8501 --rest_api_ssl_cert_file=server.pem --rest_api_ssl_key_file=server.key
"""
SERVE_SUMMARY = "serve models over TF Serving's REST and gRPC APIs (tensorflow_model_server's flags)"
# The serve command's parser, as the command line's subcommand and on its own (serve_parser).
SERVE_PARSER_TEXTS: Mapping[str, Any] = {
    "usage": "%(prog)s (--model_base_path=DIR [--model_name=NAME] | --model_config_file=FILE | "
    "--model_repository=DIR) [flags]",
    "description": "Serve TensorFlow SavedModels with TF Serving's REST and gRPC APIs. Flag names and defaults are "
    "tensorflow_model_server's; a boolean flag alone turns it on, and --flag=true or --flag=false work as in "
    "TF Serving.",
    "epilog": SERVE_EXAMPLES,
}

_FROM_OPTIONS: Any = object()  # a flag's default: its option's
_SAME_NAME = "="  # a flag's option: the ServerOptions field of its own name


def _names(text: str) -> tuple[str, ...]:
    """``A,B`` → ("A", "B")."""
    return tuple(n for n in (m.strip() for m in text.split(",")) if n)


@dataclasses.dataclass(frozen=True)
class ServeFlag:
    """One flag of ``workbench serve``."""

    name: str
    help: str
    metavar: str | None = None
    # The flag's default where it is not the option's (the option's type differs: a text of names, a count or 'auto').
    default: Any = _FROM_OPTIONS
    # The ServerOptions field it sets; None: one read by workbench.config.serve_options (which derives fields).
    option: str | None = _SAME_NAME
    convert: Callable[[Any], Any] | None = None  # its value → the option's
    repeat: bool = False  # given once per value (a list)
    hidden: bool = False  # set by programs (notebook handles, the supervisor), not people: --help leaves it out

    @property
    def aliases(self) -> tuple[str, ...]:
        """Its earlier spellings: the vocabulary's, which name an option wherever a parser has it (``--repo`` is
        ``workbench serve``'s, ``%serve start``'s and ``workbench ray deploy``'s ``--model_repository``)."""
        return tuple(alias for alias, name in OPTION_ALIASES.items() if name == self.name)

    @property
    def field(self) -> str | None:
        return self.name if self.option == _SAME_NAME else self.option

    def default_value(self) -> Any:
        if self.default is not _FROM_OPTIONS:
            return self.default
        return _OPTION_DEFAULTS[self.name]

    def argument(self, help: str, **overrides: Any) -> Argument:
        """This flag as another parser takes it (``%serve start``): its name and type, that parser's help and
        default (None unless given: the handle's own), ``overrides`` for the rest (a metavar)."""
        default = self.default_value()
        options: dict[str, Any] = (
            {"action": BoolFlag} if isinstance(default, bool) else {"type": type(default), "metavar": self.metavar}
        )
        return Argument.of(f"--{self.name}", **{**options, "help": help, **overrides})

    def add_to(self, parser: argparse._ActionsContainer) -> None:
        text = argparse.SUPPRESS if self.hidden else self.help
        default = self.default_value()
        if self.repeat:
            parser.add_argument(f"--{self.name}", action="append", default=[], metavar=self.metavar, help=text)
        elif isinstance(default, bool):
            parser.add_argument(f"--{self.name}", action=BoolFlag, default=default, help=text)
        else:
            parser.add_argument(f"--{self.name}", type=type(default), default=default, metavar=self.metavar, help=text)


@dataclasses.dataclass(frozen=True)
class FlagGroup:
    """A section of ``workbench serve --help`` (None: flags it does not list)."""

    title: str | None
    description: str | None
    flags: tuple[ServeFlag, ...]


_OPTION_DEFAULTS = {
    field.name: field.default for field in dataclasses.fields(ServerOptions) if field.default is not dataclasses.MISSING
}

SERVE_FLAGS: tuple[FlagGroup, ...] = (
    FlagGroup(
        "models",
        "what to serve (one of the three sources) and how versions load",
        (
            ServeFlag("model_name", "name of the one model served from --model_base_path", "NAME"),
            ServeFlag("model_base_path", "serve one model: a folder (or s3://, gs:// URL) of numbered versions", "DIR"),
            ServeFlag("model_config_file", "serve the models listed in a text-format ModelServerConfig", "FILE"),
            ServeFlag("model_config_file_poll_wait_seconds", "re-read --model_config_file this often (0: once)", "S"),
            ServeFlag("file_system_poll_wait_seconds", "look for new versions this often (0: once, <0: never)", "S"),
            ServeFlag("enable_model_warmup", "replay assets.extra/tf_serving_warmup_requests before serving"),
            ServeFlag("allow_version_labels_for_unavailable_models", "let a label name a version not loaded yet"),
            ServeFlag("num_load_threads", "threads that load and unload versions", "N"),
            ServeFlag(
                "wait_for_model_load_seconds",
                "a request for a model still in its first load waits this long for it (and no longer than its "
                "deadline) instead of NOT_FOUND; 0 answers at once",
                "S",
            ),
            ServeFlag(
                "memory_budget",
                "keep the loaded versions within this much memory, evicting the least recently used idle ones (which "
                "load again when asked for): bytes (8Gi, 500M), a share of this machine's memory (0.5: half; a "
                "container's limit if lower), gpu:AMOUNT for GPU memory, or both (4Gi,gpu:0.8); see "
                "docs/memory-budget.md",
                "AMOUNT",
            ),
            ServeFlag("load_on_demand", "load each version when a request first asks for it, not at start-up"),
            ServeFlag(
                "unload_after_idle",
                "unload a version no request has used for this many seconds (it loads again when asked for; 0: never)",
                "S",
            ),
            ServeFlag(
                "pin",
                "never evict MODEL's versions (or MODEL:VERSION) for the memory budget or idleness; repeat it",
                "MODEL",
                repeat=True,
                convert=tuple,
            ),
            ServeFlag(
                "model_control_mode",
                "Triton's model control: none (load every model once), poll (and follow the repository), explicit "
                "(only --load_model models, then clients load and unload whole models); not given: every model, and "
                "clients load and unload versions",
                "MODE",
            ),
            ServeFlag(
                "load_model",
                "with --model_control_mode=explicit: a model to load at start-up (repeat it; * loads every model)",
                "NAME",
                repeat=True,
                convert=tuple,
            ),
            ServeFlag(
                "response_cache_bytes",
                "Triton's response cache: keep up to this many bytes of predict answers, for the models that opt in "
                "(--response_cache_models, or response_cache { enable: true } in a Triton config.pbtxt); 0: off",
                "BYTES",
            ),
            ServeFlag(
                "response_cache_models",
                "the models whose answers the response cache keeps",
                "A,B",
                default="",
                convert=_names,
            ),
            # Both run code from the repository when a version loads: whoever can write it can run anything here.
            ServeFlag("allow_pickle", "load scikit-learn models from model.joblib / model.pkl (pickles run code)"),
            ServeFlag("allow_python_models", "load model.py, handler.py and their Python code from the repository"),
            ServeFlag(
                "prefer_tflite_model",
                "serve a version folder's model.tflite with LiteRT instead of its SavedModel (a folder holding only "
                "model.tflite is served by LiteRT either way)",
            ),
            ServeFlag("tflite_interpreters", "TF Lite interpreters per version: calls that run at once", "N"),
            ServeFlag(
                "enable_profiler",
                "answer tensorflow.ProfilerService on the gRPC port (TensorFlow's profiler, for TensorBoard and "
                "tf.profiler.experimental.client.trace)",
            ),
            ServeFlag(
                "disable_auto_complete_config",
                "Triton's: take each config.pbtxt as written: it must name its backend and declare its inputs and "
                "outputs (by default they are completed from the model files, as Triton does)",
            ),
        ),
    ),
    FlagGroup(
        "asynchronous inference",
        "POST /v1/models/M:predictAsync answers 202 with an id at once; GET /workbench/v1/async/ID gives the answer",
        (
            ServeFlag(
                "async_queue",
                "where requests wait: sqlite:///PATH (default: a file in ~/.local/state/workbench/async named after "
                "what this server serves, shared by its workers and kept across restarts), redis://HOST:PORT/DB (a "
                "Redis stream many servers share), or sqs://QUEUE?results=s3://BUCKET/PREFIX (Amazon SQS, answers "
                "as JSON objects there)",
                "URI",
            ),
            ServeFlag("async_concurrency", "asynchronous requests each serving process answers at once", "N"),
            ServeFlag(
                "async_visibility_seconds",
                "a request taken by a process that stops answering is taken again after this long",
                "S",
            ),
            ServeFlag(
                "async_max_attempts", "times a request is taken (server errors, stopped processes) before it fails", "N"
            ),
            ServeFlag("async_results_seconds", "how long answers are kept for GET", "S"),
            ServeFlag(
                "async_notify_url",
                "told of each answered request ({id, model, state, status, url}): a webhook (http:// or https://, "
                "POSTed) or a result queue (sqs://QUEUE, redis://HOST:PORT/DB?key=STREAM)",
                "URL",
            ),
        ),
    ),
    FlagGroup(
        "request logs and drift",
        "logging_config's collectors (tfrecord, parquet, cloudevents) and drift of served inputs from a reference",
        (
            ServeFlag("request_log_flush_seconds", "write buffered Parquet request-log rows at least this often", "S"),
            ServeFlag("drift_window", "rolling window of served rows per model version that drift is tested", "ROWS"),
            ServeFlag(
                "drift_reference_rows",
                "drift reference of a version with none given at export: its first ROWS served rows (0: none)",
                "ROWS",
            ),
            ServeFlag(
                "drift_thresholds",
                "when a feature drifts: psi=X (population stability index at least X), p_value=P (KS or chi-squared "
                "test below P); comma-separated, a rule left out is off",
                "RULES",
            ),
        ),
    ),
    FlagGroup(
        "network and ports",
        None,
        (
            ServeFlag("port", "gRPC port; 0 picks a free one", "PORT"),
            ServeFlag(
                "rest_api_port", "REST API port; 0 turns REST off, as in TF Serving, and -1 picks a free one", "PORT"
            ),
            ServeFlag("rest_api_timeout_in_ms", "deadline of a REST inference request", "MS"),
            ServeFlag("rest_api_enable_cors_support", "answer CORS preflights and allow any origin"),
            ServeFlag("grpc_socket_path", "also serve gRPC on this Unix socket", "PATH"),
            ServeFlag("grpc_channel_arguments", "gRPC server arguments, comma-separated key=value", "ARGS"),
            ServeFlag(
                "ssl_config_file",
                "TLS on gRPC: a text-format SSLConfig (server_key, server_cert, custom_ca: PEM texts; client_verify: "
                "require client certificates issued by custom_ca)",
                "FILE",
            ),
            # For scripts and supervisors that start servers on free ports: reading the port back from the server is
            # the only race-free way (a port picked beforehand can be taken by another process before the server binds).
            ServeFlag(
                "ready_file",
                "once serving, write the ports it bound and its health as JSON to FILE (with --port=0 / "
                "--rest_api_port=-1)",
                "FILE",
            ),
        ),
    ),
    FlagGroup(
        "batching",
        None,
        (
            ServeFlag("enable_batching", "merge concurrent requests into batches (TF Serving's parameters)"),
            ServeFlag("batching_parameters_file", "text-format BatchingParameters (with --enable_batching)", "FILE"),
        ),
    ),
    FlagGroup(
        "monitoring",
        None,
        (ServeFlag("monitoring_config_file", "text-format MonitoringConfig (Prometheus metrics)", "FILE"),),
    ),
    FlagGroup(
        "workbench's own flags",
        "not in tensorflow_model_server",
        (
            ServeFlag("model_repository", "serve every model folder under DIR; models come and go with folders", "DIR"),
            ServeFlag(
                "model_cache_dir",
                "where versions from s3://, gs:// and other fsspec URLs are downloaded to load (default: "
                "$XDG_CACHE_HOME/workbench/models or ~/.cache/workbench/models); each server uses a slot of its own",
                "DIR",
            ),
            ServeFlag("server_name", "name in JupyterLab's sidebar (default: the repository's folder name)", "NAME"),
            # Both ports bind it: read into rest_api_host and grpc_host.
            ServeFlag(
                "host",
                "address both ports bind (TF Serving binds every address: 0.0.0.0)",
                "ADDRESS",
                default="127.0.0.1",
                option=None,
            ),
            ServeFlag("rest_api_ssl_cert_file", "TLS on REST (https): the server's PEM certificate chain", "FILE"),
            ServeFlag("rest_api_ssl_key_file", "its PEM private key (default: in --rest_api_ssl_cert_file)", "FILE"),
            ServeFlag(
                "rest_api_ssl_client_ca_file",
                "mutual TLS on REST: require client certificates issued by this PEM CA",
                "FILE",
            ),
            ServeFlag(
                "openai_port",
                "OpenAI-compatible endpoints (/v1/chat/completions ...) on a port of their own, with REST's TLS "
                "(0: on the REST port; -1 picks a free one)",
                "PORT",
            ),
            ServeFlag("rest_api_max_request_bytes", "largest REST request body accepted", "BYTES"),
            ServeFlag(
                "http_server",
                "the HTTP server of the REST port (and --openai_port): uvicorn, or granian (Rust; answers the "
                "inference routes in its own interface, RSGI) (default: $WORKBENCH_HTTP_SERVER, else uvicorn)",
                "SERVER",
            ),
            ServeFlag("grpc_max_message_bytes", "largest gRPC message received or sent", "BYTES"),
            ServeFlag("num_inference_threads", "threads running TensorFlow (0: twice the cores, at least 4)", "N"),
            ServeFlag(
                "pytorch_device",
                "where PyTorch models (model.pt2, model.pt) run: auto (the first CUDA GPU PyTorch sees, else the CPU), "
                "cpu, cuda or cuda:N",
                "DEVICE",
            ),
            ServeFlag(
                "pytorch_threads",
                "PyTorch's intra-op threads per call (0: one per core); the server runs --num_inference_threads calls "
                "at once",
                "N",
            ),
            ServeFlag(
                "max_batched_tokens",
                "tokens a text generator's iteration runs at most: one per sequence decoding, the rest for a chunk of "
                "new prompts (0: 160 on a CPU, 512 on a GPU); a version's workbench.json may set its own",
                "N",
            ),
            ServeFlag(
                "inline_cheap_calls",
                "run a native model's calls (TensorFlow, scikit-learn, XGBoost, LightGBM, ONNX) on the event loop once "
                "they prove cheap (under 200 us), saving each a hop to an inference thread; false keeps every call on "
                "the threads, for a model whose calls may wait on I/O",
            ),
            ServeFlag(
                "shared_memory_max_bytes",
                "Triton's system shared memory: the most bytes the regions clients register may span together (0: "
                "none)",
                "BYTES",
            ),
            # Off by default: a client that can name a region can have the server read or overwrite this host's memory.
            ServeFlag(
                "allow_remote_shared_memory",
                "let clients on other hosts register and use shared memory (by default only loopback and Unix-socket "
                "clients may); with a management token, registering and unregistering need it",
            ),
            # A number or 'auto': resolved (and checked) by check_serve_flags.
            ServeFlag(
                "num_workers",
                "worker processes sharing the ports ('auto': one per core); with model runners (--model_runners, by "
                "default one per GPU) they hand requests to them, else each loads the models and batches on its own",
                "N",
                default="1",
                option=None,
            ),
            # 'auto', 'in_process' or a number: resolved (and checked) by check_serve_flags.
            ServeFlag(
                "model_runners",
                "processes that hold the models and run their batches for every worker ('auto': one per GPU when "
                "--num_workers is above 1, none on a machine without GPUs; 'in_process': none, each worker loads and "
                "batches on its own); a number starts that many, each holding every model, also without GPUs",
                "N",
                default="auto",
                option=None,
            ),
            ServeFlag(
                "management_state_file", "an older workbench's routing state, read where a model has none", "FILE"
            ),
            ServeFlag(
                "mlflow_tracking_uri",
                "the MLflow tracking server of models:/ and runs:/ base paths (default: $MLFLOW_TRACKING_URI, else "
                "MLflow's own default: sqlite:///mlflow.db in the working folder)",
                "URI",
            ),
            ServeFlag(
                "mlflow_stable_alias",
                "the alias of a registered model (models:/NAME) that is its stable version: moving it in MLflow moves "
                "the server",
                "ALIAS",
            ),
            ServeFlag(
                "mlflow_canary_alias",
                "the alias of a registered model that is its canary, with its share of traffic in the model's tag "
                "workbench.canary_weight",
                "ALIAS",
            ),
            ServeFlag(
                "mlflow_write_aliases",
                "let promote, canary and rollback set a registered model's aliases in MLflow (off: the registry alone "
                "routes it, and those changes are refused)",
            ),
            # The flag, else the environment: resolved (and required beyond loopback) by management_token().
            ServeFlag(
                "management_token",
                f"require this bearer token for the management API's changes (default: ${MANAGEMENT_TOKEN_ENV}, which "
                f"keeps it off command lines); a server bound to a non-loopback --host needs one, or '{NO_TOKEN}' to "
                "go without",
                "TOKEN",
                option=None,
            ),
            ServeFlag(
                "torchserve_allowed_urls",
                "TorchServe's allowed_urls: comma-separated regular expressions, one of which must match the whole "
                "URL a model registration names (default: any file:// or http(s):// URL, as TorchServe's)",
                "REGEX",
            ),
            ServeFlag(
                "mlflow_scoring_model",
                "the model MLflow's scoring protocol (POST /invocations, which names none) answers with (default: the "
                "server's only model)",
                "NAME",
            ),
            ServeFlag(
                "drain_seconds",
                "on SIGTERM or SIGINT: turn /readyz false, refuse new connections, give accepted requests up to this "
                "long in all to finish, then exit 0 (a second signal exits at once); Kubernetes' "
                "terminationGracePeriodSeconds should be at least this",
                "S",
            ),
            ServeFlag(
                "drain_delay_seconds",
                "part of --drain_seconds spent not ready but still taking new connections, while load balancers stop "
                "routing here (instead of a preStop sleep)",
                "S",
            ),
        ),
    ),
    FlagGroup(
        None,
        None,
        (
            # Set by notebook handles: stop when this process exits.
            ServeFlag("parent_pid", "", hidden=True),
            # Set by the supervisor of --num_workers (workbench.deploy.workers) on each worker: its run folder.
            ServeFlag("worker_of", "", default="", option="worker_dir", hidden=True),
            ServeFlag("worker_index", "", hidden=True),
            # Set by the supervisor on each model runner (workbench.runners.runner): its run folder and index.
            ServeFlag("runner_of", "", default="", option=None, hidden=True),
            ServeFlag("runner_index", "", default=0, option=None, hidden=True),
        ),
    ),
)
FLAGS: Mapping[str, ServeFlag] = {flag.name: flag for group in SERVE_FLAGS for flag in group.flags}


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """``workbench serve``'s flags, in their help sections, and TF Serving's that it refuses by name."""
    for group in SERVE_FLAGS:
        container = parser if group.title is None else parser.add_argument_group(group.title, group.description)
        for flag in group.flags:
            flag.add_to(container)
    for name in UNSUPPORTED_TF_SERVING_FLAGS:
        parser.add_argument(f"--{name}", nargs="?", const=True, default=None, help=argparse.SUPPRESS, dest=f"x_{name}")


def serve_parser() -> argparse.ArgumentParser:
    """``workbench serve``'s parser on its own (as the command line's ``serve`` command parses, and names itself)."""
    parser = VocabularyParser(prog="workbench serve", **SERVE_PARSER_TEXTS)
    add_serve_flags(parser)
    return parser


def serve_flag_words(values: Mapping[str, Any], *, keep_defaults: bool = False) -> list[str]:
    """``workbench serve``'s command line for ``values`` (flag name → value), in their order, for a server started
    by a program (a notebook's handle, Ray's replicas).

    None is left out, and so is a flag's default unless ``keep_defaults``; a boolean is ``--flag`` (or
    ``--flag=false``), a sequence its items joined with commas. A name that is no flag of ``workbench serve`` is a
    ValueError.
    """
    words: list[str] = []
    for name, value in values.items():
        flag = FLAGS.get(name)
        if flag is None:
            raise ValueError(f"workbench serve has no flag --{name}")
        if value is None:
            continue
        if flag.repeat:
            words += [f"--{name}={item}" for item in value]
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        default = flag.default_value()
        if not keep_defaults and (value == default or (isinstance(default, str) and str(value) == default)):
            continue
        if isinstance(value, bool):
            words.append(f"--{name}" if value else f"--{name}=false")
        else:
            words.append(f"--{name}={value}")
    return words
