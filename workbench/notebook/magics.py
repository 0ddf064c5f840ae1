"""The ``%serve`` line magic: start servers, export models, manage versions, predict and benchmark from cells.

``%load_ext workbench`` registers it; ``%serve --help`` lists the subcommands and ``%serve SUBCOMMAND --help``
shows one's options. Every mistake (a bad argument, no server, an unknown variable, an error from the server)
is an :class:`~IPython.core.error.UsageError` with a one-line message, which IPython shows without a traceback.
Servers are child processes (see :mod:`workbench.notebook.handle`): they never print into cells.
"""

from __future__ import annotations

import argparse
import difflib
import html
import json
import keyword
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, kwds, magic_arguments
from IPython.utils.process import arg_split

from workbench.bench import DEFAULT_PROTOCOL, GRPC_PROTOCOLS, LOAD_ARGUMENTS, PROTOCOLS, resolve_load
from workbench.config.server_flags import FLAGS
from workbench.config.vocabulary import (
    OPTION_ALIASES,
    Argument,
    HelpFormatter,
    canonical_options,
    unrecognized_option,
)
from workbench.core.errors import ServingError
from workbench.deploy.manifests import MANIFESTS_ARGUMENTS
from workbench.notebook.handle import (
    DEFAULT_REPOSITORY,
    ServerDied,
    ServerHandle,
    models_table_html,
    models_table_text,
    repository_location,
    running_servers,
)
from workbench.runtime.tensorflow_runtime import quiet_tensorflow

if TYPE_CHECKING:  # workbench.export is imported when first used: loading the extension stays cheap
    from workbench.export import ExportResult

__all__ = ["ServeMagics", "ServingStatus", "load_ipython_extension"]

DEFAULT_NAME = "default"
_TRANSITIONAL = ("START", "LOADING", "UNLOADING")


class ServingStatus:
    """Models and versions of a server: an HTML table in notebooks, stable plain text for output comparison.

    The text holds no ports, paths or timings, so a notebook checked with nbval compares equal from run to run.
    """

    def __init__(
        self,
        models: list[dict[str, Any]],
        server: str = DEFAULT_NAME,
        note: str = "",
        export: ExportResult | None = None,
    ) -> None:
        self.models = models
        self.server = server
        self.note = note
        self.export = export  # what ``%serve export`` wrote (path, signatures, warmup records)

    def __repr__(self) -> str:
        table = models_table_text(self.models)
        return f"{self.note}\n{table}" if self.note else table

    def _repr_html_(self) -> str:
        note = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        return note + models_table_html(self.models, title=f"workbench server <code>{html.escape(self.server)}</code>")


# ------------------------------------------------------------------------------------------- subcommand parsers
# Each function only carries a parser (``.parser``) and its help text: ``magic_arguments`` builds them from the
# decorators, and the docstring's first line is the subcommand's one-line summary in ``%serve --help``. Help is
# plain argparse text: IPython's formatter writes reST for docstrings ("::" and a doubled "%" in a cell). Each
# gets its own ``kwds``: the parser builder writes the description into that dict, so a shared one would leak.
_SERVER_OPTION = argument("--server_name", metavar="NAME", help="the server to use (default: the only one running)")
# Options are named as `workbench serve` and `workbench bench` name them (see workbench.config.vocabulary), with dashes
# or underscores; the earlier spellings (--repo, --rest-port, --clients, --signature, --server ...) still work.
_OPTIONS_NOTE = "Options take underscores or dashes: --rest_api_port or --rest-api-port."
# Aliases of one subcommand only: in `%serve start`, --name can only be the server's (elsewhere it would be vague).
_SUBCOMMAND_ALIASES: dict[str, dict[str, str]] = {"start": {"name": "server_name"}}


def _declared(spec: Argument) -> Any:
    """An option declared once for the command line too (workbench.bench, workbench.deploy.manifests)."""
    return argument(*spec.flags, **spec.options)


def _flag(name: str, help: str, **overrides: Any) -> Any:
    """One of `workbench serve`'s flags, as `%serve start` takes it (the handle turns it back into that flag)."""
    return _declared(FLAGS[name].argument(help, **overrides))


