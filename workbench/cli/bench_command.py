"""``workbench bench``: closed-loop load on a server's predict API, with latency percentiles.

The load's options are declared once in :data:`workbench.client.bench.LOAD_ARGUMENTS`, for ``%serve bench`` too.
"""

from __future__ import annotations

import argparse
import sys

from workbench.client.bench import GRPC_PROTOCOLS, LOAD_ARGUMENTS
from workbench.config.vocabulary import BoolFlag

BENCH_EXAMPLES = """\
examples:
  workbench bench --target=localhost:8501 --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=localhost:8500 --protocol=grpc --model=half_plus_two --inputs='{"x": [[1.0]]}' \\
      --concurrency=8 --duration=10
  workbench bench --target=localhost:8500 --protocol=v2-grpc --model=half_plus_two --inputs='{"x": [[1.0]]}'
  workbench bench --target=https://localhost:8501 --ca_file=ca.pem --model=half_plus_two --inputs='{"x": [[1.0]]}'
"""


def add_bench_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="closed-loop load on a server's predict API (TF Serving's or v2, REST or gRPC), with latency percentiles",
        description="Send predict requests from N concurrent clients, each waiting for its answer before sending "
        "the next, for a duration or a number of requests; print requests/s and latency percentiles. Works "
        "against workbench and TF Serving alike. The same load as `%serve bench` in a notebook, with the same "
        "defaults.",
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
    p.add_argument(
        "--inputs",
        required=True,
        metavar="JSON",
        help="""one request's inputs, e.g. '{"x": [[1.0]]}' (typed as the signature says)""",
    )
    for name in ("concurrency", "duration", "requests"):
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

    import numpy as np

    from workbench.client import ClientTLS
    from workbench.client.bench import format_table, input_dtypes, resolve_load, run_load

    try:  # usage mistakes: exit 2, as argparse's own
        duration, requests = resolve_load(args.concurrency, args.duration, args.requests)
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
        values = json.loads(args.inputs)
        if not isinstance(values, dict) or not values:
            raise ValueError("--inputs must be a JSON object of input name → value")
        dtypes = input_dtypes(args.target, args.protocol, args.model, args.signature_name, tls=tls)
        unknown = sorted(set(values) - set(dtypes))
        if unknown:
            raise ValueError(f"the signature has no input {', '.join(unknown)} (it has {', '.join(sorted(dtypes))})")
        inputs = {name: np.asarray(value, dtype=dtypes[name]) for name, value in values.items()}
        result = run_load(
            args.target,
            args.protocol,
            args.model,
            inputs,
            concurrency=args.concurrency,
            duration=duration,
            requests=requests,
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
