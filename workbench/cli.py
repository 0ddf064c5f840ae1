"""``workbench serve | demo | bench``: the command line, with ``tensorflow_model_server``'s flag names.

Flags are parsed with argparse, in the vocabulary of :mod:`workbench.config.vocabulary`: TF Serving's names, with
earlier spellings (``--rest_port``, ``--repo``, ``--clients`` ...) and dashes for underscores accepted, and a
mistyped flag answered with the nearest one. Booleans take TF Serving's forms (``--flag``, ``--flag=true``,
``--flag=false``). A TF Serving flag this server does not implement is refused by name, never ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import ipaddress
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from workbench.client.bench import DEFAULT_CONCURRENCY, DEFAULT_DURATION_S, DEFAULT_PROTOCOL, GRPC_PROTOCOLS, PROTOCOLS
from workbench.config.vocabulary import BoolFlag, HelpFormatter, canonical_options, did_you_mean, unrecognized_option

if TYPE_CHECKING:
    from workbench.config.options import ServerOptions

# TensorFlow's C++ INFO lines are noise for a server operator; warnings and errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

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
    "enable_profiler": "the TensorFlow profiler service is not exposed",
    "use_tflite_model": "TensorFlow Lite models are not supported",
    "remove_unused_fields_from_bundle_metagraph": "not applicable",
    "flush_filesystem_caches": "not applicable",
    "mixed_precision": "not supported",
    "thread_pool_factory_config_file": "not supported",
    "version": "use `workbench --version`",
}

# Command lines shown under --help. tests/wire/test_vocabulary.py parses every one, so they stay true.
EXAMPLES = """\
examples:
  workbench demo demo-models
  workbench serve --model_config_file=demo-models/models.config --rest_api_port=8501
  workbench bench --target=localhost:8501 --model=half_plus_two --inputs='{"x": [[1.0]]}'
"""
SERVE_EXAMPLES = """\
examples:
  workbench serve --model_name=half_plus_two --model_base_path=/models/half_plus_two --rest_api_port=8501
  workbench serve --model_config_file=models.config --port=8500 --rest_api_port=8501 --enable_batching
  workbench serve --model_repository=workbench-models --rest_api_port=8501 --server_name=experiments
  workbench serve --model_repository=workbench-models --ssl_config_file=ssl.config \\
      --rest_api_port=8501 --rest_api_ssl_cert_file=server.pem --rest_api_ssl_key_file=server.key
"""
BENCH_EXAMPLES = """\
examples:
  workbench bench --target=localhost:8501 --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=localhost:8500 --protocol=grpc --model=half_plus_two --inputs='{"x": [[1.0]]}' \\
      --concurrency=8 --duration=10
  workbench bench --target=localhost:8500 --protocol=v2-grpc --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=https://localhost:8501 --ca_file=ca.pem --model=half_plus_two --inputs='{"x": [[1.0]]}'
"""
RAY_EXAMPLES = """\
examples:
  workbench ray deploy --model_repository=/shared/models --num_replicas=2
  workbench ray deploy --model_repository=s3://models --address=auto --max_replicas=4 -- --enable_batching
  workbench ray status --address=auto
  workbench ray shutdown --address=auto
"""
MANIFESTS_EXAMPLES = """\
examples:
  workbench manifests digits --kserve --storage_uri=s3://models/digits --out=deploy-digits
  workbench manifests digits --kubernetes --storage_uri=s3://models/digits --server=http://localhost:8501