_PROTOCOL_OPTION = argument("--protocol", choices=PROTOCOLS, default=DEFAULT_PROTOCOL, help="the API to use")
_GRPC_OPTION = argument("--grpc", dest="protocol", action="store_const", const="grpc", help="short for --protocol grpc")
_SIGNATURE_OPTION = argument("--signature_name", default="", metavar="NAME", help="default: serving_default")


@magic_arguments(name="%serve start")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@_flag("server_name", default=DEFAULT_NAME, help="the server's name")
@_flag("model_repository", help=f"repository folder or s3:// URL (default: {DEFAULT_REPOSITORY})")
@_flag("rest_api_port", help="REST API port (default: a free one)")
@_flag("port", help="gRPC port (default: a free one)")
@_flag("enable_batching", help="dynamic batching with TF Serving's default parameters")
@_flag("batching_parameters_file", help="a BatchingParameters text proto (turns batching on)")
@_flag("allow_pickle", help="load scikit-learn pickles (model.joblib, model.pkl): they run code")
@_flag("allow_python_models", help="load model.py and handler.py from the repository")
@_flag("num_workers", default="1", help="worker processes on the same ports, or auto (default: 1)")
@_flag("response_cache_bytes", default=0, metavar="N", help="Triton's response cache, in bytes (0: off)")
@_flag("response_cache_models", default="", help="the models whose answers the cache keeps")
@_flag("ssl_config_file", help="TLS on gRPC: TF Serving's SSLConfig text proto")
@_flag("rest_api_ssl_cert_file", help="TLS on REST (https): the server's PEM certificate")
@_flag("rest_api_ssl_key_file", help="its PEM private key (default: in the certificate's file)")
@argument("--ca_file", metavar="FILE", help="the PEM CA the notebook checks the server's certificate with")
def _start_parser(line: str) -> None:
    """Start a server on a model repository (every sub-folder is a model); returns its handle."""


@magic_arguments(name="%serve stop")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("name", nargs="?", metavar="NAME", help="the server to stop (default: the only one running)")
@argument("--server_name", metavar="NAME", help="the same as NAME")
@argument("--all", action="store_true", help="stop every server of this kernel")
def _stop_parser(line: str) -> None:
    """Stop a server (or --all)."""


@magic_arguments(name="%serve restart")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("name", nargs="?", metavar="NAME", help="the server to restart (default: the only one)")
@argument("--server_name", metavar="NAME", help="the same as NAME")
def _restart_parser(line: str) -> None:
    """Restart a server (one that died too) on its ports, with its repository, options and routing."""


@magic_arguments(name="%serve status")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", nargs="?", metavar="MODEL", help="only this model")
@_SERVER_OPTION
def _status_parser(line: str) -> None:
    """Show the models, their versions, states, labels and traffic shares."""


@magic_arguments(name="%serve export")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument(
    "model_var",
    metavar="MODEL_VAR",
    help="the variable holding the model (Keras, tf.Module, tf.function, scikit-learn, XGBoost, LightGBM, ONNX, "
    "a PythonModel class, a pipeline)",
)
@argument("name", metavar="NAME", help="the served model's name")
@argument("--version", type=int, metavar="N", help="the version number (default: the next one)")
@argument("--examples", metavar="VAR", help="warmup examples: a variable name or a JSON literal")
@argument("--format", choices=["onnx"], help="convert first: onnx writes a scikit-learn model as ONNX (skl2onnx)")
@_SERVER_OPTION
def _export_parser(line: str) -> None:
    """Export a model variable as the next version and wait until the server serves it."""


@magic_arguments(name="%serve promote")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("version", type=int, metavar="VERSION")
@_SERVER_OPTION
def _promote_parser(line: str) -> None:
    """Make VERSION the stable (default) version of MODEL."""


@magic_arguments(name="%serve rollback")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@_SERVER_OPTION
def _rollback_parser(line: str) -> None:
    """Return MODEL's stable label to the version it had before the last promotion."""


