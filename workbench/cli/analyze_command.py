"""``workbench analyze``: the model analyzer from the command line (:mod:`workbench.analyzer`)."""

from __future__ import annotations

import argparse
import json
import sys

from workbench.analyzer import analyze_flags as flags
from workbench.config.vocabulary import HelpFormatter

ANALYZE_EXAMPLES = """\
examples:
  workbench analyze digits --model_base_path=models/digits --shape=x:1,64 --latency_budget_ms=20 --output=analysis/
  workbench analyze digits --model_base_path=models/digits --input_data=rows.npz --max_batch_size=1,8,32,64 \\
      --batch_timeout_micros=0,1000,5000 --num_workers=1,2 --search=quick --apply=http://localhost:8501
"""


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
    flags.REQUEST_FLAGS["batch_size"].argument().add_to(p)
    sweep = p.add_argument_group("what is swept (comma-separated values)")
    for flag in flags.SWEEP_FLAGS.values():
        flag.argument().add_to(sweep)
    goal = p.add_argument_group("constraints")
    for flag in flags.CONSTRAINT_FLAGS.values():
        flag.argument().add_to(goal)
    how = p.add_argument_group("measurement")
    for flag in flags.MEASUREMENT_FLAGS.values():
        flag.argument().add_to(how)
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
            args.model,
            args.model_base_path,
            inputs=json.loads(args.inputs) if args.inputs else None,
            input_data=args.input_data,
            shape=args.shape or (),
            **flags.keywords(vars(args)),
            serve_flags=["--allow_python_models"] if args.allow_python_models else [],
            output=args.output,
            apply_to=args.apply,
            management_token=args.management_token,
            on_point=None if args.json else told,
        )
    except ValueError as exc:
        print(f"workbench analyze: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench analyze: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(analysis.to_json()) if args.json else analysis.why)
    return 0 if analysis.winner is not None else 3
