"""The analyzer's answer: the point that serves most within the constraints, and why it won in words.

A point (a candidate at a load: a concurrency, or a request rate) is feasible when its p99 is within the latency
budget, it serves at least the minimum throughput, its server's memory is within the limit, and no request failed.
The winner is the feasible point with the most inferences a second (the lower p99 among equals); its candidate is
the configuration written.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Sequence
from typing import Any

from workbench.analyzer.sweep import Measured


@dataclasses.dataclass(frozen=True)
class Constraints:
    latency_budget_ms: float | None = None  # on the p99
    min_throughput: float | None = None  # inferences a second
    max_memory_mib: float | None = None  # the server's resident memory

    def violations(self, point: Measured) -> list[str]:
        found = []
        if self.latency_budget_ms is not None and point.p99_ms > self.latency_budget_ms:
            found.append(f"p99 {point.p99_ms:.1f} ms > {self.latency_budget_ms:g} ms")
        if self.min_throughput is not None and point.inferences_per_second < self.min_throughput:
            found.append(f"{point.inferences_per_second:,.0f}/s < {self.min_throughput:,.0f}/s")
        if self.max_memory_mib is not None and (point.memory_mib or 0.0) > self.max_memory_mib:
            found.append(f"memory {point.memory_mib:,.0f} MiB > {self.max_memory_mib:,.0f} MiB")
        if point.errors:
            found.append(f"{point.errors} failed requests")
        return found


@dataclasses.dataclass
class Analysis:
    """Every point measured, the winner (None when no point met the constraints), and why."""

    model: str
    points: list[Measured]
    constraints: Constraints
    winner: Measured | None
    why: str
    seconds: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        return [{**point.row(), "feasible": not self.constraints.violations(point)} for point in self.points]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "constraints": dataclasses.asdict(self.constraints),
            "winner": self.winner.row() if self.winner is not None else None,
            "why": self.why,
            "seconds": round(self.seconds, 1),
            "points": self.rows(),
        }

    def __str__(self) -> str:
        return self.why

    def _repr_html_(self) -> str:
        from workbench.analyzer.report import html_fragment

        return html_fragment(self)

    def _ipython_display_(self) -> None:
        """In a notebook: why the winner won, the frontier (a plotly widget, drawn by the notebook's own plotly,
        whole however late the browser loads it), and the table of every point."""
        from IPython.display import HTML, display

        from workbench.analyzer.report import figure, table
        from workbench.notebook.live_figure import figure_widget

        display(HTML(f"<p>{html.escape(self.why)}</p>"))
        display(figure_widget(figure(self)))
        display(HTML(table(self)))


def choose(model: str, points: Sequence[Measured], constraints: Constraints) -> Analysis:
    """The winner among ``points`` and the reasons, in words."""
    feasible = [point for point in points if not constraints.violations(point)]
    if not feasible:
        if not points:
            return Analysis(model, [], constraints, None, "Nothing was measured.")
        closest = max(points, key=lambda p: p.inferences_per_second)
        why = (
            f"No configuration of {model} meets the constraints: the most that was served, "
            f"{closest.inferences_per_second:,.0f} inferences/s ({closest.candidate.name}, {closest.load}), fails "
            f"them with {'; '.join(constraints.violations(closest))}."
        )
        return Analysis(model, list(points), constraints, None, why)
    winner = max(feasible, key=lambda p: (p.inferences_per_second, -p.p99_ms))
    why = (
        f"{winner.candidate.name} wins for {model}: {winner.inferences_per_second:,.0f} inferences/s at "
        f"{winner.load}, p99 {winner.p99_ms:.1f} ms"
    )
    if winner.avg_batch is not None:
        why += f", batches of {winner.avg_batch:g} on average"
    why += "."
    best_by_candidate: dict[Any, Measured] = {}
    for point in feasible:
        if point.candidate != winner.candidate:
            kept = best_by_candidate.get(point.candidate)
            if kept is None or point.inferences_per_second > kept.inferences_per_second:
                best_by_candidate[point.candidate] = point
    if best_by_candidate:
        runner_up = max(best_by_candidate.values(), key=lambda p: p.inferences_per_second)
        ratio = winner.inferences_per_second / max(runner_up.inferences_per_second, 1e-9)
        why += (
            f" That is {ratio:.2f}× the next best configuration within the constraints ({runner_up.candidate.name}: "
            f"{runner_up.inferences_per_second:,.0f}/s at p99 {runner_up.p99_ms:.1f} ms)."
        )
    excluded = len(points) - len(feasible)
    if excluded:
        why += f" {excluded} of {len(points)} points measured broke a constraint."
    return Analysis(model, list(points), constraints, winner, why)


def write_results(analysis: Analysis, folder: str) -> None:
    """``results.json`` and, for the winner, the files the server reads: ``batching_parameters.txt`` (the model's
    own, beside its versions) and ``serve_flags.txt`` (``workbench serve``'s flags for it)."""
    import os

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(analysis.to_json(), f, indent=1)
    winner = analysis.winner
    if winner is None:
        return
    if winner.candidate.batching:
        with open(os.path.join(folder, "batching_parameters.txt"), "w") as f:
            f.write(winner.candidate.batching_parameters_text())
    with open(os.path.join(folder, "serve_flags.txt"), "w") as f:
        f.write(" ".join(winner.candidate.serve_flags()) + "\n")
