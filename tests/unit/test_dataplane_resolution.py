"""The dataplane in-process on fakes: which servable a request resolves to, what it holds, how it is answered and
counted, with no framework and no sockets.

An :class:`Engine` wires :class:`~workbench.planes.dataplane.Dataplane` as ``workbench/server.py`` does (a
:class:`~workbench.models.manager.Manager`, the repository source, inference threads, a
:class:`~workbench.batching.scheduler.BatchScheduler` whose batch records feed the metrics and the rolling stats, and
optionally a :class:`~workbench.planes.response_cache.ResponseCache`), on empty version folders in ``tmp_path``
loaded by a :class:`~fakes.FakeLoader`: every servable answers ``y = x * 1 + version``, so an answer to ``x = 0``
says which version ran it. Requests enter as the frontends' do: ``with await dataplane.admit(...) as call``, then
``dataplane.predict(call, ...)``.

Covered: a request naming no version (the newest, or the promoted stable one), naming a version or a label; the
exact codes and texts of an unknown model, version or label (those the REST, gRPC and v2 frontends pass on); a
canary's exact share of default traffic, never of requests naming a version; the old servable held through a
version swap by a request in flight (and by one its deadline answered early), closed only once that run returned;
a first load that ``admit`` waits for, bounded by the deadline and the flag; a failed load's error; the metrics,
rolling stats and statistics of each request; the response cache, keyed on the resolved version; and the routing
policy's pure parts (:mod:`workbench.models.routing.policy`). Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import FakeRepository, FakeServable, version_folders

from workbench.batching.scheduler import BatchRecord, BatchScheduler
from workbench.batching.threads import InferenceThreads
from workbench.config.batching_parameters import BatchingParameters
from workbench.config.version_policy import VersionPolicy
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import Signature
from workbench.models.manager import VersionState
from workbench.models.routing.policy import CanarySplit, Routing, decide, default_version, labels_of, shares
from workbench.observability.metrics import ServingMetrics
from workbench.observability.stats import RollingStats
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.planes.response_cache import ResponseCache
from workbench.server import CacheCounts

WAIT = 5.0  # seconds any one wait may take before a test fails (they take milliseconds)
API, PROTOCOL = "predict", "unit"
LATEST = VersionPolicy()  # TF Serving's default: latest(1)
ALL = VersionPolicy(kind="all")


# ------------------------------------------------------------------------------------------------ waiting
def until(condition: Callable[[], bool], what: str) -> None:
    """Block until ``condition()`` holds (the manager's threads make it so), or fail after :data:`WAIT`."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"never came true: {what}"
        time.sleep(0.002)


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """:func:`until` on the event loop: the loop keeps running (answers and releases arrive through it)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"never came true: {what}"
        await asyncio.sleep(0.002)


async def outcome_within(task: asyncio.Future[Any], seconds: float) -> str | None:
    """None while ``task`` is still pending after ``seconds``; else what it ended with, retrieved (a failing test
    leaves no "exception never retrieved" to be logged from the garbage collector in the middle of its report)."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        return None
    if task.cancelled():
        return "cancelled"
    return repr(task.exception() or task.result())


# ------------------------------------------------------------------------------------------------ the engine
class Engine(FakeRepository):
    """What ``ModelServer.__init__`` builds around the dataplane, minus the frontends, on a fake loader."""

    def __init__(
        self,
        root: Path,
        *,
        cache_models: Sequence[str] = (),
        first_load_wait: float = WAIT,
        allow_labels_for_unavailable: bool = False,
        batching: BatchingParameters | None = None,
    ) -> None:
        """``batching``: every model's batching parameters (None: no model batches)."""
        super().__init__(root, allow_labels_for_unavailable=allow_labels_for_unavailable)
        self.metrics = ServingMetrics()
        self.stats = RollingStats()
        self.threads = InferenceThreads(2, "unit-dataplane")
        self.scheduler = BatchScheduler(self.threads, lambda servable: batching, listener=self._on_batch)
        self.batch_records: list[BatchRecord] = []
        counts = CacheCounts(self.stats, self.metrics)
        self.cache = ResponseCache(1 << 20, cache_models, counts) if cache_models else None
        self.dataplane = Dataplane(
            self.manager,
            self.metrics,
            self.stats,
            self.threads,
            self.scheduler,
            first_load_wait=first_load_wait,
            cache=self.cache,
        )
        self.manager.add_listener(self._on_state_change)

    def _on_batch(self, record: BatchRecord) -> None:
        self.batch_records.append(record)
        self.metrics.observe_batch(record)
        self.stats.record_batch(record.model, record.version, record.size, record.tasks)

    def _on_state_change(self, model: str, version: int, state: VersionState) -> None:
        if state == VersionState.END and self.cache is not None:
            self.cache.evict(model, version)

    # ---------------------------------------------------------------------------------------- models

    def add_version(self, name: str, version: int) -> None:
        """A new version folder, listed now (its load and the unloads it brings run on the manager's threads)."""
        version_folders(self.root, name, version)
        self.source.poll_once()

    def stop(self) -> None:
        super().stop()
        self.threads.shutdown(wait=False)

    def state(self, name: str, version: int) -> VersionState | None:
        return self.manager.served.version_state(name, version)

    # -------------------------------------------------------------------------------------- requests
    async def predict(self, spec: ModelSpec, x: float = 0.0, timeout: float | None = None) -> tuple[int, float]:
        """One predict of ``x``, admitted, run and counted as a frontend's: the version that held it, and ``y``."""
        with await self.dataplane.admit(spec, API, PROTOCOL, WAIT) as call:
            _, outputs = await self.dataplane.predict(call, "", {"x": column(x)}, timeout=timeout)
        return call.version, float(outputs["y"][0, 0])

    async def refusal(self, spec: ModelSpec, timeout: float | None = WAIT) -> ServingError:
        """The ServingError a predict of ``spec`` is refused with."""
        with pytest.raises(ServingError) as refused:
            await self.predict(spec, timeout=timeout)
        return refused.value

    def count(self, code: str, version: int | None, model: str = "m") -> float:
        """Requests counted in ``workbench_requests`` for ``model`` ``version`` (None: none resolved) by ``code``."""
        labels = {"model": model, "version": "" if version is None else str(version), "api": API}
        value = self.metrics.registry.get_sample_value(
            "workbench_requests_total", {**labels, "protocol": PROTOCOL, "code": code}
        )
        return value or 0.0

    def rolling(self, version: int | None, model: str = "m") -> Mapping[str, object]:
        entry: Mapping[str, object] = self.stats.snapshot()["models"][model]["" if version is None else str(version)]
        return entry


def column(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32).reshape(-1, 1)


class RunGate:
    """Holds every run of one fake servable at an event until the test opens it, and records in order when a run
    starts, when it returns, and when the servable is closed."""

    def __init__(self, servable: FakeServable) -> None:
        self.opened = threading.Event()
        self.started = threading.Event()
        self.events: list[str] = []
        run, close = servable.run, servable.close

        def gated_run(
            signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
        ) -> dict[str, np.ndarray]:
            self.events.append("run started")
            self.started.set()
            assert self.opened.wait(WAIT), "the test never opened the gate"
            try:
                return run(signature, inputs, outputs)
            finally:
                self.events.append("run returned")

        def recorded_close() -> None:
            self.events.append("closed")
            close()

        servable.run = gated_run  # type: ignore[method-assign]
        servable.close = recorded_close  # type: ignore[method-assign]


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Engines on ``tmp_path`` with the options given; each stopped at teardown, its held loads let go first."""
    made: list[Engine] = []

    def make(**options: object) -> Engine:
        made.append(Engine(tmp_path, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for each in made:
        each.stop()


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    return make_engine()


@pytest.fixture
def cached(make_engine: Callable[..., Engine]) -> Engine:
    """An engine whose model ``m`` (only) opted into the response cache."""
    return make_engine(cache_models=("m",))


# ----------------------------------------------------------------------------------------------- resolution
def test_a_request_naming_no_version_runs_on_the_newest_and_one_naming_a_version_or_label_on_it(
    engine: Engine,
) -> None:
    engine.serve("m", 1, 2, 3, policy=ALL, labels={"old": 1})

    async def main() -> list[tuple[int, float]]:
        return [
            await engine.predict(ModelSpec("m"), x=10.0),
            await engine.predict(ModelSpec("m", version=2), x=10.0),
            await engine.predict(ModelSpec("m", label="old"), x=10.0),
        ]

    assert asyncio.run(main()) == [(3, 13.0), (2, 12.0), (1, 11.0)]  # the call's version is the one that answered


def test_a_promoted_stable_version_takes_the_default_traffic_from_newer_ones(engine: Engine) -> None:
    engine.serve("m", 1, 2, 3, policy=ALL)
    engine.routing_changes.promote("m", 1, timeout=WAIT)  # written to tmp_path/m/routing.json, then routed by

    async def main() -> list[int]:
        specs = [ModelSpec("m"), ModelSpec("m", label="stable"), ModelSpec("m", version=3)]
        return [(await engine.predict(spec))[0] for spec in specs]

    assert asyncio.run(main()) == [1, 1, 3]


def test_an_unknown_model_is_not_found_at_once_in_tf_servings_words_and_counted(engine: Engine) -> None:
    engine.serve("m", 1)

    async def main() -> tuple[ServingError, float]:
        started = time.monotonic()
        refused = await engine.refusal(ModelSpec("nobody"))
        return refused, time.monotonic() - started

    refused, seconds = asyncio.run(main())
    assert (refused.code, refused.message) == (Code.NOT_FOUND, "Servable not found for request: Latest(nobody)")
    assert seconds < 1.0  # not a first load to wait for: nobody configured it
    assert engine.count("NOT_FOUND", None, model="nobody") == 1


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (ModelSpec("m", version=7), Code.NOT_FOUND, "Servable not found for request: Specific(m, 7)"),
        (ModelSpec("m", label="zzz"), Code.INVALID_ARGUMENT, "Unrecognized servable version label: zzz"),
        (
            ModelSpec("m", version=1, label="old"),
            Code.INVALID_ARGUMENT,
            "A request may name a version or a label, not both",
        ),
    ],
    ids=["unknown version", "unknown label", "version and label"],
)
def test_an_unknown_version_or_label_is_refused_with_the_code_and_text_the_frontends_pass_on(
    engine: Engine, spec: ModelSpec, code: Code, message: str
) -> None:
    engine.serve("m", 1, 2, policy=ALL, labels={"old": 1})
    refused = asyncio.run(engine.refusal(spec))
    assert (refused.code, refused.message) == (code, message)
    assert engine.count(code.name, None) == 1  # refused before any version held it: counted without one


def test_a_label_on_a_version_that_does_not_serve_is_not_found_for_that_version(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(allow_labels_for_unavailable=True)  # --allow_version_labels_for_unavailable_models
    engine.serve("m", 1, labels={"next": 5})  # a label on a version that is not (yet) there
    refused = asyncio.run(engine.refusal(ModelSpec("m", label="next")))
    assert (refused.code, refused.message) == (Code.NOT_FOUND, "Servable not found for request: Specific(m, 5)")


def test_a_handle_holds_its_servable_through_a_swap_until_its_block_ends(engine: Engine) -> None:
    engine.serve("m", 1)
    with engine.dataplane.handle(ModelSpec("m")) as held:
        assert held is engine.servable("m", 1)
        engine.add_version("m", 2)
        until(lambda: engine.state("m", 1) == VersionState.UNLOADING, "version 1 unloading once 2 serves")
        with engine.dataplane.handle(ModelSpec("m")) as newer:
            assert newer is engine.servable("m", 2)  # new requests already go to the new version
        assert not engine.servable("m", 1).closed
    until(lambda: engine.servable("m", 1).closed, "version 1 closed once its handle let go")
    until(lambda: engine.state("m", 1) == VersionState.END, "version 1 unloaded")


# ------------------------------------------------------------------------------------------------- the canary
def test_a_canary_gets_exactly_its_weight_of_default_traffic_and_its_label(engine: Engine) -> None:
    engine.serve("m", 1, 2)  # latest(1): version 2 serves; the canary change loads version 1 beside it
    engine.routing_changes.set_canary("m", 1, 0.25, timeout=WAIT)

    async def main() -> tuple[list[int], int]:
        versions = [(await engine.predict(ModelSpec("m")))[0] for _ in range(40)]
        return versions, (await engine.predict(ModelSpec("m", label="canary")))[0]

    versions, labelled = asyncio.run(main())
    assert (versions.count(1), versions.count(2)) == (10, 30)  # the split counts: exactly, not about
    assert labelled == 1


def test_requests_naming_a_version_never_go_to_the_canary_nor_move_its_share(engine: Engine) -> None:
    engine.serve("m", 1, 2)
    engine.routing_changes.set_canary("m", 1, 0.5, timeout=WAIT)

    async def main() -> tuple[list[int], list[int]]:
        named, default = [], []
        for _ in range(20):
            named.append((await engine.predict(ModelSpec("m", version=2)))[0])
            named.append((await engine.predict(ModelSpec("m", version=2)))[0])
            default.append((await engine.predict(ModelSpec("m")))[0])
        return named, default

    named, default = asyncio.run(main())
    assert set(named) == {2}
    assert default == [2, 1] * 10  # half of the default requests alone, as if the named ones had not come


def test_a_canary_weight_of_zero_ends_the_canary(engine: Engine) -> None:
    engine.serve("m", 1, 2)
    engine.routing_changes.set_canary("m", 1, 0.5, timeout=WAIT)
    engine.routing_changes.set_canary("m", 1, 0.0)

    async def main() -> tuple[set[int], ServingError]:
        versions = {(await engine.predict(ModelSpec("m")))[0] for _ in range(10)}
        return versions, await engine.refusal(ModelSpec("m", label="canary"))

    versions, refused = asyncio.run(main())
    assert versions == {2}
    assert (refused.code, refused.message) == (Code.INVALID_ARGUMENT, "Unrecognized servable version label: canary")


# ------------------------------------------------------------------------------------------ holds and swaps
def test_a_request_in_flight_during_a_swap_finishes_on_the_old_version_which_closes_only_after(
    engine: Engine,
) -> None:
    engine.serve("m", 1)
    gate = RunGate(engine.servable("m", 1))

    async def main() -> tuple[tuple[int, float], int]:
        loop = asyncio.get_running_loop()
        in_flight = asyncio.ensure_future(engine.predict(ModelSpec("m"), x=5.0))
        assert await loop.run_in_executor(None, gate.started.wait, WAIT), "the run never started"
        engine.add_version("m", 2)
        await eventually(lambda: engine.state("m", 1) == VersionState.UNLOADING, "version 1 unloading")
        newcomer = (await engine.predict(ModelSpec("m")))[0]
        assert not engine.servable("m", 1).closed and gate.events == ["run started"]
        gate.opened.set()
        return await in_flight, newcomer

    answer, newcomer = asyncio.run(main())
    assert answer == (1, 6.0)  # y = 5 * 1 + 1: the old version answered
    assert newcomer == 2
    until(lambda: engine.state("m", 1) == VersionState.END, "version 1 unloaded")
    assert gate.events == ["run started", "run returned", "closed"]


def test_a_request_its_deadline_answered_early_keeps_the_old_version_until_its_run_returns(engine: Engine) -> None:
    engine.serve("m", 1)
    gate = RunGate(engine.servable("m", 1))

    async def main() -> ServingError:
        refused = await engine.refusal(ModelSpec("m"), timeout=0.05)  # answered; its thread still runs the model
        engine.add_version("m", 2)
        await eventually(lambda: engine.state("m", 1) == VersionState.UNLOADING, "version 1 unloading")
        assert not engine.servable("m", 1).closed and gate.events == ["run started"]
        gate.opened.set()
        await eventually(lambda: engine.servable("m", 1).closed, "version 1 closed once its run returned")
        return refused

    refused = asyncio.run(main())
    assert (refused.code, refused.message) == (Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert gate.events == ["run started", "run returned", "closed"]
    assert engine.count("DEADLINE_EXCEEDED", 1) == 1


# ------------------------------------------------------------------------------------------------ first loads
def test_admit_waits_for_a_models_first_load_and_is_answered_by_it(engine: Engine) -> None:
    gate = engine.hold("slow", 3)
    engine.configure("slow", 3)
    engine.source.poll_once()
    assert engine.manager.served.loading_first("slow")

    async def main() -> tuple[int, float]:
        waiting = asyncio.ensure_future(engine.predict(ModelSpec("slow"), x=1.0))
        early = await outcome_within(waiting, 0.05)
        assert early is None, f"answered while its model was still loading: {early}"
        gate.set()
        return await waiting

    assert asyncio.run(main()) == (3, 4.0)
    assert not engine.manager.served.loading_first("slow")


def test_a_first_load_outlasting_the_deadline_or_the_flag_is_refused_with_the_frontends_words(
    engine: Engine,
) -> None:
    engine.hold("slow", 1)
    engine.configure("slow", 1)
    engine.source.poll_once()

    async def main() -> tuple[ServingError, ServingError]:
        with pytest.raises(ServingError) as deadline:
            await engine.dataplane.admit(ModelSpec("slow"), API, PROTOCOL, timeout=0.05)
        engine.dataplane.first_load_wait = 0.05  # --wait_for_model_load_seconds, shorter than the deadline
        with pytest.raises(ServingError) as flag:
            await engine.dataplane.admit(ModelSpec("slow"), API, PROTOCOL, timeout=WAIT)
        return deadline.value, flag.value

    deadline, flag = asyncio.run(main())
    assert (deadline.code, deadline.message) == (
        Code.DEADLINE_EXCEEDED,
        "Model slow is still loading: the request's deadline passed first",
    )
    assert (flag.code, flag.message) == (
        Code.UNAVAILABLE,
        "Model slow is still loading after 0.05s (--wait_for_model_load_seconds)",
    )
    assert engine.count("DEADLINE_EXCEEDED", None, model="slow") == 1  # refused, and counted as such
    assert engine.count("UNAVAILABLE", None, model="slow") == 1
    assert engine.manager.served.loading_first("slow")  # the load goes on without them


def test_a_model_whose_first_load_fails_answers_the_waiting_request_with_its_load_error(engine: Engine) -> None:
    engine.loader.fail("broken", 1, "no weights in this folder")
    gate = engine.hold("broken", 1)
    engine.configure("broken", 1)
    engine.source.poll_once()

    async def main() -> tuple[ServingError, ServingError]:
        waiting = asyncio.ensure_future(engine.refusal(ModelSpec("broken")))
        early = await outcome_within(waiting, 0.05)
        assert early is None, f"refused before its model's load was over: {early}"
        gate.set()
        return await waiting, await engine.refusal(ModelSpec("broken", version=1))

    latest, specific = asyncio.run(main())
    assert (latest.code, latest.message) == (
        Code.NOT_FOUND,
        "Servable not found for request: Latest(broken): version 1 failed to load: no weights in this folder",
    )
    assert (specific.code, specific.message) == (
        Code.NOT_FOUND,
        "Servable not found for request: Specific(broken, 1): version 1 failed to load: no weights in this folder",
    )


def start_with_a_slow_version(engine: Engine, slow: int = 123, fast: int = 124) -> threading.Event:
    """Model ``m`` with versions ``slow`` and ``fast`` (both served), listed once: ``fast`` serves, so the model's
    first load is over, while ``slow`` is still in its first load until the returned gate is set."""
    gate = engine.hold("m", slow)
    engine.configure("m", slow, fast, policy=ALL)
    engine.source.poll_once()
    until(lambda: engine.state("m", fast) == VersionState.AVAILABLE, f"version {fast} serving")
    assert not engine.manager.served.loading_first("m") and engine.state("m", slow) == VersionState.LOADING
    return gate


def test_a_request_for_a_version_still_in_its_first_load_waits_for_it_and_is_answered_by_it(
    engine: Engine,
) -> None:
    """TF Serving opens its ports once every initial version has loaded: its clients never see one missing."""
    (engine.root / "m").mkdir(parents=True)
    (engine.root / "m" / "routing.json").write_text('{"canary": 123, "canary_weight": 0.0}')  # a label naming it
    gate = start_with_a_slow_version(engine)

    async def main() -> tuple[tuple[int, float], tuple[int, float], int, ServingError]:
        by_version = asyncio.ensure_future(engine.predict(ModelSpec("m", version=123), x=1.0))
        by_label = asyncio.ensure_future(engine.predict(ModelSpec("m", label="canary"), x=1.0))
        metadata = asyncio.ensure_future(engine.dataplane.loaded("m", WAIT, ModelSpec("m", version=123)))
        early = await outcome_within(asyncio.gather(by_version, by_label, metadata), 0.05)
        assert early is None, f"answered while version 123 was still loading: {early}"
        latest = (await engine.predict(ModelSpec("m")))[0]  # the model serves meanwhile
        missing = await engine.refusal(ModelSpec("m", version=125))  # nothing to wait for: at once
        gate.set()
        await metadata
        return await by_version, await by_label, latest, missing

    by_version, by_label, latest, missing = asyncio.run(main())
    assert by_version == by_label == (123, 124.0)
    assert latest == 124
    assert (missing.code, missing.message) == (Code.NOT_FOUND, "Servable not found for request: Specific(m, 125)")
    assert engine.manager.served.version_loading_first("m", 123) is None  # from now on resolved at once, as before


def test_the_wait_for_a_version_is_bounded_by_the_deadline_then_by_the_flag(engine: Engine) -> None:
    start_with_a_slow_version(engine)

    async def main() -> tuple[ServingError, ServingError]:
        with pytest.raises(ServingError) as deadline:
            await engine.dataplane.admit(ModelSpec("m", version=123), API, PROTOCOL, timeout=0.05)
        engine.dataplane.first_load_wait = 0.05  # --wait_for_model_load_seconds, shorter than the deadline
        with pytest.raises(ServingError) as flag:
            await engine.dataplane.admit(ModelSpec("m", version=123), API, PROTOCOL, timeout=WAIT)
        return deadline.value, flag.value

    deadline, flag = asyncio.run(main())
    assert (deadline.code, deadline.message) == (
        Code.DEADLINE_EXCEEDED,
        "Version 123 of model m is still loading: the request's deadline passed first",
    )
    assert (flag.code, flag.message) == (
        Code.UNAVAILABLE,
        "Version 123 of model m is still loading after 0.05s (--wait_for_model_load_seconds)",
    )
    assert engine.count("DEADLINE_EXCEEDED", None) == 1 and engine.count("UNAVAILABLE", None) == 1


def test_a_version_whose_first_load_fails_answers_its_waiting_request_with_the_load_error(engine: Engine) -> None:
    engine.loader.fail("m", 123, "the weights are truncated")
    gate = start_with_a_slow_version(engine)

    async def main() -> ServingError:
        waiting = asyncio.ensure_future(engine.refusal(ModelSpec("m", version=123)))
        early = await outcome_within(waiting, 0.05)
        assert early is None, f"refused before version 123's load was over: {early}"
        gate.set()
        return await waiting

    failed = asyncio.run(main())
    assert (failed.code, failed.message) == (
        Code.NOT_FOUND,
        "Servable not found for request: Specific(m, 123): version 123 failed to load: the weights are truncated",
    )


def test_a_version_a_later_listing_found_is_not_found_while_it_loads_as_in_tf_serving(engine: Engine) -> None:
    engine.serve("m", 1, policy=ALL)
    gate = engine.hold("m", 2)
    engine.add_version("m", 2)
    until(lambda: engine.state("m", 2) == VersionState.LOADING, "version 2 loading")

    # Still loading when answered: a wait would have ended in DEADLINE_EXCEEDED, not in NOT_FOUND.
    refused = asyncio.run(engine.refusal(ModelSpec("m", version=2)))
    assert engine.state("m", 2) == VersionState.LOADING
    gate.set()
    assert (refused.code, refused.message) == (Code.NOT_FOUND, "Servable not found for request: Specific(m, 2)")


def test_a_new_version_that_fails_to_load_leaves_the_old_one_answering(engine: Engine) -> None:
    engine.serve("m", 1)
    engine.loader.fail("m", 2, "bad graph")
    engine.add_version("m", 2)
    until(lambda: engine.state("m", 2) == VersionState.END, "version 2 failed")

    async def main() -> tuple[int, ServingError]:
        return (await engine.predict(ModelSpec("m")))[0], await engine.refusal(ModelSpec("m", version=2))

    default, refused = asyncio.run(main())
    assert default == 1
    assert (refused.code, refused.message) == (
        Code.NOT_FOUND,
        "Servable not found for request: Specific(m, 2): version 2 failed to load: bad graph",
    )


# ---------------------------------------------------------------------------------------- metrics and stats
def test_every_request_is_counted_once_by_its_final_code_in_metrics_stats_and_statistics(engine: Engine) -> None:
    engine.serve("m", 1)

    async def main() -> None:
        for x in (1.0, 2.0, 3.0):
            await engine.predict(ModelSpec("m"), x=x)
        await engine.refusal(ModelSpec("m", version=9))
        engine.servable("m", 1).fail_with = ServingError(Code.INTERNAL, "the fake failed")
        failed = await engine.refusal(ModelSpec("m"))
        assert (failed.code, failed.message) == (Code.INTERNAL, "the fake failed")

    asyncio.run(main())
    assert (engine.count("OK", 1), engine.count("INTERNAL", 1), engine.count("NOT_FOUND", None)) == (3, 1, 1)
    tf_count = engine.metrics.registry.get_sample_value(
        ":tensorflow:serving:request_count", {"model_name": "m", "status": "OK"}
    )
    assert tf_count == 3  # TF Serving's own series, by model alone
    runs = engine.metrics.registry.get_sample_value("workbench_batch_size_count", {"model": "m", "version": "1"})
    assert runs == 3  # a run that raised records no batch
    version_1, unresolved = engine.rolling(1), engine.rolling(None)
    assert (version_1["total_requests"], version_1["total_errors"], version_1["mean_batch_size"]) == (4, 1, 1.0)
    assert (unresolved["total_requests"], unresolved["total_errors"]) == (1, 1)
    [statistics] = engine.dataplane.statistics("m")
    assert (statistics.version, statistics.success.count, statistics.fail.count) == (1, 3, 1)
    assert (statistics.execution_count, statistics.inference_count) == (3, 3)


# ----------------------------------------------------------------------------------------- the response cache
def test_a_repeated_request_is_answered_from_the_cache_without_running_the_model(cached: Engine) -> None:
    cached.serve("m", 1)
    cached.serve("other", 1)  # not opted in

    async def main() -> list[tuple[int, float]]:
        answers = [await cached.predict(ModelSpec("m"), x=2.0) for _ in range(3)]
        answers.append(await cached.predict(ModelSpec("m"), x=4.0))
        answers += [await cached.predict(ModelSpec("other"), x=2.0) for _ in range(2)]
        return answers

    assert asyncio.run(main()) == [(1, 3.0)] * 3 + [(1, 5.0)] + [(1, 3.0)] * 2
    assert cached.servable("m", 1).batches == [1, 1]  # x = 2 once, x = 4 once
    assert cached.servable("other", 1).batches == [1, 1]  # every request ran
    counted = cached.rolling(1)
    assert (counted["cache_hits"], counted["cache_misses"], counted["total_requests"]) == (2, 2, 4)
    assert cached.count("OK", 1) == 4  # an answer from the cache is a request answered


def test_the_cache_never_answers_one_version_with_anothers_answer(cached: Engine) -> None:
    cached.serve("m", 1, 2, policy=ALL, labels={"old": 1})

    async def main() -> list[tuple[int, float]]:
        answers = [
            await cached.predict(ModelSpec("m", version=1), x=5.0),
            await cached.predict(ModelSpec("m", version=2), x=5.0),
            await cached.predict(ModelSpec("m"), x=5.0),  # resolves to 2: 2's answer, from the cache
            await cached.predict(ModelSpec("m", label="old"), x=5.0),  # resolves to 1: 1's answer, from the cache
        ]
        cached.add_version("m", 3)
        await eventually(lambda: cached.state("m", 3) == VersionState.AVAILABLE, "version 3 serving")
        answers.append(await cached.predict(ModelSpec("m"), x=5.0))  # the new default runs, cache or not
        return answers

    assert asyncio.run(main()) == [(1, 6.0), (2, 7.0), (2, 7.0), (1, 6.0), (3, 8.0)]
    runs = [len(cached.servable("m", v).batches) for v in (1, 2, 3)]
    assert runs == [1, 1, 1]


# ---------------------------------------------------------------------------------- the routing policy, pure
@pytest.mark.parametrize("weight", [0.01, 0.1, 0.25, 0.5, 0.75, 0.999, 1.0])
def test_the_split_gives_the_canary_floor_of_n_times_its_weight_after_every_request(weight: float) -> None:
    split, routing = CanarySplit(), Routing(stable=1, canary=2, canary_weight=weight)
    exact = Fraction(round(weight * 1_000_000), 1_000_000)  # the split compares weights in millionths
    hits = 0
    for n in range(1, 1001):
        hits += split.pick(routing, {1, 2, 3}) == 2
        assert hits == math.floor(n * exact), f"after {n} requests at weight {weight}"


def test_the_split_restarts_its_count_when_the_canary_or_its_weight_changes() -> None:
    split = CanarySplit()
    half = Routing(stable=1, canary=2, canary_weight=0.5)
    assert [split.pick(half, {1, 2, 3}) for _ in range(3)] == [1, 2, 1]
    other = Routing(stable=1, canary=3, canary_weight=0.5)
    assert [split.pick(other, {1, 2, 3}) for _ in range(2)] == [1, 3]  # counted afresh: not 3 at once
    assert [split.pick(half, {1, 2, 3}) for _ in range(2)] == [1, 2]


@pytest.mark.parametrize(
    ("routing", "available", "default"),
    [
        (Routing(canary=2, canary_weight=0.5), {1, 2}, 2),  # the canary is the default already
        (Routing(stable=1, canary=3, canary_weight=0.5), {1, 2}, 1),  # the canary does not serve here
        (Routing(stable=1, canary=2, canary_weight=0.0), {1, 2}, 1),  # no weight
    ],
    ids=["canary is the default", "canary not serving", "weightless canary"],
)
def test_a_canary_that_cannot_take_a_share_gets_no_default_request(
    routing: Routing, available: set[int], default: int
) -> None:
    split = CanarySplit()
    assert {split.pick(routing, available) for _ in range(20)} == {default}
    assert shares(routing, available)[default] == 1.0


def test_the_default_is_the_stable_version_while_it_serves_else_the_newest_and_shares_sum_to_one() -> None:
    assert default_version(Routing(), {1, 3, 2}) == 3  # TF Serving's: the latest
    assert default_version(Routing(stable=1), {1, 3}) == 1
    assert default_version(Routing(stable=4), {1, 3}) == 3  # promoted elsewhere, not loaded here yet
    assert default_version(Routing(), set()) is None
    split = shares(Routing(stable=1, canary=2, canary_weight=0.3), {1, 2, 3})
    assert split == {1: pytest.approx(0.7), 2: pytest.approx(0.3), 3: 0.0}
    assert sum(split.values()) == pytest.approx(1.0)


def test_config_labels_win_over_the_routings_and_the_canary_stays_loaded() -> None:
    routing = Routing(stable=2, canary=3, canary_weight=0.1)
    assert labels_of({"stable": 1, "old": 1}, routing) == {"stable": 1, "canary": 3, "old": 1}
    decision = decide(routing, available={2}, on_disk={1, 2, 3, 4}, policy_versions={4})
    assert decision.aspired == {2, 3, 4}  # the stable, the canary (not serving yet) and the policy's
    assert decision.default_version == 2
