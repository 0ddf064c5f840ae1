"""The memory budget's rules as pure functions: the budget's text, what a version is charged, pins, and the
decision of :func:`~workbench.models.memory_policy.plan_load` (load, evict the least recently used idle versions,
wait, refuse), the over-budget correction and ``--unload_after_idle``'s choice."""

from __future__ import annotations

import pytest

from workbench.config.memory_budget import Budget, MemoryOptions, PinRule, parse_budget
from workbench.core.errors import Code, ServingError
from workbench.core.footprint import Footprint
from workbench.models import memory_policy as policy
from workbench.models.memory_policy import Tenant, Verdict

GiB = 2**30


def ram() -> int:
    return 16 * GiB


def gpu() -> int:
    return 80 * GiB


@pytest.mark.parametrize(
    ("text", "host", "device"),
    [
        ("", None, None),
        ("4294967296", 4 * GiB, None),
        ("4Gi", 4 * GiB, None),
        ("4GiB", 4 * GiB, None),
        ("500M", 500 * 10**6, None),
        ("1.5G", 1_500_000_000, None),
        ("0.5", 8 * GiB, None),
        ("25%", 4 * GiB, None),
        ("1.0", 16 * GiB, None),
        ("gpu:0.5", None, 40 * GiB),
        ("gpu:10Gi", None, 10 * GiB),
        ("2Gi, gpu:50%", 2 * GiB, 40 * GiB),
    ],
)
def test_budget_forms(text: str, host: int | None, device: int | None) -> None:
    budget = parse_budget(text, ram=ram, gpu=gpu)
    assert (budget.host, budget.gpu) == (host, device)
    assert budget.bounded == (host is not None or device is not None)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("lots", "is not an amount of memory"),
        ("4Qi", "unknown unit"),
        ("1.5%", None),  # a small share is fine
        ("150%", "from 0 (excluded) to 1"),
        ("0.0", "from 0 (excluded) to 1"),
        ("0", "no memory at all"),
        ("1G,2G", "host memory is given twice"),
        ("gpu:1G,gpu:2G", "GPU memory is given twice"),
    ],
)
def test_malformed_budgets_say_why(text: str, words: str | None) -> None:
    if words is None:
        assert parse_budget(text, ram=ram).host == int(16 * GiB * 0.015)
        return
    with pytest.raises(ServingError) as caught:
        parse_budget(text, ram=ram, gpu=gpu)
    assert caught.value.code == Code.INVALID_ARGUMENT
    assert words in caught.value.message and text.split(",")[0].removeprefix("gpu:") in caught.value.message


def test_a_share_of_memory_nobody_can_tell_asks_for_bytes() -> None:
    with pytest.raises(ServingError, match="give bytes instead"):
        parse_budget("gpu:0.5", gpu=lambda: None)


def test_options_are_active_with_any_of_the_flags() -> None:
    assert not MemoryOptions().active
    assert MemoryOptions(load_on_demand=True).active
    assert MemoryOptions(unload_after_idle=5).active
    assert MemoryOptions.of("1Gi", False, 0, ["m", "n:3"]).pins == (PinRule("m"), PinRule("n", 3))
    with pytest.raises(ServingError, match="cannot be negative"):
        MemoryOptions.of("", False, -1, [])


def test_pins() -> None:
    assert PinRule.parse("resnet") == PinRule("resnet")
    assert PinRule.parse("resnet:7") == PinRule("resnet", 7)
    assert PinRule.parse("a:b") == PinRule("a:b")  # not a version: part of the name
    rules = (PinRule("m"), PinRule("n", 2))
    assert policy.pinned("m", 9, rules, ())
    assert policy.pinned("n", 2, rules, ()) and not policy.pinned("n", 3, rules, ())
    assert policy.pinned("o", 1, rules, {1})  # the routing's (stable, canary, labelled...)
    with pytest.raises(ServingError):
        PinRule.parse("  ")


