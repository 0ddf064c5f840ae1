"""Shadow traffic: a copy of a share of a model's default traffic runs on another version, and the two answers are
compared; the copy's answer reaches nobody.

``:shadow {"version": 2, "fraction": 0.5}`` (the management API, stored in the model's routing like a canary, so
every replica mirrors alike) makes half of the requests that name no version run again on version 2 once they are
answered. The copy is a request of its own (counted under the protocol ``shadow``), started after the client has its
answer, so it never slows that answer: at most ``max_running`` copies run at once (the data plane allows half its
inference threads, so the clients' own calls always find one) and at most ``max_pending`` wait or run; one that
finds them all taken is dropped and counted, so a shadow that falls behind never queues work without bound. Its
failures are counted, never raised.

Each copy's answer is compared with the answer the client got, output by output (:func:`compare`): classes and
labels (integer or text outputs) row by row, scores and probabilities (float outputs of several values a row) by
their argmax, and every float output by its absolute and relative difference. A rolling window of the last
``window`` comparisons per model gives the agreement rate, the differences, both versions' latencies and the
slowest inputs (:meth:`ShadowRecord.summary`), shown in the stats snapshot under ``"shadow"`` and in Prometheus.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from workbench.core.answer_diff import OutputDiff, compare, output_summary
from workbench.observability.metrics import ServingMetrics
from workbench.planes.calls import ModelSpec, RequestInFlight
from workbench.planes.decoupled import Begun, joined


class _Plane(Protocol):
    """What the mirror needs of the data plane (workbench.planes.dataplane.Dataplane, which holds the mirror)."""

    metrics: ServingMetrics

    async def admit(
        self, spec: ModelSpec, api: str, protocol: str, timeout: float | None = None
    ) -> RequestInFlight: ...

    async def predict(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout: float | None = None,
    ) -> tuple[Any, dict[str, np.ndarray]]: ...

    def default_version(self, model: str) -> int | None: ...

    def stream(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str] = (),
        timeout: float | None = None,
    ) -> Begun[dict[str, np.ndarray]]: ...


PROTOCOL = "shadow"  # the protocol label of a copy's request metrics
DEFAULT_MAX_PENDING = 64
DEFAULT_WINDOW = 1000
SLOWEST = 5  # inputs kept as the slowest the shadow answered
RECENT = 200  # copies whose differences the summary lists


@dataclasses.dataclass
class _Compared:
    diffs: dict[str, OutputDiff]
    primary_seconds: float
    shadow_seconds: float


class ShadowRecord:
    """One model's shadow: its counters, and a rolling window of its comparisons."""

    def __init__(self, model: str, version: int, window: int = DEFAULT_WINDOW) -> None:
        self.model, self.version = model, version
        self.mirrored = self.failed = self.dropped = 0
        self._window: collections.deque[_Compared] = collections.deque(maxlen=window)
        self._slowest: list[tuple[float, str]] = []  # (shadow seconds, the inputs, shortened)

    def add(self, compared: _Compared, inputs: Mapping[str, np.ndarray]) -> None:
        self._window.append(compared)
        slowest = [*self._slowest, (compared.shadow_seconds, _shown(inputs))]
        self._slowest = sorted(slowest, reverse=True)[:SLOWEST]

    def summary(self, fraction: float, primary_version: int | None) -> dict[str, Any]:
        """The shadow's record: counters, then the window's agreement, differences and latencies (JSON-ready)."""
        window = list(self._window)
        outputs: dict[str, dict[str, float | None]] = {}
        for alias in dict.fromkeys(alias for item in window for alias in item.diffs):
            diffs = [item.diffs[alias] for item in window if alias in item.diffs]
            outputs[alias] = output_summary(diffs)
        classified = [d for item in window for d in item.diffs.values() if d.agreeing is not None]
        rows = sum(d.rows for d in classified)
        return {
            "version": self.version,
            "primary_version": primary_version,
            "fraction": fraction,
            "mirrored": self.mirrored,
            "compared": len(window),
            "failed": self.failed,
            "dropped": self.dropped,
            "agreement": round(sum(d.agreeing or 0 for d in classified) / rows, 6) if rows else None,
            "outputs": outputs,
            "primary_p50_ms": _ms([item.primary_seconds for item in window], 50),
            "primary_p99_ms": _ms([item.primary_seconds for item in window], 99),
            "p50_ms": _ms([item.shadow_seconds for item in window], 50),
            "p99_ms": _ms([item.shadow_seconds for item in window], 99),
            "slowest": [{"ms": round(seconds * 1000, 3), "inputs": shown} for seconds, shown in self._slowest],
            # The latest copies' largest float difference each: the distribution the dashboard draws.
            "recent_abs_diffs": [
                round(worst, 9)
                for item in window[-RECENT:]
                if (worst := _worst_abs(item.diffs)) is not None and math.isfinite(worst)
            ],
        }


def _worst_abs(diffs: Mapping[str, OutputDiff]) -> float | None:
    values = [diff.max_abs for diff in diffs.values() if diff.max_abs is not None]
    return max(values) if values else None


def _ms(seconds: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(seconds, q)) * 1000, 3) if seconds else None


def _shown(inputs: Mapping[str, np.ndarray]) -> str:
    text = ", ".join(f"{name}={np.asarray(value).tolist()!r}" for name, value in inputs.items())
    return text if len(text) <= 200 else text[:197] + "..."