"""


class _Parser(argparse.ArgumentParser):
    """argparse in workbench's vocabulary: aliases and dashes accepted, a mistyped flag or command answered with
    the nearest one, and every error ending with where help is."""

    commands: tuple[str, ...] = ()  # set on the top-level parser: its subcommands

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        # TF Serving takes no abbreviated flags; a prefix (--rest) is a mistake to point out, not a flag to guess.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        if self.commands:  # the top level: the command's own parser reads the flags after it
            command = next((word for word in words if not word.startswith("-")), None)
            if command is not None and command not in self.commands:
                hint = did_you_mean(command, self.commands)
                self.error(f"unknown command {command!r}{hint} (commands: {', '.join(self.commands)})")
        else:
            words = canonical_options(words, self)
            problem = unrecognized_option(words, self)
            if problem:
                self.error(problem)
        return super().parse_known_args(words, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


def _flag(
    group: argparse._ActionsContainer, name: str, default: object, help_text: str, metavar: str | None = None
) -> None:
    """``--name``, typed by its default (TF Serving's boolean forms for a bool)."""
    if isinstance(default, bool):
        group.add_argument(f"--{name}", action=BoolFlag, default=default, help=help_text)
    else:
        group.add_argument(f"--{name}", type=type(default), default=default, metavar=metavar, help=help_text)


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="serve models over TF Serving's REST and gRPC APIs (tensorflow_model_server's flags)",
        usage="%(prog)s (--model_base_path=DIR [--model_name=NAME] | --model_config_file=FILE | "
        "--model_repository=DIR) [flags]",
        description="Serve TensorFlow SavedModels with TF Serving's REST and gRPC APIs. Flag names and defaults are "
        "tensorflow_model_server's; a boolean flag alone turns it on, and --flag=true or --flag=false work as in "
        "TF Serving.",
        epilog=SERVE_EXAMPLES,
    )
    models = p.add_argument_group("models", "what to serve (one of the three sources) and how versions load")
    _flag(models, "model_name", "default", "name of the one model served from --model_base_path", "NAME")
    _flag(models, "model_base_path", "", "serve one model: a folder (or s3://, gs:// URL) of numbered versions", "DIR")
    _flag(models, "model_config_file", "", "serve the models listed in a text-format ModelServerConfig", "FILE")
    _flag(models, "model_config_file_poll_wait_seconds", 0.0, "re-read --model_config_file this often (0: once)", "S")
    _flag(models, "file_system_poll_wait_seconds", 1.0, "look for new versions this often (0: once, <0: never)", "S")
    _flag(models, "enable_model_warmup", True, "replay assets.extra/tf_serving_warmup_requests before serving")
    _flag(models, "allow_version_labels_for_unavailable_models", False, "let a label name a version not loaded yet")
    _flag(models, "num_load_threads", 2, "threads that load and unload versions", "N")
    _flag(
        models,
        "wait_for_model_load_seconds",
        60.0,
        "a request for a model still in its first load waits this long for it (and no longer than its deadline) "
        "instead of NOT_FOUND; 0 answers at once",
        "S",
    )
    _flag(
        models,
        "model_control_mode",
        "",
        "Triton's model control: none (load every model once), poll (and follow the repository), explicit (only "
        "--load_model models, then clients load and unload whole models); not given: every model, and clients load "
        "and unload versions",
        "MODE",
    )
    models.add_argument(
        "--load_model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model_control_mode=explicit: a model to load at start-up (repeat it; * loads every model)",
    )
    _flag(
        models,
        "response_cache_bytes",
        0,
        "Triton's response cache: keep up to this many bytes of predict answers, for the models that opt in "
        "(--response_cache_models, or response_cache { enable: true } in a Triton config.pbtxt); 0: off",
        "BYTES",
    )
    _flag(models, "response_cache_models", "", "the models whose answers the response cache keeps", "A,B")
    # Both run code from the repository when a version loads: whoever can write it can run anything here.
    _flag(models, "allow_pickle", False, "load scikit-learn models from model.joblib / model.pkl (pickles run code)")
    _flag(models, "allow_python_models", False, "load model.py, handler.py and their Python code from the repository")

    network = p.add_argument_group("network and ports")
    _flag(network, "port", 8500, "gRPC port; 0 picks a free one", "PORT")
    _flag(
        network,
        "rest_api_port",
        0,
        "REST API port; 0 turns REST off, as in TF Serving, and -1 picks a free one",
        "PORT",
    )
    _flag(network, "rest_api_timeout_in_ms", 30000, "deadline of a REST inference request", "MS")
    _flag(network, "rest_api_enable_cors_support", False, "answer CORS preflights and allow any origin")
    _flag(network, "grpc_socket_path", "", "also serve gRPC on this Unix socket", "PATH")
    _flag(network, "grpc_channel_arguments", "", "gRPC server arguments, comma-separated key=value", "ARGS")
    _flag(
        network,
        "ssl_config_file",
        "",
        "TLS on gRPC: a text-format SSLConfig (server_key, server_cert, custom_ca: PEM texts; client_verify: "
        "require client certificates issued by custom_ca)",
        "FILE",
    )
    # For scripts and supervisors that start servers on free ports: reading the port back from the server is the
    # only race-free way (a port picked beforehand can be taken by another process before the server binds it).
    _flag(
        network,
        "ready_file",
        "",
        "once serving, write the ports it bound and its health as JSON to FILE (with --port=0 / --rest_api_port=-1)",
        "FILE",
    )

    batching = p.add_argument_group("batching")
    _flag(batching, "enable_batching", False, "merge concurrent requests into batches (TF Serving's parameters)")
    _flag(batching, "batching_parameters_file", "", "text-format BatchingParameters (with --enable_batching)", "FILE")

    monitoring = p.add_argument_group("monitoring")
    _flag(monitoring, "monitoring_config_file", "", "text-format MonitoringConfig (Prometheus metrics)", "FILE")

    own = p.add_argument_group("workbench's own flags", "not in tensorflow_model_server")
    _flag(own, "model_repository", "", "serve every model folder under DIR; models come and go with folders", "DIR")
    _flag(
        own,
        "model_cache_dir",
        "",
        "where versions from s3://, gs:// and other fsspec URLs are downloaded to load (default: "
        "$XDG_CACHE_HOME/workbench/models or ~/.cache/workbench/models); each server uses a slot of its own",
        "DIR",
    )
    _flag(own, "server_name", "", "name in JupyterLab's sidebar (default: the repository's folder name)", "NAME")
    _flag(own, "host", "127.0.0.1", "address both ports bind (TF Serving binds every address: 0.0.0.0)", "ADDRESS")
    _flag(own, "rest_api_ssl_cert_file", "", "TLS on REST (https): the server's PEM certificate chain", "FILE")
    _flag(own, "rest_api_ssl_key_file", "", "its PEM private key (default: in --rest_api_ssl_cert_file)", "FILE")
    _flag(
        own,
        "rest_api_ssl_client_ca_file",
        "",
        "mutual TLS on REST: require client certificates issued by this PEM CA",
        "FILE",
    )
    _flag(own, "rest_api_max_request_bytes", 256 * 1024 * 1024, "largest REST request body accepted", "BYTES")
    _flag(own, "grpc_max_message_bytes", 256 * 1024 * 1024, "largest gRPC message received or sent", "BYTES")
    _flag(own, "num_inference_threads", 0, "threads running TensorFlow (0: twice the cores, at least 4)", "N")
    _flag(
        own,
        "shared_memory_max_bytes",
        4 << 30,
        "Triton's system shared memory: the most bytes the regions clients register may span together (0: none)",
        "BYTES",
    )
    # Off by default: a client that can name a region can have the server read or overwrite this host's memory.
    _flag(
        own,
        "allow_remote_shared_memory",
        False,
        "let clients on other hosts register and use shared memory (by default only loopback and Unix-socket "
        "clients may); with a management token, registering and unregistering need it",
    )
    _flag(
        own,
        "num_workers",
        "1",
        "worker processes sharing the ports, each loading the models and batching on its own ('auto': one per "
        "core); 1 keeps one copy of each model in memory: raise it on a machine given to serving",
        "N",
    )
    _flag(own, "management_state_file", "", "an older workbench's routing state, read where a model has none", "FILE")
    _flag(
        own,
        "management_token",
        "",
        f"require this bearer token for the management API's changes (default: ${MANAGEMENT_TOKEN_ENV}, which keeps it "
        f"off command lines); a server bound to a non-loopback --host needs one, or '{NO_TOKEN}' to go without",
        "TOKEN",
    )
    _flag(
        own,
        "drain_seconds",
        30.0,
        "on SIGTERM or SIGINT: turn /readyz false, refuse new connections, give accepted requests up to this long in "
        "all to finish, then exit 0 (a second signal exits at once); Kubernetes' terminationGracePeriodSeconds "
        "should be at least this",
        "S",
    )
    _flag(
        own,
        "drain_delay_seconds",
        0.0,
        "part of --drain_seconds spent not ready but still taking new connections, while load balancers stop "
        "routing here (instead of a preStop sleep)",
        "S",
    )

    # Set by notebook handles, not by people: it works, but --help does not list it.
    p.add_argument("--parent_pid", type=int, default=0, help=argparse.SUPPRESS)  # stop when this process exits
    # Set by the supervisor of --num_workers (workbench.deploy.workers) on each worker it starts.
    p.add_argument("--worker_of", default="", help=argparse.SUPPRESS)  # the supervisor's run folder
    p.add_argument("--worker_index", type=int, default=0, help=argparse.SUPPRESS)
    for name in UNSUPPORTED_TF_SERVING_FLAGS:
        p.add_argument(f"--{name}", nargs="?", const=True, default=None, help=argparse.SUPPRESS, dest=f"x_{name}")
    p.set_defaults(command=_serve)


