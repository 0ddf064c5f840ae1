"""``workbench batch MODEL --input URI --output URI``: a data set through a model (see :mod:`workbench.batch`)."""

from __future__ import annotations

import argparse
import json
import sys

from workbench.config.vocabulary import BoolFlag

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
    p.add_argument("--input", required=True, metavar="URI", help="a file, folder or glob; local, s3:// or gs://")
    p.add_argument("--output", required=True, metavar="URI", help="the folder the answers go to")
    where = p.add_argument_group("the model")
    where.add_argument(
        "--model_repository",
        default="workbench-models",
        metavar="DIR",
        help="the repository holding MODEL's folder (default: workbench-models, where workbench.export writes)",
    )
    where.add_argument("--model_base_path", default="", metavar="PATH", help="MODEL's own folder, instead")
    where.add_argument("--model_config_file", default="", metavar="FILE", help="a model config naming MODEL, instead")
    where.add_argument("--model_version", type=int, default=None, metavar="N", help="default: the latest")
    where.add_argument("--version_label", default=None, metavar="LABEL", help="a version by its label")
    where.add_argument("--signature_name", default="", metavar="NAME", help="default: serving_default")
    where.add_argument("--allow_pickle", action=BoolFlag, default=False, help="load pickled models (runs their code)")
    where.add_argument(
        "--allow_python_models", action=BoolFlag, default=False, help="load model.py and handler.py (runs their code)"
    )
    data = p.add_argument_group("the data")
    data.add_argument(
        "--columns",
        default="",
        metavar="MAP",
        help="file columns that feed inputs of other names: column=input[,column=input...]",
    )
    data.add_argument("--id_column", default=None, metavar="NAME", help="copied beside each answer (default: row)")
    data.add_argument("--input_format", default=None, metavar="FORMAT", help="default: by the files' extensions")
    data.add_argument("--output_format", default=None, metavar="FORMAT", help="default: the input's")
    run = p.add_argument_group("the run")
    run.add_argument(
        "--batch_size", type=int, default=0, metavar="ROWS", help="default: the model's max_batch_size, or 256"
    )
    run.add_argument(
        "--shard_rows", type=int, default=100_000, metavar="ROWS", help="rows a written file (default 100000)"
    )
    run.add_argument("--concurrency", type=int, default=0, metavar="N", help="batches in flight (default: cores)")
    run.add_argument(
        "--num_workers",
        type=int,
        default=1,
        metavar="N",
        help="processes scoring shards side by side, each with the model loaded (several cores for a model whose "
        "calls hold the GIL)",
    )
    run.add_argument(
        "--max_failed_rows",
        type=int,
        default=None,
        metavar="N",
        help="stop once more rows than N failed (default: failed rows never stop the job)",
    )
    run.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the --num_workers workers on a Ray cluster, with Ray Data: auto (the cluster this machine is in), "
        "local (a Ray started here) or ray://HOST:PORT",
    )
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(command=_batch)


def _batch(args: argparse.Namespace) -> int:
    from workbench.batch.feeding import parse_column_map

    try:
        columns = parse_column_map(args.columns)
    except ValueError as exc:
        print(f"workbench batch: {exc}", file=sys.stderr)
        return 2
    import logging

    from workbench.batch import batch_predict
    from workbench.cli.logs import configure_logging
    from workbench.core.errors import ServingError
    from workbench.runtime.storage import StorageError

    configure_logging("")
    # The model's loading and the engine's notes would cut through the progress bar; warnings and errors still show.
    logging.getLogger("workbench").setLevel(logging.WARNING)
    try:
        summary = batch_predict(
            args.model,
            args.input,
            args.output,
            model_repository=args.model_repository,
            model_base_path=args.model_base_path or None,
            model_config_file=args.model_config_file or None,
            model_version=args.model_version,
            version_label=args.version_label,
            signature_name=args.signature_name,
            columns=columns,
            id_column=args.id_column,
            input_format=args.input_format,
            output_format=args.output_format,
            batch_size=args.batch_size,
            shard_rows=args.shard_rows,
            concurrency=args.concurrency,
            max_failed_rows=args.max_failed_rows,
            num_workers=args.num_workers,
            ray_address=args.ray,
            allow_pickle=args.allow_pickle,
            allow_python_models=args.allow_python_models,
            progress=sys.stderr.isatty(),
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