def test_charge_is_the_measurement_with_the_files_as_floor() -> None:
    assert policy.charge_of(None, 1000) == Footprint(1000, 0)  # before the first load: the files' size
    assert policy.charge_of(Footprint(5000, 0), 1000) == Footprint(5000, 0)
    # The allocator reused freed memory: the growth reads low, the files' size stands.
    assert policy.charge_of(Footprint(0, 0), 1000) == Footprint(1000, 0)
    # The weights went to the GPU: only what is not there counts on the host.
    assert policy.charge_of(Footprint(100, 900), 1000) == Footprint(100, 900)
    # Never loaded, bound for a GPU: its files' size is counted there, so a GPU budget holds from its first load.
    assert policy.charge_of(None, 1000, on_gpu=True) == Footprint(0, 1000)
    assert policy.charge_of(Footprint(100, 900), 1000, on_gpu=True) == Footprint(100, 900)


def test_what_a_version_says_it_holds_is_a_floor_per_kind_of_memory() -> None:
    # Loaded in another process (a model runner): nothing measured here, its tensors' bytes stand.
    assert policy.charge_of(Footprint(0, 0), 1000, held=Footprint(3000, 0)) == Footprint(3000, 0)
    # The measurement saw more (its tokenizer, the library's caches): the measurement stands.
    assert policy.charge_of(Footprint(5000, 0), 1000, held=Footprint(3000, 0)) == Footprint(5000, 0)
    # Other GPU work freed memory while it loaded: the GPU growth reads low, its weights on the GPU stand, and the
    # files' size is not counted on the host for weights that are on the GPU.
    assert policy.charge_of(Footprint(100, 10), 1000, held=Footprint(0, 900)) == Footprint(100, 900)
    # Known without a measurement (a platform that measures nothing): the held bytes, not the estimate's GPU guess.
    assert policy.charge_of(None, 1000, on_gpu=True, held=Footprint(0, 1200)) == Footprint(0, 1200)


@pytest.mark.parametrize(
    ("device", "gpu_budget", "expected"),
    [
        ("cuda", 8 * GiB, Footprint(0, 4096)),  # bound for the GPU, under a GPU budget
        ("cpu", 8 * GiB, Footprint(4096, 0)),  # --pytorch_device=cpu
        ("cuda", None, Footprint(4096, 0)),  # no GPU budget: nothing to keep, the platform is not asked
    ],
)
def test_a_first_loads_estimate_is_on_the_device_its_platform_places_it(tmp_path, device, gpu_budget, expected):
    from workbench.models.residency import Residency
    from workbench.platforms import Loader
    from workbench.platforms.base import LoadPolicy

    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.pt2").write_bytes(b"\0" * 4096)  # its files name the platform; nothing is loaded here
    from workbench.runtime.storage import VersionCache, caching_loader

    # The server's loader: the platforms' Loader behind the cache of remote versions, which keeps its answer.
    loader = caching_loader(Loader(LoadPolicy(pytorch_device=device)), VersionCache(tmp_path / "cache"))
    ledger = Residency(MemoryOptions(Budget(gpu=gpu_budget)), on_gpu=loader.places_on_gpu)
    assert ledger.estimate("m", 1, str(folder)) == expected
    assert ledger.estimate("m", 1, str(folder), "pytorch") == expected
    # A platform that never places models on a GPU (scikit-learn), and a folder no platform claims.
    assert not loader.places_on_gpu(str(folder), "sklearn")
    assert not loader.places_on_gpu(str(tmp_path))


def tenant(version: int, used: float, size: int = 100, **flags: bool) -> Tenant:
    return Tenant(
        "m",
        version,
        Footprint(size, 0),
        used,
        pinned=flags.get("pinned", False),
        busy=flags.get("busy", False),
        resident=flags.get("resident", True),
        leaving=flags.get("leaving", False),
    )


BUDGET = Budget(host=500, text="500")


