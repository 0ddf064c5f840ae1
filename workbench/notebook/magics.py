"""The ``%serve`` line magic: start servers, export models, manage versions, predict and benchmark from cells.

``%load_ext workbench`` registers it; ``%serve --help`` lists the subcommands and ``%serve SUBCOMMAND --help``
shows one's options. Every mistake (a bad argument, no server, an unknown variable, an error from the server)
is an :class:`~IPython.core.error.UsageError` with a one-line message, which IPython shows without a traceback.
Servers are child processes (see :mod:`workbench.notebook.handle`): they never print into cells.
"""

from __future__ import annotations

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

from workbench.client.bench import GRPC_PROTOCOLS
from workbench.core.errors import ServingError
from workbench.notebook.handle import (
    DEFAULT_REPOSITORY,
    ServerDied,
    ServerHandle,
    models_table_html,
    models_table_text,
    repository_location,
    running_servers,
)
from workbench.notebook.serve_subcommands import DEFAULT_NAME, PARSERS, one_line, overview, parse_arguments, split_line
from workbench.runtime.tensorflow_runtime import quiet_tensorflow

if TYPE_CHECKING:  # workbench.publishing is imported when first used: loading the extension stays cheap
    from workbench.publishing import ExportResult

__all__ = ["ServeMagics", "ServingStatus", "load_ipython_extension", "parse_arguments"]

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


