"""``workbench.analyze``: sweep, choose, write, and (on request) apply to a running server."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.analyzer.analyze_flags import DEFAULTS
from workbench.analyzer.candidates import grid
from workbench.analyzer.choice import Analysis, Constraints, choose, write_results
from workbench.analyzer.sweep import Measured, measure_candidate, serving
from workbench.client import perf


def analyze(
    model: str,
    model_base_path: str | os.PathLike[str],
    *,
    inputs: Mapping[str, Any] | None = None,
    input_data: str | None = None,
    shape: Sequence[str] = (),
    batch_size: int = DEFAULTS["batch_size"],
    max_batch_size: Sequence[int] = DEFAULTS["max_batch_size"],
    batch_timeout_micros: Sequence[int] = DEFAULTS["batch_timeout_micros"],
    num_batch_threads: Sequence[int] = DEFAULTS["num_batch_threads"],
    max_enqueued_batches: Sequence[int] = DEFAULTS["max_enqueued_batches"],
    num_workers: Sequence[int] = DEFAULTS["num_workers"],
    model_runners: Sequence[str] = DEFAULTS["model_runners"],
    concurrency: Sequence[int] = DEFAULTS["concurrency"],
    request_rate: Sequence[float] = DEFAULTS["request_rate"],
    search: str = DEFAULTS["search"],
    protocol: str = DEFAULTS["protocol"],
    latency_budget_ms: float | None = DEFAULTS["latency_budget_ms"],
    min_throughput: float | None = DEFAULTS["min_throughput"],
    max_memory_mib: float | None = DEFAULTS["max_memory_mib"],
    measurement_interval_ms: float = DEFAULTS["measurement_interval_ms"],
    stability_percentage: float = DEFAULTS["stability_percentage"],
    max_trials: int = DEFAULTS["max_trials"],
    serve_flags: Sequence[str] = (),
    output: str | os.PathLike[str] | None = None,
    apply_to: str | None = None,
    management_token: str = "",
    on_point: Callable[[Measured], None] | None = None,
) -> Analysis:
    """Serve ``model`` (the versions under ``model_base_path``) with every candidate configuration, measure each at
    each concurrency as perf_analyzer would, and choose the one that serves most within the constraints.

    Requests: ``inputs`` (one request's), ``input_data`` (a .json/.npy/.npz file, :mod:`workbench.client.load_inputs`;
    ``batch_size`` rows a request) or ``shape`` (``"x:1,64"``: random). ``search``: ``brute`` (every candidate at
    every load) or ``quick`` (each candidate's loads until the frontier flattens). ``request_rate``: measure at these
    rates (open loop, requests sent whatever the answers) instead of the concurrencies. ``protocol``: the
    API the load speaks (``rest``, ``grpc``, ``v2``, ``v2-grpc``), as clients will. ``serve_flags``
    go to every ``workbench serve`` (``--allow_python_models``...). ``output``: a folder for the winner's
    ``batching_parameters.txt`` and ``serve_flags.txt``, ``results.json`` and ``report.html``. ``apply_to``: a
    running server's REST URL whose ``model`` takes the winner's batching parameters at once.
    """
    from workbench.analyzer.report import write_report

    if search not in ("brute", "quick"):
        raise ValueError(f"search is brute or quick, not {search!r}")
    given = sum(1 for value in (inputs, input_data, shape) if value)
    if given != 1:
        raise ValueError("give the requests one way: inputs, input_data or shape")
    base = Path(model_base_path)
    if not base.is_dir():
        raise ValueError(f"{base} is not a folder of model versions")
    if request_rate:
        rates = sorted(set(float(r) for r in request_rate))
        if rates[0] <= 0:
            raise ValueError("request rates are above 0")
        loads = [perf.Point(request_rate=rate) for rate in rates]
    else:
        levels = sorted(set(int(c) for c in concurrency))
        if not levels or levels[0] < 1:
            raise ValueError("concurrencies are at least 1")
        loads = [perf.Point(concurrency=clients) for clients in levels]
    chosen = grid(
        max_batch_size, batch_timeout_micros, num_batch_threads, max_enqueued_batches, num_workers, model_runners
    )
    stability = perf.Stability(interval_s=measurement_interval_ms / 1000, percentage=stability_percentage,
                               max_trials=max_trials, warmup_s=min(1.0, measurement_interval_ms / 1000))  # fmt: skip
    constraints = Constraints(latency_budget_ms, min_throughput, max_memory_mib)
    started = time.perf_counter()
    points: list[Measured] = []
    requests: list[dict[str, np.ndarray]] | None = None
    with tempfile.TemporaryDirectory(prefix="workbench-analyze-") as folder:
        for candidate in chosen:
            with serving(model, base, candidate, Path(folder), serve_flags) as served:
                if requests is None:  # typed by the model's signature, read from the first server
                    requests = _requests(served.rest_url, model, inputs, input_data, shape, batch_size)
                points += measure_candidate(
                    served, model, requests, candidate, loads, stability, search == "quick", latency_budget_ms,
                    on_point, protocol,
                )  # fmt: skip
    analysis = choose(model, points, constraints)
    analysis.seconds = time.perf_counter() - started
    if output is not None:
        write_results(analysis, str(output))
        write_report(analysis, str(Path(output) / "report.html"))
    if apply_to is not None and analysis.winner is not None:
        apply(apply_to, model, analysis, management_token)
    return analysis


def apply(url: str, model: str, analysis: Analysis, management_token: str = "") -> dict[str, Any]:
    """Give the running server at ``url`` the winner's batching parameters for ``model`` (its management API's
    ``:batching``); the description it answers."""
    from workbench.client import Client

    if analysis.winner is None:
        raise ValueError("no configuration met the constraints: nothing to apply")
    text = analysis.winner.candidate.batching_parameters_text() if analysis.winner.candidate.batching else None
    with Client(url, token=management_token or None) as client:
        return client.set_batching(model, text)


def _requests(
    url: str,
    model: str,
    inputs: Mapping[str, Any] | None,
    input_data: str | None,
    shape: Sequence[str],
    batch_size: int,
) -> list[dict[str, np.ndarray]]:
    from workbench.client import load_inputs
    from workbench.client.bench import input_dtypes

    dtypes = input_dtypes(url, "rest", model)
    if input_data:
        return load_inputs.from_file(input_data, dtypes, batch_size)
    if shape:
        return [load_inputs.random_inputs(load_inputs.parse_shapes(list(shape)), dtypes)]
    assert inputs is not None
    return [load_inputs.typed(inputs, dtypes)]
