"""The lifecycle of model versions: aspired versions in, loaded servables out, availability preserved.

A source (the repository poller) tells the manager which versions each model *should* serve and has it re-read
each model's routing state; the manager asks :func:`~workbench.models.routing.policy.decide` what that means, loads new
versions on its load threads (warming them up), and only then unloads the versions they replace, so a model that
was serving never stops serving. A version that fails to load ends in END with its error, and the versions
already serving keep serving. A composite version (a pipeline) becomes AVAILABLE only once the models it runs on
serve: it waits, loaded, while they load, and a version that failed for lack of them is retried when they serve.

All state sits behind one lock, held only for bookkeeping: loads, unloads, reading and writing the routing state,
and building JSON views all run off it. Requests never take it: each model's :class:`_Route` (its serving
versions, labels and routing) is an immutable snapshot, replaced under the lock whenever one of those changes and
read without it. A management change (promote, rollback, canary, load, unload) is a
compare-and-write of the model's stored routing (``routing_state``), so replicas sharing a repository agree; those
changes live in :mod:`~workbench.models.routing.changes`, and the manager only keeps the versions they need loaded.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workbench.config.options import ModelConfig
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Composite, Loader, Servable
from workbench.models.harness import Harness
from workbench.models.routing import policy as decisions
from workbench.models.routing.changes import RoutingChanges
from workbench.models.routing.policy import CanarySplit, Routing
from workbench.models.routing.store import (
    DamagedRoutingState,
    RoutingStateStore,
    StoredRouting,
    routing_store_for,
)
from workbench.models.views import ModelSnapshot, VersionSnapshot, describe_model
from workbench.runtime.storage import redact

log = logging.getLogger(__name__)


class VersionState(enum.IntEnum):
    """ModelVersionStatus.State, with the proto's numbers."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclasses.dataclass(frozen=True)
class DiskVersion:
    """A version folder as the source saw it; the fingerprint changes when its files do."""

    path: str
    fingerprint: tuple[int, ...] = ()


@dataclasses.dataclass
class VersionRecord:
    version: int
    path: str
    fingerprint: tuple[int, ...]
    state: VersionState = VersionState.START
    error: ServingError | None = None
    harness: Harness | None = None
    # A composite version (a pipeline) and the models it runs on that were not serving when it loaded: it waits,
    # loaded and ``parked`` (LOADING), while one of them is on its way, else it ends with that error and is
    # retried once they all serve.
    awaiting: frozenset[str] = frozenset()
    parked: Servable | None = None
    since: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """A snapshot of one version for status APIs (never holds the servable)."""

    version: int
    state: VersionState
    error: ServingError | None
    since: float


@dataclasses.dataclass
class _Model:
    config: ModelConfig
    store: RoutingStateStore
    stored: StoredRouting  # the routing this server routes by, as last read from (or written to) the store
    aspired: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    on_disk: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    policy_versions: set[int] = dataclasses.field(default_factory=set)
    versions: dict[int, VersionRecord] = dataclasses.field(default_factory=dict)
    labels: dict[str, int] = dataclasses.field(default_factory=dict)  # the model config file's version_labels
    label_map: dict[str, int] = dataclasses.field(default_factory=dict)  # every label: labels_of(labels, routing)
    # Versions a management change in progress is loading: kept loaded until the change is stored (or failed).
    held: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    split: CanarySplit = dataclasses.field(default_factory=CanarySplit)
    split_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # the split's counters
    # Bumped whenever ``stored`` is replaced, so a read that started before a newer state arrived is dropped.
    routing_epoch: int = 0
    drops_ignored: bool = False  # the routing's drops would leave nothing to serve (warned once)
    source_error: str = ""  # why its repository could not be listed at the last poll (an object store)
    removed: bool = False
    scanned: bool = False  # the source has listed its versions at least once
    # The model config's version labels have not been applied yet (they come once its versions have loaded).
    labels_pending: bool = False

    @property
    def routing(self) -> Routing:
        return self.stored.routing


