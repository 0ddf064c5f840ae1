"""``workbench demo DIRECTORY``: write the bundled demo model repository."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_demo_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
