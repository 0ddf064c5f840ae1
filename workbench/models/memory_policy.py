"""Many models in bounded memory: the rules, as pure functions of the state they are given.

``--memory_budget`` bounds what the loaded versions may hold; :func:`plan_load` decides whether a version may load
now, which least recently used versions must leave first, or why it cannot load; :func:`idle_victims` names the
versions idle for longer than ``--unload_after_idle``; :func:`charge_of` says what a version is counted for; pins
(:class:`PinRule`, ``--pin``) say which versions are never evicted. No clock, no lock, no I/O here: the manager
gathers the state under its lock (:mod:`workbench.models.residency`) and carries the decision out, the way TF
Serving's ``AspiredVersionPolicy`` is fed the versions' states.

What is counted: each version holding memory (loading, serving or unloading) is charged a :class:`Footprint`: host
bytes and GPU bytes. Before its first load, a version's estimate is its files' size on disk (on the GPU where its
platform will place it there, so a GPU budget is kept from its first load on); once loaded, it is
what its load was seen to add (resident memory and GPU memory, :class:`~workbench.models.residency.LoadMeter`), with
two floors: what the version says it holds, where its servable says (``Servable.memory_held``: a Hugging Face
model's parameters and buffers, on the device each is on), and the files' size for the part not on the GPU.
Allocators keep and reuse freed memory, so the process's growth around one load can read low (or 0), and a version
loaded in another process (a model runner) adds nothing here, while a model's weights take at least their files'
size somewhere, and exactly their tensors' bytes. The budget
holds when the charges' sum fits it, per kind of memory.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from workbench.config.memory_budget import Budget, PinRule
from workbench.core.footprint import Footprint


def total(footprints: Iterable[Footprint]) -> Footprint:
    result = Footprint()
    for footprint in footprints:
        result = result + footprint
    return result


# ---------------------------------------------------------------------------------------------- what is charged
def charge_of(
    measured: Footprint | None, disk_bytes: int, on_gpu: bool = False, held: Footprint | None = None
) -> Footprint:
    """What a version is counted for: its files' size before its first load (``measured`` and ``held`` None), in
    GPU memory where its platform places it on a GPU (``on_gpu``), else in host memory; once loaded, what its load
    was measured to add, with two floors: what the version says it holds (``held``: a Hugging Face model's
    parameters and buffers, per device), and its files' size not accounted for on the GPU, for the host part."""
    if measured is None and held is None:
        return Footprint(0, max(0, disk_bytes)) if on_gpu else Footprint(max(0, disk_bytes), 0)
    measured = measured or Footprint()
    held = held or Footprint()
    gpu = max(0, measured.gpu, held.gpu)
    return Footprint(max(measured.host, held.host, disk_bytes - gpu, 0), gpu)


def pinned(model: str, version: int, rules: Sequence[PinRule], routed: Iterable[int]) -> bool:
    """Whether a version is never evicted: a ``--pin`` names it, or its model's routing needs it (``routed``: the
    stable version, the one a rollback returns to, the canary, the shadow, versions pinned by a management load,
    and the versions a label names)."""
    return version in routed or any(rule.covers(model, version) for rule in rules)


# ------------------------------------------------------------------------------------------------- the decision
@dataclasses.dataclass(frozen=True)
class Tenant:
    """A version that holds memory (or is about to): what the policy weighs."""

    model: str
    version: int
    charge: Footprint
    last_used: float  # when a request last took it (or it loaded): the LRU order
    pinned: bool
    busy: bool  # requests run on it, or wait for it: never evicted under them
    resident: bool  # serving (AVAILABLE); a version loading or unloading cannot be evicted, but counts
    leaving: bool = False  # unloading: it still counts, but its memory is on its way back

    @property
    def key(self) -> tuple[str, int]:
        return self.model, self.version

    @property
    def evictable(self) -> bool:
        return self.resident and not self.pinned and not self.busy


class Verdict(enum.Enum):
    LOAD = "load"  # it fits now
    EVICT = "evict"  # it fits once the victims have left
    WAIT = "wait"  # it could fit, but what must leave is busy (or still loading): ask again when that changes
    REFUSE = "refuse"  # it cannot fit: it is bigger than the budget, or than what pinned versions leave of it


@dataclasses.dataclass(frozen=True)
class Plan:
    verdict: Verdict
    victims: tuple[Tenant, ...] = ()
    reason: str = ""


def lru(tenants: Iterable[Tenant]) -> list[Tenant]:
    """The evictable tenants, least recently used first (ties: by name and version, so the order is stable)."""
    return sorted((t for t in tenants if t.evictable), key=lambda t: (t.last_used, t.model, t.version))


def plan_load(budget: Budget, need: Footprint, tenants: Sequence[Tenant], what: str) -> Plan:
    """Whether a version of ``need`` (``what`` names it) may load beside ``tenants``, and what must leave first.

    Victims are the least recently used evictable versions, taken in that order, skipping those that free none of
    the kind of memory that is short, until the load fits.
    """
    if not budget.holds(need):
        return Plan(
            Verdict.REFUSE,
            reason=f"Insufficient resources to load servable {what}: it needs {need.describe()}, more than the whole "
            f"memory budget, {budget.describe()}",
        )
    held = total(t.charge for t in tenants)
    if budget.holds(held + need):
        return Plan(Verdict.LOAD)
    coming = held - total(t.charge for t in tenants if t.leaving)
    if budget.holds(coming + need):
        return Plan(Verdict.WAIT, reason=f"{what} waits for versions being unloaded to free their memory")
    held = coming
    pins = [t for t in tenants if t.pinned]
    if not budget.holds(total(t.charge for t in pins) + need):
        names = ", ".join(f"{t.model}:{t.version}" for t in pins)
        return Plan(
            Verdict.REFUSE,
            reason=f"Insufficient resources to load servable {what}: it needs {need.describe()}, and pinned versions "
            f"({names}) hold {total(t.charge for t in pins).describe()} of the memory budget, {budget.describe()}",
        )
    victims: list[Tenant] = []
    for candidate in lru(tenants):
        short = budget.short(held + need)
        frees = (short.host > 0 and candidate.charge.host > 0) or (short.gpu > 0 and candidate.charge.gpu > 0)
        if not frees:
            continue
        victims.append(candidate)
        held = held - candidate.charge
        if budget.holds(held + need):
            return Plan(Verdict.EVICT, tuple(victims))
    return Plan(
        Verdict.WAIT,
        reason=f"{what} waits for memory: the versions that would make room for it are in use or still loading",
    )


def over_budget(budget: Budget, tenants: Sequence[Tenant]) -> tuple[Tenant, ...]:
    """The versions to evict, least recently used first, to bring ``tenants`` back under the budget (a version
    measured larger than its estimate): as many as that takes among the evictable ones."""
    plan = plan_load(budget, Footprint(), tenants, "")
    return plan.victims if plan.verdict is Verdict.EVICT else ()


def idle_victims(tenants: Iterable[Tenant], now: float, idle_seconds: float) -> list[Tenant]:
    """``--unload_after_idle``: the evictable versions no request has taken for ``idle_seconds`` (0: never)."""
    if idle_seconds <= 0:
        return []
    return [t for t in lru(tenants) if now - t.last_used >= idle_seconds]
