"""``workbench consume``: a consumer of asynchronous requests alone, no ports (the agent pattern: take a request
from the queue, run it, record the answer, acknowledge it). Run as many as the queue needs: each takes requests
from the same queue (``--async_queue``), with ``--async_concurrency`` in flight, and may write each answer as
``<output>/<id>.json`` too. It takes ``workbench serve``'s flags for its models; SIGTERM finishes what it holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from workbench.config.server_flags import add_serve_flags

CONSUME_EXAMPLES = """\
examples:
  workbench consume --model_repository=models --async_queue=redis://redis:6379/0
  workbench consume --model_repository=s3://models --async_queue='sqs://requests?results=s3://answers/async' \\
      --output=s3://answers/json
"""


def add_consume_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "consume",
        help="answer asynchronous requests from a queue (SQLite, Redis, SQS), with no ports: a headless consumer",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=CONSUME_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_flags(parser)
    parser.add_argument("--output", default="", metavar="URI", help="also write each answer here, as ID.json")
    parser.set_defaults(command=_consume)


def _consume(args: argparse.Namespace) -> int:
    from workbench.cli.logs import configure_logging
    from workbench.config.serve_options import check_serve_flags, options_from_flags
    from workbench.core.errors import ServingError

    try:
        if check_serve_flags(args) != 1:
            raise ValueError("a consumer is one process: run several consumers instead of --num_workers")
    except ValueError as exc:
        for line in str(exc).splitlines():
            print(f"workbench consume: {line}", file=sys.stderr)
        return 2
    options = dataclasses.replace(options_from_flags(args, 1), consume_only=True, async_output=args.output)
    configure_logging("[consumer] ")
    from workbench.server import run

    try:
        return run(options)
    except ServingError as exc:
        print(f"workbench consume: {exc.message}", file=sys.stderr)
        return 1