@magic_arguments(name="%serve canary")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("version", type=int, metavar="VERSION")
@argument("weight", type=float, metavar="WEIGHT", help="share of default traffic, 0 to 1 (0 ends the canary)")
@_SERVER_OPTION
def _canary_parser(line: str) -> None:
    """Send a share (0 to 1) of MODEL's default traffic to VERSION; 0 ends the canary."""


@magic_arguments(name="%serve predict")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("data", nargs="+", metavar="DATA", help="""a variable name or a JSON literal: '{"x": [[1.0]]}' or [[1.0]]""")
@_PROTOCOL_OPTION
@_GRPC_OPTION
@argument("--version", type=int, metavar="N", help="this version")
@argument("--label", metavar="L", help="the version with this label")
@_SIGNATURE_OPTION
@_SERVER_OPTION
def _predict_parser(line: str) -> None:
    """Run a predict; returns the outputs (a dict of numpy arrays with .latency_ms)."""


@magic_arguments(name="%serve bench")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("data", nargs="+", metavar="DATA", help="one request's inputs: a variable name or a JSON literal")
@_declared(LOAD_ARGUMENTS["protocol"])
@_declared(LOAD_ARGUMENTS["grpc"])
@_declared(LOAD_ARGUMENTS["concurrency"])
@_declared(LOAD_ARGUMENTS["duration"])
@_declared(LOAD_ARGUMENTS["requests"])
@_declared(LOAD_ARGUMENTS["signature_name"])
@_SERVER_OPTION
def _bench_parser(line: str) -> None:
    """Closed-loop load on MODEL, as `workbench bench`: shows throughput and latency percentiles, returns them."""


@magic_arguments(name="%serve dashboard")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("--window", type=float, default=60.0, metavar="S", help="seconds of history on the live chart")
@_SERVER_OPTION
def _dashboard_parser(line: str) -> None:
    """The serving dashboard: versions and their buttons, queries, a live latency chart and a load button."""


@magic_arguments(name="%serve logs")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("--last", type=int, default=20, metavar="N", help="show the newest N records; 0 shows all")
@argument("--filename_prefix", metavar="PATH", help="read this log (default: where the server logs MODEL)")
@_SERVER_OPTION
def _logs_parser(line: str) -> None:
    """Show MODEL's logged requests (its logging_config); returns them (workbench.request_log)."""


@magic_arguments(name="%serve manifests")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("--kserve", action="store_true", help="an InferenceService on the workbench ClusterServingRuntime")
@argument("--kubernetes", action="store_true", help="Deployment, Service, autoscaler, model config (ConfigMap)")
@argument(
    "--storage_uri",
    metavar="URI",
    help="where the cluster reads the model: s3://…, gs://… or pvc://CLAIM/PATH (default: the server's folder, "
    "which a cluster cannot read)",
)
@_declared(MANIFESTS_ARGUMENTS["replicas"])
@_declared(MANIFESTS_ARGUMENTS["image"])
@argument("--out", metavar="DIR", help="also write the files into DIR")
@_SERVER_OPTION
def _manifests_parser(line: str) -> None:
    """Render KServe or Kubernetes manifests for MODEL with its routing; --out DIR writes them."""


_PARSERS: dict[str, Callable[..., Any]] = {
    "start": _start_parser,
    "stop": _stop_parser,
    "restart": _restart_parser,
    "status": _status_parser,
    "export": _export_parser,
    "promote": _promote_parser,
    "rollback": _rollback_parser,
    "canary": _canary_parser,
    "predict": _predict_parser,
    "bench": _bench_parser,
    "dashboard": _dashboard_parser,
    "logs": _logs_parser,
    "manifests": _manifests_parser,
}


def _summary(sub: str) -> str:
    description = _PARSERS[sub].parser.description or ""  # type: ignore[attr-defined]
    return description.strip().splitlines()[0]


def overview() -> str:
    """The text of ``%serve --help``: one line per subcommand."""
    width = max(map(len, _PARSERS))
    lines = ["Usage: %serve SUBCOMMAND [options]   (%serve SUBCOMMAND --help for its options)", ""]
    lines += [f"  {sub:<{width}}  {_summary(sub)}" for sub in _PARSERS]
    lines += ["", _OPTIONS_NOTE]
    return "\n".join(lines)


