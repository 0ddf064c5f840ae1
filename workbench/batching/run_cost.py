"""Whether a signature's calls are cheap enough to run on the event loop rather than on an inference thread."""

from __future__ import annotations


class RunCost:
    """Whether one signature's calls are cheap enough to run on the event loop rather than on a thread.

    Calls start on the inference threads. There a call's wall time also counts its wait for the GIL (long while
    the loop is busy, which is when this matters), so a slow call there proves nothing, and :data:`SETTLE_RUNS`
    calls under :data:`INLINE_BUDGET_SECONDS` prove the model cheap. On the loop a call's time is its own: one
    over the budget (a bigger batch, a model grown slow, the machine busy) sends the calls back to the threads
    until they prove cheap again. Only platforms described ``inline`` qualify at all
    (:data:`workbench.platforms.INLINE_PLATFORMS`).
    """

    INLINE_BUDGET_SECONDS = 200e-6  # one call on the loop delays every other request by this much at most
    SETTLE_RUNS = 8

    __slots__ = ("inline", "_cheap_runs", "_allowed")

    def __init__(self, allowed: bool = True) -> None:
        self.inline = False
        self._cheap_runs = 0
        self._allowed = allowed

    def record(self, seconds: float, on_loop: bool) -> None:
        """One call took ``seconds`` (wall time), on the loop or on a thread."""
        cheap = seconds < self.INLINE_BUDGET_SECONDS
        if on_loop:
            if not cheap:
                self.inline, self._cheap_runs = False, 0
        elif cheap and self._allowed:
            self._cheap_runs += 1
            self.inline = self._cheap_runs >= self.SETTLE_RUNS


class CostCurve:
    """What one signature's batches cost by their size, fitted as ``fixed + per_row * rows`` from the batches run.

    A least-squares line over the recent batches (each older batch weighs :data:`DECAY` of the next one's), so it
    follows a model whose speed changes (a warm cache, a busy machine). It knows nothing until batches of
    different sizes have run: under load they do.

    The scheduler asks :meth:`fills_first` before starting a second concurrent batch of a signature: when a call's
    fixed cost dominates (a random forest walks every tree whatever the rows; a GPU call pays its launches and
    copies), a small batch started beside a running one costs almost a full call for a few rows, and on a CPU the two
    calls only share the cores and the GIL; waiting for the running one to end lets the next batch fill with
    everything that arrives meanwhile, as many rows for the cost of one call.
    """

    DECAY = 0.98
    MIN_BATCHES = 8

    __slots__ = ("_weight", "_rows", "_rows_squared", "_seconds", "_rows_seconds", "_batches")

    def __init__(self) -> None:
        self._weight = self._rows = self._rows_squared = self._seconds = self._rows_seconds = 0.0
        self._batches = 0

    def record(self, rows: int, seconds: float) -> None:
        decay = self.DECAY
        self._weight = self._weight * decay + 1.0
        self._rows = self._rows * decay + rows
        self._rows_squared = self._rows_squared * decay + rows * rows
        self._seconds = self._seconds * decay + seconds
        self._rows_seconds = self._rows_seconds * decay + rows * seconds
        self._batches += 1

    def line(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds a row), or None while the batches seen cannot tell them apart."""
        if self._batches < self.MIN_BATCHES:
            return None
        weight, rows = self._weight, self._rows
        spread = weight * self._rows_squared - rows * rows
        if spread <= 1e-9 * weight * weight:  # every batch the same size: no slope to fit
            return None
        per_row = max(0.0, (weight * self._rows_seconds - rows * self._seconds) / spread)
        fixed = max(0.0, (self._seconds - per_row * rows) / weight)
        return fixed, per_row

    def fills_first(self, rows: int) -> bool:
        """Whether a batch of ``rows`` should wait for a running batch to end and grow meanwhile: its call's fixed
        cost is more than its rows' own."""
        line = self.line()
        return line is not None and line[0] > line[1] * rows
