"""``workbench analyze``: the model analyzer from the command line (:mod:`workbench.analyzer`)."""

from __future__ import annotations

import argparse
import json
import sys

from workbench.client.protocols import PROTOCOLS
from workbench.config.vocabulary import HelpFormatter

ANALYZE_EXAMPLES = """\
examples:
  workbench analyze digits --model_base_path=models/digits --shape=x:1,64 --latency_budget_ms=20 --output=analysis/
  workbench analyze digits --model_base_path=models/digits --input_data=rows.npz --max_batch_size=1,8,32,64 \\
      --batch_timeout_micros=0,1000,5000 --num_workers=1,2 --search=quick --apply=http://localhost:8501
"""


def _numbers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of whole numbers, not {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("at least one value")
    return values


def add_analyze_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "analyze",
        help="find the batching settings and workers that serve a model best, measured",
        description="Serve MODEL with every candidate configuration (batching parameters, workers), each in a "
        "`workbench serve` of its own; load each as perf_analyzer does at each concurrency; choose the one that "
        "serves most within the constraints; write it as the files the server reads, and a report.",
        epilog=ANALYZE_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--model_base_path", required=True, metavar="DIR", help="the model's folder of numbered versions")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--inputs", metavar="JSON", help="one request's inputs, e.g. '{\"x\": [[0.5, 1.0]]}'")
    data.add_argument("--input_data", metavar="FILE", help="requests from a .json, .npy or .npz file")
    data.add_argument("--shape", action="append", metavar="NAME:D1[,D2...]", help="random requests of this shape")
    p.add_argument("--batch_size", type=int, default=1, metavar="ROWS", help="rows a request from --input_data")
    sweep = p.add_argument_group("what is swept (comma-separated values)")
    sweep.add_argument("--max_batch_size", type=_numbers, default=[1, 8, 32], help="(1: no batching; default 1,8,32)")
    sweep.add_argument("--batch_timeout_micros", type=_numbers, default=[0, 2000], help="(default 0,2000)")
    sweep.add_argument("--num_batch_threads", type=_numbers, default=[1], help="(default 1)")
    sweep.add_argument("--max_enqueued_batches", type=_numbers, default=[100], help="(default 100)")
    sweep.add_argument("--num_workers", type=_numbers, default=[1], help="worker processes (default 1)")
    sweep.add_argument(
        "--model_runners",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=["auto"],
        help="what the workers hand batches to: auto, in_process, or a count (default auto)",
    )
    sweep.add_argument("--concurrency", type=_numbers, default=[1, 2, 4, 8, 16], help="(default 1,2,4,8,16)")
    sweep.add_argument(
        "--request_rate",
        type=lambda text: [float(part) for part in text.split(",") if part.strip()],
        default=[],
        metavar="R,R",
        help="measure at these requests a second (open loop) instead of the concurrencies",
    )
    sweep.add_argument("--search", choices=("brute", "quick"), default="brute", help="every point, or stop early")
    sweep.add_argument(
        "--protocol", choices=PROTOCOLS, default="rest", help="the API the load speaks, as clients will (default rest)"
    )
    goal = p.add_argument_group("constraints")
    goal.add_argument("--latency_budget_ms", type=float, metavar="MS", help="on the p99")
    goal.add_argument("--min_throughput", type=float, metavar="N", help="inferences a second")
    goal.add_argument("--max_memory", type=float, metavar="MIB", help="the server's resident memory")
    how = p.add_argument_group("measurement")
    how.add_argument("--measurement_interval", type=float, default=2000.0, metavar="MS", help="(default 2000)")
    how.add_argument("--stability_percentage", type=float, default=10.0, metavar="P", help="(default 10)")
    how.add_argument("--max_trials", type=int, default=6, metavar="N", help="windows a point (default 6)")
    p.add_argument("--allow_python_models", action="store_true", help="serve a model.py (as workbench serve)")
    p.add_argument("--output", metavar="DIR", help="write the winner's files, results.json and report.html here")
    p.add_argument("--apply", metavar="URL", help="give a running server's MODEL the winner's batching parameters")
    p.add_argument("--management_token", default="", metavar="TOKEN", help="that server's management token")
    p.add_argument("--json", action="store_true", help="print the analysis as JSON")
    p.set_defaults(command=_analyze)


def _analyze(args: argparse.Namespace) -> int:
    from workbench.analyzer import analyze
    from workbench.analyzer.sweep import Measured

    def told(point: Measured) -> None:
        print(
            f"{point.candidate.name}, {point.load}: {point.inferences_per_second:,.0f}/s, "
            f"p99 {point.p99_ms:.1f} ms" + ("" if point.stable else " (not stable)"),
            file=sys.stderr,
            flush=True,
        )

    try:
        analysis = analyze(
            args.model, args.model_base_path,
            inputs=json.loads(args.inputs) if args.inputs else None, input_data=args.input_data,
            shape=args.shape or (), batch_size=args.batch_size,
            max_batch_size=args.max_batch_size, batch_timeout_micros=args.batch_timeout_micros,
            num_batch_threads=args.num_batch_threads, max_enqueued_batches=args.max_enqueued_batches,
            num_workers=args.num_workers, model_runners=args.model_runners, concurrency=args.concurrency,
            request_rate=args.request_rate,
            search=args.search, protocol=args.protocol,
            latency_budget_ms=args.latency_budget_ms, min_throughput=args.min_throughput,
            max_memory_mib=args.max_memory, measurement_interval_ms=args.measurement_interval,
            stability_percentage=args.stability_percentage, max_trials=args.max_trials,
            serve_flags=["--allow_python_models"] if args.allow_python_models else [],
            output=args.output, apply_to=args.apply, management_token=args.management_token,
            on_point=None if args.json else told,
        )  # fmt: skip
    except ValueError as exc:
        print(f"workbench analyze: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench analyze: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(analysis.to_json()) if args.json else analysis.why)
    return 0 if analysis.winner is not None else 3