class FlagError(ValueError):
    """A command line that names what cannot be served together (the message says why)."""


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches an address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name (or 0.0.0.0's kin): others may reach it
        return False


def management_token(flag: str, host: str) -> str:
    """The token the management API requires ("" for none): the flag, else ``$WORKBENCH_MANAGEMENT_TOKEN``.

    A server others can reach (any --host but loopback) needs one: without it, anyone who reaches the port could
    promote, unload or load models. Going without is allowed when said explicitly (``--management_token=none``).
    """
    token = flag or os.environ.get(MANAGEMENT_TOKEN_ENV, "")
    if token == NO_TOKEN:
        return ""
    if not token and not is_loopback(host):
        raise FlagError(
            f"--host={host} lets other machines reach this server, and its management API changes what is served: "
            f"give it a token (--management_token=TOKEN, or ${MANAGEMENT_TOKEN_ENV} to keep it off the command line), "
            f"or --management_token={NO_TOKEN} to serve without one on purpose"
        )
    return token


def _check_serve_args(args: argparse.Namespace) -> int:
    """The number of workers the flags ask for, once they make sense together; raises :class:`FlagError`."""
    from workbench.deploy.workers import resolve_num_workers

    refused = [n for n in UNSUPPORTED_TF_SERVING_FLAGS if getattr(args, f"x_{n}") is not None]
    if refused:
        raise FlagError(
            "\n".join(f"--{name} is not supported: {UNSUPPORTED_TF_SERVING_FLAGS[name]}" for name in refused)
        )
    sources = [flag for flag in ("model_config_file", "model_base_path", "model_repository") if getattr(args, flag)]
    if len(sources) > 1:
        raise FlagError(f"give one of --{' or --'.join(sources)}, not several")
    if not sources:
        raise FlagError(
            "nothing to serve: give --model_base_path=DIR (with --model_name), "
            "--model_config_file=FILE or --model_repository=DIR"
        )
    management_token(args.management_token, args.host)  # refused here, before anything starts
    num_workers = resolve_num_workers(args.num_workers)  # a ValueError says why
    if num_workers > 1 and args.grpc_socket_path:
        raise FlagError("--grpc_socket_path serves one process, not --num_workers")
    if args.wait_for_model_load_seconds < 0:
        raise FlagError("--wait_for_model_load_seconds cannot be negative (0 answers at once)")
    from workbench.config.model_control import ControlMode, check_load_models
    from workbench.core.errors import ServingError

    try:
        mode = ControlMode.parse(args.model_control_mode)
        check_load_models(mode, args.load_model)
    except ServingError as exc:
        raise FlagError(exc.message) from None
    if args.response_cache_bytes < 0:
        raise FlagError("--response_cache_bytes cannot be negative (0 turns the cache off)")
    if args.response_cache_models and not args.response_cache_bytes:
        raise FlagError("--response_cache_models needs --response_cache_bytes: the cache's size")
    if args.shared_memory_max_bytes < 0:
        raise FlagError("--shared_memory_max_bytes cannot be negative (0 lets no shared memory register)")
    if mode is ControlMode.EXPLICIT and not args.model_repository:
        raise FlagError("--model_control_mode=explicit loads models out of a repository: give --model_repository")
    return num_workers


def _server_options(args: argparse.Namespace, num_workers: int) -> ServerOptions:
    from workbench.config.options import ServerOptions

    return ServerOptions(
        port=args.port,
        rest_api_port=args.rest_api_port,
        rest_api_host=args.host,
        grpc_host=args.host,
        rest_api_timeout_in_ms=args.rest_api_timeout_in_ms,
        rest_api_enable_cors_support=args.rest_api_enable_cors_support,
        rest_api_max_request_bytes=args.rest_api_max_request_bytes,
        grpc_socket_path=args.grpc_socket_path,
        grpc_channel_arguments=args.grpc_channel_arguments,
        grpc_max_message_bytes=args.grpc_max_message_bytes,
        ssl_config_file=args.ssl_config_file,
        rest_api_ssl_cert_file=args.rest_api_ssl_cert_file,
        rest_api_ssl_key_file=args.rest_api_ssl_key_file,
        rest_api_ssl_client_ca_file=args.rest_api_ssl_client_ca_file,
        model_name=args.model_name,
        model_base_path=args.model_base_path,
        model_config_file=args.model_config_file,
        model_config_file_poll_wait_seconds=args.model_config_file_poll_wait_seconds,
        file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
        enable_model_warmup=args.enable_model_warmup,
        monitoring_config_file=args.monitoring_config_file,
        allow_version_labels_for_unavailable_models=args.allow_version_labels_for_unavailable_models,
        num_inference_threads=args.num_inference_threads,
        num_load_threads=args.num_load_threads,
        wait_for_model_load_seconds=args.wait_for_model_load_seconds,
        model_control_mode=args.model_control_mode,
        load_model=tuple(args.load_model),
        response_cache_bytes=args.response_cache_bytes,
        response_cache_models=tuple(n for n in (m.strip() for m in args.response_cache_models.split(",")) if n),
        enable_batching=args.enable_batching,
        batching_parameters_file=args.batching_parameters_file,
        model_repository=args.model_repository,
        model_cache_dir=args.model_cache_dir,
        management_state_file=args.management_state_file,
        management_token=management_token(args.management_token, args.host),
        server_name=args.server_name,
        drain_seconds=args.drain_seconds,
        drain_delay_seconds=args.drain_delay_seconds,
        ready_file=args.ready_file,
        parent_pid=args.parent_pid,
        allow_pickle=args.allow_pickle,
        allow_python_models=args.allow_python_models,
        shared_memory_max_bytes=args.shared_memory_max_bytes,
        allow_remote_shared_memory=args.allow_remote_shared_memory,
        num_workers=num_workers,
        worker_index=args.worker_index,
        worker_dir=args.worker_of,
    )


def serve_options(flags: Sequence[str]) -> ServerOptions:
    """``workbench serve``'s flags (without the command) as the options of one serving process.

    For embedding the engine elsewhere (a Ray Serve replica): the same vocabulary and checks as the command line;
    a bad flag raises :class:`FlagError` (argparse's own message) instead of exiting.
    """
    parser = build_parser()
    words = ["serve", *flags]
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            args = parser.parse_args(words)
    except SystemExit:
        raise FlagError(err.getvalue().strip()) from None
    try:
        num_workers = _check_serve_args(args)
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    if num_workers > 1:
        raise FlagError("--num_workers: one embedded server is one process")
    return _server_options(args, 1)


def _serve(args: argparse.Namespace) -> int:
    try:
        num_workers = _check_serve_args(args)
    except ValueError as exc:
        for line in str(exc).splitlines():
            print(f"workbench serve: {line}", file=sys.stderr)
        return 2
    if num_workers > 1 and not args.worker_of:
        from workbench.core.errors import ServingError

        try:  # every worker reads the TLS files: a bad one is said once here, not by workers restarting forever
            options = _server_options(args, num_workers)
            options.grpc_tls()
            options.rest_tls()
        except ServingError as exc:
            print(f"workbench serve: {exc.message}", file=sys.stderr)
            return 1
        return _supervise(args, num_workers)
    options = _server_options(args, num_workers)
    _configure_logging(f"[worker {args.worker_index}] " if args.worker_of else "")
    from workbench.core.errors import ServingError
    from workbench.server import run

    try:
        return run(options)
    except ServingError as exc:
        print(f"workbench serve: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the port is taken
        print(f"workbench serve: {exc}", file=sys.stderr)
        return 1


def _supervise(args: argparse.Namespace, num_workers: int) -> int:
    """``--num_workers`` above 1: this process starts the workers (before importing gRPC or TensorFlow)."""
    from workbench.deploy.workers import Supervisor

    _configure_logging()
    words: list[str] = args.words
    supervisor = Supervisor(
        serve_args=words[words.index("serve") + 1 :],
        num_workers=num_workers,
        host=args.host,
        grpc_port=args.port,
        rest_api_port=args.rest_api_port,
        drain_seconds=args.drain_seconds,
        ready_file=args.ready_file,
        parent_pid=args.parent_pid,
    )
    try:
        return supervisor.run()
    except OSError as exc:  # e.g. the port is taken
        print(f"workbench serve: {exc}", file=sys.stderr)
        return 1


def _configure_logging(prefix: str = "") -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
    for noisy in ("tensorflow", "absl", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _demo_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="write the bundled demo model repository (half_plus_two v1+v2, a digits classifier)",
        description="Write a model repository with half_plus_two (versions 1 and 2) and a small classifier "
        "trained on scikit-learn's digits data, plus models.config to serve them.",
    )
    p.add_argument("directory", help="folder to create (must not exist or be empty)")
    p.set_defaults(command=_demo)


def _demo(args: argparse.Namespace) -> int:
    from workbench.demo import write_demo_repository

    try:
        root = write_demo_repository(args.directory)
    except ValueError as exc:
        print(f"workbench demo: {exc}", file=sys.stderr)
        return 2
    print(f"Wrote demo models to {root}")
    config = shlex.quote(str(root / "models.config"))
    print(f"Serve them with: workbench serve --rest_api_port=8501 --model_config_file={config}")
    return 0


def _bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="closed-loop load on a server's predict API (TF Serving's or v2, REST or gRPC), with latency percentiles",
        description="Send predict requests from N concurrent clients, each waiting for its answer before sending "
        "the next, for a duration or a number of requests; print requests/s and latency percentiles. Works "
        "against workbench and TF Serving alike. The same load as `%serve bench` in a notebook, with the same "
        "defaults.",
        epilog=BENCH_EXAMPLES,
    )
    p.add_argument(
        "--target",
        required=True,
        metavar="ADDRESS",
        help="the server: host:port, or http://host:port or https://host:port for REST",
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default=DEFAULT_PROTOCOL, help="the API to load")
    p.add_argument("--grpc", dest="protocol", action="store_const", const="grpc", help="short for --protocol=grpc")
    p.add_argument("--model", required=True, metavar="NAME", help="the model's name")
    p.add_argument("--signature_name", default="", metavar="NAME", help="the signature (default: serving_default)")
    p.add_argument(
        "--inputs",
        required=True,
        metavar="JSON",
        help="""one request's inputs, e.g. '{"x": [[1.0]]}' (typed as the signature says)""",
    )
    p.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N", help="clients in flight at once"
    )
    p.add_argument("--duration", type=float, metavar="S", help=f"seconds to run (default: {DEFAULT_DURATION_S:g})")
    p.add_argument("--requests", type=int, metavar="N", help="stop after this many requests instead of a duration")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    tls = p.add_argument_group("TLS", "an https:// target, or a gRPC server started with --ssl_config_file")
    tls.add_argument("--tls", action=BoolFlag, default=False, help="gRPC over TLS (on by itself with any file below)")
    tls.add_argument(
        "--ca_file",
        default="",
        metavar="FILE",
        help="PEM CA the server's certificate must chain to (default: the system's trust store; gRPC's bundled "
        "roots for gRPC)",
    )
    tls.add_argument("--cert_file", default="", metavar="FILE", help="client certificate (PEM), for mutual TLS")
    tls.add_argument("--key_file", default="", metavar="FILE", help="its key (default: in --cert_file)")
    p.set_defaults(command=_bench)