def parse_arguments(sub: str, words: list[str]) -> argparse.Namespace:
    """The arguments of ``%serve SUB WORDS``, with options in the vocabulary's spelling (a UsageError if wrong).

    Aliases and dashes are read first (``--rest-port`` is ``--rest_api_port``), so a mistyped option is reported
    with the nearest real one; argparse's own messages say which subcommand they come from and where help is.
    """
    parser = _PARSERS[sub].parser  # type: ignore[attr-defined]
    words = canonical_options(words, parser, {**OPTION_ALIASES, **_SUBCOMMAND_ALIASES.get(sub, {})})
    problem = unrecognized_option(words, parser)
    if problem:
        raise UsageError(f"%serve {sub}: {problem} (%serve {sub} --help)")
    try:
        return parser.parse_args(words)  # type: ignore[no-any-return]
    except UsageError as exc:
        raise UsageError(f"%serve {sub}: {_one_line(str(exc))} (%serve {sub} --help)") from None


# ------------------------------------------------------------------------------------------------- helpers
def _split(line: str) -> list[str]:
    """Split like a shell, but keep JSON intact.

    IPython's non-POSIX split keeps quotes inside words (POSIX rules would turn ``{"x":[[1]]}`` into
    ``{x:[[1]]}``); a word quoted as a whole loses its outer quotes here.
    """
    try:
        words = arg_split(line, strict=True)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"%serve: cannot split the line: {exc}") from None
    # IPython hands a line magic the rest of its line, comment included: `%serve start  # note` must work as
    # in a shell, so an unquoted word that starts with "#" ends the arguments.
    comment = next((i for i, w in enumerate(words) if w.startswith("#")), len(words))
    words = words[:comment]
    return [w[1:-1] if len(w) >= 2 and w[0] == w[-1] and w[0] in "'\"" else w for w in words]


def _one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, shortened: UsageError messages must stay one line."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _died(exc: ServerDied, handle: ServerHandle | None) -> str:
    """One line for a server that is gone: what happened, where the log is, how to go on."""
    first = _one_line(str(exc)).rstrip(":")
    name = handle.server_name if handle is not None else DEFAULT_NAME
    # --name is --server_name's alias in `%serve start`; tests/wire/test_magics.py still expects this spelling here.
    again = "%serve start" + ("" if name == DEFAULT_NAME else f" --name {name}")
    return f"{first}; see handle.log_tail() for why, `{again}` starts it again"


