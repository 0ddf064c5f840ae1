"""The options ``workbench serve``'s flags ask for: the flags checked together, and turned into
:class:`~workbench.config.options.ServerOptions` (the flags themselves are declared in
:mod:`workbench.config.server_flags`). The command line uses it, and so does an engine embedded elsewhere (a Ray
Serve replica), through :func:`serve_options`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import ipaddress
import os
import re
from collections.abc import Sequence
from typing import Any

from workbench.config.options import ServerOptions
from workbench.config.server_flags import (
    FLAGS,
    MANAGEMENT_TOKEN_ENV,
    NO_TOKEN,
    UNSUPPORTED_TF_SERVING_FLAGS,
    serve_parser,
)
from workbench.runtime.process import available_cores, visible_gpus


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


def resolve_num_workers(value: str) -> int:
    """``--num_workers``: a positive number, or ``auto`` for the machine's cores (those this process may use)."""
    if value.strip().lower() == "auto":
        return available_cores()
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--num_workers takes a number or 'auto', not {value!r}") from None
    if count < 1:
        raise ValueError(f"--num_workers must be at least 1, got {count}")
    return count


def resolve_model_runners(value: str, num_workers: int) -> int:
    """``--model_runners``: how many runner processes (0: none, every worker loads and batches on its own)."""
    word = value.strip().lower()
    if word == "in_process":
        return 0
    if word == "auto":
        # A runner per GPU: one copy of each model on each device, fed by every worker. On CPUs alone the workers
        # stay shared-nothing: measured there, a runner's extra hop and process cost more than its fuller batches
        # (benchmarks/runners.py, benchmarks/request_path.py, gpu.py's CPU rows), and each worker's copy uses its cores.
        return len(visible_gpus()) if num_workers > 1 else 0
    try:
        count = int(word)
    except ValueError:
        raise ValueError(f"--model_runners takes a number, 'auto' or 'in_process', not {value!r}") from None
    if count < 1:
        raise ValueError(f"--model_runners must be at least 1 (or 'in_process'), got {count}")
    return count