def _bench(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from workbench.client import ClientTLS
    from workbench.client.bench import format_table, input_dtypes, resolve_load, run_load

    try:  # usage mistakes: exit 2, as argparse's own
        duration, requests = resolve_load(args.concurrency, args.duration, args.requests)
        if args.protocol in GRPC_PROTOCOLS and "://" in args.target:
            raise ValueError(f"a gRPC --target is host:port, not a URL ({args.target})")
        files = (args.ca_file or None, args.cert_file or None, args.key_file or None)
        https = args.target.startswith("https://")
        tls = ClientTLS(*files) if args.tls or https or any(files) else None
        if tls is not None and args.protocol not in GRPC_PROTOCOLS and not https:
            raise ValueError(f"TLS over REST needs an https:// --target, not {args.target}")
    except ValueError as exc:
        print(f"workbench bench: {exc}", file=sys.stderr)
        return 2
    try:
        values = json.loads(args.inputs)
        if not isinstance(values, dict) or not values:
            raise ValueError("--inputs must be a JSON object of input name → value")
        dtypes = input_dtypes(args.target, args.protocol, args.model, args.signature_name, tls=tls)
        unknown = sorted(set(values) - set(dtypes))
        if unknown:
            raise ValueError(f"the signature has no input {', '.join(unknown)} (it has {', '.join(sorted(dtypes))})")
        inputs = {name: np.asarray(value, dtype=dtypes[name]) for name, value in values.items()}
        result = run_load(
            args.target,
            args.protocol,
            args.model,
            inputs,
            concurrency=args.concurrency,
            duration=duration,
            requests=requests,
            signature_name=args.signature_name,
            tls=tls,
        )
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench bench: {exc}", file=sys.stderr)
        return 1
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_table([summary], list(summary)))
    return 0 if result.errors == 0 else 3


