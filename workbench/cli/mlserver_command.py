"""``workbench mlserver start DIR``: serve a folder laid out for MLServer as ``mlserver start DIR`` serves it.

The folder's ``settings.json`` gives the ports and host (``http_port`` 8080 and ``grpc_port`` 8081 by default, as
MLServer's), MLServer's variables (``MLSERVER_HTTP_PORT``, ``MLSERVER_HOST``...) what it leaves out; the folder is
the models' root, as in MLServer, and its ``model-settings.json`` files are the models (or, with none, the one model
``MLSERVER_MODEL_IMPLEMENTATION``, ``MLSERVER_MODEL_URI``... describe: how KServe starts MLServer). The rest is
``workbench serve``'s defaults; for other flags, run ``workbench serve --model_repository=DIR``.
Pickles and custom runtimes run code, and MLServer loads
both from the folder it is given, so this command allows them (``--allow_pickle``, ``--allow_python_models``);
``workbench serve --model_repository=DIR`` serves the same folder without them. Without a ``host`` in the settings
(or ``MLSERVER_HOST``), workbench binds 127.0.0.1 where MLServer binds 0.0.0.0: pass ``--host=0.0.0.0`` to be
reached from elsewhere.
"""

from __future__ import annotations

import argparse
import sys

from workbench.config.server_flags import add_serve_flags

SUMMARY = "serve a folder laid out for MLServer (settings.json, model-settings.json), as `mlserver start DIR` does"


def add_mlserver_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("mlserver", help=SUMMARY, description=__doc__.split("\n\n", 1)[1].strip())
    actions = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    start = actions.add_parser(
        "start",
        help="serve the models of FOLDER with its settings.json",
        usage="%(prog)s FOLDER [workbench serve flags]",
    )
    start.add_argument("folder", metavar="FOLDER", help="the folder `mlserver start` would be given")
    # workbench serve's flags, after the folder: parsed here so a mistyped one is answered with the nearest.
    add_serve_flags(start)
    start.set_defaults(command=_start)
    parser.commands = tuple(actions.choices)  # dispatches like the top level: `start`'s parser reads its flags


def serve_flags(folder: str) -> list[str]:
    """The ``workbench serve`` flags that serve ``folder`` as MLServer would, from its ``settings.json``."""
    from workbench.config.mlserver_settings import read_server_settings

    settings = read_server_settings(folder)
    flags = [
        # `mlserver start FOLDER` makes FOLDER the models' root, whatever model_repository_root says (cli/serve.py).
        f"--model_repository={folder}",
        f"--rest_api_port={settings.http_port}",
        f"--port={settings.grpc_port}",
        "--allow_pickle",
        "--allow_python_models",
    ]
    if settings.host:
        flags.append(f"--host={settings.host}")
    return flags


def _start(args: argparse.Namespace) -> int:
    from workbench.cli.serve_command import serve
    from workbench.config.serve_options import serve_parser
    from workbench.core.errors import ServingError

    try:
        flags = serve_flags(args.folder)
    except ServingError as exc:
        print(f"workbench mlserver start: {exc.message}", file=sys.stderr)
        return 1
    typed = typed_serve_flags(list(getattr(args, "words", [])), args.folder)
    if not any(word.lstrip("-").replace("-", "_").startswith("model_control_mode") for word in typed):
        flags += model_control_flags(args.folder)
    flags += typed
    served = serve_parser().parse_args(flags)
    served.words = ["serve", *flags]  # as if typed: --num_workers' supervisor hands them on to its workers
    return serve(served)


def model_control_flags(folder: str) -> list[str]:
    """MLServer's model control: every model loads at start (unless ``load_models_at_startup`` is false), the folder
    is read again when a load asks (not polled), and clients load and unload whole models by name: Triton's
    explicit mode."""
    from workbench.config.mlserver_settings import read_server_settings

    flags = ["--model_control_mode=explicit"]
    if read_server_settings(folder).load_models_at_startup:
        flags.append("--load_model=*")
    return flags


def typed_serve_flags(words: list[str], folder: str) -> list[str]:
    """The ``workbench serve`` flags typed after ``mlserver start`` (the folder left out): they come after the
    settings' flags, so argparse's last-one-wins makes them win."""
    from workbench.cli.serve_command import replace_positional

    if "start" in words:
        words = words[words.index("start") + 1 :]
    return replace_positional(words, folder, None)