def _died(exc: ServerDied, handle: ServerHandle | None) -> str:
    """One line for a server that is gone: what happened, where the log is, how to go on."""
    first = one_line(str(exc)).rstrip(":")
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
        words = split_line(line)
        if not words or words[0] in ("-h", "--help", "help"):
            print(overview())
            return None
        sub, rest = words[0], words[1:]
        if sub not in PARSERS:
            close = difflib.get_close_matches(sub, PARSERS, n=2)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise UsageError(f"%serve: unknown subcommand {sub!r}: {hint}one of {', '.join(PARSERS)} (%serve --help)")
        parser = PARSERS[sub].parser  # type: ignore[attr-defined]
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
            raise UsageError(f"%serve {sub}: {exc.code.name}: {one_line(exc.message)}") from None
        except (ValueError, TimeoutError, OSError) as exc:  # bad inputs for the client, a load that never came
            raise UsageError(f"%serve {sub}: {one_line(str(exc))}") from None

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
            # The parser's options are the handle's keywords (%serve start's are workbench serve's flags); one not
            # given (None) is left to the handle's default.
            options = {option: value for option, value in vars(args).items() if value is not None}
            options["response_cache_models"] = [m.strip() for m in args.response_cache_models.split(",") if m.strip()]
            handle = ServerHandle(**options)
        self._current = handle
        try:
            handle.restart()  # a handle that died starts again on the same ports if they were chosen
        except ServerDied:
            last = one_line(handle.log_tail(1)) or "no output"
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

    def _export(self, args: Any) -> ServingStatus | ExportResult:
        from workbench.publishing import ExportError, export

        if args.mlflow:
            return self._export_to_mlflow(args)
        handle = self._server(args.server_name)
        model = self._variable(args.model_var, "MODEL_VAR")
        examples = self._data(args.examples, "--examples") if args.examples is not None else None
        tokenizer = self._variable(args.tokenizer, "--tokenizer") if args.tokenizer is not None else None
        try:
            result = export(
                model,
                args.name,
                handle.model_repository,
                version=args.version,
                examples=examples,
                format=args.format,
                tokenizer=tokenizer,
                task=args.task,
            )
        except ExportError as exc:
            raise UsageError(one_line(str(exc))) from None
        return self._served_export(handle, args.name, result)

    def _export_to_mlflow(self, args: Any) -> ServingStatus | ExportResult:
        """``%serve export VAR NAME --mlflow``: registered in MLflow; shown as served where a server of this kernel
        serves ``models:/NAME`` (it polls the registry), else the export's result."""
        from workbench.publishing import ExportError, export

        model = self._variable(args.model_var, "MODEL_VAR")
        examples = self._data(args.examples, "--examples") if args.examples is not None else None
        try:
            result = export(
                model, args.name, registry="mlflow", version=args.version, examples=examples, format=args.format
            )
        except ExportError as exc:
            raise UsageError(one_line(str(exc))) from None
        registered = f"models:/{args.name}"
        serving = [
            h
            for h in self._known().values()
            if h.running and h.model_base_path == registered and args.server_name in (None, h.server_name)
        ]
        if not serving:
            return result
        handle = serving[0]
        return self._served_export(handle, handle.model_name or "default", result)

    def _served_export(self, handle: ServerHandle, served: str, result: ExportResult) -> ServingStatus:
        """Wait until ``handle`` serves the exported version as ``served``; its status, with what was exported."""
        try:
            handle.wait_for_version(served, result.version)
        except ServerDied as exc:
            if not handle.running:
                raise
            # wait_for_version also says "died" for a version that failed to load: the server itself is fine.
            raise UsageError(one_line(str(exc))) from None
        self._settle(handle, served)
        signature = result.signatures.get("serving_default", "")
        where = f" (in MLflow: {result.path})" if str(result.path).startswith("models:/") else ""
        note = f"exported {result.name} v{result.version} {signature}".rstrip() + where
        return self._status_of(handle, served, note, export=result)

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
        try:
            doc = handle.client.promote(args.model, args.version, args.condition)
        except ServingError as exc:
            if args.condition is None:
                raise
            raise UsageError(exc.message) from None  # not earned: the figures, said in the cell
        return ServingStatus([doc], handle.server_name, f"promoted {args.model} v{args.version} to stable")

    def _shadow(self, args: Any) -> ServingStatus:
        copied = f"shadow: {args.fraction:.0%} of {args.model}'s default traffic copied to v{args.version}"
        return self._share(args, "--fraction", args.fraction, "shadow", f"shadow of {args.model} ended", copied)

    def _rollback(self, args: Any) -> ServingStatus:
        handle = self._server(args.server_name)
        doc = handle.client.rollback(args.model)
        return ServingStatus([doc], handle.server_name, f"rolled {args.model} back to v{doc.get('stable')}")

    def _canary(self, args: Any) -> ServingStatus:
        sent = f"canary: {args.weight:.0%} of {args.model}'s traffic to v{args.version}"
        return self._share(args, "WEIGHT", args.weight, "canary", f"canary of {args.model} ended", sent)

    def _share(self, args: Any, name: str, share: float, change: str, ended: str, started: str) -> ServingStatus:
        """A share (0 to 1) of MODEL's default traffic for VERSION: the client's ``canary`` or ``shadow``."""
        if not 0.0 <= share <= 1.0:
            raise UsageError(f"{name} must be from 0 to 1, not {share:g}")
        handle = self._server(args.server_name)
        doc = getattr(handle.client, change)(args.model, args.version, share)
        return ServingStatus([doc], handle.server_name, ended if share == 0 else started)

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
            key=args.key,
        )

    def _chat(self, args: Any) -> Any:
        from workbench.notebook.chat_widget import ChatWidget

        handle = self._server(args.server_name)
        parameters = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed}
        parameters = {name: value for name, value in parameters.items() if value is not None}
        if not args.message:
            return ChatWidget(handle.client, args.model, system=args.system, key=args.key, **parameters)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": " ".join(args.message)})
        answer = handle.client.chat(
            args.model, messages, on_piece=lambda piece: print(piece, end="", flush=True), key=args.key, **parameters
        )
        print()  # the streamed text's line ends before the answer's summary
        return answer

    def _bench(self, args: Any) -> Any:
        from workbench.client import perf
        from workbench.client.bench import format_table, run_load

        plan = perf.plan_of(args)  # ValueError: usage
        handle = self._server(args.server_name)
        data = self._data(" ".join(args.data), "DATA")
        client = handle.client
        # Cast once with the model's own dtypes (and check the model exists) before any load is sent.
        inputs = client.encode_inputs(client.signature(args.model, args.signature_name), data)
        target = handle.grpc_target if args.protocol in GRPC_PROTOCOLS else handle.rest_url
        if plan.points is not None:
            results = perf.run_measurement(
                target, args.protocol, args.model, [inputs], plan.points, plan.stability or perf.Stability(),
                signature_name=args.signature_name, tls=client.tls, shared_memory=args.shared_memory,
            )  # fmt: skip
            rows, table = perf.report(results, args.csv)
            print(table)
            return rows
        result = run_load(
            target,
            args.protocol,
            args.model,
            inputs,
            concurrency=plan.clients,
            duration=plan.duration,
            requests=plan.requests,
            signature_name=args.signature_name,
            tls=client.tls,  # a TLS server is loaded as the handle's client reaches it
        )
        summary = result.summary()
        print(format_table([summary], list(summary)))
        return result

    def _analyze(self, args: Any) -> Any:
        from IPython.display import display

        from workbench.analyzer import analyze
        from workbench.analyzer.report import figure
        from workbench.analyzer.sweep import Measured

        handle = self._server(args.server_name)
        if not isinstance(handle.model_repository, Path):
            raise UsageError(f"the analyzer serves a local model folder; this server's is {handle.model_repository}")
        data = self._data(" ".join(args.data), "DATA")
        client = handle.client
        signature = client.signature(args.model)
        inputs = client.encode_inputs(signature, data)
        from tqdm.auto import tqdm

        from workbench.analyzer.analyze_flags import DEFAULTS, keywords
        from workbench.analyzer.candidates import grid

        candidates = grid(
            args.max_batch_size, args.batch_timeout_micros, args.num_batch_threads,
            DEFAULTS["max_enqueued_batches"], args.num_workers, args.model_runners,
        )  # fmt: skip
        chart = _LiveFrontier(args.model)
        display(chart.widget)
        # A bar over the points (a quick search may stop a candidate early: the bar then ends short of its total).
        loads = len(set(args.request_rate)) or len(set(args.concurrency))
        bar = tqdm(total=len(candidates) * loads, desc=f"analyzing {args.model}", unit="point")

        def measured(point: Measured) -> None:
            chart.add(point)
            bar.set_postfix_str(f"{point.candidate.name}, {point.load}", refresh=False)
            bar.update()

        try:  # interrupting the kernel cancels the analysis: its servers stop, the bar closes
            analysis = analyze(
                args.model,
                handle.model_repository / args.model,
                inputs=inputs,
                **keywords(vars(args)),
                serve_flags=["--allow_python_models"] if handle.allow_python_models else [],
                output=args.output,
                apply_to=handle.rest_url if args.apply else None,
                on_point=measured,
            )
        finally:
            bar.close()
        chart.finish(figure(analysis))
        return analysis

    def _batch(self, args: Any) -> Any:
        from workbench.batch_prediction import batch_predict
        from workbench.batch_prediction.feeding import parse_column_map
        from workbench.config.batch_flags import keywords

        # The models of the server running here (what %serve export wrote), else workbench.export's own folder.
        repository = self._server(args.server_name).model_repository if self._known() else DEFAULT_REPOSITORY
        summary = batch_predict(
            args.model,
            **keywords(vars(args), leave_out=("columns",)),
            model_repository=repository,
            columns=parse_column_map(args.columns),
        )
        print(
            f"{summary.rows_out} rows scored, {summary.rows_failed} failed, by {args.model} version "
            f"{summary.version} in {summary.seconds:.1f} s: {summary.output}"
        )
        return summary

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
            sink = logging.get("sink", "tfrecord")
            if sink == "cloudevents":
                raise UsageError(f"model {args.model!r} sends its requests as CloudEvents to {prefix}: nothing to read")
            if sink == "parquet":  # a data set, not TFRecord files: read it as one (docs/request-logs-and-drift.md)
                import pandas as pd

                frame = pd.read_parquet(prefix, filters=[("model", "=", args.model)])
                return frame.sort_values("time").tail(args.last) if args.last else frame.sort_values("time")
        try:
            return read_request_log(prefix, model=args.model, last=args.last or None)
        except FileNotFoundError:
            raise UsageError(f"no requests of {args.model!r} logged under {prefix} yet") from None

    def _profile(self, args: Any) -> Any:
        """A trace of the server's process as tensorflow_model_server's users take one: TensorFlow's profiler
        client against the gRPC port (tensorflow.ProfilerService); the trace file, for TensorBoard's profile plugin."""
        if args.duration_ms <= 0:
            raise UsageError("--duration_ms must be positive")
        handle = self._server(args.server_name)
        logdir = Path(args.logdir or Path("logs") / "profile" / time.strftime("%Y%m%d-%H%M%S")).resolve()
        logdir.mkdir(parents=True, exist_ok=True)
        with quiet_tensorflow():
            from tensorflow.python.profiler import profiler_client

            try:
                profiler_client.trace(f"grpc://{handle.grpc_target}", str(logdir), args.duration_ms, "", 3)
            except Exception as exc:  # noqa: BLE001 - TensorFlow's client raises its own RuntimeError kinds
                raise UsageError(
                    f"no trace: {one_line(str(exc))} (the trace holds what the server ran meanwhile: send requests "
                    "while it runs)"
                ) from None
        traces = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
        print(
            f"trace written: {traces[-1] if traces else logdir}\nopen it in TensorBoard (its profile plugin: pip "
            f"install tensorboard-plugin-profile):\n  %load_ext tensorboard\n  %tensorboard --logdir {logdir}"
        )
        return traces[-1] if traces else logdir

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
            model_format=args.model_format,
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
            raise UsageError(f"{what} is neither a variable nor JSON: {one_line(str(exc))}") from None


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%serve`` (``%load_ext workbench``); ``%reload_ext`` keeps the servers already started."""
    magics = ServeMagics(ipython)
    previous = ipython.magics_manager.registry.get(ServeMagics.__name__)
    if previous is not None:  # servers outlive a reload of the code: don't lose track of them
        magics.servers = getattr(previous, "servers", {})
    ipython.register_magics(magics)


class _LiveFrontier:
    """The analyzer's frontier drawing itself in the cell: a plotly FigureWidget, a line a candidate, a point each
    time one is measured; replaced by the finished chart (winner starred) at the end.

    The points arrive while the analysis holds the kernel, so the browser's acknowledgements of them wait too, and
    :class:`~workbench.notebook.live_figure.LiveFigure` could not tell a slow browser from a deaf one: the finished
    chart is a new figure instead, whole from its creation, so it draws even where the live one never did."""

    def __init__(self, model: str) -> None:
        import ipywidgets as widgets

        from workbench.notebook.live_figure import figure_widget

        layout = {
            "title": f"{model}: measuring (throughput against p99 latency)",
            "xaxis_title": "p99 latency (ms)",
            "yaxis_title": "inferences/s",
            "template": "plotly_white",
            "height": 420,
        }
        self.figure = figure_widget({"layout": layout})
        self.widget = widgets.VBox([self.figure])
        self._traces: dict[str, int] = {}

    def add(self, point: Any) -> None:
        name = point.candidate.name
        if name not in self._traces:
            self.figure.add_scatter(x=[], y=[], mode="lines+markers", name=name)
            self._traces[name] = len(self.figure.data) - 1
        trace = self.figure.data[self._traces[name]]
        with self.figure.batch_update():
            trace.x = (*trace.x, point.p99_ms)
            trace.y = (*trace.y, point.inferences_per_second)

    def finish(self, final: Any) -> None:
        from workbench.notebook.live_figure import figure_widget

        measuring, self.figure = self.figure, figure_widget(final)
        self.widget.children = (self.figure,)
        measuring.close()