@dataclasses.dataclass(frozen=True, eq=False)
class _Route:
    """What requests for one model resolve against: built under the manager's lock, read without it.

    A new route replaces the old one whenever a version enters or leaves AVAILABLE, the labels change or the
    routing does; a request that read the old one just before sees at worst a version that has started to
    unload, whose harness then refuses it (and :meth:`Manager.resolve` reads the newer route).
    """

    serving: Mapping[int, Harness]  # the AVAILABLE versions
    labels: Mapping[str, int]
    routing: Routing
    split: CanarySplit
    split_lock: threading.Lock
    # Where a request naming no version goes, when no canary shares the traffic (None: ask the split, or none).
    default: Harness | None

    def pick(self) -> Harness | None:
        """The version a request that names none runs on (None when nothing serves)."""
        if self.default is not None or not self.serving:
            return self.default
        with self.split_lock:  # the canary's exact share counts every request once
            return self.serving[self.split.pick(self.routing, self.serving.keys())]


class ServableHandle:
    """``with handle as servable:`` releases the servable when the request is done (a class: it is hot)."""

    __slots__ = ("_harness",)

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    @property
    def harness(self) -> Harness:
        return self._harness

    def __enter__(self) -> Servable:
        return self._harness.servable

    def __exit__(self, *exc: object) -> None:
        self._harness.release()


Warmup = Callable[[Servable], None]
StateListener = Callable[[str, int, "VersionState"], None]
RoutingStores = Callable[[str], RoutingStateStore]