def test_a_version_that_fits_loads() -> None:
    assert policy.plan_load(BUDGET, Footprint(100), [tenant(1, 0), tenant(2, 1)], "m:3").verdict is Verdict.LOAD


def test_the_least_recently_used_idle_unpinned_versions_leave_first() -> None:
    tenants = [tenant(1, 5.0), tenant(2, 1.0), tenant(3, 3.0), tenant(4, 2.0), tenant(5, 4.0)]
    plan = policy.plan_load(BUDGET, Footprint(200), tenants, "m:6")
    assert plan.verdict is Verdict.EVICT
    assert [t.version for t in plan.victims] == [2, 4]  # used at 1.0 and 2.0: the two needed, no more


def test_pinned_busy_and_loading_versions_are_never_victims() -> None:
    tenants = [
        tenant(1, 0.0, pinned=True),
        tenant(2, 1.0, busy=True),
        tenant(3, 2.0, resident=False),  # loading
        tenant(4, 3.0),
        tenant(5, 4.0),
    ]
    plan = policy.plan_load(BUDGET, Footprint(100), tenants, "m:6")
    assert [t.version for t in plan.victims] == [4]


def test_when_the_victims_are_busy_the_load_waits() -> None:
    tenants = [tenant(v, v, busy=True) for v in range(1, 6)]
    plan = policy.plan_load(BUDGET, Footprint(100), tenants, "m:6")
    assert plan.verdict is Verdict.WAIT and "in use" in plan.reason


def test_memory_on_its_way_back_is_waited_for_not_evicted_again() -> None:
    tenants = [tenant(1, 0.0, resident=False, leaving=True), *(tenant(v, v) for v in range(2, 6))]
    plan = policy.plan_load(BUDGET, Footprint(100), tenants, "m:6")
    assert plan.verdict is Verdict.WAIT and "being unloaded" in plan.reason


def test_a_version_bigger_than_the_budget_is_refused_with_the_figures() -> None:
    plan = policy.plan_load(BUDGET, Footprint(600), [], "big:1")
    assert plan.verdict is Verdict.REFUSE
    assert plan.reason.startswith("Insufficient resources to load servable big:1: it needs 600 B")
    assert "--memory_budget=500" in plan.reason


def test_a_version_that_pinned_ones_leave_no_room_for_is_refused() -> None:
    tenants = [tenant(1, 0, size=300, pinned=True), tenant(2, 0, size=100)]
    plan = policy.plan_load(BUDGET, Footprint(300), tenants, "m:3")
    assert plan.verdict is Verdict.REFUSE and "pinned versions (m:1)" in plan.reason


def test_victims_free_the_kind_of_memory_that_is_short() -> None:
    budget = Budget(host=None, gpu=1000)
    host_only = Tenant("cpu", 1, Footprint(900, 0), 0.0, pinned=False, busy=False, resident=True)
    on_gpu = Tenant("gpu", 1, Footprint(10, 800), 1.0, pinned=False, busy=False, resident=True)
    plan = policy.plan_load(budget, Footprint(0, 500), [host_only, on_gpu], "gpu:2")
    assert [t.model for t in plan.victims] == ["gpu"]  # the older host-only version frees no GPU memory


def test_over_budget_evicts_until_it_fits() -> None:
    tenants = [tenant(1, 1.0, size=300), tenant(2, 2.0, size=200), tenant(3, 3.0, size=200)]
    assert [t.version for t in policy.over_budget(BUDGET, tenants)] == [1]
    assert policy.over_budget(BUDGET, tenants[1:]) == ()


def test_idle_versions() -> None:
    tenants = [tenant(1, 0.0), tenant(2, 8.0), tenant(3, 1.0, pinned=True), tenant(4, 0.0, busy=True)]
    assert [t.version for t in policy.idle_victims(tenants, now=10.0, idle_seconds=5.0)] == [1]
    assert policy.idle_victims(tenants, now=10.0, idle_seconds=0) == []
