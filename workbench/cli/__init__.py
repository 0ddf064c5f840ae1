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

import os
import sys
from collections.abc import Sequence

from workbench.cli.analyze_command import add_analyze_command
from workbench.cli.batch_command import add_batch_command
from workbench.cli.bench_command import add_bench_command
from workbench.cli.consume_command import add_consume_command
from workbench.cli.demo_command import add_demo_command
from workbench.cli.manifests_command import _manifests as _manifests  # the command's function, as parsers name it
from workbench.cli.manifests_command import add_manifests_command
from workbench.cli.ray_command import add_ray_command
from workbench.cli.routing_command import add_routing_command
from workbench.cli.serve_command import add_serve_command
from workbench.config.vocabulary import VocabularyParser

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


def build_parser() -> VocabularyParser:
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
    add_serve_command(sub)
    add_demo_command(sub)
    add_bench_command(sub)
    add_batch_command(sub)
    add_analyze_command(sub)
    add_routing_command(sub)
    add_consume_command(sub)
    add_manifests_command(sub)
    add_ray_command(sub)
    parser.commands = tuple(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(words)
    args.words = words  # as typed: the supervisor of --num_workers hands them on to its workers
    return int(args.command(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
