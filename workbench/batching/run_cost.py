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
