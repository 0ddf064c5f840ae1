"""Routing decisions as pure functions (workbench.models.routing.policy): plain data in, a decision out, no server."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from workbench.core.errors import Code, ServingError
from workbench.models.routing import policy as r
from workbench.models.routing.policy import CanarySplit, Decision, Routing, decide
from workbench.models.routing.routing_file import DamagedRoutingState, decode, encode


def decision(routing: Routing, available=(), on_disk=(1, 2, 3), policy=(3,), held=()) -> Decision:
    return decide(routing, available=set(available), on_disk=set(on_disk), policy_versions=set(policy), held=held)


# ------------------------------------------------------------------------------------------------- decide
def test_without_routing_it_is_tf_servings_default():
    d = decision(Routing(), available={2, 3})
    assert (d.default_version, dict(d.shares), d.aspired) == (3, {2: 0.0, 3: 1.0}, {3})
    assert decision(Routing(), available=()).default_version is None
    assert decision(Routing(), available=()).shares == {}


def test_stable_is_the_default_while_it_serves_and_is_kept_loaded():
    promoted = Routing(stable=1, history=(2,))
    d = decision(promoted, available={1, 3})
    assert d.default_version == 1 and d.shares == {1: 1.0, 3: 0.0}
    assert d.aspired == {1, 2, 3}  # the stable, the rollback target, the policy's
    # while the stable loads (another replica promoted it), the latest keeps serving
    assert decision(promoted, available={3}).default_version == 3


def test_canary_share_and_labels():
    routing = Routing(stable=1, canary=2, canary_weight=0.1)
    d = decision(routing, available={1, 2, 3})
    assert d.shares == {1: pytest.approx(0.9), 2: pytest.approx(0.1), 3: 0.0}
    assert d.aspired == {1, 2, 3}
    assert decision(routing, available={1, 3}).shares == {1: 1.0, 3: 0.0}  # a canary not loaded here gets nothing
    assert r.labels_of({}, routing) == {"stable": 1, "canary": 2}


def test_versions_not_on_disk_are_never_aspired():
    d = decision(Routing(stable=7, pinned=frozenset({8})), available={3})
    assert d.aspired == {3} and d.default_version == 3


def test_drops_and_holds():
    assert decision(Routing(pinned=frozenset({1}), dropped=frozenset({3})), available={1, 3}).aspired == {1}
    # a change in progress holds a version even if it was dropped
    assert decision(Routing(dropped=frozenset({2})), held={2}).aspired == {2, 3}


def test_drops_never_leave_a_model_with_nothing_to_serve():
    d = decision(Routing(dropped=frozenset({3})), available={3})
    assert d.drops_ignored and d.aspired == {3}
    assert not decision(Routing(dropped=frozenset({3})), on_disk=(), available=()).drops_ignored


def test_a_config_file_label_wins_and_management_of_it_is_refused():
    routing = Routing(stable=2, canary=3, canary_weight=0.5)
    assert r.labels_of({"stable": 1, "old": 1}, routing) == {"stable": 1, "canary": 3, "old": 1}
    with pytest.raises(ServingError) as refused:
        r.check_label_owner("m", "stable", {"stable": 1})
    assert refused.value.code == Code.FAILED_PRECONDITION
    assert 'Label "stable" of model m is set by the model config file' in refused.value.message
    r.check_label_owner("m", "canary", {"stable": 1})  # a label the config does not name is the routing's


# ------------------------------------------------------------------------------------------------ changes
def test_promote_keeps_history_and_graduates_the_canary():
    first = r.promote(Routing(), 1)
    assert first == Routing(stable=1)
    second = r.promote(r.set_canary(first, 2, 0.2), 2)
    assert second == Routing(stable=2, history=(1,))
    assert r.promote(second, 2) == second  # promoting the stable again changes nothing
    assert r.promote(Routing(dropped=frozenset({3})), 3).dropped == frozenset()


def test_rollback_skips_history_that_does_not_serve():
    routing = Routing(stable=3, history=(1, 2))
    assert r.rollback("m", routing, available={1, 3}) == (Routing(stable=1), 1)
    assert r.rollback("m", routing, available={1, 2, 3}) == (Routing(stable=2, history=(1,)), 2)
    with pytest.raises(ServingError) as refused:
        r.rollback("m", routing, available={3})
    assert (refused.value.code, refused.value.message) == (
        Code.FAILED_PRECONDITION,
        "Model m has no previous stable version to roll back to",
    )


def test_canary_start_change_and_end():
    started = r.set_canary(Routing(stable=1), 2, 0.25)
    assert (started.canary, started.canary_weight) == (2, 0.25)
    assert r.set_canary(started, 3, 0) == started  # ending another version's canary leaves this one
    assert r.set_canary(started, 2, 0) == Routing(stable=1)
    with pytest.raises(ServingError) as refused:
        r.set_canary(started, 2, 1.5)
    assert refused.value.code == Code.INVALID_ARGUMENT


def test_pin_and_drop():
    pinned = r.pin(Routing(stable=2, history=(1,), dropped=frozenset({3})), 3)
    assert (pinned.pinned, pinned.dropped) == ({3}, frozenset())
    dropped = r.drop("m", pinned, 1, available={1, 2})
    assert (dropped.dropped, dropped.history) == ({1}, ())  # a rollback target that is gone is no target
    with pytest.raises(ServingError, match="Version 2 of model m is its stable version"):
        r.drop("m", pinned, 2, available={1, 2})
    with pytest.raises(ServingError, match="only version of model m serving"):
        r.drop("m", Routing(), 1, available={1})
    with pytest.raises(ServingError, match="is its canary version"):
        r.drop("m", Routing(canary=1, canary_weight=0.5), 1, available={1, 2})


def test_removing_the_last_version_empties_the_model_on_purpose():
    """TorchServe's unregister and Triton's unload (``keep_last=False``): the last serving version goes with its
    roles, and the drop that leaves nothing to load is then applied, not ignored; a pin serves the model again."""
    promoted = Routing(stable=1, history=(1,), shadow=1, shadow_fraction=0.5)
    emptied = r.drop("m", promoted, 1, available={1}, keep_last=False)
    assert emptied == Routing(dropped=frozenset({1}), emptied=True)
    assert decision(emptied, available={1}, on_disk={1}, policy={1}).aspired == frozenset()
    assert not decision(emptied, available={1}, on_disk={1}, policy={1}).drops_ignored
    # a hand-written or raced drop of everything is still ignored
    assert decision(Routing(dropped=frozenset({1})), on_disk={1}, policy={1}).drops_ignored
    with pytest.raises(ServingError, match="is its stable version"):  # roles still hold while another serves
        r.drop("m", Routing(stable=1), 1, available={1, 2}, keep_last=False)
    assert r.pin(emptied, 1) == Routing(pinned=frozenset({1}))
    assert decode(encode(emptied, 3), "routing.json").routing == emptied
    assert "emptied" not in json.loads(encode(Routing(stable=1), 3))  # files of routings that never emptied stay


# ------------------------------------------------------------------------------------------- the split
def test_canary_split_is_exact_and_restarts_with_a_new_canary():
    split = CanarySplit()
    routing = Routing(stable=1, canary=2, canary_weight=0.1)
    picks = Counter(split.pick(routing, {1, 2}) for _ in range(1000))
    assert picks == Counter({1: 900, 2: 100})
    other = Routing(stable=1, canary=2, canary_weight=0.5)
    assert Counter(split.pick(other, {1, 2}) for _ in range(10)) == Counter({1: 5, 2: 5})
    assert {split.pick(routing, {1}) for _ in range(10)} == {1}  # a canary not loaded gets nothing
    assert split.pick(Routing(), {1, 4}) == 4


# ------------------------------------------------------------------------------------ the stored form
def test_routing_json_round_trip_and_damage():
    routing = Routing(stable=1, history=(3, 2), canary=4, canary_weight=0.25, pinned=frozenset({5}))
    stored = decode(encode(routing, 7), "routing.json")
    assert (stored.routing, stored.generation) == (routing, 7)
    assert stored.etag and stored.etag != decode(encode(routing, 8), "routing.json").etag
    doc = json.loads(encode(routing, 7))
    assert doc["generation"] == 7 and doc["history"] == [3, 2] and "written_by" in doc
    # a hand-written file needs only what it sets
    assert decode(b'{"stable": 2}', "f").routing == Routing(stable=2)
    for damaged in (b"[]", b"{", b'{"generation": -1}', b'{"pinned": 3}', b'{"stable": true}'):
        with pytest.raises(DamagedRoutingState, match="f is not a routing state"):
            decode(damaged, "f")
