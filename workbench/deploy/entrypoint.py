"""``workbench-entrypoint``: the container image's entry point, with the ``tensorflow/serving`` image's interface.

The ``tensorflow/serving`` image runs, in effect::

    tensorflow_model_server --port=8500 --rest_api_port=8501 \\
        --model_name=${MODEL_NAME} --model_base_path=${MODEL_BASE_PATH}/${MODEL_NAME} "$@"

so ``docker run -e MODEL_NAME=half_plus_two -v …:/models/half_plus_two IMAGE`` serves one model, and any extra
arguments are appended. This does the same for ``workbench serve``, in this very process (no shell, no child),
so that the signals a container runtime sends reach the server and its drain directly:

* ``MODEL_NAME`` (default ``model``) and ``MODEL_BASE_PATH`` (default ``/models``): the model served is
  ``$MODEL_BASE_PATH/$MODEL_NAME`` under the name ``$MODEL_NAME``.
* ``--port=8500 --rest_api_port=8501 --host=0.0.0.0``: TF Serving's ports, on every address. workbench alone
  binds ``127.0.0.1``, which inside a container no one outside it can reach.
* Extra arguments come after those defaults, and the later of two flags wins (argparse, as TF Serving's flag
  library), so ``IMAGE --rest_api_port=9001`` moves the REST port.
* Arguments that name their own models (``--model_config_file``, ``--model_repository``) replace the
  environment's model altogether: workbench refuses two model sources. ``--model_base_path`` replaces only the
  path, and the model keeps ``$MODEL_NAME`` as its name, as the ``tensorflow/serving`` image names it.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import signal
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

DEFAULT_MODEL_NAME = "model"
DEFAULT_MODEL_BASE_PATH = "/models"
# TF Serving's ports; a container's ports must be bound on every address to be published.
IMAGE_DEFAULTS = ("--port=8500", "--rest_api_port=8501", "--host=0.0.0.0")
# Flags that name what to serve, each replacing the environment's model (base path: only its path).
WHOLE_SOURCE_FLAGS = ("model_config_file", "model_repository")
PATH_FLAG = "model_base_path"


def _serve_parser() -> argparse.ArgumentParser:
    """``workbench serve``'s own parser: the one place that knows its flags, their aliases and spellings."""
    from workbench.config.server_flags import serve_parser

    return serve_parser()


def named_flags(args: Sequence[str], names: Sequence[str]) -> set[str]:
    """Which of ``names`` (flag names without dashes) ``args`` sets to something, however it is spelled.

    ``--model-config-file X``, ``--model_config_file=X`` and an alias such as ``--repo=X`` all count, as
    ``workbench serve`` reads them; ``--model_config_file=`` (empty) does not, since it serves nothing.
    """
    from workbench.config.vocabulary import canonical_options

    found: set[str] = set()
    for word in canonical_options(list(args), _serve_parser()):
        if word == "--":  # what follows is not an option
            break
        for name in names:
            flag = f"--{name}"
            if word == flag or (word.startswith(f"{flag}=") and word != f"{flag}="):
                found.add(name)
    return found


def serve_arguments(args: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The ``workbench serve`` arguments for the container's arguments ``args`` and its environment."""
    name = environ.get("MODEL_NAME") or DEFAULT_MODEL_NAME
    base = environ.get("MODEL_BASE_PATH") or DEFAULT_MODEL_BASE_PATH
    named = named_flags(args, (*WHOLE_SOURCE_FLAGS, PATH_FLAG))
    model: list[str] = []
    if not named & set(WHOLE_SOURCE_FLAGS):
        model.append(f"--model_name={name}")
        if PATH_FLAG not in named:
            model.append(f"--{PATH_FLAG}={posixpath.join(base, name)}")
    return [*IMAGE_DEFAULTS, *model, *args]


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os._exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if os.getpid() == 1:
        # PID 1 of a container: the kernel ignores a signal it has no handler for, so until the server installs
        # its own (the drain, once TensorFlow is imported) a `docker stop` would wait out its timeout. Before
        # that there is nothing to drain: end at once.
        signal.signal(signal.SIGTERM, _exit_now)
    from workbench.cli import main as workbench_main

    return workbench_main(["serve", *serve_arguments(args, os.environ)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
