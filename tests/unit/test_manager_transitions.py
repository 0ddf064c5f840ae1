"""The manager's version transitions, in-process on fakes: what loads, what serves, what unloads and when.

These drive :class:`~workbench.models.manager.Manager` the way the server does (``set_models``, the repository
source's ``poll_once``, ``wait_until_settled``, ``set_labels``) on empty version folders in ``tmp_path``, loaded
by a :class:`~tests.unit.fakes.FakeLoader`, whose servables answer ``y = x * 1 + version``: a request for ``x = 0``
says which version ran it. Covered: the version policies (latest N, all, specific); a new version replacing the old
one on a rescan, the old servable closed only once the last request holding it lets go; a version that fails to
load (its error shown, the serving version kept, a retry once its folder changes); a model removed; the first load
a request waits for (``loading_first``, ``when_first_loaded``, ``why_not_serving``, ``knows``); the management
changes (promote, rollback, canary, pin and unload) and their refusals; and the order state listeners see.

Nothing here sleeps blindly: every wait is on a condition (the manager's own, or a listener's) with a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeRepository, FakeServable, version_folders

from workbench.config.version_policy import VersionPolicy
from workbench.core.errors import Code, ServingError
from workbench.models.manager import VersionState
from workbench.models.readiness import Phase, ServerReadiness
from workbench.models.routing.policy import Routing

LATEST = VersionPolicy()  # TF Serving's default policy: latest(1)
WAIT = 5.0  # seconds any one transition may take before a test fails (they take milliseconds)

LOADING, AVAILABLE, UNLOADING, END = (
    VersionState.LOADING,
    VersionState.AVAILABLE,
    VersionState.UNLOADING,
    VersionState.END,
)


class StateLog:
    """A state listener that records every ``(model, version, state)`` and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, VersionState]] = []
        self._changed = threading.Condition()

    def __call__(self, model: str, version: int, state: VersionState) -> None:
        with self._changed:
            self.events.append((model, version, state))
            self._changed.notify_all()

    def of(self, model: str) -> list[tuple[int, VersionState]]:
        with self._changed:
            return [(v, s) for m, v, s in self.events if m == model]

    def wait_for(self, model: str, version: int, state: VersionState) -> None:
        with self._changed:
            seen = self._changed.wait_for(lambda: (model, version, state) in self.events, timeout=WAIT)
        assert seen, f"{model} version {version} never reached {state.name}; saw {self.events}"


class Bench(FakeRepository):
    """A manager on a fake loader, fed by the real repository source over ``root``'s folders, as the server does;
    its state changes recorded."""

    def __init__(self, root: Path, **manager_options: bool) -> None:
        super().__init__(root, **manager_options)
        self.states = StateLog()
        self.manager.add_listener(self.states)

    def add_version(self, name: str, version: int) -> Path:
        version_folders(self.root, name, version)
        return self.root / name / str(version)

    def answer(self, name: str, version: int | None = None, label: str | None = None) -> int:
        """The version that answers a request for ``name`` (``version`` or ``label``, else the default)."""
        with self.manager.served.handle(name, version, label) as servable:
            return run_version(servable)

    def serving(self, name: str) -> dict[int, VersionState]:
        return {s.version: s.state for s in self.manager.served.version_status(name)}

    def routing(self, name: str) -> Routing:
        return self.manager.served.snapshots(name)[0].routing


