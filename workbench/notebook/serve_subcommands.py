"""``%serve``'s subcommands: their arguments and help (``%serve SUB --help``), and how a magic's line is read.

Options are named as ``workbench serve`` and ``workbench bench`` name them; those the command line has too are
declared once for both: ``%serve start``'s are ``workbench serve``'s flags (:mod:`workbench.config.server_flags`,
typed there), the load's are :data:`workbench.client.bench.LOAD_ARGUMENTS`, the manifests' are
:data:`workbench.deploy.manifests.MANIFESTS_ARGUMENTS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, kwds, magic_arguments
from IPython.utils.process import arg_split

from workbench.analyzer.analyze_flags import FLAGS as ANALYZE_FLAGS
from workbench.client.bench import DEFAULT_PROTOCOL, LOAD_ARGUMENTS, PROTOCOLS
from workbench.config.batch_flags import FLAGS as BATCH_FLAGS
from workbench.config.server_flags import FLAGS
from workbench.config.vocabulary import OPTION_ALIASES, Argument, HelpFormatter, canonical_options, unrecognized_option
from workbench.deploy.manifests import MANIFESTS_ARGUMENTS
from workbench.notebook.handle import DEFAULT_REPOSITORY, DEFAULT_SERVER_NAME

DEFAULT_NAME = DEFAULT_SERVER_NAME  # the server's name when none is given (the handle's)


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
    """An option declared once for the command line too (workbench.client.bench, workbench.deploy.manifests)."""
    return argument(*spec.flags, **spec.options)


def _flag(name: str, help: str, shows_default: bool = False, **overrides: Any) -> Any:
    """One of `workbench serve`'s flags, as `%serve start` takes it (the handle turns it back into that flag); with
    ``shows_default``, its default is the server's, for the help to show (else None: the handle's own)."""
    if shows_default:
        overrides.setdefault("default", FLAGS[name].default_value())
    return _declared(FLAGS[name].argument(help, **overrides))


_PROTOCOL_OPTION = argument("--protocol", choices=PROTOCOLS, default=DEFAULT_PROTOCOL, help="the API to use")
_GRPC_OPTION = argument("--grpc", dest="protocol", action="store_const", const="grpc", help="short for --protocol grpc")
_SIGNATURE_OPTION = argument("--signature_name", default="", metavar="NAME", help="default: serving_default")


@magic_arguments(name="%serve start")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@_flag("server_name", default=DEFAULT_NAME, help="the server's name")
@_flag("model_repository", help=f"repository folder or s3:// URL (default: {DEFAULT_REPOSITORY})")
@_flag("model_base_path", help="serve one model instead: its folder, s3:// URL, or MLflow's models:/NAME")
@_flag("model_name", help="the one model's name (default: default)")
@_flag("rest_api_port", help="REST API port (default: a free one)")
@_flag("port", help="gRPC port (default: a free one)")
@_flag("openai_port", help="OpenAI-compatible endpoints on a port of their own (-1: a free one; default: REST's)")
@_flag("enable_batching", help="dynamic batching with TF Serving's default parameters")
@_flag("batching_parameters_file", help="a BatchingParameters text proto (turns batching on)")
@_flag("allow_pickle", help="load scikit-learn pickles (model.joblib, model.pkl): they run code")
@_flag("allow_python_models", help="load model.py and handler.py from the repository")
@_flag("num_workers", shows_default=True, help="worker processes on the same ports, or auto (default: 1)")
@_flag("response_cache_bytes", shows_default=True, metavar="N", help="Triton's response cache, in bytes (0: off)")
@_flag("response_cache_models", shows_default=True, help="the models whose answers the cache keeps")
@_flag("memory_budget", help="keep loaded versions within this memory (4Gi, 0.5, gpu:0.8); the rest load on demand")
@_flag("load_on_demand", help="load each version when first asked for, not at start-up")
@_flag("unload_after_idle", help="unload a version idle this many seconds (0: never)")
@_flag("pin", action="append", type=str, help="a model (or MODEL:VERSION) never evicted; repeat it")
@_flag("ssl_config_file", help="TLS on gRPC: TF Serving's SSLConfig text proto")
@_flag("rest_api_ssl_cert_file", help="TLS on REST (https): the server's PEM certificate")
@_flag("rest_api_ssl_key_file", help="its PEM private key (default: in the certificate's file)")
@argument("--ca_file", metavar="FILE", help="the PEM CA the notebook checks the server's certificate with")
@_flag("mlflow_tracking_uri", help="MLflow's tracking server (default: $MLFLOW_TRACKING_URI, else MLflow's own)")
@_flag("mlflow_stable_alias", help="the registered model's alias that is its stable version (default: champion)")
@_flag("mlflow_canary_alias", help="the alias that is its canary (default: challenger)")
@_flag("mlflow_write_aliases", help="let promote, canary and rollback move the aliases in MLflow")
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
    "a PythonModel class, a pipeline, a transformers pipeline or model)",
)
@argument("name", metavar="NAME", help="the served model's name")
@argument("--version", type=int, metavar="N", help="the version number (default: the next one)")
@argument("--examples", metavar="VAR", help="warmup examples: a variable name or a JSON literal")
@argument("--format", choices=["onnx"], help="convert first: onnx writes a scikit-learn model as ONNX (skl2onnx)")
@argument("--tokenizer", metavar="VAR", help="a transformers model's tokenizer (a pipeline holds its own)")
@argument("--task", metavar="TASK", help="the task a transformers model serves (default: its pipeline's or config's)")
@argument(
    "--mlflow",
    action="store_true",
    help="log it to MLflow ($MLFLOW_TRACKING_URI) and register it as NAME's next version there (needs --examples)",
)
@_SERVER_OPTION
def _export_parser(line: str) -> None:
    """Export a model variable as the next version and wait until the server serves it."""


@magic_arguments(name="%serve promote")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("version", type=int, metavar="VERSION")
@argument(
    "--if",
    dest="condition",
    metavar="CONDITION",
    help='only if VERSION\'s record as the shadow meets it, e.g. "agreement >= 0.99 and p99_ms <= 20"',
)
@_SERVER_OPTION
def _promote_parser(line: str) -> None:
    """Make VERSION the stable (default) version of MODEL (with --if, only if its shadow record earns it)."""


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


@magic_arguments(name="%serve shadow")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("version", type=int, metavar="VERSION")
@argument(
    "--fraction", type=float, default=1.0, metavar="F", help="share of default traffic copied, 0 to 1 (0 ends it)"
)
@_SERVER_OPTION
def _shadow_parser(line: str) -> None:
    """Copy a share of MODEL's default traffic to VERSION, answered to nobody and compared with the answers
    clients get; shows the comparison so far."""


@magic_arguments(name="%serve predict")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("data", nargs="+", metavar="DATA", help="""a variable name or a JSON literal: '{"x": [[1.0]]}' or [[1.0]]""")
@_PROTOCOL_OPTION
@_GRPC_OPTION
@argument("--version", type=int, metavar="N", help="this version")
@argument("--label", metavar="L", help="the version with this label")
@argument("--key", metavar="K", help="a stickiness key: under a canary split, the same key gets the same version")
@_SIGNATURE_OPTION
@_SERVER_OPTION
def _predict_parser(line: str) -> None:
    """Run a predict; returns the outputs (a dict of numpy arrays with .latency_ms)."""


@magic_arguments(name="%serve chat")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("message", nargs="*", metavar="MESSAGE", help="a question, answered into the cell (none: a chat widget)")
@argument("--max_tokens", type=int, metavar="N", help="at most N new tokens per answer")
@argument("--temperature", type=float, metavar="T", help="sampling temperature (0: greedy)")
@argument("--seed", type=int, metavar="S", help="the sampling seed, for an answer that repeats")
@argument("--system", metavar="TEXT", help="a system message that opens the conversation")
@argument("--key", metavar="K", help="a stickiness key: under a canary split, the same key gets the same version")
@_SERVER_OPTION
def _chat_parser(line: str) -> None:
    """Chat with a served text generator over its OpenAI-compatible endpoint, the answer streamed."""


@magic_arguments(name="%serve bench")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("data", nargs="+", metavar="DATA", help="one request's inputs: a variable name or a JSON literal")
@_declared(LOAD_ARGUMENTS["protocol"])
@_declared(LOAD_ARGUMENTS["grpc"])
@_declared(LOAD_ARGUMENTS["concurrency"])
@_declared(LOAD_ARGUMENTS["duration"])
@_declared(LOAD_ARGUMENTS["requests"])
@_declared(LOAD_ARGUMENTS["request_rate"])
@_declared(LOAD_ARGUMENTS["request_distribution"])
@_declared(LOAD_ARGUMENTS["measurement_interval"])
@_declared(LOAD_ARGUMENTS["stability_percentage"])
@_declared(LOAD_ARGUMENTS["max_trials"])
@_declared(LOAD_ARGUMENTS["csv"])
@_declared(LOAD_ARGUMENTS["shared_memory"])
@_declared(LOAD_ARGUMENTS["signature_name"])
@_SERVER_OPTION
def _bench_parser(line: str) -> None:
    """Load on MODEL, as `workbench bench`: shows throughput and latency percentiles, returns them. A range of
    concurrencies, a request rate or --measurement_interval measures each point as perf_analyzer does (returns
    perf_analyzer's rows)."""


def _analyzer(name: str, **overrides: Any) -> Any:
    """One of the analyzer's options (declared once for `workbench analyze` too), with this magic's help."""
    return _declared(ANALYZE_FLAGS[name].argument(**overrides))


@magic_arguments(name="%serve analyze")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@argument("data", nargs="+", metavar="DATA", help="one request's inputs: a variable name or a JSON literal")
@_analyzer("max_batch_size", metavar="N,N", help="(1: no batching)")
@_analyzer("batch_timeout_micros", metavar="N,N", help=None)
@_analyzer("num_batch_threads", metavar="N,N", help=None)
@_analyzer("num_workers", metavar="N,N", help=None)
@_analyzer("model_runners", metavar="R,R", help="auto, in_process or a count")
@_analyzer("concurrency", metavar="N,N", help=None)
@_analyzer("request_rate")
@_analyzer("search", help=None)
@_analyzer("latency_budget_ms")
@_analyzer("min_throughput")
@_analyzer("max_memory")
@_analyzer("measurement_interval", help=None)
@argument("--output", metavar="DIR", help="write the winner's files, results.json and report.html here")
@argument("--apply", action="store_true", help="give the running server's MODEL the winner's batching parameters")
@_SERVER_OPTION
def _analyze_parser(line: str) -> None:
    """Find the batching settings and workers that serve MODEL best: each candidate served on its own and loaded as
    perf_analyzer does, the frontier drawn as it is measured; returns the analysis (its report in the cell)."""


def _batch(name: str, **overrides: Any) -> Any:
    """One of a batch job's options (declared once for `workbench batch` too), as `%serve batch` takes it."""
    return _declared(BATCH_FLAGS[name].argument(**overrides))


@magic_arguments(name="%serve batch")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("model", metavar="MODEL")
@_batch(
    "input",
    help="a file, folder or glob of CSV, Parquet, JSON Lines, .npy/.npz or TFRecord files; local, s3:// or gs://",
)
@_batch("output")
@_batch("model_version")
@_batch("version_label")
@_batch("signature_name")
@_batch("columns", help="file columns that feed inputs of other names: column=input,...", default="")
@_batch("id_column", help="copied beside each answer (default: row, the row's number)")
@_batch("output_format")
@_batch("shard_rows")
@_batch("max_failed_rows", help="stop once more rows than N failed")
@_batch("allow_python_models", action="store_true")
@_SERVER_OPTION
def _batch_parser(line: str) -> None:
    """Score a data set with MODEL from the server's repository, as `workbench batch`; returns the summary."""


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
@_declared(MANIFESTS_ARGUMENTS["model_format"])
@argument("--out", metavar="DIR", help="also write the files into DIR")
@_SERVER_OPTION
def _manifests_parser(line: str) -> None:
    """Render KServe or Kubernetes manifests for MODEL with its routing; --out DIR writes them."""


@magic_arguments(name="%serve profile")
@kwds(formatter_class=HelpFormatter, epilog=_OPTIONS_NOTE)
@argument("--duration_ms", type=int, default=2000, metavar="MS", help="how long to trace (default: 2000)")
@argument("--logdir", metavar="DIR", help="where the trace goes (default: a folder of its own under logs/profile)")
@_SERVER_OPTION
def _profile_parser(line: str) -> None:
    """Trace the server with TensorFlow's profiler (over its gRPC port) for TensorBoard's profile plugin."""


PARSERS: dict[str, Callable[..., Any]] = {
    "start": _start_parser,
    "stop": _stop_parser,
    "restart": _restart_parser,
    "status": _status_parser,
    "export": _export_parser,
    "promote": _promote_parser,
    "rollback": _rollback_parser,
    "canary": _canary_parser,
    "shadow": _shadow_parser,
    "predict": _predict_parser,
    "chat": _chat_parser,
    "bench": _bench_parser,
    "batch": _batch_parser,
    "analyze": _analyze_parser,
    "dashboard": _dashboard_parser,
    "logs": _logs_parser,
    "profile": _profile_parser,
    "manifests": _manifests_parser,
}


def _summary(sub: str) -> str:
    description = PARSERS[sub].parser.description or ""  # type: ignore[attr-defined]
    return description.strip().splitlines()[0]


def overview() -> str:
    """The text of ``%serve --help``: one line per subcommand."""
    width = max(map(len, PARSERS))
    lines = ["Usage: %serve SUBCOMMAND [options]   (%serve SUBCOMMAND --help for its options)", ""]
    lines += [f"  {sub:<{width}}  {_summary(sub)}" for sub in PARSERS]
    lines += ["", _OPTIONS_NOTE]
    return "\n".join(lines)


def parse_arguments(sub: str, words: list[str]) -> argparse.Namespace:
    """The arguments of ``%serve SUB WORDS``, with options in the vocabulary's spelling (a UsageError if wrong).

    Aliases and dashes are read first (``--rest-port`` is ``--rest_api_port``), so a mistyped option is reported
    with the nearest real one; argparse's own messages say which subcommand they come from and where help is.
    """
    parser = PARSERS[sub].parser  # type: ignore[attr-defined]
    words = canonical_options(words, parser, {**OPTION_ALIASES, **_SUBCOMMAND_ALIASES.get(sub, {})})
    problem = unrecognized_option(words, parser)
    if problem:
        raise UsageError(f"%serve {sub}: {problem} (%serve {sub} --help)")
    try:
        return parser.parse_args(words)  # type: ignore[no-any-return]
    except UsageError as exc:
        raise UsageError(f"%serve {sub}: {one_line(str(exc))} (%serve {sub} --help)") from None


# ------------------------------------------------------------------------------------------------- helpers
def split_line(line: str) -> list[str]:
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


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, shortened: UsageError messages must stay one line."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"
