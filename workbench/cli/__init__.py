"""``workbench serve | demo | bench | batch | analyze | routing | consume | manifests | ray``: the command line, in
TF Serving's words.

Flags are parsed with argparse, in the vocabulary of :mod:`workbench.config.vocabulary`: TF Serving's names, with
earlier spellings (``--rest_port``, ``--repo``, ``--clients`` ...) and dashes for underscores accepted, and a
mistyped flag answered with the nearest one. Booleans take TF Serving's forms (``--flag``, ``--flag=true``,
``--flag=false``). A TF Serving flag this server does not implement is refused by name, never ignored.

One module per command: ``serve`` (its flags are declared in :mod:`workbench.config.server_flags`), ``demo``,
``bench``, ``batch``, ``analyze``, ``routing``, ``consume``, ``manifests`` and ``ray``; this one puts them under one
parser.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from workbench.config.vocabulary import VocabularyParser
from workbench.runtime import tensorflow_runtime

# Each command's module and the function adding its parser, in the order --help lists them. A command line names
# one command, and only that one's module is imported: `workbench serve` used to import every command's (the load
# generator's among them), half a second of a notebook's first answer on 2 cores.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("workbench.cli.serve_command", "add_serve_command"),
    "demo": ("workbench.cli.demo_command", "add_demo_command"),
    "bench": ("workbench.cli.bench_command", "add_bench_command"),
    "batch": ("workbench.cli.batch_command", "add_batch_command"),
    "analyze": ("workbench.cli.analyze_command", "add_analyze_command"),
    "routing": ("workbench.cli.routing_command", "add_routing_command"),
    "consume": ("workbench.cli.consume_command", "add_consume_command"),
    "manifests": ("workbench.cli.manifests_command", "add_manifests_command"),
    "ray": ("workbench.cli.ray_command", "add_ray_command"),
    "mlserver": ("workbench.cli.mlserver_command", "add_mlserver_command"),
}


def __getattr__(name: str) -> Any:
    if name == "_manifests":  # the manifests command's function, as its parser names it
        from workbench.cli.manifests_command import _manifests

        return _manifests
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# TensorFlow's C++ INFO lines are noise for a server operator; warnings and errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

# Command lines shown under --help. tests/wire/test_vocabulary.py parses every one, so they stay true.
EXAMPLES = """\
examples:
  workbench demo demo-models
  workbench serve --model_config_file=demo-models/models.config --rest_api_port=8501
  workbench bench --target=localhost:8501 --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench batch half_plus_two --model_repository=demo-models --input=rows.csv --output=scored/
"""


def build_parser(command: str | None = None) -> VocabularyParser:
    """The whole command line's parser; with ``command`` (one of :data:`COMMANDS`), a parser that reads only that
    command's flags (the same parser, the others left out), importing only that command's module."""
    from workbench.runtime.version import __version__

    # prog is fixed: run as `python -m workbench`, argparse would call itself "__main__.py".
    parser = VocabularyParser(
        prog="workbench",
        description="A Jupyter-centric model-serving workbench: TF Serving's REST and gRPC APIs, from a notebook or "
        "headless.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True, parser_class=VocabularyParser)
    for name, (module, adder) in COMMANDS.items():
        if command is None or name == command:
            add: Callable[[Any], None] = getattr(importlib.import_module(module), adder)
            add(sub)
    parser.commands = tuple(COMMANDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    tensorflow_runtime.mark_server_process()  # the command line's process is workbench's own
    words = list(sys.argv[1:] if argv is None else argv)
    command = words[0] if words and words[0] in COMMANDS else None
    args = build_parser(command).parse_args(words)
    args.words = words  # as typed: the supervisor of --num_workers hands them on to its workers
    return int(args.command(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
