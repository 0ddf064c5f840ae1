"""Plots of an explanation (:meth:`workbench.Client.explain`'s answer) with plotly, the notebook's charting library.

- :func:`waterfall` — one row of a tabular model: from the base value (SHAP's expected value), each feature's
  attribution as a step, the largest first, the rest summed as one step, to the explained output.
- :func:`heatmap` — one row of an image model: the attributions as a heat map (channels summed), diverging
  around 0, so what raised the output and what lowered it read apart.
- :func:`plot` — whichever fits the row's shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.protocol.attributions import Explanation


def plot(explanation: Explanation, row: int = 0, **options: Any) -> Any:
    """:func:`heatmap` for rows of two or more dimensions (images), :func:`waterfall` for a row of features."""
    if explanation.attributions[row].ndim >= 2:
        return heatmap(explanation, row, **options)
    return waterfall(explanation, row, **options)


def waterfall(explanation: Explanation, row: int = 0, max_features: int = 12) -> Any:
    """Row ``row`` as a plotly Waterfall: base value, the ``max_features`` largest attributions, the others summed,
    and the explained output as the total (a ``go.Figure`` with one ``Waterfall`` trace)."""
    import plotly.graph_objects as go

    values = np.asarray(explanation.attributions[row], dtype=np.float64).reshape(-1)
    names = list(explanation.feature_names) or [f"feature {i}" for i in range(len(values))]
    order = np.argsort(-np.abs(values))
    shown, rest = order[:max_features], order[max_features:]
    base = float(explanation.base_values[row])
    labels = ["base value", *(names[i] for i in shown)]
    measures = ["absolute", *(["relative"] * len(shown))]
    steps = [base, *(float(values[i]) for i in shown)]
    if len(rest):
        labels.append(f"{len(rest)} other features")
        measures.append("relative")
        steps.append(float(values[rest].sum()))
    labels.append("output")
    measures.append("total")
    steps.append(0.0)  # a total's value is computed by plotly from the steps before it
    target = int(explanation.targets[row])
    figure = go.Figure(
        go.Waterfall(
            orientation="h",
            y=labels,
            x=steps,
            measure=measures,
            increasing={"marker": {"color": "#d62728"}},
            decreasing={"marker": {"color": "#1f77b4"}},
            totals={"marker": {"color": "#7f7f7f"}},
        )
    )
    figure.update_layout(
        title=f"{explanation.method}: {explanation.output_name} [{target}] ({explanation.output_space}), row {row}",
        yaxis={"autorange": "reversed"},
        template="plotly_white",
        showlegend=False,
    )
    return figure


def heatmap(explanation: Explanation, row: int = 0) -> Any:
    """Row ``row``'s attributions as a plotly Heatmap (an image's channels, the last dimension of a 3-D row,
    summed), colours diverging around 0."""
    import plotly.graph_objects as go

    values = np.asarray(explanation.attributions[row], dtype=np.float64)
    if values.ndim == 3:
        values = values.sum(axis=-1)
    elif values.ndim == 1:
        values = values.reshape(1, -1)
    elif values.ndim > 3:
        values = values.reshape(values.shape[0], -1)
    limit = float(np.abs(values).max()) or 1.0
    figure = go.Figure(go.Heatmap(z=values, colorscale="RdBu", reversescale=True, zmin=-limit, zmax=limit))
    target = int(explanation.targets[row])
    figure.update_layout(
        title=f"{explanation.method}: {explanation.output_name} [{target}], row {row}",
        yaxis={"autorange": "reversed", "scaleanchor": "x"},
        template="plotly_white",
    )
    return figure
