"""Sticky canaries: a key's version under a split (workbench.models.routing.policy.sticky_pick)."""

from __future__ import annotations

from workbench.models.routing.policy import Routing, sticky_pick

SPLIT = Routing(stable=1, canary=2, canary_weight=0.25)
KEYS = [f"key-{n}" for n in range(20_000)]


def test_many_keys_split_by_the_weight_and_one_key_keeps_its_version() -> None:
    picks = {key: sticky_pick(SPLIT, [1, 2], key) for key in KEYS}
    share = sum(1 for version in picks.values() if version == 2) / len(KEYS)
    assert abs(share - 0.25) < 0.01  # 20,000 keys: one standard deviation is 0.003
    assert all(sticky_pick(SPLIT, [1, 2], key) == picks[key] for key in KEYS[:500])


def test_a_raised_weight_keeps_the_canarys_keys_and_a_new_canary_deals_again() -> None:
    before = {key for key in KEYS if sticky_pick(SPLIT, [1, 2], key) == 2}
    raised = Routing(stable=1, canary=2, canary_weight=0.5)
    after = {key for key in KEYS if sticky_pick(raised, [1, 2], key) == 2}
    assert before < after
    other = Routing(stable=1, canary=3, canary_weight=0.25)
    dealt = {key for key in KEYS if sticky_pick(other, [1, 2, 3], key) == 3}
    assert abs(len(dealt) - len(before)) < 0.05 * len(KEYS) and dealt != before


def test_without_a_canary_sharing_every_key_gets_the_default() -> None:
    assert {sticky_pick(Routing(stable=1), [1, 2], key) for key in KEYS[:100]} == {1}
    assert {sticky_pick(Routing(stable=1, canary=2, canary_weight=0.5), [1], key) for key in KEYS[:100]} == {1}
