"""The dashboard's charts against a browser that loaded plotly.js too late (anywidget's 2 s) and drops their changes.

The browser side is played here by what it sends the kernel: plotly's acknowledgement of each trace change a view
drew (``_js2py_traceDeltas``), and the message that opens each figure's model. tests/system/test_live_figure_browser.py
runs the same against a real, slowed Chromium."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import pytest
from ipywidgets.widgets import widget as ipywidget

from workbench.notebook import live_figure
from workbench.notebook.live_figure import LiveFigure, figure_widget


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The state each widget's model is created with in the browser (the comm_open message's), in order."""
    states: list[dict[str, Any]] = []
    create = ipywidget.comm.create_comm

    def recording(**kwargs: Any) -> Any:
        states.append(kwargs["data"]["state"])
        return create(**kwargs)

    monkeypatch.setattr(ipywidget.comm, "create_comm", recording)
    return states


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stall is declared after 5 draws, without the 20 s wait."""
    monkeypatch.setattr(live_figure, "STALL_SECONDS", 0.0)


def acknowledge(live: LiveFigure, edit_id: int | None = None) -> None:
    """What a view of the figure sends after drawing the trace change ``edit_id`` (the newest when None)."""
    figure = live.figure
    figure._js2py_traceDeltas = {
        "trace_deltas": [],
        "trace_edit_id": figure._last_trace_edit_id if edit_id is None else edit_id,
    }


def change(live: LiveFigure, step: int) -> None:
    trace = live.figure.data[0]
    trace.x, trace.y = (*trace.x, step), (*trace.y, step % 3)
    live.drawn()


def line(points: int = 2) -> go.Figure:
    return go.Figure(data=[go.Scatter(x=list(range(points)), y=[0] * points)], layout={"height": 300})


def test_a_figures_model_is_created_with_its_data_and_layout(opened: list[dict[str, Any]]) -> None:
    # plotly's own FigureWidget opens its model empty and sends data and layout as a change just after: a model
    # that is late to load drops that change, and draws an empty chart forever.
    go.FigureWidget(line())
    assert opened[-1]["_widget_data"] == [] and opened[-1]["_widget_layout"] == {}
    figure_widget(line(3))
    assert [trace["x"] for trace in opened[-1]["_widget_data"]] == [[0, 1, 2]]
    assert opened[-1]["_widget_layout"]["height"] == 300


def test_a_view_that_draws_every_change_keeps_its_figure(quick: None) -> None:
    live = LiveFigure(line())
    first = live.figure
    acknowledge(live)  # the view's first draw
    for step in range(2, 40):
        change(live, step)
        acknowledge(live)
    assert live.figure is first and live.rebuilds == 0


def test_a_browser_slow_to_draw_is_given_time_while_it_catches_up(quick: None) -> None:
    live = LiveFigure(line())
    first = live.figure
    acknowledge(live)
    for step in range(2, 60):
        change(live, step)
        if step % 4 == 0:  # the view draws, four changes behind: slow, not deaf
            acknowledge(live, live.figure._last_trace_edit_id - 4)
    assert live.figure is first and live.rebuilds == 0


def test_a_figure_never_shown_is_not_rebuilt(quick: None) -> None:
    live = LiveFigure(line())
    for step in range(2, 40):
        change(live, step)
    assert live.rebuilds == 0


def test_a_figure_whose_view_stopped_taking_changes_is_rebuilt_whole_in_its_box(
    quick: None, opened: list[dict[str, Any]]
) -> None:
    live = LiveFigure(line())
    stuck = live.figure
    acknowledge(live, 0)  # the view drew what the model was created with, and nothing after: its model is deaf
    for step in range(2, 2 + live_figure.STALL_DRAWS + 1):
        change(live, step)
    assert live.rebuilds == 1 and live.figure is not stuck
    assert live.widget.children == (live.figure,)
    assert stuck.comm is None  # closed: the browser drops its model
    drawn = list(range(2 + live_figure.STALL_DRAWS + 1))
    assert list(live.figure.data[0].x) == drawn  # the kernel's copy, every change included,
    assert list(opened[-1]["_widget_data"][0]["x"]) == drawn  # in the message that creates the new model
    # The new figure is watched afresh: a view that draws it keeps it.
    acknowledge(live)
    for step in range(20, 40):
        change(live, step)
        acknowledge(live)
    assert live.rebuilds == 1


def test_rebuilds_stop_after_a_few(quick: None) -> None:
    # A box no longer shown anywhere (its cell cleared) never answers: rebuilding it forever would resend plotly.js.
    live = LiveFigure(line())
    step = 2
    while step < 200:
        acknowledge(live, 0)
        for _ in range(live_figure.STALL_DRAWS + 2):
            change(live, step)
            step += 1
    assert live.rebuilds == live_figure.MAX_REBUILDS
