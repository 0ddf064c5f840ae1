"""The analyzer's options, each declared once: flag name, type, default and help, and the keyword of
:func:`workbench.analyze` it fills where that is named otherwise.

From the declaration come ``workbench analyze``'s flags (:meth:`AnalyzeFlag.argument`, with the help written here),
``%serve analyze``'s (the same, with that magic's shorter help and metavars) and :func:`workbench.analyze`'s defaults
(:data:`DEFAULTS`). A swept option's default is a tuple for Python and the same values as a list on a command line
(what a parsed comma-separated value is).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from workbench.client.protocols import PROTOCOLS
from workbench.config.vocabulary import Argument

_UNSET: Any = object()  # an override not given: the declaration's own


def whole_numbers(text: str) -> list[int]:
    """``1,8,32`` → [1, 8, 32]: at least one whole number."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of whole numbers, not {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("at least one value")
    return values


def words(text: str) -> list[str]:
    """``auto,2`` → ["auto", "2"]."""
    return [part.strip() for part in text.split(",") if part.strip()]


def rates(text: str) -> list[float]:
    """``10,100.5`` → [10.0, 100.5]."""
    return [float(part) for part in text.split(",") if part.strip()]


@dataclasses.dataclass(frozen=True)
class AnalyzeFlag:
    """One option of the analyzer."""

    name: str
    default: Any
    # workbench analyze --help's text; "{default}" in it is the default as a command line writes it (1,8,32)
    help: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    keyword: str | None = None  # workbench.analyze's keyword, where it is not the flag's name

    @property
    def parameter(self) -> str:
        return self.keyword or self.name

    def command_line_default(self) -> Any:
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def argument(self, help: str | None = _UNSET, metavar: str | None = _UNSET) -> Argument:
        """This option as a parser takes it: the command line's help and metavar unless given (a magic's)."""
        default = self.command_line_default()
        text = self.help if help is _UNSET else help
        if text is not None and "{default" in text:
            text = text.format(default=",".join(map(str, default)) if isinstance(default, list) else default)
        options: dict[str, Any] = {"default": default, "help": text}
        if self.type is not None:
            options["type"] = self.type
        chosen_metavar = self.metavar if metavar is _UNSET else metavar
        if chosen_metavar is not None:
            options["metavar"] = chosen_metavar
        if self.choices is not None:
            options["choices"] = self.choices
        return Argument.of(f"--{self.name}", **options)


def _flags(*flags: AnalyzeFlag) -> Mapping[str, AnalyzeFlag]:
    return {flag.name: flag for flag in flags}


# What is swept: comma-separated values on a command line, sequences in Python.
SWEEP_FLAGS = _flags(
    AnalyzeFlag("max_batch_size", (1, 8, 32), "(1: no batching; default {default})", whole_numbers),
    AnalyzeFlag("batch_timeout_micros", (0, 2000), "(default {default})", whole_numbers),
    AnalyzeFlag("num_batch_threads", (1,), "(default {default})", whole_numbers),
    AnalyzeFlag("max_enqueued_batches", (100,), "(default {default})", whole_numbers),
    AnalyzeFlag("num_workers", (1,), "worker processes (default {default})", whole_numbers),
    AnalyzeFlag(
        "model_runners",
        ("auto",),
        "what the workers hand batches to: auto, in_process, or a count (default {default})",
        words,
    ),
    AnalyzeFlag("concurrency", (1, 2, 4, 8, 16), "(default {default})", whole_numbers),
    AnalyzeFlag(
        "request_rate",
        (),
        "measure at these requests a second (open loop) instead of the concurrencies",
        rates,
        metavar="R,R",
    ),
    AnalyzeFlag("search", "brute", "every point, or stop early", choices=("brute", "quick")),
    AnalyzeFlag("protocol", "rest", "the API the load speaks, as clients will (default {default})", choices=PROTOCOLS),
)
CONSTRAINT_FLAGS = _flags(
    AnalyzeFlag("latency_budget_ms", None, "on the p99", float, "MS"),
    AnalyzeFlag("min_throughput", None, "inferences a second", float, "N"),
    AnalyzeFlag("max_memory", None, "the server's resident memory", float, "MIB", keyword="max_memory_mib"),
)
MEASUREMENT_FLAGS = _flags(
    AnalyzeFlag(
        "measurement_interval", 2000.0, "(default {default:g})", float, "MS", keyword="measurement_interval_ms"
    ),
    AnalyzeFlag("stability_percentage", 10.0, "(default {default:g})", float, "P"),
    AnalyzeFlag("max_trials", 6, "windows a point (default {default})", int, "N"),
)
REQUEST_FLAGS = _flags(AnalyzeFlag("batch_size", 1, "rows a request from --input_data", int, "ROWS"))
FLAGS: Mapping[str, AnalyzeFlag] = {**REQUEST_FLAGS, **SWEEP_FLAGS, **CONSTRAINT_FLAGS, **MEASUREMENT_FLAGS}
# workbench.analyze's defaults, by keyword.
DEFAULTS: Mapping[str, Any] = {flag.parameter: flag.default for flag in FLAGS.values()}


def keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """Parsed options (flag name → value; a namespace's ``vars``) as :func:`workbench.analyze`'s keywords: the
    declared options ``values`` has."""
    return {flag.parameter: values[name] for name, flag in FLAGS.items() if name in values}