class ShadowTraffic:
    """The data plane's mirror: copies default requests to a model's shadow version and compares the answers."""

    def __init__(
        self,
        dataplane: _Plane,
        shadow_of: Callable[[str], tuple[int, float] | None],
        max_pending: int = DEFAULT_MAX_PENDING,
        max_running: int = DEFAULT_MAX_PENDING,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self._dataplane = dataplane
        self._shadow_of = shadow_of  # the model's shadow version and share, from its route (lock-free)
        self.max_pending = max_pending
        self.max_running = max_running
        self._running: asyncio.Semaphore | None = None  # made on the loop, by the first copy
        self.window = window
        self._pending = 0
        self._records: dict[str, ShadowRecord] = {}
        self._shares: dict[str, tuple[tuple[int, float], int, int]] = {}  # model → (shadow, requests, copies)
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str],
        answered: Mapping[str, np.ndarray],
    ) -> None:
        """After a default request is answered: a copy of it to the shadow, if the model has one and this request
        is in its share."""
        found = self._shadow_of(call.model)
        if found is None or found[0] == call.version or not self._sampled(call.model, found):
            return
        record = self._record(call.model, found[0])
        record.mirrored += 1
        if self._pending >= self.max_pending:
            record.dropped += 1
            self._dataplane.metrics.observe_shadow(call.model, found[0], "dropped")
            return
        self._pending += 1
        primary_seconds = call.elapsed_seconds
        task = asyncio.get_running_loop().create_task(
            self._copy(record, signature_name, dict(inputs), tuple(output_filter), dict(answered), primary_seconds)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def shadowed(self, model: str) -> bool:
        """Whether ``model`` has a shadow now (a decoupled stream keeps its responses for it only then)."""
        return self._shadow_of(model) is not None

    def _sampled(self, model: str, shadow: tuple[int, float]) -> bool:
        """Exactly ``fraction`` of the model's default requests, as the canary's split counts them."""
        key, requests, copies = self._shares.get(model, (shadow, 0, 0))
        if key != shadow:
            requests, copies = 0, 0
        requests += 1
        take = (copies + 1) * 1_000_000 <= requests * round(shadow[1] * 1_000_000)
        self._shares[model] = (shadow, requests, copies + take)
        return take

    def _record(self, model: str, version: int) -> ShadowRecord:
        record = self._records.get(model)
        if record is None or record.version != version:  # a new shadow: a new record
            record = self._records[model] = ShadowRecord(model, version, self.window)
        return record

    async def _copy(
        self,
        record: ShadowRecord,
        signature_name: str,
        inputs: dict[str, np.ndarray],
        output_filter: tuple[str, ...],
        answered: dict[str, np.ndarray],
        primary_seconds: float,
    ) -> None:
        dataplane = self._dataplane
        if self._running is None:
            self._running = asyncio.Semaphore(self.max_running)
        started = time.perf_counter()
        try:
            async with self._running:  # its turn among the copies: the shadow's latency is counted from here
                started = time.perf_counter()
                spec = ModelSpec(record.model, version=record.version, signature_name=signature_name)
                with await dataplane.admit(spec, "predict", PROTOCOL) as call:
                    if call.servable.decoupled:  # a generator's shadow: its responses joined, as the primary's were
                        stream = dataplane.stream(call, signature_name, inputs, output_filter)
                        async with contextlib.aclosing(stream) as responses:
                            outputs = joined([response async for response in responses])
                    else:
                        _, outputs = await dataplane.predict(call, signature_name, inputs, output_filter)
        except Exception:  # noqa: BLE001 - a shadow's failure is counted (its request metrics say why), never raised
            record.failed += 1
            dataplane.metrics.observe_shadow(record.model, record.version, "failed")
            return
        finally:
            self._pending -= 1
        compared = _Compared(compare(answered, outputs), primary_seconds, time.perf_counter() - started)
        record.add(compared, inputs)
        dataplane.metrics.observe_shadow(record.model, record.version, "compared", compared.diffs)

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Each model with a shadow now: its record (JSON-ready)."""
        found = {}
        for model, record in list(self._records.items()):
            shadow = self._shadow_of(model)
            if shadow is None or shadow[0] != record.version:
                continue
            found[model] = record.summary(shadow[1], self._dataplane.default_version(model))
        return found

    async def stop(self) -> None:
        """Let the copies running end (the server is stopping)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)


def figures(summary: Mapping[str, Any]) -> dict[str, float | int | None]:
    """A shadow record's figures by the names a promotion's condition uses: ``agreement``, ``p50_ms``, ``p99_ms``
    (the shadow's), ``primary_p50_ms``, ``primary_p99_ms``, ``compared``, ``mirrored``, ``failed``, ``dropped``, and
    the worst output's ``mean_abs_diff``, ``max_abs_diff`` and ``mean_rel_diff``."""
    outputs = list(summary.get("outputs", {}).values())

    def worst(name: str) -> float | None:
        values = [output[name] for output in outputs if output.get(name) is not None]
        return max(values) if values else None

    names = ("agreement", "p50_ms", "p99_ms", "primary_p50_ms", "primary_p99_ms", "compared", "mirrored", "failed")
    found: dict[str, float | int | None] = {name: summary.get(name) for name in (*names, "dropped")}
    found.update({name: worst(name) for name in ("mean_abs_diff", "max_abs_diff", "mean_rel_diff")})
    return found