# --------------------------------------------------------------------------------------------------- magics
@magics_class
class ServeMagics(Magics):
    """``%serve``: notebook servers by name, kept per shell."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.servers: dict[str, ServerHandle] = {}
        self._current: ServerHandle | None = None  # the server the running subcommand uses, for error messages

    @no_var_expand  # JSON literals hold braces, which IPython would otherwise try to expand as {expressions}
    @line_magic
    def serve(self, line: str) -> Any:
        """Serve models from the notebook: ``%serve --help`` lists the subcommands."""
        words = _split(line)
        if not words or words[0] in ("-h", "--help", "help"):
            print(overview())
            return None
        sub, rest = words[0], words[1:]
        if sub not in _PARSERS:
            close = difflib.get_close_matches(sub, _PARSERS, n=2)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise UsageError(f"%serve: unknown subcommand {sub!r}: {hint}one of {', '.join(_PARSERS)} (%serve --help)")
        parser = _PARSERS[sub].parser  # type: ignore[attr-defined]
        if "-h" in rest or "--help" in rest:
            print(parser.format_help().rstrip())
            return None
        args = parse_arguments(sub, rest)
        handler: Callable[[Any], Any] = getattr(self, f"_{sub}")
        self._current = None
        try:
            # The client imports TensorFlow (through TF Serving's protos) the first time a subcommand needs it:
            # its start-up notices are not the cell's to show.
            with quiet_tensorflow():
                return handler(args)
        except UsageError as exc:  # the subcommand's own message: say which subcommand it comes from
            raise UsageError(f"%serve {sub}: {exc}") from None
        except ServerDied as exc:
            raise UsageError(_died(exc, self._current)) from None
        except ServingError as exc:
            raise UsageError(f"%serve {sub}: {exc.code.name}: {_one_line(exc.message)}") from None
        except (ValueError, TimeoutError, OSError) as exc:  # bad inputs for the client, a load that never came
            raise UsageError(f"%serve {sub}: {_one_line(str(exc))}") from None

    # ------------------------------------------------------------------------------------- servers
    def _known(self) -> dict[str, ServerHandle]:
        """Servers by name: this shell's plus any started with ``workbench.serve()`` in this kernel."""
        known = {h.name: h for h in running_servers()}  # started and not stopped (possibly died since)
        known.update({name: h for name, h in self.servers.items() if h.pid is not None})
        return known

    def _server(self, name: str | None) -> ServerHandle:
        known = self._known()
        if name is not None:
            if name not in known:
                names = ", ".join(sorted(known)) or "none"
                raise UsageError(
                    f"no workbench server named {name!r} (running: {names}); "
                    f"start it with `%serve start --server_name {name}`"
                )
            handle = known[name]
        else:
            alive = [h for h in known.values() if h.running]
            if len(alive) > 1:
                names = ", ".join(sorted(h.name for h in alive))
                raise UsageError(f"several workbench servers run ({names}): pick one with --server_name NAME")
            if alive:
                handle = alive[0]
            elif len(known) == 1:  # one that died: check() below says so, with what to do
                handle = next(iter(known.values()))
            else:
                raise UsageError("no workbench server is running: start one with `%serve start --model_repository DIR`")
        self._current = handle
        handle.check()
        return handle

    def _status_of(
        self, handle: ServerHandle, model: str, note: str = "", export: ExportResult | None = None
    ) -> ServingStatus:
        return ServingStatus([handle.client.model(model)], handle.server_name, note, export)

    # ----------------------------------------------------------------------------------- subcommands
    def _start(self, args: Any) -> ServerHandle:
        name = args.server_name
        if args.batching_parameters_file and not Path(args.batching_parameters_file).is_file():
            raise UsageError(f"no batching parameters file {args.batching_parameters_file!r}")
        handle = self._known().get(name)
        if handle is not None and handle.running:
            repository = args.model_repository
            if repository is not None and handle.model_repository != repository_location(repository):
                print(f"server {name!r} already runs on {handle.model_repository}: returning it (stop it to move it)")
            self.servers[name] = handle
            return handle
        if handle is None:
            handle = ServerHandle(
                args.model_repository or DEFAULT_REPOSITORY,
                server_name=name,
                rest_api_port=args.rest_api_port,
                port=args.port,
                enable_batching=args.enable_batching,
                batching_parameters_file=args.batching_parameters_file,
                allow_pickle=args.allow_pickle,
                allow_python_models=args.allow_python_models,
                num_workers=args.num_workers,
                response_cache_bytes=args.response_cache_bytes,
                response_cache_models=[m.strip() for m in args.response_cache_models.split(",") if m.strip()],
                ssl_config_file=args.ssl_config_file,
                rest_api_ssl_cert_file=args.rest_api_ssl_cert_file,
                rest_api_ssl_key_file=args.rest_api_ssl_key_file,
                ca_file=args.ca_file,
            )
        self._current = handle
        try:
            handle.restart()  # a handle that died starts again on the same ports if they were chosen
        except ServerDied:
            last = _one_line(handle.log_tail(1)) or "no output"
            handle.stop()  # frees what is left; the log file stays for reading
            self.servers.pop(name, None)
            raise UsageError(f"workbench server {name!r} could not start: {last} (log: {handle.log_path})") from None
        self.servers[name] = handle
        return handle

    def _stop(self, args: Any) -> None:
        known = self._known()
        names = ", ".join(sorted(known)) or "none"
        if args.name is not None and args.server_name is not None and args.name != args.server_name:
            raise UsageError(f"NAME {args.name!r} and --server_name {args.server_name!r} differ: give one")
        name = args.name if args.name is not None else args.server_name
        if args.all:
            handles = list(known.values())  # none is fine: teardown code stops "all" without knowing
        elif name is not None:
            if name not in known:
                raise UsageError(f"no workbench server named {name!r} (running: {names})")
            handles = [known[name]]
        elif len(known) == 1:
            handles = list(known.values())
        elif not known:
            raise UsageError("no workbench server is running")
        else:
            raise UsageError(f"several workbench servers run ({names}): name one, or give --all")
        for handle in handles:
            handle.stop()
            self.servers.pop(handle.server_name, None)
            print(f"stopped workbench server {handle.server_name!r}")

    def _restart(self, args: Any) -> ServerHandle:
        known = self._known()  # a server that died stays known until stopped: restarting it is the point
        if args.name is not None and args.server_name is not None and args.name != args.server_name:
            raise UsageError(f"NAME {args.name!r} and --server_name {args.server_name!r} differ: give one")
        name = args.name if args.name is not None else args.server_name
        if name is None:
            if len(known) != 1:
                names = ", ".join(sorted(known))
                raise UsageError(f"several workbench servers ({names}): name one" if known else "no workbench server")
            name = next(iter(known))
        if name not in known:
            names = ", ".join(sorted(known)) or "none"
            raise UsageError(f"no workbench server named {name!r} (known: {names}); `%serve start` starts one")
        handle = self._current = known[name]
        handle.restart()  # a ServerDied (a port taken meanwhile) becomes the one-line message with the log's place
        self.servers[name] = handle
        return handle

    def _status(self, args: Any) -> ServingStatus:
        handle = self._server(args.server_name)
        if args.model is not None:
            return self._status_of(handle, args.model)
        return ServingStatus(handle.models(), handle.server_name)

    def _export(self, args: Any) -> ServingStatus:
        from workbench.export import ExportError, export

        handle = self._server(args.server_name)
        model = self._variable(args.model_var, "MODEL_VAR")
        examples = self._data(args.examples, "--examples") if args.examples is not None else None
        try:
            result = export(
                model, args.name, handle.model_repository, version=args.version, examples=examples, format=args.format
            )
        except ExportError as exc:
            raise UsageError(_one_line(str(exc))) from None
        try:
            handle.wait_for_version(args.name, result.version)
        except ServerDied as exc:
            if not handle.running:
                raise
            # wait_for_version also says "died" for a version that failed to load: the server itself is fine.
            raise UsageError(_one_line(str(exc))) from None
        self._settle(handle, args.name)
        signature = result.signatures.get("serving_default", "")
        note = f"exported {args.name} v{result.version} {signature}".rstrip()
        return self._status_of(handle, args.name, note, export=result)

    @staticmethod
    def _settle(handle: ServerHandle, model: str, timeout: float = 10.0) -> None:
        """Wait (briefly) until no version of ``model`` is loading or unloading, so the status shown is final."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            states = [v["state"] for v in handle.client.model(model)["versions"]]
            if not any(s in _TRANSITIONAL for s in states):
                return
            time.sleep(0.05)

    def _promote(self, args: Any) -> ServingStatus:
        handle = self._server(args.server_name)
        doc = handle.client.promote(args.model, args.version)
        return ServingStatus([doc], handle.server_name, f"promoted {args.model} v{args.version} to stable")

    def _rollback(self, args: Any) -> ServingStatus:
        handle = self._server(args.server_name)
        doc = handle.client.rollback(args.model)
        return ServingStatus([doc], handle.server_name, f"rolled {args.model} back to v{doc.get('stable')}")

    def _canary(self, args: Any) -> ServingStatus:
        if not 0.0 <= args.weight <= 1.0:
            raise UsageError(f"WEIGHT must be from 0 to 1, not {args.weight:g}")
        handle = self._server(args.server_name)
        doc = handle.client.canary(args.model, args.version, args.weight)
        note = (
            f"canary of {args.model} ended"
            if args.weight == 0
            else f"canary: {args.weight:.0%} of {args.model}'s traffic to v{args.version}"
        )
        return ServingStatus([doc], handle.server_name, note)

    def _predict(self, args: Any) -> Any:
        if args.version is not None and args.label is not None:
            raise UsageError("give --version or --label, not both")
        handle = self._server(args.server_name)
        data = self._data(" ".join(args.data), "DATA")
        return handle.client.predict(
            args.model,
            data,
            version=args.version,
            label=args.label,
            signature_name=args.signature_name,
            protocol=args.protocol,
        )

    def _bench(self, args: Any) -> Any:
        from workbench.bench import format_table, run_load

        duration, requests = resolve_load(args.concurrency, args.duration, args.requests)  # ValueError: usage
        handle = self._server(args.server_name)
        data = self._data(" ".join(args.data), "DATA")
        client = handle.client
        # Cast once with the model's own dtypes (and check the model exists) before any load is sent.
        inputs = client.encode_inputs(client.signature(args.model, args.signature_name), data)
        result = run_load(
            handle.grpc_target if args.protocol in GRPC_PROTOCOLS else handle.rest_url,
            args.protocol,
            args.model,
            inputs,
            concurrency=args.concurrency,
            duration=duration,
            requests=requests,
            signature_name=args.signature_name,
            tls=client.tls,  # a TLS server is loaded as the handle's client reaches it
        )
        summary = result.summary()
        print(format_table([summary], list(summary)))
        return result

    def _dashboard(self, args: Any) -> Any:
        from workbench.notebook.widgets import Dashboard

        if args.window <= 0:
            raise UsageError("--window must be positive")
        return Dashboard(self._server(args.server_name), window_seconds=args.window)

    def _logs(self, args: Any) -> Any:
        from workbench.request_log import read_request_log

        if args.last < 0:
            raise UsageError("--last must not be negative")
        prefix = args.filename_prefix
        if prefix is None:  # ask the server where it writes (the files are read here: a server of this machine)
            handle = self._server(args.server_name)
            logging = handle.client.health().get("request_log", {}).get(args.model)
            if logging is None:
                raise UsageError(
                    f"model {args.model!r} does not log requests: put a logging_config.txt beside it, e.g. "
                    'log_collector_config { filename_prefix: "logs/requests" } sampling_config { sampling_rate: 1.0 }'
                )
            prefix = logging["filename_prefix"]
        try:
            return read_request_log(prefix, model=args.model, last=args.last or None)
        except FileNotFoundError:
            raise UsageError(f"no requests of {args.model!r} logged under {prefix} yet") from None

    def _manifests(self, args: Any) -> Any:
        from workbench.deploy.manifests import DEFAULT_IMAGE, render_manifests

        if args.kserve == args.kubernetes:
            raise UsageError("give one of --kserve or --kubernetes")
        handle = self._server(args.server_name)
        model = handle.client.model(args.model)  # its routing, and where this server reads it from
        manifests = render_manifests(
            args.model,
            target="kserve" if args.kserve else "kubernetes",
            storage_uri=args.storage_uri or model["base_path"],
            replicas=args.replicas,
            image=args.image or DEFAULT_IMAGE,
            routing=model,
        )
        if args.out is not None:
            for path in manifests.write(args.out):
                print(f"wrote {path}")
        return manifests

    # ------------------------------------------------------------------------------------ user data
    def _variable(self, name: str, what: str) -> Any:
        namespace = self.shell.user_ns if self.shell is not None else {}
        if name not in namespace:
            raise UsageError(f"no variable {name!r} in the notebook for {what}")
        return namespace[name]

    def _data(self, text: str, what: str) -> Any:
        """A user variable's value, or a JSON literal (a variable wins when a name is both)."""
        namespace = self.shell.user_ns if self.shell is not None else {}
        if text.isidentifier() and not keyword.iskeyword(text) and text in namespace:
            return namespace[text]
        try:
            return json.loads(text)
        except ValueError as exc:
            if text.isidentifier():
                raise UsageError(f"no variable {text!r} in the notebook for {what}") from None
            raise UsageError(f"{what} is neither a variable nor JSON: {_one_line(str(exc))}") from None


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%serve`` (``%load_ext workbench``); ``%reload_ext`` keeps the servers already started."""
    magics = ServeMagics(ipython)
    previous = ipython.magics_manager.registry.get(ServeMagics.__name__)
    if previous is not None:  # servers outlive a reload of the code: don't lose track of them
        magics.servers = getattr(previous, "servers", {})
    ipython.register_magics(magics)