def check_serve_flags(args: argparse.Namespace) -> int:
    """The number of workers the flags ask for, once they make sense together; raises :class:`FlagError` (or
    ValueError, for --num_workers)."""
    from workbench.config.model_control import ControlMode, check_load_models
    from workbench.core.errors import ServingError

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
    resolve_model_runners(args.model_runners, num_workers)  # a ValueError says why
    if num_workers > 1 and args.grpc_socket_path:
        raise FlagError("--grpc_socket_path serves one process, not --num_workers")
    if args.wait_for_model_load_seconds < 0:
        raise FlagError("--wait_for_model_load_seconds cannot be negative (0 answers at once)")
    try:
        mode = ControlMode.parse(args.model_control_mode)
        check_load_models(mode, args.load_model)
    except ServingError as exc:
        raise FlagError(exc.message) from None
    if args.unload_after_idle < 0:
        raise FlagError("--unload_after_idle cannot be negative (0 never unloads an idle version)")
    try:  # a malformed budget or pin is refused here, before anything starts
        from workbench.config.memory_budget import MemoryOptions

        MemoryOptions.of(args.memory_budget, args.load_on_demand, args.unload_after_idle, args.pin)
    except ServingError as exc:
        raise FlagError(exc.message) from None
    try:
        from workbench.runtime.archive_download import allowed_urls

        allowed_urls(args.torchserve_allowed_urls)
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    if args.response_cache_bytes < 0:
        raise FlagError("--response_cache_bytes cannot be negative (0 turns the cache off)")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.pytorch_device):  # checked again, against the GPUs, at load
        raise FlagError(f"--pytorch_device={args.pytorch_device}: expected auto, cpu, cuda or cuda:N (a GPU's index)")
    try:
        ServerOptions(http_server=args.http_server).chosen_http_server()
    except ServingError as exc:
        raise FlagError(exc.message) from None
    if args.max_batched_tokens < 0:
        raise FlagError("--max_batched_tokens cannot be negative (0: the default, 160 on a CPU and 512 on a GPU)")
    if args.pytorch_threads < 0:
        raise FlagError("--pytorch_threads cannot be negative (0: PyTorch's default, one per core)")
    if args.async_concurrency < 1 or args.async_max_attempts < 1:
        raise FlagError("--async_concurrency and --async_max_attempts must be at least 1")
    if args.async_visibility_seconds <= 0 or args.async_results_seconds <= 0:
        raise FlagError("--async_visibility_seconds and --async_results_seconds must be positive")
    if "://" in args.async_queue and args.async_queue.split("://", 1)[0] not in ("sqlite", "redis", "rediss", "sqs"):
        raise FlagError(
            f"--async_queue={args.async_queue}: a queue is sqlite:///PATH, redis://HOST:PORT/DB or "
            "sqs://QUEUE?results=s3://BUCKET/PREFIX"
        )
    if args.async_notify_url and args.async_notify_url.split("://", 1)[0] not in ("http", "https", "sqs", "redis"):
        raise FlagError(
            f"--async_notify_url={args.async_notify_url}: a webhook (http:// or https://) or a result queue "
            "(sqs://QUEUE, redis://HOST:PORT/DB?key=STREAM)"
        )
    if args.async_queue.startswith("sqs://") and "results=" not in args.async_queue:
        raise FlagError(f"--async_queue={args.async_queue}: SQS keeps no answers: add ?results=s3://BUCKET/PREFIX")
    if args.response_cache_models and not args.response_cache_bytes:
        raise FlagError("--response_cache_models needs --response_cache_bytes: the cache's size")
    if args.shared_memory_max_bytes < 0:
        raise FlagError("--shared_memory_max_bytes cannot be negative (0 lets no shared memory register)")
    if mode is ControlMode.EXPLICIT and not args.model_repository:
        raise FlagError("--model_control_mode=explicit loads models out of a repository: give --model_repository")
    return num_workers


# ------------------------------------------------------------------------------------------------ options
def options_from_flags(args: argparse.Namespace, num_workers: int) -> ServerOptions:
    """The options of one serving process from ``workbench serve``'s parsed (and checked) flags."""
    fields: dict[str, Any] = {}
    for flag in FLAGS.values():
        if flag.field is not None:
            value = getattr(args, flag.name)
            fields[flag.field] = value if flag.convert is None else flag.convert(value)
    return ServerOptions(
        **fields,
        rest_api_host=args.host,
        grpc_host=args.host,
        management_token=management_token(args.management_token, args.host),
        num_workers=num_workers,
        model_runners=resolve_model_runners(args.model_runners, num_workers),
    )


def serve_options(flags: Sequence[str]) -> ServerOptions:
    """``workbench serve``'s flags (without the command) as the options of one serving process.

    For embedding the engine elsewhere (a Ray Serve replica): the same vocabulary and checks as the command line;
    a bad flag raises :class:`FlagError` (argparse's own message) instead of exiting.
    """
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            args = serve_parser().parse_args(list(flags))
    except SystemExit:
        raise FlagError(err.getvalue().strip()) from None
    try:
        num_workers = check_serve_flags(args)
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    if num_workers > 1:
        raise FlagError("--num_workers: one embedded server is one process")
    if resolve_model_runners(args.model_runners, 1):
        raise FlagError("--model_runners: one embedded server is one process")
    if args.openai_port:
        # An embedded server opens no port of its own; with this flag its REST app would leave OpenAI's endpoints
        # out, for a port that never opens, and the endpoints would be nowhere.
        raise FlagError(
            "--openai_port: an embedded server (a Ray Serve replica) opens no ports, Ray's proxy owns them; "
            "OpenAI's endpoints are served on the REST address, under /v1 and /openai/v1: leave --openai_port out"
        )
    return options_from_flags(args, 1)
