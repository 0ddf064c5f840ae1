"""The lifecycle of model versions: aspired versions in, loaded servables out, availability preserved.

A source (the repository poller) tells the manager which versions each model *should* serve and has it re-read
each model's routing state; the manager asks :func:`~workbench.models.routing.policy.decide` what that means, loads new
versions on its load threads (warming them up), and only then unloads the versions they replace, so a model that
was serving never stops serving. A version that fails to load ends in END with its error, and the versions
already serving keep serving. A model whose versions stand for files read at load (``ModelConfig.reload_changed``:
MLServer's model-settings.json) reloads a serving version whose files changed: the new load replaces the old one in
one route once it serves, and the old one unloads after its requests. A composite version (a pipeline) becomes
AVAILABLE only once the models it runs on
serve: it waits, loaded, while they load, and a version that failed for lack of them is retried when they serve
(:mod:`~workbench.models.composites`).

All state sits behind one lock, held only for bookkeeping: loads, unloads, reading and writing the routing state,
and building JSON views all run off it. The manager owns that state (:class:`~workbench.models.served.ServedState`:
the records of :mod:`~workbench.models.records` and the lock) and the parts that work on it: ``served``
(:class:`~workbench.models.served.ServedModels`, the queries: status, views, resolution) and ``budgeted_loads``
(:class:`~workbench.models.budgeted_loads.BudgetedLoads`, the memory budget's part, handed the transitions below as
callbacks); the manager is the one writer. Requests never take the lock: each model's
:class:`~workbench.models.routes.Route` (its serving versions, labels and routing) is an immutable snapshot, replaced
under the lock whenever one of those changes and read without it. A management change (promote, rollback, canary,
load, unload) is a compare-and-write of the model's stored routing (``routing_state``), so replicas sharing a
repository agree: :class:`~workbench.models.routing.changes.RoutingChanges` makes it through the public methods here
(the server's control plane, :mod:`workbench.planes.controlplane`, holds the one instance), and the manager only
keeps the versions it needs loaded.

Why a module of this size: it is the one writer of the served models, and every transition (load, publish,
unload, retry, a late load of a removed model) is read here together with the lock it holds; the reads, records,
routes, composites and first loads live beside it (:mod:`~workbench.models.served` and its siblings).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

from workbench.config.memory_budget import MemoryOptions
from workbench.config.options import ModelConfig
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Composite, Loader, Servable
from workbench.models import composites
from workbench.models.budgeted_loads import BudgetedLoads, Transitions
from workbench.models.harness import Harness
from workbench.models.records import DiskVersion, ModelRecord, VersionRecord, VersionState, VersionStatus
from workbench.models.residency import Residency, memory_held
from workbench.models.routes import ServableHandle, check_labels, route_of
from workbench.models.routing import policy as decisions
from workbench.models.routing.policy import Routing
from workbench.models.routing.reading import RoutingReader
from workbench.models.routing.routing_file import (
    RoutingStateStore,
    StoredRouting,
    routing_store_for,
)
from workbench.models.served import ServedModels, ServedState

# Importers name these here: the manager's vocabulary, kept in its records and routes modules.
__all__ = ["DiskVersion", "Manager", "ServableHandle", "VersionState", "VersionStatus"]

log = logging.getLogger(__name__)

Warmup = Callable[[Servable], None]
StateListener = Callable[[str, int, "VersionState"], None]
RoutingStores = Callable[[str], RoutingStateStore]


class Manager:
    """The models' versions, loaded and routed: the one writer of the state it owns. Its parts: :attr:`served`, the
    reads of that state (status, views, resolution), and :attr:`budgeted_loads`, the memory budget's part (which
    version loads now, requests' claims, evictions)."""

    def __init__(
        self,
        loader: Loader,
        *,
        warmup: Warmup | None = None,
        load_threads: int = 2,
        allow_labels_for_unavailable: bool = False,
        routing_stores: RoutingStores = routing_store_for,
        initial_routing: Mapping[str, Routing] | None = None,
        memory: MemoryOptions | None = None,
    ) -> None:
        """``routing_stores(base_path)`` gives a model's routing store; ``initial_routing`` is each model's routing
        while its store holds none (an older workbench's state file, migrated on the first change); ``memory``: the
        memory budget, loading on demand, unloading idle versions and pins (see :mod:`workbench.models.residency`)."""
        places_on_gpu = getattr(loader, "places_on_gpu", None)  # a plain function loads nothing onto a GPU
        on_gpu = places_on_gpu or (lambda path, platform: False)
        state = ServedState(Residency(memory or MemoryOptions(), on_gpu=on_gpu))
        self._state = state  # shared with the manager's other parts; only the manager writes
        self.served = ServedModels(state)
        self._loader = loader
        self._routing_stores = routing_stores
        self._routing_reader = RoutingReader(initial_routing)
        self._warmup = warmup
        self._allow_unavailable_labels = allow_labels_for_unavailable
        self._executor = ThreadPoolExecutor(max_workers=max(1, load_threads), thread_name_prefix="workbench-load")
        self._closed = False
        self._listeners: list[StateListener] = []
        self._change_locks: dict[str, threading.Lock] = {}  # routing changes: one change of a model at a time
        self.budgeted_loads = BudgetedLoads(
            state,
            Transitions(
                reconcile=self._reconcile,
                set_state=self._set_state,
                start_load=lambda model, record: self._executor.submit(self._load, model, record),
                start_unload=lambda model, record: self._executor.submit(self._unload, model, record),
                submit=self._executor.submit,
            ),
        )
        self.budgeted_loads.start_idle_watch()

    # ----------------------------------------------------------------------------------------- config
    def set_models(self, configs: Iterable[ModelConfig]) -> None:
        """Serve exactly these models (labels are applied separately, once versions have loaded)."""
        configs = list(configs)
        names = {c.name for c in configs}
        with self._state.lock:
            for config in configs:
                model = self._state.models.get(config.name)
                if model is None or model.removed:
                    initial = self._routing_reader.initial(config.name)
                    model = ModelRecord(config=config, store=self._routing_stores(config.base_path), stored=initial)
                    model.label_map = decisions.labels_of(model.labels, model.routing)
                    model.labels_pending = bool(config.labels)
                    self._state.models[config.name] = model
                    self._state.first_loads.expect(config.name)
                else:
                    if model.config.base_path != config.base_path:
                        model.store = self._routing_stores(config.base_path)
                    if config.labels and config.labels != model.config.labels:
                        model.labels_pending = True  # a repository's new version names (MLServer's strings)
                    model.config = config
                self._publish(model)
            for name, model in self._state.models.items():
                if name not in names and not model.removed:
                    model.removed = True
                    model.aspired = {}
                    model.labels = {}
                    model.label_map = {}
                    self._publish(model)
                    self._reconcile(model)
                    self._settle_first_load(model)

    def set_labels(self, labels_by_model: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the version labels of the given models, all or nothing.

        A label may only point at an AVAILABLE version unless the server allows labels for unavailable
        models (then it can be set before the version has loaded, as TF Serving's flag allows).
        """
        with self._state.lock:
            try:
                for name, labels in labels_by_model.items():
                    check_labels(self._state.live_model(name), labels, self._allow_unavailable_labels)
                for name, labels in labels_by_model.items():
                    model = self._state.models[name]
                    model.labels = dict(labels)
                    model.label_map = decisions.labels_of(model.labels, model.routing)
                    self._publish(model)
            finally:  # applied or refused, the config's labels are settled: a first load waiting for them is over
                for name in labels_by_model:
                    settled = self._state.models.get(name)
                    if settled is not None and settled.labels_pending:
                        settled.labels_pending = False
                        self._settle_first_load(settled)

    def apply_pending_labels(self) -> None:
        """The labels a model's config names, applied once its versions have loaded or failed, for models the
        repository brought in or renamed versions of after start-up (MLServer's version strings); a config applied
        as a whole (:meth:`ControlPlane.apply_models`) sets its own. A label whose version failed to load waits for it:
        the others are set now, and it is set once that version serves (fixed and retried)."""
        with self._state.lock:
            ready = {
                name: dict(model.config.labels)
                for name, model in self._state.models.items()
                if not model.removed
                and model.scanned
                and (
                    (
                        model.labels_pending
                        and set(model.config.labels.values()) <= set(model.aspired)  # a version still settling
                        and self._aspired_settled(model)
                    )
                    or (model.labels_waiting and self._servable_labels(model) != model.labels)
                )
            }
        for name, labels in ready.items():  # one model at a time: one model's bad label keeps no other's back
            with self._state.lock:
                model = self._state.models[name]
                usable = labels if self._allow_unavailable_labels else self._servable_labels(model)
                waiting = sorted(set(labels) - set(usable))
                first = not model.labels_waiting
            try:
                self.set_labels({name: usable})
            except ServingError as exc:
                log.warning("The version labels of model %s were not applied: %s", name, exc.message)
            with self._state.lock:
                model.labels_waiting = bool(waiting)
            if waiting and first:
                log.warning(
                    "The version labels %s of model %s wait for their versions, which do not serve", waiting, name
                )

    def _servable_labels(self, model: ModelRecord) -> dict[str, int]:
        """The config's labels whose versions serve (lock held)."""
        return {
            label: version
            for label, version in model.config.labels.items()
            if (record := model.versions.get(version)) is not None and record.state == VersionState.AVAILABLE
        }

    @staticmethod
    def _aspired_settled(model: ModelRecord) -> bool:
        """Every version the source aspires to has loaded or failed (none aspired: nothing to label yet)."""
        done = (VersionState.AVAILABLE, VersionState.END)
        states = [model.versions[v].state if v in model.versions else None for v in model.aspired]
        return bool(states) and all(state in done for state in states)

    # ---------------------------------------------------------------------------------------- source
    def set_aspired_versions(
        self, name: str, versions: Mapping[int, DiskVersion], on_disk: Mapping[int, DiskVersion] | None = None
    ) -> None:
        """Called by the source: the policy wants ``versions`` of ``name``; ``on_disk`` is all there is."""
        with self._state.lock:
            model = self._state.models.get(name)
            if model is None or model.removed:
                return
            model.on_disk = dict(on_disk if on_disk is not None else versions)
            model.policy_versions = set(versions)
            first_listing, model.scanned = not model.scanned, True
            self._update_aspired(model)
            if first_listing:  # the versions it starts loading are initial ones: a request for one waits for it
                self._state.first_loads.expect_versions(model)

    def set_source_error(self, name: str, problem: str | None) -> bool:
        """The source could (None) or could not list ``name``'s repository; True when ``problem`` is news."""
        with self._state.lock:
            model = self._state.models.get(name)
            if model is None or model.removed or model.source_error == (problem or ""):
                return False
            model.source_error = problem or ""
            self._settle_first_load(model)
            return problem is not None

    def refresh_routing(self, name: str) -> None:
        """Called by the source on every poll: route ``name`` by its stored routing (read with no lock held).

        A state that cannot be read (damaged, unreachable) leaves the model routing as before, and is logged once.
        """
        with self._state.lock:
            model = self._state.models.get(name)
            if model is None or model.removed:
                return
            store, epoch = model.store, model.routing_epoch
        stored = self._routing_reader.read(name, store)
        if stored is None:
            return
        with self._state.lock:
            if model.routing_epoch == epoch and not model.removed:
                self._apply_routing(model, stored)

    def _apply_routing(self, model: ModelRecord, stored: StoredRouting) -> None:
        """Route by ``stored`` from now on: load and unload what it implies (lock held)."""
        if stored == model.stored:
            return
        if stored.generation != model.stored.generation or stored.routing != model.routing:
            log.info(
                "Model %s routes by generation %d of %s: %s",
                model.config.name,
                stored.generation,
                model.store.location,
                stored.routing.to_json(),
            )
        model.stored = stored
        model.routing_epoch += 1
        model.label_map = decisions.labels_of(model.labels, stored.routing)
        self._publish(model)
        self._update_aspired(model)

    def _update_aspired(self, model: ModelRecord) -> None:
        """Aspire to what the routing decision wants loaded, then move towards it (lock held)."""
        decision = decisions.decide(
            model.routing,
            available=model.available(),
            on_disk=model.on_disk,
            policy_versions=model.policy_versions,
            held=model.held,
        )
        if decision.drops_ignored and not model.drops_ignored:
            log.warning("Model %s: its drops would leave nothing to serve; not dropping", model.config.name)
        model.drops_ignored = decision.drops_ignored
        aspired_before = set(model.aspired)
        model.aspired = {v: model.on_disk[v] for v in sorted(decision.aspired)}
        if aspired_before != set(model.aspired):
            self._publish(model)  # the route's ``wanted`` (a request's default among them) follows them
        self._reconcile(model)

    def _reconcile(self, model: ModelRecord) -> None:
        """Start the loads and unloads that move ``model`` towards its aspired versions (lock held)."""
        if self._closed:
            return
        for version, disk in model.aspired.items():
            record = model.versions.get(version)
            changed = (
                record is not None and record.state == VersionState.AVAILABLE and record.fingerprint != disk.fingerprint
            )
            if changed and self._replace(model, version, disk):
                continue
            retry = (
                record is not None
                and record.state == VersionState.END
                and (
                    record.error is None
                    or record.fingerprint != disk.fingerprint
                    or (record.awaiting and not composites.unserved(self._state.models, record.awaiting))
                )
            )
            if self._state.memory.active:  # versions load when asked for, and within the memory budget
                self.budgeted_loads.load_within_budget(model, version, disk, record, bool(retry))
                continue
            if record is None or retry:
                if record is not None and record.error is not None and record.fingerprint != disk.fingerprint:
                    name = model.config.name
                    log.info("Retrying %s version %d: its files changed since it failed to load", name, version)
                record = VersionRecord.of(version, disk)
                model.versions[version] = record
                self._set_state(model, record, VersionState.LOADING)
                self._executor.submit(self._load, model, record)

        aspired = [model.versions[v] for v in model.aspired if v in model.versions]
        aspired_available = any(r.state == VersionState.AVAILABLE for r in aspired)
        pending = any(r.state in (VersionState.START, VersionState.LOADING) for r in aspired)
        failed = any(r.state == VersionState.END and r.error is not None for r in aspired)
        # Availability first: an old version goes only once a new one serves, or when nothing is on its
        # way to replace it (a removed model, or versions removed from disk with none left to load).
        may_unload = aspired_available or not (pending or failed)
        for record in list(model.versions.values()):
            if record.state == VersionState.START and record.version not in model.aspired:
                self.budgeted_loads.stop_waiting(model, record)  # waiting for memory, and not wanted any more
            if record.version in model.aspired or record.state != VersionState.AVAILABLE:
                continue
            if may_unload:
                self._set_state(model, record, VersionState.UNLOADING)
                self._executor.submit(self._unload, model, record)
        self._wake_parked()
        self._settle_first_load(model)
        self.budgeted_loads.wake_claims()
        self._state.settled.notify_all()

    def _replace(self, model: ModelRecord, version: int, disk: DiskVersion) -> bool:
        """Load serving ``version`` anew from its changed files, where its model reloads changed versions (lock
        held). The new load replaces it once it serves (:meth:`_finish_replacement`), so requests never find the
        version missing; one at a time, and a failed one is not retried until the files change again. Under a
        memory budget a version does not reload (two copies would have to fit). Whether it is this model's way."""
        if not model.config.reload_changed or self._state.memory.active:
            return False
        pending = model.replacing.get(version)
        if pending is not None and (pending.state == VersionState.LOADING or pending.fingerprint == disk.fingerprint):
            return True  # loading (a newer change loads after it), or failed for these very files
        replacement = VersionRecord.of(version, disk)
        replacement.state = VersionState.LOADING
        model.replacing[version] = replacement
        log.info("Reloading %s version %d: its files changed", model.config.name, version)
        self._executor.submit(self._load, model, replacement)
        return True

    def _finish_replacement(
        self, model: ModelRecord, record: VersionRecord, harness: Harness | None, error: ServingError | None
    ) -> Harness | None:
        """A replacement load ended (lock held): it takes its version's place if it serves and the version still
        does; returns the harness to unload (the replaced one, or the replacement when it is not wanted)."""
        name, version = model.config.name, record.version
        serving = model.versions.get(version)
        if error is not None:
            log.error(
                "Reloading %s version %d failed; the version loaded before serves on: %s", name, version, error.message
            )
            record.error, record.state = error, VersionState.END
            return None
        del model.replacing[version]
        wanted = version in model.aspired and serving is not None and serving.state == VersionState.AVAILABLE
        if self._closed or model.removed or not wanted or serving is None:
            record.state = VersionState.END
            return harness
        # The swap, in one route: requests find the version serving all along, the new servable from now on.
        record.harness, record.state = harness, VersionState.AVAILABLE
        model.versions[version] = record
        replaced, serving.harness, serving.state = serving.harness, None, VersionState.END
        self._publish(model)
        # The old load ended and the new one serves: what keeps per-version state (the response cache's answers, a
        # sequence's state) forgets the old; the version's downloaded copy stays, as the version still serves.
        self._notify(model, version, VersionState.END)
        self._notify(model, version, VersionState.AVAILABLE)
        log.info("Reloaded %s version %d", name, version)
        return replaced

    def _load(self, model: ModelRecord, record: VersionRecord) -> None:
        name = model.config.name
        started = time.perf_counter()
        try:
            if self._state.memory.active:  # what the load adds to the process is what it is charged
                prepare = getattr(self._loader, "prepare", None)
                if prepare is not None:  # the framework's import is the process's, not this version's
                    prepare(name, record.version, record.path, model.config.platform)
                with self._state.memory.meter.measure() as measured:
                    servable = self._loader(name, record.version, record.path, model.config.platform)
                measured.held = memory_held(servable)
                with self._state.lock:
                    self._state.memory.measurements[id(record)] = measured
            else:
                servable = self._loader(name, record.version, record.path, model.config.platform)
        except BaseException as exc:  # noqa: BLE001 - a load failure must never kill the load thread
            self._finish_load(model, record, None, record.failed(from_exception(exc)))
            return
        self._admit(model, record, servable, started)

    def _admit(self, model: ModelRecord, record: VersionRecord, servable: Servable, started: float) -> None:
        """Warm ``servable`` up and make it AVAILABLE; a composite first needs the models it runs on serving."""
        name = model.config.name
        if isinstance(servable, Composite):
            with self._state.lock:
                missing = composites.unserved(self._state.models, servable.members())
                if self._state.memory.active:  # members not loaded now load when the composite's requests ask for them
                    missing = frozenset(m for m in missing if not self.served.serves_on_demand(m))
                if missing and any(composites.coming(self._state.models, m) for m in missing):
                    record.parked, record.awaiting = servable, missing  # _wake_parked admits it again
                    return
            if missing:
                servable.close()
                self._finish_load(
                    model, record, None, composites.members_error(self._state.models, name, missing), awaiting=missing
                )
                return
        if self._warmup is not None:
            try:
                self._warmup(servable)
            except BaseException as exc:  # noqa: BLE001
                servable.close()
                self._finish_load(model, record, None, record.failed(from_exception(exc)))
                return
        log.info("Loaded %s version %d in %.2fs", name, record.version, time.perf_counter() - started)
        self._finish_load(model, record, Harness(servable), None)

    def _finish_load(
        self,
        model: ModelRecord,
        record: VersionRecord,
        harness: Harness | None,
        error: ServingError | None,
        awaiting: frozenset[str] = frozenset(),
    ) -> None:
        with self._state.lock:
            replacement = model.replacing.get(record.version) is record
            if replacement:
                replaced = self._finish_replacement(model, record, harness, error)
                self._reconcile(model)  # the files may have changed again meanwhile
                self._state.settled.notify_all()
        if replacement:
            if replaced is not None:
                replaced.unload()  # after the requests that hold it end (new ones take the new load)
            return
        discard = None
        with self._state.lock:
            if self._state.memory.active:
                error = self.budgeted_loads.charge_load(model, record, harness, error)
                if error is not None and harness is not None:
                    discard, harness = harness, None
            if error is not None:
                log.error("Failed to load %s version %d: %s", model.config.name, record.version, error.message)
                record.error = error
                record.awaiting = awaiting
                self._set_state(model, record, VersionState.END)
            elif self._closed or model.removed or model.versions.get(record.version) is not record:
                # Not wanted any more (the model left the config while it loaded): never published, closed at once.
                discard = harness
                self._set_state(model, record, VersionState.END)
                self._forget_if_gone(model)
            else:
                record.harness = harness
                if self._state.memory.active and harness is not None:
                    harness.on_idle = self.budgeted_loads.memory_freed
                self._set_state(model, record, VersionState.AVAILABLE)
                for waiting in composites.waiting_for(self._state.models, model.config.name):
                    self._reconcile(waiting)
                if self._state.memory.active:  # measured larger than its estimate: others make room
                    self.budgeted_loads.restore_budget(f"{model.config.name}:{record.version} took more than estimated")
            self._reconcile(model)
            if self._state.memory.active:
                self.budgeted_loads.admit_waiting()
        if discard is not None:
            discard.unload()

    def _forget_if_gone(self, model: ModelRecord) -> bool:
        """Forget a removed model once every version of it has ended (lock held); whether it was forgotten."""
        finished = all(r.state == VersionState.END for r in model.versions.values())
        if model.removed and finished and self._state.models.get(model.config.name) is model:
            del self._state.models[model.config.name]
            del self._state.routes[model.config.name]
            self._state.memory.forget(model.config.name)
            return True
        return False

    def _unload(self, model: ModelRecord, record: VersionRecord) -> None:
        harness = record.harness
        try:
            if harness is not None:
                harness.unload()
        except BaseException as exc:  # noqa: BLE001
            log.error("Unloading %s version %d failed: %s", model.config.name, record.version, exc)
        with self._state.lock:
            record.harness = None
            self._set_state(model, record, VersionState.END)
            log.info("Unloaded %s version %d", model.config.name, record.version)
            if self._state.memory.active:  # its memory is free: the versions waiting for some go first
                self.budgeted_loads.left(model.config.name, record.version)
            if not self._forget_if_gone(model) and not model.removed:
                # Aspired again while it was unloading (a load right after an unload): load it anew. Done under
                # the same lock as END, so a waiter never mistakes this unload's END for a failed load.
                self._reconcile(model)
            self.budgeted_loads.wake_claims()
            self._state.settled.notify_all()

    def _set_state(self, model: ModelRecord, record: VersionRecord, state: VersionState) -> None:
        serving = record.state == VersionState.AVAILABLE or state == VersionState.AVAILABLE
        record.state = state
        record.since = time.time()
        if serving and self._state.models.get(model.config.name) is model:  # not a model already replaced
            self._publish(model)
        self._notify(model, record.version, state)

    def _notify(self, model: ModelRecord, version: int, state: VersionState) -> None:
        for listener in list(self._listeners):
            try:
                listener(model.config.name, version, state)
            except Exception:  # listeners must not break the manager
                log.exception("state listener failed")

    def _publish(self, model: ModelRecord) -> None:
        """Route ``model``'s requests by its state as it is now (lock held; the one writer of ``_routes``)."""
        self._state.routes[model.config.name] = route_of(model)

    def _wake_parked(self) -> None:
        """Admit again the parked composites whose members now serve, or have stopped coming (lock held)."""
        for model, record, servable in composites.unparked(self._state.models):
            self._executor.submit(self._admit, model, record, servable, time.perf_counter())

    def _settle_first_load(self, model: ModelRecord) -> None:
        """Wake what waits for ``model``'s first load once it is over (lock held)."""
        if self._state.models.get(model.config.name) is model:
            self._state.first_loads.settle(model)

    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener(model, version, state)`` (under the manager's lock) whenever a version changes state."""
        self._listeners.append(listener)

    # --------------------------------------------- routing changes: what RoutingChanges uses (each NOT_FOUND-checked)
    def change_lock(self, name: str) -> threading.Lock:
        """The lock that lets one routing change of ``name`` run at a time in this process."""
        with self._state.lock:
            self._state.live_model(
                name
            )  # an unknown name is NOT_FOUND here, and leaves no lock behind for each one sent
            return self._change_locks.setdefault(name, threading.Lock())

    def reread_routing(self, name: str) -> StoredRouting:
        """Read ``name``'s stored routing afresh (no lock held), route by it unless a newer state arrived meanwhile
        or it cannot be read, and return what ``name`` routes by now."""
        with self._state.lock:
            model = self._state.live_model(name)
            store, epoch = model.store, model.routing_epoch
        stored = self._routing_reader.read(name, store)
        with self._state.lock:
            if stored is not None and model.routing_epoch == epoch:
                self._apply_routing(model, stored)
            return model.stored

    def route_by(self, name: str, stored: StoredRouting, store: RoutingStateStore) -> None:
        """Route ``name`` by ``stored``, just read from or written to ``store``: not when the model has gone, or
        was configured anew (with another store) meanwhile."""
        with self._state.lock:
            model = self._state.models.get(name)
            if model is not None and model.store is store:
                self._apply_routing(model, stored)

    @contextlib.contextmanager
    def hold_loaded(self, name: str, version: int, timeout: float) -> Iterator[None]:
        """Load ``version`` if it is not serving, wait for it, and keep it loaded while the ``with`` block gives it
        a role; a version that fails to load raises with its load error. The lock is not held in the block."""
        with self._state.lock:
            model = self._state.live_model(name)
            if version not in model.on_disk:
                record = model.versions.get(version)
                if record is None or record.state != VersionState.AVAILABLE:
                    raise ServingError(Code.NOT_FOUND, f"Model {name} has no version {version} in its repository")
            model.held[version] += 1
            self._update_aspired(model)

            def settled() -> bool:
                record = model.versions.get(version)
                return record is not None and record.state in (VersionState.AVAILABLE, VersionState.END)

            finished = self._state.settled.wait_for(settled, timeout=timeout)
            record = model.versions.get(version)
            ok = finished and record is not None and record.state == VersionState.AVAILABLE
        try:
            if not finished:
                raise ServingError(
                    Code.DEADLINE_EXCEEDED, f"Version {version} of model {name} did not load in {timeout:g}s"
                )
            if not ok:
                detail = f": {record.error.message}" if record is not None and record.error is not None else ""
                message = f"Version {version} of model {name} failed to load{detail}"
                raise ServingError(Code.FAILED_PRECONDITION, message)
            yield
        finally:
            with self._state.lock:
                model.held[version] -= 1
                if model.held[version] <= 0:
                    del model.held[version]
                if not model.removed:
                    self._update_aspired(model)

    def stop(self) -> None:
        with self._state.lock:
            self._closed = True
            self.budgeted_loads.stop()
            harnesses = [
                r.harness for m in self._state.models.values() for r in m.versions.values() if r.harness is not None
            ]
            parked = [
                r.parked for m in self._state.models.values() for r in m.versions.values() if r.parked is not None
            ]
        self._executor.shutdown(wait=True, cancel_futures=True)
        for harness in harnesses:
            harness.unload(drain_timeout=5.0)
        for servable in parked:
            servable.close()
