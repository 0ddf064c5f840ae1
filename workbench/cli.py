"""``workbench serve | demo``: the command line, with ``tensorflow_model_server``'s flag names.

Flags are parsed with argparse. Booleans take TF Serving's forms (``--flag``, ``--flag=true``,
``--flag=false``). A TF Serving flag this server does not implement is refused by name, never ignored.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence

# TensorFlow's C++ INFO lines are noise for a server operator; warnings and errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

# tensorflow_model_server flags that workbench does not implement (yet): refused with a clear message.
UNSUPPORTED_TF_SERVING_FLAGS = {
    "ssl_config_file": "TLS is not supported; put a TLS-terminating proxy in front",
    "platform_config_file": "only the tensorflow platform is supported",
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


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "t", "yes", "y"):
        return True
    if value in ("0", "false", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


def _flag(parser: argparse.ArgumentParser, name: str, kind: type | object, default: object, help_text: str) -> None:
    if kind is bool:
        parser.add_argument(f"--{name}", type=_bool, nargs="?", const=True, default=default, help=help_text)
    else:
        parser.add_argument(f"--{name}", type=kind, default=default, help=help_text)  # type: ignore[arg-type]


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="serve models over TF Serving's REST and gRPC APIs (tensorflow_model_server's flags)",
        description="Serve TensorFlow SavedModels with TF Serving's REST and gRPC APIs. Flag names and defaults are "
        "tensorflow_model_server's.",
    )
    _flag(p, "port", int, 8500, "gRPC port (TF Serving's default 8500)")
    _flag(p, "rest_api_port", int, 0, "REST port; 0 turns REST off (as in TF Serving), -1 picks a free port")
    _flag(p, "rest_api_timeout_in_ms", int, 30000, "deadline for a REST inference request")
    _flag(p, "rest_api_enable_cors_support", bool, False, "answer CORS preflights and allow any origin")
    _flag(p, "model_name", str, "default", "name of the one model served with --model_base_path")
    _flag(p, "model_base_path", str, "", "folder of numbered version folders of the one model to serve")
    _flag(p, "model_config_file", str, "", "text-format tensorflow.serving.ModelServerConfig listing the models")
    _flag(p, "model_config_file_poll_wait_seconds", float, 0.0, "re-read the model config file this often (0: once)")
    _flag(p, "file_system_poll_wait_seconds", float, 1.0, "scan model folders this often (0: once, <0: never)")
    _flag(p, "enable_model_warmup", bool, True, "replay assets.extra/tf_serving_warmup_requests before serving")
    _flag(p, "monitoring_config_file", str, "", "text-format MonitoringConfig (enables Prometheus metrics)")
    _flag(p, "allow_version_labels_for_unavailable_models", bool, False, "allow labels on versions not loaded yet")
    _flag(p, "num_load_threads", int, 2, "threads that load and unload model versions")
    _flag(p, "enable_batching", bool, False, "merge concurrent requests into batches (TF Serving's defaults)")
    _flag(p, "batching_parameters_file", str, "", "text-format BatchingParameters (needs --enable_batching)")
    _flag(p, "grpc_socket_path", str, "", "also serve gRPC on this Unix socket")
    _flag(p, "grpc_channel_arguments", str, "", "gRPC server arguments, comma-separated key=value")
    # workbench's own flags
    _flag(p, "host", str, "127.0.0.1", "address to bind (workbench: loopback unless told otherwise)")
    _flag(p, "rest_api_max_request_bytes", int, 256 * 1024 * 1024, "largest REST request body accepted")
    _flag(p, "grpc_max_message_bytes", int, 256 * 1024 * 1024, "largest gRPC message received or sent")
    _flag(p, "num_inference_threads", int, 0, "threads running TensorFlow (0: twice the cores, at least 4)")
    _flag(p, "model_repository", str, "", "serve every model folder under this root (models come and go with folders)")
    _flag(p, "management_state_file", str, "", "where promotions, canaries and pins persist (JSON)")
    _flag(p, "management_token", str, "", "require this bearer token for the management API's changes")
    _flag(p, "server_name", str, "", "this server's name in Jupyter's sidebar (default: its repository folder)")
    _flag(p, "ready_file", str, "", "write the ports as JSON here once the server answers")
    _flag(p, "parent_pid", int, 0, "stop when this process exits (set by notebook handles)")
    for name in UNSUPPORTED_TF_SERVING_FLAGS:
        p.add_argument(f"--{name}", nargs="?", const=True, default=None, help=argparse.SUPPRESS, dest=f"x_{name}")
    p.set_defaults(command=_serve)


def _serve(args: argparse.Namespace) -> int:
    from workbench.engine.options import ServerOptions

    refused = [n for n in UNSUPPORTED_TF_SERVING_FLAGS if getattr(args, f"x_{n}") is not None]
    if refused:
        for name in refused:
            print(f"workbench serve: --{name} is not supported: {UNSUPPORTED_TF_SERVING_FLAGS[name]}", file=sys.stderr)
        return 2
    sources = [flag for flag in ("model_config_file", "model_base_path", "model_repository") if getattr(args, flag)]
    if len(sources) > 1:
        print(f"workbench serve: give one of --{' or --'.join(sources)}, not several", file=sys.stderr)
        return 2
    if not sources:
        print(
            "workbench serve: nothing to serve: give --model_base_path=DIR (with --model_name), "
            "--model_config_file=FILE or --model_repository=DIR",
            file=sys.stderr,
        )
        return 2
    options = ServerOptions(
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
        enable_batching=args.enable_batching,
        batching_parameters_file=args.batching_parameters_file,
        model_repository=args.model_repository,
        management_state_file=args.management_state_file,
        management_token=args.management_token,
        server_name=args.server_name,
        ready_file=args.ready_file,
        parent_pid=args.parent_pid,
    )
    _configure_logging()
    from workbench.engine.status import ServingError
    from workbench.server import run

    try:
        return run(options)
    except ServingError as exc:
        print(f"workbench serve: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the port is taken
        print(f"workbench serve: {exc}", file=sys.stderr)
        return 1


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
        help="closed-loop load on a server's predict API (REST or gRPC), with latency percentiles",
        description="Send predict requests from N concurrent clients, each waiting for its answer before sending "
        "the next, for a duration or a number of requests; print requests/s and latency percentiles. Works "
        "against workbench and TF Serving alike.",
    )
    p.add_argument("--target", required=True, help="host:port (gRPC) or http://host:port (REST)")
    p.add_argument("--protocol", choices=["rest", "grpc"], default="grpc")
    p.add_argument("--model", required=True, help="model name")
    p.add_argument("--signature_name", default="", help="signature (default: serving_default)")
    p.add_argument(
        "--inputs", required=True, help="one request's inputs as JSON, e.g. '{\"x\": [[1.0]]}' (dtypes from metadata)"
    )
    p.add_argument("--concurrency", type=int, default=1, help="clients in flight at once")
    p.add_argument("--duration", type=float, default=10.0, help="seconds to run (ignored with --requests)")
    p.add_argument("--requests", type=int, default=None, help="stop after this many requests instead")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(command=_bench)


def _bench(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from workbench.bench import format_table, input_dtypes, run_load

    try:
        values = json.loads(args.inputs)
        if not isinstance(values, dict) or not values:
            raise ValueError("--inputs must be a JSON object of input name → value")
        dtypes = input_dtypes(args.target, args.protocol, args.model, args.signature_name)
        unknown = sorted(set(values) - set(dtypes))
        if unknown:
            raise ValueError(f"the signature has no input {', '.join(unknown)} (it has {', '.join(sorted(dtypes))})")
        inputs = {name: np.asarray(value, dtype=dtypes[name]) for name, value in values.items()}
        if args.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        result = run_load(
            args.target,
            args.protocol,
            args.model,
            inputs,
            concurrency=args.concurrency,
            duration=None if args.requests else args.duration,
            requests=args.requests,
            signature_name=args.signature_name,
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


def build_parser() -> argparse.ArgumentParser:
    from workbench import __version__

    parser = _Parser(prog="workbench", description="A Jupyter-centric model-serving workbench.")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(title="commands", required=True, parser_class=_Parser)
    _serve_parser(sub)
    _demo_parser(sub)
    _bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.command(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
