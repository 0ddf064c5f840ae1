"""A plotly chart the dashboard keeps drawing into, rebuilt when the browser has stopped taking its changes.

plotly's ``FigureWidget`` is an anywidget: the browser runs the figure's JavaScript (plotly.js, about 5 MB, sent and
parsed afresh for every figure) before it applies any message from the kernel, and anywidget gives that 2 seconds.
A figure not ready by then drops every later message for good (anywidget 0.11, the ``Runtime`` of its widget.js):
its chart stays as it was when the kernel created it, which for plotly is empty, since a ``FigureWidget`` sends its
data and layout just after its creation. A busy machine or a slow browser crosses the 2 seconds, and a live chart
then stays blank however long it runs.

So every figure here opens its link to the browser with its data and layout in it (:func:`figure_widget`): one
whose script loads too late still draws what it held when created, and a static one (the analyzer's) draws whole.

The browser also tells the kernel which changes it drew: after each change to the traces, every view of a figure
sends back the id of that change (``_js2py_traceDeltas``, plotly's own protocol), and a view sends the id it knows
when it first draws. A figure whose view has spoken but whose changes stay unacknowledged for a while, over several
draws, is taken for one the browser stopped listening to: :class:`LiveFigure` builds a new ``FigureWidget`` from
the kernel's copy of the figure in its place, in the same box (a plain ipywidgets box, which has no such limit).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import ipywidgets as widgets

log = logging.getLogger(__name__)

# How long, and over how many draws, the browser may leave a change undrawn before the figure is rebuilt. Loose:
# a browser that is only slow catches up well within it, and a rebuild sends plotly.js to the browser again.
STALL_SECONDS = 20.0
STALL_DRAWS = 5
# A figure whose box is no longer shown anywhere never answers again; rebuilding it is then pointless, so a few.
MAX_REBUILDS = 3


@functools.cache
def _figure_widget_class() -> type:
    import plotly.graph_objects as go

    class FigureWidget(go.FigureWidget):  # type: ignore[misc]
        """A ``FigureWidget`` whose comm opens once its data and layout are set, so they travel in the message that
        creates the browser's model (plotly opens it first, then sends them as a change, which a model that is not
        ready in time drops)."""

        _open_later = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._open_later = True
            try:
                super().__init__(*args, **kwargs)
            finally:
                self._open_later = False
            self.open()

        def open(self) -> None:
            if not self._open_later:
                super().open()

    return FigureWidget


def figure_widget(figure: Any = None) -> Any:
    """A plotly ``FigureWidget`` of ``figure`` (a figure, a dict, or None) that the browser draws whole however
    late it loads plotly.js; changes made later still need a browser that was ready in time (:class:`LiveFigure`)."""
    return _figure_widget_class()(figure)


class LiveFigure:
    """A ``FigureWidget`` (:attr:`figure`) inside :attr:`widget`, the box to display.

    Change :attr:`figure` as any ``FigureWidget``, on the kernel's thread, then call :meth:`drawn`: it rebuilds the
    figure if the browser has not drawn its changes for :data:`STALL_SECONDS` and :data:`STALL_DRAWS` draws. Read
    :attr:`figure` anew each time: a rebuild replaces it."""

    def __init__(self, figure: Any = None) -> None:
        self.widget = widgets.VBox()
        self.rebuilds = 0
        self._attach(figure_widget(figure))

    def _attach(self, figure: Any) -> None:
        self.figure = figure
        self._heard = False  # whether a view of this figure has said anything yet
        self._acknowledged = -1  # the newest trace change a view has said it drew
        self._behind_since: float | None = None
        self._awaited = 0  # the change sent when the figure was first seen behind
        self._behind_draws = 0
        figure.observe(self._acknowledge, names="_js2py_traceDeltas")
        self.widget.children = (figure,)

    def _acknowledge(self, change: dict[str, Any]) -> None:
        message = change["new"]
        if isinstance(message, dict) and isinstance(message.get("trace_edit_id"), int):
            self._heard = True
            self._acknowledged = max(self._acknowledged, message["trace_edit_id"])

    def drawn(self) -> None:
        """Note that :attr:`figure` was just changed; rebuild it if the browser stopped drawing it."""
        sent = int(self.figure._last_trace_edit_id)  # noqa: SLF001 - plotly tells the edits it sent nowhere else
        if not self._heard or self._acknowledged >= sent:
            self._behind_since = None  # no view yet (nothing to draw into), or every change drawn
            return
        now = time.monotonic()
        if self._behind_since is None or self._acknowledged >= self._awaited:
            # Behind now, or still behind but the browser drew what it was behind on last time: a new count.
            self._behind_since, self._awaited, self._behind_draws = now, sent, 0
            return
        self._behind_draws += 1
        stalled = now - self._behind_since >= STALL_SECONDS and self._behind_draws >= STALL_DRAWS
        if stalled and self.rebuilds < MAX_REBUILDS:
            self.rebuild()

    def rebuild(self) -> None:
        """Put a new ``FigureWidget``, holding what :attr:`figure` holds, in its place."""
        stuck = self.figure
        self.rebuilds += 1
        log.info(
            "a chart's browser side drew none of its changes for %.0f s (the browser took too long to load it); "
            "rebuilding it (%d of %d)", STALL_SECONDS, self.rebuilds, MAX_REBUILDS,
        )  # fmt: skip
        self.replace(stuck)

    def replace(self, figure: Any) -> None:
        """Put a new ``FigureWidget`` of ``figure`` (a figure, a dict, a ``FigureWidget``) in :attr:`figure`'s place:
        a stuck one's copy, or a figure laid out anew (a live chart's rows added)."""
        old = self.figure
        self._attach(figure_widget(figure))
        old.close()
