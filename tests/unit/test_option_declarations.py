"""Each command's options are declared once: ``workbench batch``'s and the analyzer's flags, their magics and their
Python functions take names, types and defaults from one declaration, and ``workbench.serve`` takes
``ServerHandle``'s keywords."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import workbench
from workbench.analyzer import analyze_flags
from workbench.cli import build_parser
from workbench.config import batch_flags
from workbench.notebook.serve_subcommands import PARSERS


def _defaults(function: Any) -> dict[str, Any]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def _command_defaults(command: str, words: list[str]) -> dict[str, Any]:
    return vars(build_parser(command).parse_args([command, *words]))


@pytest.mark.parametrize(
    ("declaration", "function"),
    [(batch_flags, lambda: workbench.batch_predict), (analyze_flags, lambda: workbench.analyze)],
    ids=["batch", "analyze"],
)
def test_the_python_functions_defaults_are_the_declared_ones(declaration: Any, function: Any) -> None:
    defaults = _defaults(function())
    assert {keyword: defaults[keyword] for keyword in declaration.DEFAULTS} == dict(declaration.DEFAULTS)


def test_the_batch_command_parses_to_the_declared_defaults() -> None:
    parsed = _command_defaults("batch", ["m", "--input=i", "--output=o"])
    declared = {name: flag.default for name, flag in batch_flags.FLAGS.items() if not flag.required}
    assert {name: parsed[name] for name in declared} == declared


def test_the_analyze_command_parses_to_the_declared_defaults_as_lists() -> None:
    parsed = _command_defaults("analyze", ["m", "--model_base_path=d", "--shape=x:1"])
    declared = analyze_flags.FLAGS
    assert {name: parsed[name] for name in declared} == {n: f.command_line_default() for n, f in declared.items()}


def test_the_magics_take_the_declared_types_and_defaults() -> None:
    batch = vars(PARSERS["batch"].parser.parse_args(["m", "--input=i", "--output=o", "--shard_rows=5"]))  # type: ignore[attr-defined]
    assert batch["shard_rows"] == 5 and batch["signature_name"] == batch_flags.DEFAULTS["signature_name"]
    analyze = vars(PARSERS["analyze"].parser.parse_args(["m", "x", "--max_batch_size=1,4"]))  # type: ignore[attr-defined]
    assert analyze["max_batch_size"] == [1, 4]
    assert analyze["concurrency"] == list(analyze_flags.DEFAULTS["concurrency"])
    assert (
        analyze_flags.keywords(analyze)["measurement_interval_ms"] == analyze_flags.DEFAULTS["measurement_interval_ms"]
    )


def test_serve_takes_the_handles_keywords_and_shows_them() -> None:
    handle = inspect.signature(workbench.ServerHandle)
    serve = inspect.signature(workbench.serve)
    assert serve.parameters == handle.parameters
    assert serve.parameters["timeout"].default == 180.0
    assert serve.parameters["server_name"].annotation == "str"
    assert "num_workers" in (workbench.serve.__doc__ or "")
