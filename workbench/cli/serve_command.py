"""``workbench serve``: one serving process, or the supervisor of ``--num_workers`` processes.

The flags are declared once in :mod:`workbench.config.server_flags`; their checks and the options they become are
:mod:`workbench.config.serve_options`'.
"""

from __future__ import annotations

import argparse
import sys

from workbench.cli.logs import configure_logging
from workbench.config.serve_options import check_serve_flags, options_from_flags
from workbench.config.server_flags import SERVE_PARSER_TEXTS, SERVE_SUMMARY, add_serve_flags


def add_serve_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    texts = {**SERVE_PARSER_TEXTS, "usage": SERVE_PARSER_TEXTS["usage"].replace("%(prog)s (", "%(prog)s (DIR | ", 1)}
    parser = sub.add_parser("serve", help=SERVE_SUMMARY, **texts)
    parser.add_argument(
        "folder",
        nargs="?",
        metavar="DIR",
        help="a model repository to serve, as --model_repository=DIR (an MLServer folder, a Triton repository...)",
    )
    add_serve_flags(parser)
    parser.set_defaults(command=serve)


def repository_of_folder(args: argparse.Namespace) -> None:
    """``workbench serve DIR`` is ``workbench serve --model_repository=DIR``, in the namespace and in the words the
    supervisor of --num_workers hands its workers."""
    folder = getattr(args, "folder", None)
    if not folder:
        return
    if args.model_repository:
        raise ValueError(f"give the folder {folder} or --model_repository={args.model_repository}, not both")
    args.model_repository = folder
    args.folder = None
    args.words = replace_positional(list(getattr(args, "words", ["serve"])), folder, f"--model_repository={folder}")


def replace_positional(words: list[str], value: str, replacement: str | None) -> list[str]:
    """``words`` with the positional word ``value`` (not an option's separate value) replaced, or dropped when
    ``replacement`` is None."""
    for index, word in enumerate(words):
        previous = words[index - 1] if index else ""
        takes_value = previous.startswith("--") and "=" not in previous
        if word == value and not takes_value:
            return [*words[:index], *([replacement] if replacement else []), *words[index + 1 :]]
    return words


def serve(args: argparse.Namespace) -> int:
    """``workbench serve`` with its parsed flags (also ``workbench mlserver start``'s, translated)."""
    try:
        repository_of_folder(args)
        num_workers = check_serve_flags(args)
    except ValueError as exc:
        for line in str(exc).splitlines():
            print(f"workbench serve: {line}", file=sys.stderr)
        return 2
    if args.runner_of:
        return _run_model_runner(args, num_workers)
    options = options_from_flags(args, num_workers)
    if (num_workers > 1 or options.model_runners) and not args.worker_of:
        from workbench.core.errors import ServingError

        try:  # every worker reads the TLS files: a bad one is said once here, not by workers restarting forever
            options.grpc_tls()
            options.rest_tls()
        except ServingError as exc:
            print(f"workbench serve: {exc.message}", file=sys.stderr)
            return 1
        return _supervise(args, num_workers, options.model_runners)
    configure_logging(f"[worker {args.worker_index}] " if args.worker_of else "")
    _serving_process()
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


def _run_model_runner(args: argparse.Namespace, num_workers: int) -> int:
    """A model runner of a supervised server (``--runner_of``): it holds the models, the workers send it requests."""
    options = options_from_flags(args, num_workers)
    configure_logging(f"[runner {args.runner_index}] ")
    _serving_process()
    from workbench.runners.runner import run

    return run(options, args.runner_of, args.runner_index)


def _serving_process() -> None:
    """This process serves models (a server, a worker or a runner), and nothing else: the platforms may leave out
    what only a notebook's kernel uses."""
    from workbench.platforms import sklearn as sklearn_platform

    sklearn_platform.serving_process()


def _supervise(args: argparse.Namespace, num_workers: int, model_runners: int) -> int:
    """``--num_workers`` above 1, or model runners: this process starts the workers and runners (before importing
    gRPC or TensorFlow)."""
    from workbench.deploy.workers import Supervisor

    configure_logging()
    words: list[str] = args.words
    supervisor = Supervisor(
        serve_args=words[words.index("serve") + 1 :],
        num_workers=num_workers,
        model_runners=model_runners,
        host=args.host,
        grpc_port=args.port,
        rest_api_port=args.rest_api_port,
        openai_port=args.openai_port,
        drain_seconds=args.drain_seconds,
        ready_file=args.ready_file,
        parent_pid=args.parent_pid,
    )
    try:
        return supervisor.run()
    except OSError as exc:  # e.g. the port is taken
        print(f"workbench serve: {exc}", file=sys.stderr)
        return 1
