"""``workbench batch MODEL --input URI --output URI``: a data set through a model (see
:mod:`workbench.batch_prediction`)."""

from __future__ import annotations

import argparse
import json
import sys

from workbench.config.batch_flags import BATCH_FLAGS

BATCH_EXAMPLES = """\
examples:
  workbench batch digits --input=digits.csv --output=scored/
  workbench batch digits --input='data/part-*.parquet' --output=s3://bucket/scored --model_version=2
  workbench batch digits --input=rows.jsonl --output=scored/ --columns=pixels=x --id_column=id --max_failed_rows=10
"""


def add_batch_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "batch",
        help="score a data set with a model (CSV, Parquet, JSON Lines, .npy/.npz, TFRecord; local or s3:// gs://)",
        description="Run every row of the input through the model, as `workbench serve` would serve it, in full "
        "batches; write the answers as one file per shard in the output folder, each with an id column, and the "
        "rows that fail with their reasons beside them. Run the same command again after it was stopped: it "
        "finishes the shards left, and writes none twice.",
        epilog=BATCH_EXAMPLES,
    )
    p.add_argument("model", metavar="MODEL", help="the model's name")
    for group in BATCH_FLAGS:
        section = p if group.title is None else p.add_argument_group(group.title)
        for flag in group.flags:
            flag.argument().add_to(section)
    # The command line's own, listed with the run's flags (the last section).
    section.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(command=_batch)


def _batch(args: argparse.Namespace) -> int:
    from workbench.batch_prediction.feeding import parse_column_map

    try:
        columns = parse_column_map(args.columns or "")
    except ValueError as exc:
        print(f"workbench batch: {exc}", file=sys.stderr)
        return 2
    import logging

    from workbench.batch_prediction import batch_predict
    from workbench.cli.logs import configure_logging
    from workbench.config.batch_flags import keywords
    from workbench.core.errors import ServingError
    from workbench.runtime.storage import StorageError

    configure_logging("")
    # The model's loading and the engine's notes would cut through the progress bar; warnings and errors still show.
    logging.getLogger("workbench").setLevel(logging.WARNING)
    try:
        summary = batch_predict(
            args.model, **keywords(vars(args), leave_out=("columns",)), columns=columns, progress=sys.stderr.isatty()
        )
    except (ServingError, StorageError, ValueError) as exc:
        print(f"workbench batch: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    if args.json:
        import dataclasses

        print(json.dumps(dataclasses.asdict(summary)))
    else:
        print(
            f"{summary.rows_out} rows scored, {summary.rows_failed} failed, by {summary.model} version "
            f"{summary.version} in {summary.seconds:.1f} s ({summary.rows_per_second:.0f} rows/s): {summary.output}"
        )
    return 0