def _manifests_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "manifests",
        help="KServe or Kubernetes manifests that serve a model with workbench",
        description="Render the manifests that deploy MODEL with workbench: an InferenceService on the workbench "
        "ClusterServingRuntime (--kserve), or a Deployment, Service, HorizontalPodAutoscaler and model config "
        "(--kubernetes). With --server, the model's routing (stable version, canary) is read from a running "
        "workbench and described in them; the replicas themselves read it from routing.json beside the versions.",
        epilog=MANIFESTS_EXAMPLES,
    )
    p.add_argument("model", metavar="MODEL", help="the model's name")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--kserve", dest="target", action="store_const", const="kserve", help="an InferenceService and the runtime"
    )
    target.add_argument(
        "--kubernetes", dest="target", action="store_const", const="kubernetes", help="a Deployment, Service, HPA…"
    )
    p.add_argument(
        "--storage_uri",
        metavar="URI",
        help="the model's base path for the cluster: s3://…, gs://…, pvc://CLAIM/PATH "
        "(default: the server's base path with --server, else pvc://workbench-models/MODEL)",
    )
    p.add_argument("--replicas", type=int, default=2, metavar="N", help="replicas (the autoscaler's minimum)")
    p.add_argument("--image", metavar="IMAGE", help="the workbench image (default: deploy/'s example name)")
    p.add_argument("--server", metavar="URL", help="a running workbench's REST address, to read MODEL's routing")
    p.add_argument("--out", metavar="DIR", help="write the files into DIR (default: print them)")
    p.set_defaults(command=_manifests)


