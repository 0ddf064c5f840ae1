"""The analyzer's report: the throughput–latency frontier (plotly: a line a candidate, its points the concurrencies,
the winner starred), the table of every point, and why the winner won. One HTML file (plotly's script inlined, so it
opens anywhere without a network), or a fragment the notebook shows."""

from __future__ import annotations

import html
from typing import Any, Protocol

from workbench.analyzer.sweep import Measured


class Analysis(Protocol):
    """What the report shows of an analysis (workbench.analyzer.choice.Analysis, which shows itself with it)."""

    model: str
    points: list[Measured]
    winner: Measured | None
    why: str

    @property
    def constraints(self) -> Any: ...

    def rows(self) -> list[dict[str, Any]]: ...


COLUMNS = (
    ("candidate", "configuration"),
    ("concurrency", "concurrency"),
    ("request_rate", "requests/s sent"),
    ("inferences_per_second", "inferences/s"),
    ("p50_ms", "p50 ms"),
    ("p95_ms", "p95 ms"),
    ("p99_ms", "p99 ms"),
    ("queue_us", "queue µs"),
    ("compute_us", "compute µs"),
    ("avg_batch", "mean batch"),
    ("cpu_cores", "CPU cores"),
    ("memory_mib", "memory MiB"),
    ("gpu_memory_mib", "GPU MiB"),
    ("feasible", "within constraints"),
)


def figure(analysis: Analysis) -> Any:
    """The frontier as a plotly figure: p99 latency across, inferences/s up."""
    import plotly.graph_objects as go

    fig = go.Figure()
    by_candidate: dict[str, list[Any]] = {}
    for point in analysis.points:
        by_candidate.setdefault(point.candidate.name, []).append(point)
    for name, points in by_candidate.items():
        fig.add_trace(
            go.Scatter(
                x=[p.p99_ms for p in points],
                y=[p.inferences_per_second for p in points],
                mode="lines+markers",
                name=name,
                text=[p.load for p in points],
                hovertemplate="%{text}<br>p99 %{x:.2f} ms<br>%{y:,.0f} inferences/s",
            )
        )
    winner = analysis.winner
    if winner is not None:
        fig.add_trace(
            go.Scatter(
                x=[winner.p99_ms],
                y=[winner.inferences_per_second],
                mode="markers",
                marker={"symbol": "star", "size": 18, "color": "gold", "line": {"width": 1, "color": "black"}},
                name="winner",
            )
        )
    budget = analysis.constraints.latency_budget_ms
    if budget is not None:
        fig.add_vline(x=budget, line_dash="dash", annotation_text=f"budget {budget:g} ms")
    fig.update_layout(
        title=f"{analysis.model}: throughput against p99 latency",
        xaxis_title="p99 latency (ms)",
        yaxis_title="inferences/s",
        template="plotly_white",
        height=420,
    )
    return fig


def table(analysis: Analysis) -> str:
    """Every point, the winner's row in bold."""
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in COLUMNS)
    rows = []
    winner = analysis.winner
    best = (winner.candidate.name, winner.concurrency, winner.request_rate) if winner is not None else None
    for row in analysis.rows():
        cells = "".join(f"<td>{html.escape(_shown(row.get(key)))}</td>" for key, _ in COLUMNS)
        won = (row["candidate"], row["concurrency"], row["request_rate"]) == best
        rows.append(f"<tr{' class=winner style=font-weight:bold' if won else ''}>{cells}</tr>")
    return f"<table class=workbench-analysis><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def html_fragment(analysis: Analysis, include_plotlyjs: bool | str = "require") -> str:
    """The report inside a page or a notebook cell."""
    chart = figure(analysis).to_html(full_html=False, include_plotlyjs=include_plotlyjs)
    return f"<div><p>{html.escape(analysis.why)}</p>{chart}{table(analysis)}</div>"


def write_report(analysis: Analysis, path: str) -> None:
    """One self-contained HTML file."""
    body = html_fragment(analysis, include_plotlyjs=True)
    style = "body{font-family:sans-serif;margin:2em} td,th{padding:2px 8px;text-align:right} th{background:#eee}"
    page = f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(analysis.model)} analysis</title>"
    page += f"<style>{style}</style></head><body><h1>{html.escape(analysis.model)}</h1>{body}</body></html>"
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
