"""``workbench bench``: load on a server's predict API, with latency percentiles: one fixed measurement (closed loop,
``--duration`` or ``--requests``), or perf_analyzer's (concurrency or request-rate ranges, windows until stable,
the server's share from its statistics, perf_analyzer's CSV): :mod:`workbench.client.perf`.

The load's options are declared once in :data:`workbench.client.bench.LOAD_ARGUMENTS`, for ``%serve bench`` too.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.client.bench import GRPC_PROTOCOLS, LOAD_ARGUMENTS
from workbench.config.vocabulary import BoolFlag

BENCH_EXAMPLES = """\
examples:
  workbench bench --target=localhost:8501 --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=localhost:8500 --protocol=grpc --model=half_plus_two --inputs='{"x": [[1.0]]}' \\
      --concurrency=8 --duration=10
  workbench bench --target=localhost:8500 --protocol=v2-grpc --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=https://localhost:8501 --ca_file=ca.pem --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=localhost:8501 --model=half_plus_two --inputs='{"x": [[1.0]]}' --concurrency=1:16:4 \
      --csv=points.csv
  workbench bench --target=localhost:8500 --protocol=v2-grpc --model=digits --input_data=rows.npz \
      --request_rate=100:400:100 --request_distribution=poisson
"""


def add_bench_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="load on a server's predict API (TF Serving's or v2, REST or gRPC), with latency percentiles",
        description="Send predict requests from N concurrent clients, each waiting for its answer before sending "
        "the next, for a duration or a number of requests; print requests/s and latency percentiles. With a "
        "range of concurrencies, a request rate (open loop) or --measurement_interval, each point is measured "
        "as perf_analyzer measures it: windows until three agree, the server's queue and compute time from its "
        "statistics, perf_analyzer's CSV with --csv. Works against workbench and TF Serving alike. The same load "
        "as `%serve bench` in a notebook, with the same defaults.",
        epilog=BENCH_EXAMPLES,
    )
    p.add_argument(
        "--target",
        required=True,
        metavar="ADDRESS",
        help="the server: host:port, or http://host:port or https://host:port for REST",
    )
    LOAD_ARGUMENTS["protocol"].add_to(p)
    LOAD_ARGUMENTS["grpc"].add_to(p)
    p.add_argument("--model", required=True, metavar="NAME", help="the model's name")
    LOAD_ARGUMENTS["signature_name"].add_to(p)
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument(
        "--inputs", metavar="JSON", help="""one request's inputs, e.g. '{"x": [[1.0]]}' (typed as the signature says)"""
    )
    data.add_argument(
        "--input_data",
        "--input-data",
        dest="input_data",
        metavar="FILE",
        help='requests sent in turn: a .json file (perf_analyzer\'s {"data": [{input: value}, ...]}), or a .npy '
        "(one input) or .npz (an array per input) file cut into requests of --batch_size rows",
    )
    data.add_argument(
        "--shape",
        action="append",
        metavar="NAME:D1[,D2...]",
        help="random values of this shape for input NAME (every input needs one), as perf_analyzer's --shape",
    )
    p.add_argument(
        "--batch_size", "-b", type=int, default=1, metavar="ROWS", help="rows a request from a .npy/.npz file"
    )
    for name in (
        "concurrency",
        "duration",
        "requests",
        "request_rate",
        "request_distribution",
        "measurement_interval",
        "stability_percentage",
        "max_trials",
        "csv",
        "shared_memory",
    ):
        LOAD_ARGUMENTS[name].add_to(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    tls = p.add_argument_group("TLS", "an https:// target, or a gRPC server started with --ssl_config_file")
    tls.add_argument("--tls", action=BoolFlag, default=False, help="gRPC over TLS (on by itself with any file below)")
    tls.add_argument(
        "--ca_file",
        default="",
        metavar="FILE",
        help="PEM CA the server's certificate must chain to (default: the system's trust store; gRPC's bundled "
        "roots for gRPC)",
    )
    tls.add_argument("--cert_file", default="", metavar="FILE", help="client certificate (PEM), for mutual TLS")
    tls.add_argument("--key_file", default="", metavar="FILE", help="its key (default: in --cert_file)")
    p.set_defaults(command=_bench)


def _bench(args: argparse.Namespace) -> int:
    import json

    from workbench.client import ClientTLS, perf
    from workbench.client.bench import format_table, input_dtypes, run_load

    try:  # usage mistakes: exit 2, as argparse's own
        plan = perf.plan_of(args)
        if args.protocol in GRPC_PROTOCOLS and "://" in args.target:
            raise ValueError(f"a gRPC --target is host:port, not a URL ({args.target})")
        files = (args.ca_file or None, args.cert_file or None, args.key_file or None)
        https = args.target.startswith("https://")
        tls = ClientTLS(*files) if args.tls or https or any(files) else None
        if tls is not None and args.protocol not in GRPC_PROTOCOLS and not https:
            raise ValueError(f"TLS over REST needs an https:// --target, not {args.target}")
    except ValueError as exc:
        print(f"workbench bench: {exc}", file=sys.stderr)
        return 2
    try:
        dtypes = input_dtypes(args.target, args.protocol, args.model, args.signature_name, tls=tls)
        sent = _requests(args, dtypes)
        if plan.points is not None:
            results = perf.run_measurement(
                args.target, args.protocol, args.model, sent, plan.points, plan.stability or perf.Stability(),
                signature_name=args.signature_name, tls=tls, shared_memory=args.shared_memory,
                on_point=None if args.json else lambda done: print(_point_line(done), file=sys.stderr, flush=True),
            )  # fmt: skip
            rows, table = perf.report(results, args.csv)
            print(json.dumps(rows) if args.json else table)
            return 0 if all(row["Errors"] == 0 for row in rows) else 3
        result = run_load(
            args.target,
            args.protocol,
            args.model,
            sent[0],
            concurrency=plan.clients,
            duration=plan.duration,
            requests=plan.requests,
            signature_name=args.signature_name,
            tls=tls,
        )
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench bench: {exc}", file=sys.stderr)
        return 1
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_table([summary], list(summary)))
    return 0 if result.errors == 0 else 3


def _requests(args: argparse.Namespace, dtypes: dict[str, Any]) -> list[dict[str, Any]]:
    """The requests the options name: --inputs (one), --input_data (a file's) or --shape (random)."""
    import json

    from workbench.client import load_inputs

    if args.input_data:
        return load_inputs.from_file(args.input_data, dtypes, args.batch_size)
    if args.shape:
        return [load_inputs.random_inputs(load_inputs.parse_shapes(args.shape), dtypes)]
    values = json.loads(args.inputs)
    if not isinstance(values, dict) or not values:
        raise ValueError("--inputs must be a JSON object of input name → value")
    return [load_inputs.typed(values, dtypes)]


def _point_line(result: Any) -> str:
    point = result.point
    at = f"concurrency {point.concurrency}" if point.concurrency is not None else f"{point.request_rate:g} requests/s"
    stable = "" if result.stable else f" (not stable after {result.windows} windows)"
    return (
        f"{at}: {result.inferences_per_second:.1f} inferences/s, p50 {result.latency_us(50) / 1000:.2f} ms, "
        f"p99 {result.latency_us(99) / 1000:.2f} ms{stable}"
    )
