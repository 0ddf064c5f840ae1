"""Whether a signature's calls are cheap enough to run on the event loop rather than on an inference thread."""

from __future__ import annotations

import resource
import time

# getrusage's per-thread form (Linux): a thread's CPU time and its involuntary context switches in one call.
_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


def thread_mark() -> tuple[float, int, int]:
    """The calling thread's CPU seconds, voluntary and involuntary context switches so far (0 where the OS does not
    say): taken before and after a call on the event loop, for :func:`since`."""
    if _RUSAGE_THREAD is None:
        return time.thread_time(), 0, 0
    usage = resource.getrusage(_RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw


def since(mark: tuple[float, int, int]) -> tuple[float, bool]:
    """The calling thread's CPU seconds since ``mark`` (:func:`thread_mark`), and whether the call's waits were all
    the OS's: it was preempted (its core taken while it ran) and never waited of its own accord (a sleep, I/O, a
    lock, the framework's own threads, the GIL)."""
    cpu, voluntary, involuntary = thread_mark()
    return cpu - mark[0], involuntary > mark[2] and voluntary == mark[1]


class RunCost:
    """Whether one signature's calls are cheap enough to run on the event loop rather than on a thread.

    Calls start on the inference threads. There a call's wall time also counts its wait for the GIL (long while
    the loop is busy, which is when this matters), so a slow call there proves nothing, and :data:`SETTLE_RUNS`
    calls under :data:`INLINE_BUDGET_SECONDS` prove the model cheap. A model under load from its first request
    may never show such a call; where a call's own CPU time on its thread was within budget while its wall time
    was not, but stayed under :data:`PROBE_WALL_LIMIT_SECONDS` (what waits for the GIL take, not a wait on I/O),
    the next call is a *probe*: it runs on the loop and is timed there. On the loop a call's time is its
    own: one within budget keeps (or puts) the calls there; a probe over budget, two settled calls in a row over
    it, or one over :data:`HICCUP_SECONDS` (a bigger batch, a model grown slow, work done on the framework's own
    threads, which a thread's CPU time does not see) send them back to the threads until they prove cheap again
    (a single call a little over budget is the machine's hiccup, a preempted loop, and is let pass), and the next
    probe waits :data:`FIRST_PROBE_WAIT_SECONDS`, twice as long after each probe that failed, up to
    :data:`LAST_PROBE_WAIT_SECONDS`. A call on the loop that only the OS kept waiting (*preempted*: another process
    took the core, on a busy machine every few calls) and whose own CPU time stayed within budget is as cheap as it
    was: its wall time says nothing of the model, and sending the calls to the threads for it cost each a hop
    (about 0.2 ms of CPU for half_plus_two over gRPC) for seconds. A call that waited of its own accord at all (on
    the framework's threads, on I/O, for the GIL) is judged by its wall time, as before. Only platforms described
    ``inline`` qualify at all (:data:`workbench.platforms.INLINE_PLATFORMS`).
    """

    INLINE_BUDGET_SECONDS = 200e-6  # one call on the loop delays every other request by this much at most
    SETTLE_RUNS = 8
    FIRST_PROBE_WAIT_SECONDS = 1.0
    LAST_PROBE_WAIT_SECONDS = 60.0
    PROBE_WALL_LIMIT_SECONDS = 5e-3
    HICCUP_SECONDS = 2e-3
    # With one client (workbench.planes.one_client), a call up to this long runs on the loop: nobody else's request
    # waits behind it (a second client's first one, at most once, as behind a hiccup).
    ONE_CLIENT_BUDGET_SECONDS = HICCUP_SECONDS
    TYPICAL_SHARE = 0.1  # the weight of each new call in the typical call's seconds (after the first few)

    __slots__ = (
        "inline", "_cheap_runs", "_allowed", "_maybe_cheap", "_next_probe", "_probe_wait", "_slow_on_loop",
        "_typical", "_calls",
    )  # fmt: skip

    def __init__(self, allowed: bool = True) -> None:
        self.inline = False
        self._cheap_runs = 0
        self._allowed = allowed
        self._maybe_cheap = False  # a call on a thread used little CPU: worth timing one on the loop
        self._next_probe = 0.0  # time.monotonic() from which a probe may run
        self._probe_wait = self.FIRST_PROBE_WAIT_SECONDS
        self._slow_on_loop = False  # the last call on the loop, of calls settled there, was over budget
        self._typical = 0.0  # a call's wall seconds, wherever it ran (the mean of the first calls, then weighted)
        self._calls = 0

    def record(self, seconds: float, on_loop: bool, cpu_seconds: float | None = None, preempted: bool = False) -> None:
        """One call took ``seconds`` (wall time), on the loop or on a thread; ``cpu_seconds`` is its thread's own
        CPU time for the call, where measured; ``preempted``: the OS took the loop's core during the call."""
        self._typical_call(seconds)
        budget = self.INLINE_BUDGET_SECONDS
        cheap = seconds < budget
        if on_loop:
            if preempted and cpu_seconds is not None and cpu_seconds < budget:
                cheap = True  # slow only because another process ran: the model is as cheap as it was
            if cheap:
                self.inline = self._allowed
                self._probe_wait = self.FIRST_PROBE_WAIT_SECONDS
                self._slow_on_loop = False
            elif self.inline and not self._slow_on_loop and seconds < self.HICCUP_SECONDS:
                # One call a little over budget among cheap ones: the machine's hiccup (the loop's thread preempted
                # by another process), not the model. A second in a row, or one far over, is the model.
                self._slow_on_loop = True
            else:
                self.inline, self._cheap_runs, self._maybe_cheap, self._slow_on_loop = False, 0, False, False
                self._next_probe = time.monotonic() + self._probe_wait
                self._probe_wait = min(2 * self._probe_wait, self.LAST_PROBE_WAIT_SECONDS)
        elif self._allowed:
            if cheap:
                self._cheap_runs += 1
                self.inline = self._cheap_runs >= self.SETTLE_RUNS
            elif cpu_seconds is not None and cpu_seconds < budget and seconds < self.PROBE_WALL_LIMIT_SECONDS:
                self._maybe_cheap = True

    def runs_on_loop(self) -> bool:
        """Whether the next call runs on the loop: the calls are there, or it is a probe that is due."""
        return self.inline or (self._maybe_cheap and time.monotonic() >= self._next_probe)

    def record_for_one_client(self, seconds: float) -> None:
        """A call run on the loop for one client took ``seconds`` (wall time). Recorded here alone: it was over the
        inline budget, and says nothing of whether calls belong on the loop under load."""
        self._typical_call(seconds)

    def _typical_call(self, seconds: float) -> None:
        """The typical call's wall seconds, wherever calls ran: the mean of the first calls, then weighted."""
        self._calls += 1
        self._typical += (seconds - self._typical) * max(1.0 / self._calls, self.TYPICAL_SHARE)

    def runs_for_one_client(self) -> bool:
        """Whether the next call runs on the loop when the server has one client: the calls may run there at all,
        and have taken under :data:`ONE_CLIENT_BUDGET_SECONDS` of wall time (where they ran: on a thread that
        counts its waits for the interpreter lock, so calls seen only under load have to prove cheaper)."""
        return self._allowed and self._calls >= self.SETTLE_RUNS and self._typical < self.ONE_CLIENT_BUDGET_SECONDS


class _Line:
    """A least-squares line ``seconds = fixed + per_row * rows`` over recent batches (each older batch weighs
    :data:`CostCurve.DECAY` of the next one's)."""

    __slots__ = ("_weight", "_rows", "_rows_squared", "_seconds", "_rows_seconds", "batches")

    def __init__(self) -> None:
        self._weight = self._rows = self._rows_squared = self._seconds = self._rows_seconds = 0.0
        self.batches = 0

    def record(self, rows: int, seconds: float, decay: float) -> None:
        self._weight = self._weight * decay + 1.0
        self._rows = self._rows * decay + rows
        self._rows_squared = self._rows_squared * decay + rows * rows
        self._seconds = self._seconds * decay + seconds
        self._rows_seconds = self._rows_seconds * decay + rows * seconds
        self.batches += 1

    def fit(self, least: int) -> tuple[float, float] | None:
        if self.batches < least:
            return None
        weight, rows = self._weight, self._rows
        spread = weight * self._rows_squared - rows * rows
        if spread <= 1e-9 * weight * weight:  # every batch the same size: no slope to fit
            return None
        per_row = max(0.0, (weight * self._rows_seconds - rows * self._seconds) / spread)
        fixed = max(0.0, (self._seconds - per_row * rows) / weight)
        return fixed, per_row


class CostCurve:
    """What one signature's batches cost by their size, fitted as ``fixed + per_row * rows`` from the batches run:
    those that ran alone, and apart those that ran beside another batch of the same signature.

    It follows a model whose speed changes (a warm cache, a busy machine), and knows nothing until batches of
    different sizes have run: under load they do.

    The scheduler asks :meth:`fills_first` before starting a second concurrent batch of a signature. When a call's
    fixed cost dominates and calls slow each other down when they overlap (a random forest walks every tree whatever
    the rows, under the GIL, on the same cores), a small batch started beside a running one costs almost a full call
    for a few rows: waiting for the running one to end lets the next batch fill with everything that arrives
    meanwhile, as many rows for the cost of one call. Where overlapping calls cost what they cost alone (a GPU's
    kernels, a call that waits on I/O, the hand-offs between the loop and the threads), batches keep overlapping.
    """

    DECAY = 0.98
    MIN_BATCHES = 8
    CONTENDED = 1.5  # beside another batch, a call's fixed cost grows this much or more: the calls compete
    GATHER_MIN_SECONDS = 1e-3
    # A gather waits until the queue has not grown for GATHER_QUIET_SHARE of the fixed cost since its last arrival,
    # GATHER_LONGEST_SHARE in all, and ends at once with the rows expected back (the callers the batch before
    # answered, and those that waited for it) or a full batch. A tenth was too short: after a batch the loop writes
    # every answer before it reads the callers' next requests, and for 32 answered callers of a 200-tree forest
    # (11-18 ms a call) that often took longer, so gathers ended before they were back (a quarter: 1.09-1.35x the
    # forest's requests over REST, front_door.py heavy-1x32). Over gRPC, whose answers cost the loop more, a quarter
    # was still too short: the first caller came back 8 ms (p50) after a 31 ms batch ended, all 32 after 23 ms, and
    # batches alternated between those who waited and those answered (17 rows on average, a batch of one in seven).
    # Three quarters, with the quiet spell counted from the first arrival and the expected rows ending it: the
    # forest's gRPC requests 1.75-1.77x over the quarter, its REST 0.93-1.20x (front_door.py heavy-1x32, 5 rounds;
    # half served about 0.85x of three quarters over gRPC in a quick A/B). A gather that waits it out still costs
    # its requests less than a second call would.
    GATHER_QUIET_SHARE = 0.25
    GATHER_LONGEST_SHARE = 0.75

    __slots__ = ("_alone", "_beside")

    def __init__(self) -> None:
        self._alone = _Line()
        self._beside = _Line()

    def record(self, rows: int, seconds: float, beside: bool = False) -> None:
        (self._beside if beside else self._alone).record(rows, seconds, self.DECAY)

    def line(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds a row) of the batches run alone, or None while they cannot tell them apart."""
        return self._alone.fit(self.MIN_BATCHES)

    def line_beside(self) -> tuple[float, float] | None:
        """The same, of the batches that ran beside another."""
        return self._beside.fit(self.MIN_BATCHES)

    def gathering(self, rows: int) -> tuple[float, float] | None:
        """Whether a batch of ``rows`` about to start as the last one ended should first let the event loop take in
        the requests that arrived meanwhile, and if so for how long: None, or (quiet, longest) seconds.

        It should where its call costs at least :data:`GATHER_MIN_SECONDS`, mostly its fixed part: each row the
        wait adds is one more answer from the same call. Once a request has arrived, it waits for one more until
        none came for ``quiet`` (:data:`GATHER_QUIET_SHARE` of the fixed cost: an answer's trip to its client and
        the client's next request, a few loop turns), and ``longest`` in all (:data:`GATHER_LONGEST_SHARE`): a batch
        that gathers nothing costs its requests that much more latency at most, less than a second call."""
        alone = self.line()
        if alone is None or alone[0] < self.GATHER_MIN_SECONDS or alone[0] <= alone[1] * rows:
            return None
        return alone[0] * self.GATHER_QUIET_SHARE, alone[0] * self.GATHER_LONGEST_SHARE

    def rows_dominate(self, rows: int) -> bool:
        """Whether a batch of ``rows`` is known to cost mostly its rows' own part (a forward pass a row, not a fixed
        cost a call): a batch started sooner with fewer rows then costs no more a row."""
        alone = self.line()
        return alone is not None and alone[0] <= alone[1] * rows

    def fills_first(self, rows: int) -> bool:
        """Whether a batch of ``rows`` should wait for a running batch to end and grow meanwhile: its call's fixed
        cost is more than its rows' own, and calls run side by side have been seen to slow each other down (before
        any ran side by side, they may: that is how it is learnt)."""
        alone = self.line()
        if alone is None or alone[0] <= alone[1] * rows:
            return False
        beside = self.line_beside()
        return beside is not None and beside[0] >= self.CONTENDED * alone[0]


class Contention:
    """Whether one signature's unbatched calls slow each other down when they run at once: the mean seconds of the
    calls that ran alone against those that ran beside another (exponentially weighted, as :class:`CostCurve`).

    Requests with batching off each run their own call, on as many threads as are free. A model whose calls hold
    the GIL or every core (a random forest in scikit-learn) then runs several calls at once each several times
    slower, for no more answers a second, and every request waits the longer: once that is seen, its calls take
    turns instead (:meth:`contended`). Calls under :data:`MIN_SECONDS` never do: for them a turn's hand-off costs
    more than the overlap. Turns never stall behind a call that waits rather than computes (on a lock, a file, a
    remote service): where no call has ended for :meth:`patience`, the next is let in beside it.
    """

    DECAY = 0.95
    MIN_CALLS = 8
    MIN_SECONDS = 0.001
    CONTENDED = 1.5
    STALL_FACTOR = 4.0
    MIN_STALL_SECONDS = 0.1

    __slots__ = ("_alone", "_beside", "_beside_cpu", "_alone_calls", "_beside_calls")

    def __init__(self) -> None:
        self._alone = self._beside = self._beside_cpu = 0.0
        self._alone_calls = self._beside_calls = 0

    def record(self, seconds: float, beside: bool, cpu_seconds: float | None = None) -> None:
        """One call of ``seconds`` (wall time), alone or beside another; ``cpu_seconds``: its thread's own CPU time
        (None: not measured, taken as the wall time)."""
        # The plain mean of the first calls, then the weighted one: a first odd call does not linger.
        if beside:
            self._beside_calls += 1
            share = max(1.0 / self._beside_calls, 1.0 - self.DECAY)
            self._beside += (seconds - self._beside) * share
            cpu = seconds if cpu_seconds is None else cpu_seconds
            self._beside_cpu += (cpu - self._beside_cpu) * share
        else:
            self._alone_calls += 1
            share = max(1.0 / self._alone_calls, 1.0 - self.DECAY)
            self._alone += (seconds - self._alone) * share

    def takes_turns(self) -> bool:
        """Whether the next call should wait until no other runs: its calls contend, or they are still to be seen
        alone (a model under load from its first request has only calls side by side to go by: a few take turns,
        and it is known). Calls that use under :data:`MIN_SECONDS` of their thread's CPU side by side need not be
        seen alone: cheap ones never contend, and those that mostly wait (on I/O, on a device) overlap freely."""
        learning = (
            self._beside_calls >= self.MIN_CALLS
            and self._alone_calls < self.MIN_CALLS
            and self._beside_cpu >= self.MIN_SECONDS
        )
        return learning or self.contended()

    def patience(self) -> float:
        """Seconds calls taking turns may go without one ending before the next waiter runs beside them: several
        times a call's usual length (a call that long is waiting, not contending), and never under
        :data:`MIN_STALL_SECONDS`."""
        return max(self.MIN_STALL_SECONDS, self.STALL_FACTOR * max(self._alone, self._beside))

    def contended(self) -> bool:
        return (
            self._alone_calls >= self.MIN_CALLS
            and self._beside_calls >= self.MIN_CALLS
            and self._alone >= self.MIN_SECONDS
            and self._beside >= self.CONTENDED * self._alone
        )