def run_version(servable: object) -> int:
    """Run a fake servable on ``x = 0``: its answer is its version."""
    assert isinstance(servable, FakeServable)
    y = servable.run(servable.signatures["serving_default"], {"x": np.zeros((1, 1), np.float32)}, ["y"])["y"]
    return int(y[0, 0])


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    made = Bench(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def refused(code: Code, call: object, *args: object, **kwargs: object) -> str:
    """Call ``call`` and return the message of the ServingError with ``code`` it must raise."""
    assert callable(call)
    with pytest.raises(ServingError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value
    return caught.value.message


# ------------------------------------------------------------------------------------------- policies


@pytest.mark.parametrize(
    ("policy", "loaded"),
    [
        (VersionPolicy(), {3}),
        (VersionPolicy(kind="latest", num_versions=2), {2, 3}),
        (VersionPolicy(kind="all"), {1, 2, 3}),
        (VersionPolicy(kind="specific", versions=frozenset({1, 3, 7})), {1, 3}),
    ],
    ids=["latest", "latest-2", "all", "specific"],
)
def test_the_policy_picks_which_versions_load_and_only_those_become_available(
    bench: Bench, policy: VersionPolicy, loaded: set[int]
) -> None:
    bench.serve("m", 1, 2, 3, policy=policy)

    assert bench.serving("m") == dict.fromkeys(loaded, AVAILABLE)
    assert sorted(bench.loader.loaded) == [("m", v) for v in sorted(loaded)]
    assert bench.answer("m") == max(loaded)  # TF Serving's default: the latest available version
    for version in loaded:
        assert bench.answer("m", version) == version
    for version in {1, 2, 3} - loaded:
        message = refused(Code.NOT_FOUND, bench.answer, "m", version)
        assert message == f"Servable not found for request: Specific(m, {version})"


# ------------------------------------------------------------------------------------ version swaps


def test_a_new_version_folder_loads_on_rescan_and_then_the_old_version_unloads_and_closes(bench: Bench) -> None:
    bench.serve("m", 1)
    old = bench.servable("m", 1)

    bench.add_version("m", 2)
    bench.rescan()

    assert bench.serving("m") == {2: AVAILABLE, 1: END}
    assert bench.answer("m") == 2
    assert old.closed
    assert not bench.servable("m", 2).closed
    assert refused(Code.NOT_FOUND, bench.answer, "m", 1).endswith("Specific(m, 1)")


def test_state_listeners_see_the_new_version_serve_before_the_old_one_starts_to_unload(bench: Bench) -> None:
    bench.serve("m", 1)
    bench.add_version("m", 2)
    bench.rescan()

    assert bench.states.of("m") == [
        (1, LOADING),
        (1, AVAILABLE),
        (2, LOADING),
        (2, AVAILABLE),
        (1, UNLOADING),
        (1, END),
    ]


def test_removing_the_newest_folder_loads_the_one_before_it_before_unloading_the_newest(bench: Bench) -> None:
    bench.serve("m", 1, 2)
    (bench.root / "m" / "2").rmdir()

    bench.rescan()

    assert bench.answer("m") == 1
    assert bench.serving("m") == {2: END, 1: AVAILABLE}
    assert bench.servable("m", 2).closed
    after_first_serve = bench.states.of("m")[2:]
    assert after_first_serve.index((1, AVAILABLE)) < after_first_serve.index((2, UNLOADING))


def test_the_old_servable_stays_open_while_a_request_holds_it_and_closes_once_it_is_released(bench: Bench) -> None:
    bench.serve("m", 1)
    old = bench.servable("m", 1)

    with bench.manager.served.handle("m") as held:  # a request that resolved to version 1 just before the swap
        bench.add_version("m", 2)
        bench.source.poll_once()
        bench.states.wait_for("m", 1, UNLOADING)

        assert not old.closed
        assert run_version(held) == 1  # the request still runs on the version it resolved
        assert bench.answer("m") == 2  # new requests go to the new version
        refused(Code.NOT_FOUND, bench.answer, "m", 1)  # and none resolve to the one unloading
        assert bench.manager.served.version_state("m", 1) == UNLOADING

    bench.states.wait_for("m", 1, END)
    assert old.closed
    assert bench.manager.served.wait_until_settled(WAIT)


# ---------------------------------------------------------------------------------------- failures


def test_a_version_that_fails_to_load_ends_with_its_error_and_the_serving_version_keeps_serving(bench: Bench) -> None:
    bench.serve("m", 1)
    bench.loader.fail("m", 2, "the weights are truncated")

    bench.add_version("m", 2)
    bench.rescan()

    (newest, oldest) = bench.manager.served.version_status("m")
    assert (newest.version, newest.state, oldest.version, oldest.state) == (2, END, 1, AVAILABLE)
    assert newest.error is not None and newest.error.message == "the weights are truncated"
    assert oldest.error is None
    assert bench.answer("m") == 1
    assert not bench.servable("m", 1).closed
    assert (1, UNLOADING) not in bench.states.of("m")
    assert bench.manager.served.why_not_serving("m", 2) == "version 2 failed to load: the weights are truncated"
    assert bench.manager.served.why_not_serving("m") == ""  # the model serves: nothing to explain
    message = refused(Code.NOT_FOUND, bench.answer, "m", 2)
    assert (
        message == "Servable not found for request: Specific(m, 2): version 2 failed to load: the weights are truncated"
    )


def test_a_failed_version_is_retried_only_once_its_folder_changes(bench: Bench) -> None:
    bench.serve("m", 1)
    bench.loader.fail("m", 2)
    folder = bench.add_version("m", 2)
    bench.rescan()
    del bench.loader.failing[("m", 2)]  # it would load now, but nothing on disk says it changed

    bench.rescan()
    assert bench.serving("m") == {2: END, 1: AVAILABLE}

    (folder / "saved_model.pb").touch()  # the version's model file is replaced
    bench.rescan()

    assert bench.serving("m") == {2: AVAILABLE, 1: END}
    assert bench.answer("m") == 2
    assert bench.manager.served.version_status("m", 2)[0].error is None


def test_a_model_whose_only_version_fails_is_not_served_and_says_why(bench: Bench) -> None:
    bench.loader.fail("m", 1, "no such op")

    bench.serve("m", 1)

    assert bench.serving("m") == {1: END}
    assert not bench.manager.served.loading_first("m")  # its first load is over: failed
    assert bench.manager.served.why_not_serving("m") == "version 1 failed to load: no such op"
    message = refused(Code.NOT_FOUND, bench.answer, "m")
    assert message == "Servable not found for request: Latest(m): version 1 failed to load: no such op"


# --------------------------------------------------------------------------------------- removal


def test_a_model_removed_from_the_config_unloads_closes_and_is_forgotten(bench: Bench) -> None:
    bench.serve("m", 1)
    bench.serve("other", 1)

    del bench.configs["m"]
    bench.manager.set_models(bench.configs.values())
    assert bench.manager.served.wait_until_settled(WAIT)

    assert not bench.manager.served.knows("m")
    assert bench.manager.served.model_names() == ["other"]
    assert bench.servable("m", 1).closed
    assert bench.states.of("m")[-2:] == [(1, UNLOADING), (1, END)]
    refused(Code.NOT_FOUND, bench.manager.served.snapshots, "m")
    assert refused(Code.NOT_FOUND, bench.answer, "m") == "Servable not found for request: Latest(m)"
    assert bench.answer("other") == 1 and not bench.servable("other", 1).closed


# ------------------------------------------------------------------------------------ first loads


def test_a_request_can_wait_for_the_first_load_and_is_called_back_once_it_serves(bench: Bench) -> None:
    gate = bench.hold("m", 1)
    bench.configure("m", 1)
    assert bench.manager.served.loading_first("m")  # configured, not even listed yet
    bench.source.poll_once()
    bench.states.wait_for("m", 1, LOADING)

    loaded = threading.Event()
    assert bench.manager.served.when_first_loaded("m", loaded.set)
    assert bench.manager.served.knows("m") and bench.manager.served.loading_first("m")
    assert bench.manager.served.why_not_serving("m") == ""  # on its way: nothing has gone wrong
    assert refused(Code.NOT_FOUND, bench.answer, "m") == "Servable not found for request: Latest(m)"
    assert not loaded.is_set()

    gate.set()

    assert loaded.wait(WAIT)
    assert not bench.manager.served.loading_first("m")
    assert not bench.manager.served.when_first_loaded("m", loaded.set)  # over: a later waiter is told so at once
    assert bench.answer("m") == 1


def test_a_model_nobody_configured_is_unknown_and_has_no_first_load_to_wait_for(bench: Bench) -> None:
    bench.serve("m", 1)

    assert not bench.manager.served.knows("nope")
    assert not bench.manager.served.loading_first("nope")
    assert not bench.manager.served.when_first_loaded("nope", lambda: None)
    assert bench.manager.served.why_not_serving("nope") == ""
    assert refused(Code.NOT_FOUND, bench.answer, "nope") == "Servable not found for request: Latest(nope)"


def test_the_first_load_is_over_only_once_the_configs_labels_are_applied(bench: Bench) -> None:
    # The version loads after the scan has ended: a scan applies the labels of a model whose versions have loaded
    # (Manager.apply_pending_labels), and a load that beat the scan's end would end the first load there.
    gate = bench.hold("m", 1)
    bench.configure("m", 1, labels={"prod": 1})
    bench.source.poll_once()
    gate.set()
    bench.states.wait_for("m", 1, AVAILABLE)
    assert bench.manager.served.wait_until_settled(WAIT)

    assert bench.serving("m") == {1: AVAILABLE}
    assert bench.manager.served.loading_first("m")  # a request for label "prod" must not be refused yet
    refused(Code.INVALID_ARGUMENT, bench.answer, "m", label="prod")

    bench.manager.set_labels({"m": {"prod": 1}})

    assert not bench.manager.served.loading_first("m")
    assert bench.answer("m", label="prod") == 1


def test_labels_for_a_version_not_available_are_refused_and_still_end_the_first_load(bench: Bench) -> None:
    bench.configure("m", 1, labels={"prod": 2})
    bench.rescan()

    message = refused(Code.FAILED_PRECONDITION, bench.manager.set_labels, {"m": {"prod": 2}})

    assert "version 2 of model m, which is not currently available" in message
    assert bench.manager.served.labels("m") == {}
    assert not bench.manager.served.loading_first("m")


def test_a_model_removed_while_its_first_load_is_held_ends_the_wait_and_its_late_load_is_closed(
    bench: Bench,
) -> None:
    gate = bench.hold("m", 1)
    bench.configure("m", 1)
    bench.source.poll_once()
    bench.states.wait_for("m", 1, LOADING)
    over = threading.Event()
    assert bench.manager.served.when_first_loaded("m", over.set)

    del bench.configs["m"]
    bench.manager.set_models([])

    assert over.is_set()  # at once: the model went
    assert not bench.manager.served.knows("m") and not bench.manager.served.loading_first("m")
    gate.set()
    bench.states.wait_for("m", 1, END)
    assert bench.manager.served.wait_until_settled(WAIT)
    assert bench.servable("m", 1).closed
    assert bench.manager.served.model_names() == []
    # The late load was never published: no request could have reached a model that had left the config.
    assert bench.states.of("m") == [(1, LOADING), (1, END)]


# ---------------------------------------------------------------------------- management changes


def test_promote_loads_an_older_version_makes_it_the_default_and_stores_the_routing(bench: Bench) -> None:
    bench.serve("m", 1, 2)
    assert bench.serving("m") == {2: AVAILABLE}

    bench.routing_changes.promote("m", 1, timeout=WAIT)

    assert bench.answer("m") == 1
    assert bench.serving("m") == {2: AVAILABLE, 1: AVAILABLE}  # 2 stays: the policy wants it
    assert bench.manager.served.labels("m") == {"stable": 1}
    assert bench.answer("m", label="stable") == 1
    assert (bench.root / "m" / "routing.json").exists()
    assert bench.manager.served.snapshots("m")[0].generation == 1

    bench.rescan()  # the stored routing keeps version 1 loaded although the policy does not pick it
    assert bench.serving("m") == {2: AVAILABLE, 1: AVAILABLE}
    assert bench.answer("m") == 1


def test_rollback_returns_stable_to_the_version_promoted_before_and_then_has_nothing_left(bench: Bench) -> None:
    bench.serve("m", 1, 2, 3, policy=VersionPolicy(kind="all"))
    bench.routing_changes.promote("m", 1, timeout=WAIT)
    bench.routing_changes.promote("m", 2, timeout=WAIT)
    assert bench.answer("m") == 2

    assert bench.routing_changes.rollback("m") == 1

    assert bench.answer("m") == 1
    assert bench.routing("m") == Routing(stable=1)
    message = refused(Code.FAILED_PRECONDITION, bench.routing_changes.rollback, "m")
    assert message == "Model m has no previous stable version to roll back to"
    assert bench.answer("m") == 1


def test_promoting_a_version_not_in_the_repository_is_refused_and_changes_nothing(bench: Bench) -> None:
    bench.serve("m", 1)

    message = refused(Code.NOT_FOUND, bench.routing_changes.promote, "m", 9, timeout=WAIT)

    assert message == "Model m has no version 9 in its repository"
    assert bench.routing("m") == Routing()
    assert not (bench.root / "m" / "routing.json").exists()
    assert bench.answer("m") == 1


def test_promoting_a_version_that_fails_to_load_is_refused_with_its_load_error_and_keeps_the_default(
    bench: Bench,
) -> None:
    bench.serve("m", 1, 2)
    bench.loader.fail("m", 1, "bad graph")

    message = refused(Code.FAILED_PRECONDITION, bench.routing_changes.promote, "m", 1, timeout=WAIT)

    assert message == "Version 1 of model m failed to load: bad graph"
    assert bench.answer("m") == 2
    assert bench.manager.served.labels("m") == {}
    assert bench.manager.served.snapshots("m")[0].generation == 0
    assert bench.manager.served.snapshots("m")[0].held == frozenset()  # the hold ended with the refusal


def test_a_canary_gets_its_exact_share_of_default_traffic_and_unloads_when_its_weight_goes_to_zero(
    bench: Bench,
) -> None:
    bench.serve("m", 1, 2)

    bench.routing_changes.set_canary("m", 1, 0.25, timeout=WAIT)

    answers = [bench.answer("m") for _ in range(8)]
    assert answers.count(1) == 2 and answers.count(2) == 6
    assert bench.manager.served.labels("m") == {"canary": 1}
    assert bench.answer("m", label="canary") == 1
    canary = bench.servable("m", 1)

    bench.routing_changes.set_canary("m", 1, 0.0)
    assert bench.manager.served.wait_until_settled(WAIT)

    assert bench.serving("m") == {2: AVAILABLE, 1: END}  # no role left, and the policy does not pick it
    assert canary.closed
    assert [bench.answer("m") for _ in range(4)] == [2, 2, 2, 2]
    assert bench.manager.served.labels("m") == {}


def test_management_refuses_bad_weights_unknown_models_stale_generations_and_config_owned_labels(
    bench: Bench,
) -> None:
    bench.serve("m", 1, 2, labels={"stable": 2})
    changes = bench.routing_changes

    assert "between 0 and 1, got 1.5" in refused(Code.INVALID_ARGUMENT, changes.set_canary, "m", 1, 1.5)
    assert refused(Code.NOT_FOUND, changes.promote, "ghost", 1) == "Model ghost is not in the server's config"
    assert "not generation 7" in refused(Code.ABORTED, changes.load_version, "m", 1, generation=7)
    assert "set by the model config file" in refused(Code.FAILED_PRECONDITION, changes.promote, "m", 1)

    assert bench.routing("m") == Routing()
    assert bench.serving("m") == {2: AVAILABLE}
    assert bench.manager.served.labels("m") == {"stable": 2}


def test_a_pinned_version_stays_loaded_until_unloaded_and_the_last_serving_version_cannot_be(bench: Bench) -> None:
    bench.serve("m", 1, 2)

    bench.routing_changes.load_version("m", 1, timeout=WAIT)
    bench.rescan()
    assert bench.serving("m") == {2: AVAILABLE, 1: AVAILABLE}
    assert bench.routing("m").pinned == frozenset({1})

    bench.routing_changes.unload_version("m", 1)
    assert bench.manager.served.wait_until_settled(WAIT)
    assert bench.serving("m") == {2: AVAILABLE, 1: END}
    assert bench.servable("m", 1).closed

    message = refused(Code.FAILED_PRECONDITION, bench.routing_changes.unload_version, "m", 2)
    assert message == "Version 2 is the only version of model m serving; load another one first"
    assert refused(Code.NOT_FOUND, bench.routing_changes.unload_version, "m", 9) == "Model m has no version 9"
    assert bench.answer("m") == 2


def test_removing_the_last_version_on_request_empties_the_model_until_a_version_is_loaded_again(
    bench: Bench,
) -> None:
    """TorchServe's unregister and Triton's unload ask for ``keep_last=False``: the last serving version goes, with
    its role, and stays gone across rescans (its drop is meant, not ignored) until it is loaded again."""
    bench.serve("m", 1)
    bench.routing_changes.promote("m", 1, timeout=WAIT)  # the stable one: TorchServe's set-default of its only version

    bench.routing_changes.unload_version("m", 1, keep_last=False)
    assert bench.manager.served.wait_until_settled(WAIT)

    assert bench.serving("m") == {1: END} and bench.servable("m", 1).closed
    assert bench.routing("m") == Routing(dropped=frozenset({1}), emptied=True)
    assert bench.manager.served.emptied("m")
    readiness = ServerReadiness(bench.manager.served)
    readiness.enter(Phase.SERVING)
    assert readiness().ready  # removed on purpose: no reason to take the server out of traffic
    assert refused(Code.NOT_FOUND, bench.answer, "m") == "Servable not found for request: Latest(m)"
    bench.rescan()  # the repository still holds version 1: it stays unloaded
    assert bench.serving("m") == {1: END} and bench.manager.served.emptied("m")

    bench.routing_changes.load_version("m", 1, timeout=WAIT)
    assert bench.answer("m") == 1
    assert bench.routing("m") == Routing(pinned=frozenset({1}))
    assert not bench.manager.served.emptied("m")


def test_stop_closes_every_loaded_servable(bench: Bench) -> None:
    bench.serve("m", 1, 2, policy=VersionPolicy(kind="all"))

    bench.manager.stop()

    assert bench.servable("m", 1).closed and bench.servable("m", 2).closed