class Manager(RoutingChanges):
    """The models' versions, loaded and routed; their management changes are :class:`RoutingChanges`."""

    def __init__(
        self,
        loader: Loader,
        *,
        warmup: Warmup | None = None,
        load_threads: int = 2,
        allow_labels_for_unavailable: bool = False,
        routing_stores: RoutingStores = routing_store_for,
        initial_routing: Mapping[str, Routing] | None = None,
    ) -> None:
        """``routing_stores(base_path)`` gives a model's routing store; ``initial_routing`` is each model's routing
        while its store holds none (an older workbench's state file, migrated on the first change)."""
        self._loader = loader
        self._routing_stores = routing_stores
        self._initial_routing = dict(initial_routing or {})
        self._warmup = warmup
        self._allow_unavailable_labels = allow_labels_for_unavailable
        self._lock = threading.RLock()
        self._settled = threading.Condition(self._lock)
        self._models: dict[str, _Model] = {}
        self._routes: dict[str, _Route] = {}  # by model name; replaced (never changed) under the lock
        self._executor = ThreadPoolExecutor(max_workers=max(1, load_threads), thread_name_prefix="workbench-load")
        self._closed = False
        self._listeners: list[StateListener] = []
        self._change_locks: dict[str, threading.Lock] = {}  # RoutingChanges: one change of a model at a time
        self._read_problems: dict[str, str] = {}  # model → the routing read error last logged (logged once)
        # Models whose first load is under way → what to call when it is over (see :meth:`when_first_loaded`).
        # Read without the lock by :meth:`loading_first`, on every request; changed under it.
        self._first_loads: dict[str, list[Callable[[], None]]] = {}

    # ----------------------------------------------------------------------------------------- config
    def set_models(self, configs: Iterable[ModelConfig]) -> None:
        """Serve exactly these models (labels are applied separately, once versions have loaded)."""
        configs = list(configs)
        names = {c.name for c in configs}
        with self._lock:
            for config in configs:
                model = self._models.get(config.name)
                if model is None or model.removed:
                    initial = StoredRouting(self._initial_routing.get(config.name, Routing()))
                    model = _Model(config=config, store=self._routing_stores(config.base_path), stored=initial)
                    model.label_map = decisions.labels_of(model.labels, model.routing)
                    model.labels_pending = bool(config.labels)
                    self._models[config.name] = model
                    self._first_loads.setdefault(config.name, [])
                else:
                    if model.config.base_path != config.base_path:
                        model.store = self._routing_stores(config.base_path)
                    model.config = config
                self._publish(model)
            for name, model in self._models.items():
                if name not in names and not model.removed:
                    model.removed = True
                    model.aspired = {}
                    model.labels = {}
                    model.label_map = {}
                    self._publish(model)
                    self._reconcile(model)
                    self._settle_first_load(model)

    def configs(self) -> list[ModelConfig]:
        with self._lock:
            return [m.config for m in self._models.values() if not m.removed]

    def set_labels(self, labels_by_model: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the version labels of the given models, all or nothing.

        A label may only point at an AVAILABLE version unless the server allows labels for unavailable
        models (then it can be set before the version has loaded, as TF Serving's flag allows).
        """
        with self._lock:
            try:
                self._check_labels(labels_by_model)
                for name, labels in labels_by_model.items():
                    model = self._models[name]
                    model.labels = dict(labels)
                    model.label_map = decisions.labels_of(model.labels, model.routing)
                    self._publish(model)
            finally:  # applied or refused, the config's labels are settled: a first load waiting for them is over
                for name in labels_by_model:
                    settled = self._models.get(name)
                    if settled is not None and settled.labels_pending:
                        settled.labels_pending = False
                        self._settle_first_load(settled)

    def _check_labels(self, labels_by_model: Mapping[str, Mapping[str, int]]) -> None:
        """Refuse labels that name versions not AVAILABLE (unless allowed) or are empty (lock held)."""
        for name, labels in labels_by_model.items():
            model = self._live_model(name)
            for label, version in labels.items():
                record = model.versions.get(version)
                available = record is not None and record.state == VersionState.AVAILABLE
                if not available and not self._allow_unavailable_labels:
                    raise ServingError(
                        Code.FAILED_PRECONDITION,
                        f"Request to assign label to version {version} of model {name}, which is not "
                        "currently available for inference",
                    )
                if not label:
                    raise ServingError(Code.INVALID_ARGUMENT, f"Empty version label for model {name}")

    def _live_model(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None or model.removed:
            raise ServingError(Code.NOT_FOUND, f"Model {name} is not in the server's config")
        return model

    # ---------------------------------------------------------------------------------------- source
    def set_aspired_versions(
        self, name: str, versions: Mapping[int, DiskVersion], on_disk: Mapping[int, DiskVersion] | None = None
    ) -> None:
        """Called by the source: the policy wants ``versions`` of ``name``; ``on_disk`` is all there is."""
        with self._lock:
            model = self._models.get(name)
            if model is None or model.removed:
                return
            model.on_disk = dict(on_disk if on_disk is not None else versions)
            model.policy_versions = set(versions)
            model.scanned = True
            self._update_aspired(model)

    def set_source_error(self, name: str, problem: str | None) -> bool:
        """The source could (None) or could not list ``name``'s repository; True when ``problem`` is news."""
        with self._lock:
            model = self._models.get(name)
            if model is None or model.removed or model.source_error == (problem or ""):
                return False
            model.source_error = problem or ""
            self._settle_first_load(model)
            return problem is not None

    def refresh_routing(self, name: str) -> None:
        """Called by the source on every poll: route ``name`` by its stored routing (read with no lock held).

        A state that cannot be read (damaged, unreachable) leaves the model routing as before, and is logged once.
        """
        with self._lock:
            model = self._models.get(name)
            if model is None or model.removed:
                return
            store, epoch = model.store, model.routing_epoch
        stored = self._read_routing(name, store)
        if stored is None:
            return
        with self._lock:
            if model.routing_epoch == epoch and not model.removed:
                self._apply_routing(model, stored)

    def _read_routing(self, name: str, store: RoutingStateStore) -> StoredRouting | None:
        """The stored routing of ``name`` (its initial routing when none is stored), or None if unreadable."""
        try:
            stored = store.read()
        except (DamagedRoutingState, OSError) as exc:
            problem = str(exc)
            with self._lock:
                first = self._read_problems.get(name) != problem
                self._read_problems[name] = problem
            if first:
                log.error("Model %s keeps its routing: the routing state cannot be read: %s", name, problem)
            return None
        with self._lock:
            self._read_problems.pop(name, None)
        return stored if stored is not None else StoredRouting(self._initial_routing.get(name, Routing()))

    def _apply_routing(self, model: _Model, stored: StoredRouting) -> None:
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

    def _update_aspired(self, model: _Model) -> None:
        """Aspire to what the routing decision wants loaded, then move towards it (lock held)."""
        decision = decisions.decide(
            model.routing,
            available=self._available(model),
            on_disk=model.on_disk,
            policy_versions=model.policy_versions,
            held=model.held,
        )
        if decision.drops_ignored and not model.drops_ignored:
            log.warning("Model %s: its drops would leave nothing to serve; not dropping", model.config.name)
        model.drops_ignored = decision.drops_ignored
        model.aspired = {v: model.on_disk[v] for v in sorted(decision.aspired)}
        self._reconcile(model)

    @staticmethod
    def _available(model: _Model) -> set[int]:
        return {v for v, r in model.versions.items() if r.state == VersionState.AVAILABLE}

    def _reconcile(self, model: _Model) -> None:
        """Start the loads and unloads that move ``model`` towards its aspired versions (lock held)."""
        if self._closed:
            return
        for version, disk in model.aspired.items():
            record = model.versions.get(version)
            retry = (
                record is not None
                and record.state == VersionState.END
                and (
                    record.error is None
                    or record.fingerprint != disk.fingerprint
                    or (record.awaiting and not self._unserved(record.awaiting))
                )
            )
            if record is None or retry:
                record = VersionRecord(version=version, path=disk.path, fingerprint=disk.fingerprint)
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
            if record.version in model.aspired or record.state != VersionState.AVAILABLE:
                continue
            if may_unload:
                self._set_state(model, record, VersionState.UNLOADING)
                self._executor.submit(self._unload, model, record)
        self._wake_parked()
        self._settle_first_load(model)
        self._settled.notify_all()

    def _load(self, model: _Model, record: VersionRecord) -> None:
        name = model.config.name
        started = time.perf_counter()
        try:
            servable = self._loader(name, record.version, record.path, model.config.platform)
        except BaseException as exc:  # noqa: BLE001 - a load failure must never kill the load thread
            self._finish_load(model, record, None, from_exception(exc))
            return
        self._admit(model, record, servable, started)

    def _admit(self, model: _Model, record: VersionRecord, servable: Servable, started: float) -> None:
        """Warm ``servable`` up and make it AVAILABLE; a composite first needs the models it runs on serving."""
        name = model.config.name
        if isinstance(servable, Composite):
            with self._lock:
                missing = self._unserved(servable.members())
                if missing and any(self._coming(m) for m in missing):
                    record.parked, record.awaiting = servable, missing  # _wake_parked admits it again
                    return
            if missing:
                servable.close()
                self._finish_load(model, record, None, self._members_error(name, missing), awaiting=missing)
                return
        if self._warmup is not None:
            try:
                self._warmup(servable)
            except BaseException as exc:  # noqa: BLE001
                servable.close()
                self._finish_load(model, record, None, from_exception(exc))
                return
        log.info("Loaded %s version %d in %.2fs", name, record.version, time.perf_counter() - started)
        self._finish_load(model, record, Harness(servable), None)

    # ------------------------------------------ composites (pipelines): the models they run on (lock held)
    def _serves(self, name: str) -> bool:
        model = self._models.get(name)
        return model is not None and not model.removed and bool(self._available(model))

    def _unserved(self, names: Iterable[str]) -> frozenset[str]:
        return frozenset(n for n in names if not self._serves(n))

    def _coming(self, name: str) -> bool:
        """Whether ``name`` may serve soon: configured but not listed yet, or a version of it loading."""
        model = self._models.get(name)
        if model is None or model.removed:
            return False
        if not model.scanned and not model.source_error:
            return True
        loading = (VersionState.START, VersionState.LOADING)
        return any(r.state in loading and r.parked is None for r in model.versions.values())

    def _members_error(self, name: str, missing: frozenset[str]) -> ServingError:
        reasons = []
        for member in sorted(missing):
            model = self._models.get(member)
            reasons.append(f"{member} ({'no version AVAILABLE' if model and not model.removed else 'not served'})")
        return ServingError(
            Code.FAILED_PRECONDITION,
            f"Model {name} runs on models that are not serving: {', '.join(reasons)}; it loads once they serve",
        )

    def _wake_parked(self) -> None:
        """Admit again the parked composites whose members now serve, or have stopped coming."""
        for model in self._models.values():
            for record in model.versions.values():
                servable = record.parked
                if servable is None or any(self._coming(m) and not self._serves(m) for m in record.awaiting):
                    continue
                record.parked = None
                self._executor.submit(self._admit, model, record, servable, time.perf_counter())

    def _retry_waiting_for(self, name: str) -> None:
        """``name`` serves now: retry the composite versions that failed for lack of it."""
        for model in list(self._models.values()):
            if not model.removed and any(name in r.awaiting and r.parked is None for r in model.versions.values()):
                self._reconcile(model)

    def _finish_load(
        self,
        model: _Model,
        record: VersionRecord,
        harness: Harness | None,
        error: ServingError | None,
        awaiting: frozenset[str] = frozenset(),
    ) -> None:
        discard = None
        with self._lock:
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
                self._set_state(model, record, VersionState.AVAILABLE)
                self._retry_waiting_for(model.config.name)
            self._reconcile(model)
        if discard is not None:
            discard.unload()

    def _forget_if_gone(self, model: _Model) -> bool:
        """Forget a removed model once every version of it has ended (lock held); whether it was forgotten."""
        finished = all(r.state == VersionState.END for r in model.versions.values())
        if model.removed and finished and self._models.get(model.config.name) is model:
            del self._models[model.config.name]
            del self._routes[model.config.name]
            return True
        return False

    def _unload(self, model: _Model, record: VersionRecord) -> None:
        harness = record.harness
        try:
            if harness is not None:
                harness.unload()
        except BaseException as exc:  # noqa: BLE001
            log.error("Unloading %s version %d failed: %s", model.config.name, record.version, exc)
        with self._lock:
            record.harness = None
            self._set_state(model, record, VersionState.END)
            log.info("Unloaded %s version %d", model.config.name, record.version)
            if not self._forget_if_gone(model) and not model.removed:
                # Aspired again while it was unloading (a load right after an unload): load it anew. Done under
                # the same lock as END, so a waiter never mistakes this unload's END for a failed load.
                self._reconcile(model)
            self._settled.notify_all()

    def _set_state(self, model: _Model, record: VersionRecord, state: VersionState) -> None:
        serving = record.state == VersionState.AVAILABLE or state == VersionState.AVAILABLE
        record.state = state
        record.since = time.time()
        if serving and self._models.get(model.config.name) is model:  # not a model already replaced
            self._publish(model)
        for listener in list(self._listeners):
            try:
                listener(model.config.name, record.version, state)
            except Exception:  # noqa: BLE001 - listeners must not break the manager
                log.exception("state listener failed")

    def _publish(self, model: _Model) -> None:
        """Route ``model``'s requests by its state as it is now (lock held; the one writer of ``_routes``)."""
        serving = {
            v: r.harness
            for v, r in sorted(model.versions.items())
            if r.state == VersionState.AVAILABLE and r.harness is not None
        }
        routing = model.routing
        # TF Serving's default is the latest version; a promotion changes that, and a canary may take a share
        # (then each request asks the split, which needs two versions serving).
        default = decisions.default_version(routing, serving.keys())
        canary_shares = routing.canary is not None and len(serving) > 1
        self._routes[model.config.name] = _Route(
            serving=serving,
            labels=dict(model.label_map),
            routing=routing,
            split=model.split,
            split_lock=model.split_lock,
            default=serving[default] if default is not None and not canary_shares else None,
        )

    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener(model, version, state)`` (under the manager's lock) whenever a version changes state."""
        self._listeners.append(listener)

    # ------------------------------------------------- versions held loaded while a routing change is stored
    @contextlib.contextmanager
    def _held(self, name: str, version: int, timeout: float) -> Iterator[None]:
        """Load ``version`` if it is not serving, wait for it, and keep it loaded while the ``with`` block gives it
        a role; a version that fails to load raises with its load error. The lock is not held in the block."""
        with self._lock:
            model = self._live_model(name)
            if version not in model.on_disk:
                record = model.versions.get(version)
                if record is None or record.state != VersionState.AVAILABLE:
                    raise ServingError(Code.NOT_FOUND, f"Model {name} has no version {version} in its repository")
            model.held[version] += 1
            self._update_aspired(model)

            def settled() -> bool:
                record = model.versions.get(version)
                return record is not None and record.state in (VersionState.AVAILABLE, VersionState.END)

            finished = self._settled.wait_for(settled, timeout=timeout)
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
            with self._lock:
                model.held[version] -= 1
                if model.held[version] <= 0:
                    del model.held[version]
                if not model.removed:
                    self._update_aspired(model)

    # ---------------------------------------------------------------- first loads: requests that wait for them
    def knows(self, name: str) -> bool:
        """Whether ``name`` is one of the server's models (lock-free: asked on every v2 request)."""
        model = self._models.get(name)
        return model is not None and not model.removed

    def dependents(self, name: str) -> set[str]:
        """The models with a version (serving or waiting to) that runs on ``name``: its pipelines and handlers."""
        with self._lock:
            found = set()
            for model in self._models.values():
                for record in model.versions.values():
                    servable = record.parked or (record.harness.servable if record.harness is not None else None)
                    if isinstance(servable, Composite) and name in servable.members():
                        found.add(model.config.name)
            return found

    def loading_first(self, name: str) -> bool:
        """Whether ``name`` is configured and its first load is not over yet (lock-free: asked on every request).

        A request for such a model waits for that load (:meth:`when_first_loaded`) instead of being told the model
        does not exist, as TF Serving never says: it opens its ports only once the initial models have loaded.
        """
        return name in self._first_loads

    def when_first_loaded(self, name: str, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` (from any thread, under the lock) once ``name``'s first load is over; False when it
        already is (then ``callback`` is never called)."""
        with self._lock:
            waiting = self._first_loads.get(name)
            if waiting is None:
                return False
            waiting.append(callback)
            return True

    @staticmethod
    def _first_load_over(model: _Model) -> bool:
        """A version serves, or every version the first listing found has loaded or failed, or the model's
        repository cannot be listed, or the model went; and the config's labels for it are applied."""
        if model.labels_pending and not model.removed:
            return False
        if model.removed or model.source_error:
            return True
        states = [r.state for r in model.versions.values()]
        if VersionState.AVAILABLE in states:
            return True
        return model.scanned and VersionState.START not in states and VersionState.LOADING not in states

    def _settle_first_load(self, model: _Model) -> None:
        """Wake what waits for ``model``'s first load once it is over (lock held)."""
        name = model.config.name
        if name not in self._first_loads or self._models.get(name) is not model or not self._first_load_over(model):
            return
        for callback in self._first_loads.pop(name):
            try:
                callback()
            except Exception:  # noqa: BLE001 - a waiter must not break the manager
                log.exception("first-load callback failed")

    def why_not_serving(self, name: str, version: int | None = None) -> str:
        """Why a configured ``name`` (or its ``version``) does not serve: load errors or its source's problem
        ("" when there is nothing to tell: an unknown model, or versions on their way)."""
        with self._lock:
            model = self._models.get(name)
            if model is None or model.removed:
                return ""
            if model.source_error:
                return f"its repository cannot be listed: {model.source_error}"
            failed = {v: r.error.message for v, r in sorted(model.versions.items()) if r.error is not None}
            if version is not None:
                return f"version {version} failed to load: {failed[version]}" if version in failed else ""
            if failed and not self._available(model):
                return "; ".join(f"version {v} failed to load: {message}" for v, message in failed.items())
            if model.scanned and not model.versions:
                return "no version found in its base path"
            return ""

    # ----------------------------------------------------------------------------------------- views
    def snapshots(self, name: str | None = None) -> list[ModelSnapshot]:
        """Every model (or one) as plain data, copied under the lock; views are built from it without it."""
        with self._lock:
            if name is not None:
                models = [self._live_model(name)]
            else:
                models = [m for _, m in sorted(self._models.items()) if not m.removed]
            return [self._snapshot(m) for m in models]

    @staticmethod
    def _snapshot(model: _Model) -> ModelSnapshot:
        versions = tuple(
            VersionSnapshot(
                r.version,
                r.state.name,
                r.error.message if r.error else "",
                r.error.code.name if r.error else "OK",
            )
            for r in model.versions.values()
        )
        return ModelSnapshot(
            name=model.config.name,
            base_path=redact(model.config.base_path),
            platform=model.config.platform,
            policy=model.config.policy.describe(),
            versions=versions,
            on_disk=frozenset(model.on_disk),
            policy_versions=frozenset(model.policy_versions),
            held=frozenset(model.held),
            config_labels=dict(model.labels),
            routing=model.routing,
            generation=model.stored.generation,
            routing_state=model.store.location,
            error=model.source_error,
        )

    def describe(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every model (or one) with its versions, states, labels, traffic shares and routing, JSON-ready."""
        return [describe_model(snapshot) for snapshot in self.snapshots(name)]

    # -------------------------------------------------------------------------------------- queries
    def handle(self, name: str, version: int | None = None, label: str | None = None) -> ServableHandle:
        """Hold the servable a request runs on until the request is answered (it cannot unload meanwhile)."""
        return ServableHandle(self.resolve(name, version, label))

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> Harness:
        """The servable a request for (name, version or label) runs on, already acquired for the caller.

        Lock-free: it reads the model's current :class:`_Route`. A version leaves the route (under the lock)
        before its unload starts, so when the harness refuses (it is unloading), a newer route is already in
        place and resolution starts over from it. Callers release what they get.
        """
        route = self._routes.get(name)
        if label is not None:
            version = route.labels.get(label) if route is not None else None
            if version is None:
                raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        while route is not None:
            chosen = route.pick() if version is None else route.serving.get(version)
            if chosen is None:
                break
            if chosen.acquire():
                return chosen
            newer = self._routes.get(name)
            route = newer if newer is not route else None
        # TF Serving's words, which clients match on; then why, when the model is configured and failed to load.
        wanted = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        why = self.why_not_serving(name, version)
        raise ServingError(Code.NOT_FOUND, f"Servable not found for request: {wanted}" + (f": {why}" if why else ""))

    def version_status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        """Versions of ``name``, newest first, as GetModelStatus reports them."""
        with self._lock:
            model = self._models.get(name)
            records = list(model.versions.values()) if model is not None else []
            problem = model.source_error if model is not None else ""
        if problem and not records:  # e.g. a missing bucket: say so rather than "no versions"
            raise ServingError(Code.NOT_FOUND, f"Could not find any versions of model {name}: {problem}")
        if version is not None:
            records = [r for r in records if r.version == version]
            if not records:
                raise ServingError(Code.NOT_FOUND, f"Could not find version {version} of model {name}")
        elif not records:
            raise ServingError(Code.NOT_FOUND, f"Could not find any versions of model {name}")
        return [
            VersionStatus(r.version, r.state, r.error, r.since)
            for r in sorted(records, key=lambda r: r.version, reverse=True)
        ]

    def version_state(self, name: str, version: int) -> VersionState | None:
        """The state of the current record of ``version`` (None: never loaded); a listener may call it."""
        with self._lock:
            model = self._models.get(name)
            record = model.versions.get(version) if model is not None else None
            return record.state if record is not None else None

    def label_version(self, name: str, label: str) -> int:
        with self._lock:
            model = self._models.get(name)
            version = model.label_map.get(label) if model is not None and not model.removed else None
        if version is None:
            raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        return version

    def labels(self, name: str) -> dict[str, int]:
        with self._lock:
            model = self._models.get(name)
            return dict(model.label_map) if model is not None else {}

    def model_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, m in self._models.items() if not m.removed)

    def _settled_locked(self) -> bool:
        for model in self._models.values():
            for record in model.versions.values():
                if record.state in (VersionState.START, VersionState.LOADING, VersionState.UNLOADING):
                    return False
        return True

    def wait_until_settled(self, timeout: float | None = None) -> bool:
        """Block until no version is loading or unloading (True), or ``timeout`` passes (False)."""
        with self._lock:
            return self._settled.wait_for(self._settled_locked, timeout=timeout)

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            harnesses = [r.harness for m in self._models.values() for r in m.versions.values() if r.harness is not None]
            parked = [r.parked for m in self._models.values() for r in m.versions.values() if r.parked is not None]
        self._executor.shutdown(wait=True, cancel_futures=True)
        for harness in harnesses:
            harness.unload(drain_timeout=5.0)
        for servable in parked:
            servable.close()
