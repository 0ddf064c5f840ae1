"""A batch prediction job's options, each declared once: flag name, type, default, help, and the keyword of
:func:`workbench.batch_predict` it fills where that is named otherwise.

From the declaration come ``workbench batch``'s flags (:meth:`BatchFlag.argument`, in :data:`BATCH_FLAGS`' help
sections), ``%serve batch``'s (the same, with that magic's help where it is shorter) and
:func:`workbench.batch_predict`'s defaults (:data:`DEFAULTS`). It lives on the ground floor, beside ``workbench
serve``'s flags, so that the command line reads it without importing the job's engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from workbench.config.vocabulary import Argument, BoolFlag

_UNSET: Any = object()  # an override not given: the declaration's own


@dataclasses.dataclass(frozen=True)
class BatchFlag:
    """One option of a batch job."""

    name: str
    default: Any
    # workbench batch --help's text; "{default}" in it is the default
    help: str
    metavar: str | None = None
    type: type | None = None  # None: text, or a switch where the default is a bool
    required: bool = False
    keyword: str | None = None  # batch_predict's keyword, where it is not the flag's name

    @property
    def parameter(self) -> str:
        return self.keyword or self.name

    def argument(self, help: str = _UNSET, **overrides: Any) -> Argument:
        """This option as a parser takes it: the command line's help unless given, ``overrides`` for the rest (a
        magic's ``action="store_true"``)."""
        text = (self.help if help is _UNSET else help).format(default=self.default)
        options: dict[str, Any]
        if isinstance(self.default, bool):
            options = {"action": BoolFlag, "default": self.default}
        else:
            options = {"default": self.default, "metavar": self.metavar}
            if self.type is not None:
                options["type"] = self.type
            if self.required:
                options = {"required": True, "metavar": self.metavar}
        return Argument.of(f"--{self.name}", **{**options, "help": text, **overrides})


@dataclasses.dataclass(frozen=True)
class BatchFlagGroup:
    """A section of ``workbench batch --help`` (None: the command's own options)."""

    title: str | None
    flags: tuple[BatchFlag, ...]


BATCH_FLAGS: tuple[BatchFlagGroup, ...] = (
    BatchFlagGroup(
        None,
        (
            BatchFlag("input", None, "a file, folder or glob; local, s3:// or gs://", "URI", required=True),
            BatchFlag("output", None, "the folder the answers go to", "URI", required=True),
        ),
    ),
    BatchFlagGroup(
        "the model",
        (
            BatchFlag(
                "model_repository",
                "workbench-models",  # where workbench.export writes
                "the repository holding MODEL's folder (default: {default}, where workbench.export writes)",
                "DIR",
            ),
            BatchFlag("model_base_path", None, "MODEL's own folder, instead", "PATH"),
            BatchFlag("model_config_file", None, "a model config naming MODEL, instead", "FILE"),
            BatchFlag("model_version", None, "default: the latest", "N", int),
            BatchFlag("version_label", None, "a version by its label", "LABEL"),
            BatchFlag("signature_name", "", "default: serving_default", "NAME"),
            BatchFlag("allow_pickle", False, "load pickled models (runs their code)"),
            BatchFlag("allow_python_models", False, "load model.py and handler.py (runs their code)"),
        ),
    ),
    BatchFlagGroup(
        "the data",
        (
            # Text on a command line (column=input,...), a mapping in Python: read by feeding.parse_column_map.
            BatchFlag(
                "columns", None, "file columns that feed inputs of other names: column=input[,column=input...]", "MAP"
            ),
            BatchFlag("id_column", None, "copied beside each answer (default: row)", "NAME"),
            BatchFlag("input_format", None, "default: by the files' extensions", "FORMAT"),
            BatchFlag("output_format", None, "default: the input's", "FORMAT"),
        ),
    ),
    BatchFlagGroup(
        "the run",
        (
            BatchFlag("batch_size", 0, "default: the model's max_batch_size, or 256", "ROWS", int),
            BatchFlag("shard_rows", 100_000, "rows a written file (default {default})", "ROWS", int),
            BatchFlag("concurrency", 0, "batches in flight (default: cores)", "N", int),
            BatchFlag(
                "num_workers",
                1,
                "processes scoring shards side by side, each with the model loaded (several cores for a model whose "
                "calls hold the GIL)",
                "N",
                int,
            ),
            BatchFlag(
                "max_failed_rows",
                None,
                "stop once more rows than N failed (default: failed rows never stop the job)",
                "N",
                int,
            ),
            BatchFlag(
                "ray",
                None,
                "run the --num_workers workers on a Ray cluster, with Ray Data: auto (the cluster this machine is in), "
                "local (a Ray started here) or ray://HOST:PORT",
                "ADDRESS",
                keyword="ray_address",
            ),
        ),
    ),
)
FLAGS: Mapping[str, BatchFlag] = {flag.name: flag for group in BATCH_FLAGS for flag in group.flags}
# workbench.batch_predict's defaults, by keyword (a required option has none).
DEFAULTS: Mapping[str, Any] = {flag.parameter: flag.default for flag in FLAGS.values() if not flag.required}
DEFAULT_SHARD_ROWS: int = DEFAULTS["shard_rows"]


def keywords(values: Mapping[str, Any], leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """Parsed options (flag name → value; a namespace's ``vars``) as :func:`workbench.batch_predict`'s keywords:
    the declared options ``values`` has, less ``leave_out``."""
    return {flag.parameter: values[name] for name, flag in FLAGS.items() if name in values and name not in leave_out}
