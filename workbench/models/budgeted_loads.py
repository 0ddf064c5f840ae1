"""Versions that leave memory and come back when asked for: the manager's part for ``--memory_budget``,
``--load_on_demand``, ``--unload_after_idle`` and ``--pin``.

:class:`BudgetedLoads` works on the state the :class:`~workbench.models.manager.Manager` owns
(:class:`~workbench.models.served.ServedState`), under its lock like the rest, and has the manager's lifecycle load,
unload and publish through the :class:`Transitions` it is handed:

- which aspired version loads now (:meth:`BudgetedLoads.load_within_budget`): a *needed* one (pinned, held by a
  management change, claimed by a request, or replacing a version that serves) always, evicting the least recently
  used idle versions to fit, or waiting in START for some to become idle; one nobody asked for only with room to
  spare and without --load_on_demand; an evicted one only when needed again. A version that cannot fit ends with
  RESOURCE_EXHAUSTED (TF Serving's "Insufficient resources to load servable");
- requests for a version that does not serve (:meth:`BudgetedLoads.resident`, :meth:`BudgetedLoads.claim`): the
  request claims it, which loads it and keeps it from eviction until the request holds it
  (:meth:`BudgetedLoads.release_claim`); the data plane waits meanwhile (:mod:`workbench.planes.on_demand`);
- evictions (:meth:`BudgetedLoads._evict`): only AVAILABLE, unpinned versions no request holds or waits for; the
  harness drains what reached it anyway, so nothing serving is unloaded under a request;
- ``--unload_after_idle`` (:meth:`BudgetedLoads.start_idle_watch`, a thread of its own).

The decisions are :mod:`workbench.models.memory_policy`'s, the ledger :mod:`workbench.models.residency`'s; the
manager calls in here as its versions are reconciled, loaded and unloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable

from workbench.core.errors import Code, ServingError
from workbench.models import memory_policy as memory
from workbench.models.harness import Harness
from workbench.models.records import DiskVersion, ModelRecord, VersionRecord, VersionState
from workbench.models.residency import waiting_order
from workbench.models.routing import policy as decisions
from workbench.models.served import ServedState

log = logging.getLogger("workbench.models.manager")  # the manager's log lines, wherever its parts live

Claim = tuple[str, int]  # (model, version) a request waits for


@dataclasses.dataclass(frozen=True)
class Transitions:
    """What the budget has the lifecycle that owns it do (:class:`~workbench.models.manager.Manager`'s; each called
    with the lock held)."""

    reconcile: Callable[[ModelRecord], None]  # move a model towards its aspired versions
    set_state: Callable[[ModelRecord, VersionRecord, VersionState], None]  # a version's new state, published
    start_load: Callable[[ModelRecord, VersionRecord], object]  # load it on a load thread
    start_unload: Callable[[ModelRecord, VersionRecord], object]  # unload it on a load thread
    submit: Callable[[Callable[[], None]], object]  # run a task on a load thread (RuntimeError once stopped)


class BudgetedLoads:
    """The memory budget's side of the manager (see the module's docstring), over the state the manager owns."""

    def __init__(self, state: ServedState, transitions: Transitions) -> None:
        """``transitions``: what a load, an eviction or a wait sets going."""
        self._state = state  # shared with the manager's other parts; only the manager writes
        self._transitions = transitions
        self._on_demand = self._state.memory.active  # asked on every request: fixed for the server's life
        self._stopped = False
        self._idle_watch = threading.Event()  # set on stop: the idle-unload thread ends
        # Requests waiting for a version they asked for to serve (or fail): called once it has, under the lock.
        self._claim_waiters: dict[Claim, list[Callable[[], None]]] = {}
        # A load measured larger than its estimate put the server over its budget: the versions evicted to bring it
        # back, until they have left (a request that loaded a version is answered once the budget holds again),
        # and whether it is still over with those gone (the rest were in use: evicted once idle).
        self._making_room: set[Claim] = set()
        self._over_budget = False

    def start_idle_watch(self) -> None:
        """--unload_after_idle: start the thread that evicts idle versions (once the manager is built)."""
        if self._state.memory.options.unload_after_idle > 0:
            threading.Thread(target=self._unload_idle, name="workbench-idle-unload", daemon=True).start()

    def stop(self) -> None:
        """The manager stops (lock held): nothing is admitted or evicted from now on."""
        self._stopped = True
        self._idle_watch.set()

    # ------------------------------------------------------------- requests for versions that are not loaded
    @property
    def on_demand(self) -> bool:
        """Whether versions leave memory and come back when asked for (--memory_budget, --load_on_demand,
        --unload_after_idle): requests then go through :meth:`resident` and :meth:`claim`."""
        return self._on_demand

    def resident(self, name: str, version: int | None, label: str | None, key: str | None = None) -> Harness | None:
        """The serving version a request names, already acquired for it; None when that version does not serve
        now (evicted, never loaded) or the request names nothing servable (then resolution says why).

        Lock-free, like resolution; a request naming no version wants its model's default among the versions
        it aspires to, loaded or not (the latest, or the promoted one), not whichever happens to be loaded.
        """
        route = self._state.routes.get(name)
        if route is None or (version is not None and label is not None):
            return None
        if label is not None:
            version = route.labels.get(label)
            if version is None:
                return None
        if version is None:
            if route.wanted is None or route.wanted not in route.serving:
                return None
            chosen = route.pick(key)
        else:
            chosen = route.serving.get(version)
        return chosen if chosen is not None and chosen.acquire() else None

    def claim(self, name: str, version: int | None, label: str | None) -> Claim | None:
        """A request waits for the version it names (or its model's default) to serve: load it, evicting others if
        the budget must, and keep it from eviction until :meth:`release_claim`. None when there is nothing to load
        (an unknown model, label or version: resolution answers the request)."""
        with self._state.lock:
            model = self._state.models.get(name)
            if model is None or model.removed or (version is not None and label is not None):
                return None
            if label is not None:
                version = model.label_map.get(label)
            elif version is None:
                version = decisions.default_version(model.routing, set(model.aspired) | model.available())
            if version is None or version not in model.aspired:
                return None
            entry = self._state.memory.of(name, version)
            entry.claims += 1
            entry.asked = True
            self._transitions.reconcile(model)
            return name, version

    def when_claim_settled(self, claim: Claim, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` (from any thread, under the lock) once the claimed version serves or will not;
        False when it already has (``callback`` is never called then)."""
        with self._state.lock:
            if self._claim_settled(claim):
                return False
            self._claim_waiters.setdefault(claim, []).append(callback)
            return True

    def claim_error(self, claim: Claim) -> ServingError | None:
        """Why the claimed version could not load for lack of memory (RESOURCE_EXHAUSTED), if that is why."""
        with self._state.lock:
            model = self._state.models.get(claim[0])
            record = model.versions.get(claim[1]) if model is not None else None
            if record is None or record.state != VersionState.END or record.error is None:
                return None
            return record.error if record.error.code == Code.RESOURCE_EXHAUSTED else None

    def release_claim(self, claim: Claim) -> None:
        """The request that claimed a version holds it now, or gave up: it may be evicted again."""
        with self._state.lock:
            entry = self._state.memory.of(*claim)
            entry.claims = max(0, entry.claims - 1)
            model = self._state.models.get(claim[0])
            if entry.claims == 0 and model is not None and not model.removed:
                self._transitions.reconcile(model)  # a version still waiting for memory for it stops waiting
                self.admit_waiting()  # and one waiting for others may evict it now

    def _claim_settled(self, claim: Claim) -> bool:
        """Whether a claimed version serves, or will not: it failed, or is no longer aspired (lock held)."""
        model = self._state.models.get(claim[0])
        if model is None or model.removed or claim[1] not in model.aspired:
            return True
        record = model.versions.get(claim[1])
        if record is None:
            return True
        if record.state == VersionState.AVAILABLE:
            return not self._making_room
        return record.state == VersionState.END and record.error is not None

    def wake_claims(self) -> None:
        """Call what waits for the claimed versions that have settled (lock held)."""
        if not self._claim_waiters:
            return
        for claim in [c for c in self._claim_waiters if self._claim_settled(c)]:
            for callback in self._claim_waiters.pop(claim):
                try:
                    callback()
                except Exception:  # a waiter must not break the manager
                    log.exception("claim callback failed")

    # ------------------------------------------------------------------------------------- the memory budget
    def load_within_budget(
        self, model: ModelRecord, version: int, disk: DiskVersion, record: VersionRecord | None, retry: bool
    ) -> None:
        """Load an aspired ``version`` if it is wanted now, within the budget (lock held).

        Wanted now: needed (pinned, held by a management change, asked for by a request), replacing a version that
        serves, or, without --load_on_demand, never loaded yet and fitting without evicting anything. An evicted
        version comes back only when needed. A needed one evicts the least recently used idle versions to fit, or
        waits (START) for some to be idle; one that cannot fit at all ends with RESOURCE_EXHAUSTED.
        """
        name = model.config.name
        entry = self._state.memory.of(name, version)
        self._state.memory.note_files(name, version, disk)  # read here, on the source's thread, not a request's
        needed = self._state.memory.needed(model, version) or self._replaces_serving(model, version)
        if record is not None and record.state == VersionState.START:
            if not needed:
                self.stop_waiting(model, record)
            return
        if record is not None and record.state == VersionState.END and entry.refused:
            # Refused for lack of memory: tried again when a request or a change asks for it (pins may have moved).
            retry = entry.asked or version in model.held
        entry.asked = False
        if not (record is None or retry):
            return
        if not needed and (self._state.memory.options.load_on_demand or record is not None):
            return
        need = self._state.memory.estimate(name, version, disk.path, model.config.platform)
        plan = memory.plan_load(
            self._state.memory.budget, need, self._state.memory.tenants(self._state.models), f"{name}:{version}"
        )
        if not needed and plan.verdict is not memory.Verdict.LOAD:
            return  # loads nobody asked for never evict: it loads when asked for
        record = VersionRecord.of(version, disk)
        model.versions[version] = record
        self._carry_out(model, record, plan, need)

    def _replaces_serving(self, model: ModelRecord, version: int) -> bool:
        """Whether ``version`` is the model's default-to-be while a version it replaces serves (a new latest
        version): it loads at once, as without a budget, so the model keeps serving across the swap."""
        serving_old = any(
            r.state == VersionState.AVAILABLE and v not in model.aspired for v, r in model.versions.items()
        )
        return serving_old and version == decisions.default_version(model.routing, model.aspired)

    def _carry_out(self, model: ModelRecord, record: VersionRecord, plan: memory.Plan, need: memory.Footprint) -> None:
        """Load ``record`` now, evict what it needs gone and wait, or refuse it, as ``plan`` says (lock held)."""
        name, version = model.config.name, record.version
        if plan.verdict is memory.Verdict.LOAD:
            self._state.memory.reserve(name, version, need)
            self._transitions.set_state(model, record, VersionState.LOADING)
            self._transitions.start_load(model, record)
        elif plan.verdict is memory.Verdict.REFUSE:
            log.error("Not loading %s version %d: %s", name, version, plan.reason)
            self._state.memory.of(name, version).refused = True
            self._state.memory.released(name, version)
            record.error = ServingError(Code.RESOURCE_EXHAUSTED, plan.reason)
            self._transitions.set_state(model, record, VersionState.END)
        else:
            for victim in plan.victims:
                self._evict(victim, f"to make room for {name}:{version}", "budget")
            if (name, version) not in self._state.memory.waiting:
                self._state.memory.of(name, version).waiting_since = self._state.memory.clock()
                self._state.memory.waiting[(name, version)] = (model, record)
                if not plan.victims:
                    log.debug("%s", plan.reason)
                self._transitions.set_state(model, record, VersionState.START)  # listeners see it wait

    def _evict(self, victim: memory.Tenant, why: str, reason: str) -> bool:
        """Unload an idle, unpinned version to free memory (lock held); it loads again when asked for. Returns
        whether it was evicted (it may have stopped serving since the tenants were read)."""
        model = self._state.models.get(victim.model)
        record = model.versions.get(victim.version) if model is not None else None
        if model is None or record is None or record.state != VersionState.AVAILABLE:
            return False
        log.info("Evicting %s version %d (%s, %s)", victim.model, victim.version, reason, why)
        self._state.memory.evicted(victim.model, victim.version, reason)
        self._transitions.set_state(model, record, VersionState.UNLOADING)
        self._transitions.start_unload(model, record)
        return True

    def restore_budget(self, why: str) -> None:
        """Back within the budget after a load measured larger than its estimate (lock held): the least recently
        used idle versions leave, and the requests waiting for a load are answered once they have
        (:meth:`_claim_settled`). Versions in use are not evicted under their requests: the server stays over
        until they are idle, and tries again then (:meth:`_memory_freed`)."""
        tenants = self._state.memory.tenants(self._state.models)
        for victim in memory.over_budget(self._state.memory.budget, tenants):
            if self._evict(victim, why, "budget"):
                self._making_room.add(victim.key)
        staying = memory.total(t.charge for t in tenants if not t.leaving and t.key not in self._making_room)
        self._over_budget = not self._state.memory.budget.holds(staying)

    def left(self, name: str, version: int) -> None:
        """A version stopped holding memory (lock held): what waits for memory goes first."""
        self._state.memory.released(name, version)
        self._making_room.discard((name, version))
        self.admit_waiting()

    def stop_waiting(self, model: ModelRecord, record: VersionRecord) -> None:
        """A version waiting for memory is not wanted any more (its requests gave up): it stays unloaded."""
        self._state.memory.released(model.config.name, record.version)
        self._transitions.set_state(model, record, VersionState.END)

    def admit_waiting(self) -> None:
        """Ask again for the versions waiting for memory, first come first (lock held); first, if a load left the
        server over its budget, evict what has become idle since."""
        if self._over_budget:
            self.restore_budget("the budget was overdrawn by a load measured larger than its estimate")
        waiting = self._state.memory.waiting
        for key in waiting_order((k, self._state.memory.of(*k)) for k in list(waiting)):
            model, record = waiting[key]
            if model.versions.get(record.version) is not record or record.state != VersionState.START:
                waiting.pop(key, None)
                continue
            if model.removed or not self._state.memory.needed(model, record.version):
                waiting.pop(key, None)
                self.stop_waiting(model, record)
                continue
            need = self._state.memory.estimate(key[0], key[1], record.path, model.config.platform)
            tenants = self._state.memory.tenants(self._state.models)
            self._carry_out(
                model, record, memory.plan_load(self._state.memory.budget, need, tenants, f"{key[0]}:{key[1]}"), need
            )

    def memory_freed(self) -> None:
        """A request let go of a version (from any thread): if loads wait for memory, or the server is over its
        budget, it may be evicted now."""
        if (self._state.memory.waiting or self._over_budget) and not self._stopped:
            with contextlib.suppress(RuntimeError):  # the manager has stopped
                self._transitions.submit(self._admit_waiting_locked)

    def _admit_waiting_locked(self) -> None:
        with self._state.lock:
            self.admit_waiting()
            self.wake_claims()
            self._state.settled.notify_all()

    def _unload_idle(self) -> None:
        """--unload_after_idle: evict the versions no request has taken for that long (its own thread)."""
        idle = self._state.memory.options.unload_after_idle
        while not self._idle_watch.wait(min(1.0, max(0.05, idle / 4))):
            with self._state.lock:
                if self._stopped:
                    return
                tenants = self._state.memory.tenants(self._state.models)
                for victim in memory.idle_victims(tenants, self._state.memory.clock(), idle):
                    self._evict(victim, f"idle for {idle:g}s", "idle")

    def charge_load(
        self, model: ModelRecord, record: VersionRecord, harness: Harness | None, error: ServingError | None
    ) -> ServingError | None:
        """Charge a load that ended what it was measured to take, or release its reservation; a version that does
        not fit the whole budget once measured is refused after all (lock held). Returns the load's error."""
        name, version = model.config.name, record.version
        measured = self._state.memory.measurements.pop(id(record), None)
        if error is not None or harness is None:
            self._state.memory.released(name, version)
            return error
        charge = self._state.memory.loaded(name, version, measured)
        if self._state.memory.budget.holds(charge):
            return None
        self._state.memory.of(name, version).refused = True
        self._state.memory.released(name, version)
        reason = (
            f"Insufficient resources to load servable {name}:{version}: it took {charge.describe()} once loaded, more "
            f"than the whole memory budget, {self._state.memory.budget.describe()}"
        )
        return ServingError(Code.RESOURCE_EXHAUSTED, reason)
