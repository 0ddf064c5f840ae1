"""A batch job's shards, and what its output folder says of the work already done.

The input (every file :func:`~workbench.batch_prediction.formats.list_inputs` finds, in order) is cut into shards of at
most ``shard_rows`` rows, never across files; shard ``i`` is written whole as ``part-{i:05d}.<format>`` in the output
folder, under a temporary name first, so a part that exists is finished. The plan (inputs, their rows, the shard size,
the model version that scored them) is written first as ``_JOB.json``; a job started again with the same output reads it
back and skips the shards whose part exists: nothing is scored twice, and nothing is lost. A job whose plan differs
(other input, another shard size, another version) is refused rather than mixed into the same output. ``_SUMMARY.json``
is written last.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from workbench.batch_prediction.formats import (
    child,
    count_rows,
    exists,
    format_of,
    list_names,
    read_text,
    remove,
    write_text,
)
from workbench.core.errors import Code, ServingError

PLAN_FILE = "_JOB.json"
SUMMARY_FILE = "_SUMMARY.json"
PART_PREFIX = "part-"
ERRORS_PREFIX = "errors-"
TEMPORARY_PREFIX = ".tmp-"  # formats.write_table's name for a file until it is whole
OUTPUT_EXTENSIONS = {"csv": "csv", "parquet": "parquet", "jsonl": "jsonl", "npz": "npz", "tfrecord": "tfrecord"}


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    format: str
    rows: int
    first_row: int  # the job-wide number of its first row: outputs without an id column are numbered so


@dataclasses.dataclass(frozen=True)
class Shard:
    index: int
    file: InputFile
    start: int  # rows [start, stop) of the file
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def first_row(self) -> int:
        return self.file.first_row + self.start


@dataclasses.dataclass(frozen=True)
class Plan:
    model: str
    version: int
    signature_name: str
    output_format: str
    shard_rows: int
    files: tuple[InputFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def shards(self) -> list[Shard]:
        shards: list[Shard] = []
        for file in self.files:
            for start in range(0, file.rows, self.shard_rows):
                shards.append(Shard(len(shards), file, start, min(start + self.shard_rows, file.rows)))
        return shards

    def part_name(self, shard: Shard) -> str:
        return f"{PART_PREFIX}{shard.index:05d}.{OUTPUT_EXTENSIONS[self.output_format]}"

    @staticmethod
    def errors_name(shard: Shard) -> str:
        return f"{ERRORS_PREFIX}{shard.index:05d}.jsonl"

    def document(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> Plan:
        files = tuple(InputFile(**f) for f in document["files"])
        return cls(**{**document, "files": files})


def make_plan(
    model: str,
    version: int,
    signature_name: str,
    inputs: Sequence[str],
    input_format: str | None,
    output_format: str | None,
    shard_rows: int,
) -> Plan:
    """The plan of a job over ``inputs`` (each file's rows are counted: the shards depend on them)."""
    if shard_rows < 1:
        raise ServingError(Code.INVALID_ARGUMENT, f"shard_rows must be at least 1, not {shard_rows}")
    files: list[InputFile] = []
    first = 0
    for path in inputs:
        fmt = format_of(path, input_format)
        rows = count_rows(path, fmt)
        files.append(InputFile(path, fmt, rows, first))
        first += rows
    if output_format is None:  # the input's own format; one unnamed array cannot hold ids beside the answers
        output_format = "npz" if files and files[0].format == "npy" else (files[0].format if files else "parquet")
    output_format = output_format.lower()
    if output_format not in OUTPUT_EXTENSIONS:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"Cannot write the output as {output_format}: choose one of {', '.join(OUTPUT_EXTENSIONS)}",
        )
    return Plan(model, version, signature_name, output_format, shard_rows, tuple(files))


def resume(plan: Plan, output: str, tidy: bool = True) -> set[int]:
    """Write ``plan`` to ``output`` or check it against the one there; the shards already done there. ``tidy``
    removes what a killed run left half-written (not where other processes of the same job write beside)."""
    plan_path = child(output, PLAN_FILE)
    if exists(plan_path):
        earlier = Plan.from_document(json.loads(read_text(plan_path)))
        if earlier != plan:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{output} holds the output of another job ({_difference(earlier, plan)}): write to another "
                "output, or delete it to start again",
            )
    else:
        write_text(plan_path, json.dumps(plan.document(), indent=2) + "\n")
    names = set(list_names(output))
    if tidy:
        remove_temporaries(output, names)
    return {shard.index for shard in plan.shards() if plan.part_name(shard) in names}


def remove_temporaries(output: str, names: set[str] | None = None) -> None:
    """Delete what a killed run left half-written in ``output``: never a finished shard."""
    for name in list_names(output) if names is None else names:
        if name.startswith(TEMPORARY_PREFIX):
            remove(child(output, name))


def _difference(earlier: Plan, now: Plan) -> str:
    if earlier.version != now.version or earlier.model != now.model:
        return (
            f"its shards were scored by {earlier.model} version {earlier.version}, this job would use "
            f"{now.model} version {now.version}; pass --model_version={earlier.version} to finish it"
        )
    if earlier.files != now.files:
        return "its input was other files, or files of other lengths"
    fields = [f.name for f in dataclasses.fields(Plan) if getattr(earlier, f.name) != getattr(now, f.name)]
    return "a different " + ", ".join(fields)