def _manifests(args: argparse.Namespace) -> int:
    from workbench.deploy.manifests import DEFAULT_IMAGE, render_manifests

    routing = None
    storage_uri = args.storage_uri
    try:
        if args.server:
            from workbench.client import Client

            with Client(args.server) as client:
                routing = client.model(args.model)
            storage_uri = storage_uri or routing["base_path"]
        manifests = render_manifests(
            args.model,
            target=args.target,
            storage_uri=storage_uri,
            replicas=args.replicas,
            image=args.image or DEFAULT_IMAGE,
            routing=routing,
        )
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench manifests: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    if args.out is None:
        print(repr(manifests), end="")
        return 0
    for path in manifests.write(args.out):
        print(f"wrote {path}")
    return 0


def _ray_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "ray",
        help="serve a model repository on a Ray cluster (Ray Serve replicas behind Ray's HTTP and gRPC proxies)",
        description="Deploy workbench on Ray Serve: each replica runs the engine on a shared repository, Ray's "
        "proxies serve TF Serving's REST and gRPC APIs and v2 on every node. Needs `pip install "
        "'workbench-serving[ray]'`.",
        epilog=RAY_EXAMPLES,
    )
    actions = p.add_subparsers(title="actions", metavar="ACTION", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--name", default="workbench", metavar="NAME", help="the Ray Serve application's name")
    common.add_argument(
        "--address",
        default="",
        metavar="ADDRESS",
        help="the Ray cluster (default: $RAY_ADDRESS; deploy without "
        "either starts a local Ray and serves until SIGINT or SIGTERM)",
    )
    deploy = actions.add_parser(
        "deploy",
        parents=[common],
        help="deploy (or redeploy) the application",
        description="Deploy a repository on Ray Serve; flags after -- go to every replica's `workbench serve`.",
    )
    deploy.add_argument(
        "--model_repository",
        default="",
        metavar="DIR",
        help="every model folder under DIR (a path every node sees, or an s3:// / gs:// URL)",
    )
    deploy.add_argument("--num_replicas", type=int, metavar="N", help="a fixed number of replicas (default 1)")
    deploy.add_argument("--min_replicas", type=int, default=1, metavar="N", help="autoscaling's lower bound")
    deploy.add_argument("--max_replicas", type=int, metavar="N", help="autoscale up to N replicas")
    deploy.add_argument(
        "--target_ongoing_requests", type=float, metavar="N", help="autoscaling's target of requests per replica"
    )
    deploy.add_argument("--num_cpus", type=float, metavar="N", help="CPUs Ray reserves for each replica")
    deploy.add_argument("--num_gpus", type=float, metavar="N", help="GPUs Ray reserves for each replica")
    deploy.add_argument("--http_host", default="127.0.0.1", metavar="ADDRESS", help="address Ray's HTTP proxies bind")
    deploy.add_argument("--http_port", type=int, default=8501, metavar="PORT", help="Ray's HTTP proxy port (REST)")
    deploy.add_argument("--grpc_port", type=int, default=8500, metavar="PORT", help="Ray's gRPC proxy port")
    deploy.add_argument("--route_prefix", default="/", metavar="PATH", help="where the REST API is mounted")
    deploy.add_argument(
        "--ready_file", default="", metavar="FILE", help="once serving, write the addresses as JSON to FILE"
    )
    deploy.add_argument("serve_flags", nargs="*", metavar="-- SERVE_FLAG", help="`workbench serve` flags for replicas")
    deploy.set_defaults(command=_ray, action="deploy")
    status = actions.add_parser("status", parents=[common], help="the application's status and replicas, as JSON")
    status.set_defaults(command=_ray, action="status")
    shutdown = actions.add_parser("shutdown", parents=[common], help="delete the application (and Serve if last)")
    shutdown.set_defaults(command=_ray, action="shutdown")
    p.commands = tuple(actions.choices)  # dispatches like the top level: each action's parser reads its flags


def _ray(args: argparse.Namespace) -> int:
    try:
        from workbench.ray import command
    except ImportError as exc:
        print(f"workbench ray: {exc}", file=sys.stderr)
        return 2
    _configure_logging()
    run = {"deploy": command.deploy_command, "status": command.status_command, "shutdown": command.shutdown_command}
    return run[args.action](args)


def build_parser() -> argparse.ArgumentParser:
    from workbench import __version__

    # prog is fixed: run as `python -m workbench`, argparse would call itself "__main__.py".
    parser = _Parser(
        prog="workbench",
        description="A Jupyter-centric model-serving workbench: TF Serving's REST and gRPC APIs, from a notebook or "
        "headless.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True, parser_class=_Parser)
    _serve_parser(sub)
    _demo_parser(sub)
    _bench_parser(sub)
    _manifests_parser(sub)
    _ray_parser(sub)
    parser.commands = tuple(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(words)
    args.words = words  # as typed: the supervisor of --num_workers hands them on to its workers
    return int(args.command(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
