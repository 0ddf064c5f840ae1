"""The lifecycle of model versions: aspired versions in, loaded servables out, availability preserved.

A source (the repository poller) tells the manager which versions each model *should* serve; the manager
loads new ones on its load threads (warming them up), and only then unloads the versions they replace, so a
model that was serving never stops serving. A version that fails to load ends in END with its error, and the
versions already serving keep serving. All state sits behind one lock; loads and unloads run off it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workbench.engine.options import ModelConfig
from workbench.engine.routing import Routing, RoutingStore
from workbench.engine.servable import Loader, Servable
from workbench.engine.status import Code, ServingError, from_exception

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
    servable: Servable | None = None
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
    aspired: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    on_disk: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    policy_versions: set[int] = dataclasses.field(default_factory=set)
    versions: dict[int, VersionRecord] = dataclasses.field(default_factory=dict)
    labels: dict[str, int] = dataclasses.field(default_factory=dict)
    removed: bool = False


class ServableHandle:
    """``with handle as servable:`` releases the servable when the request is done (a class: it is hot)."""

    __slots__ = ("_servable",)

    def __init__(self, servable: Servable) -> None:
        self._servable = servable

    def __enter__(self) -> Servable:
        return self._servable

    def __exit__(self, *exc: object) -> None:
        self._servable.release()


Warmup = Callable[[Servable], None]
StateListener = Callable[[str, int, "VersionState"], None]


class Manager:
    def __init__(
        self,
        loaders: Mapping[str, Loader],
        *,
        warmup: Warmup | None = None,
        load_threads: int = 2,
        allow_labels_for_unavailable: bool = False,
        routing_store: RoutingStore | None = None,
    ) -> None:
        self._loaders = dict(loaders)
        self._store = routing_store or RoutingStore(None)
        self._routings: dict[str, Routing] = self._store.load()
        self._warmup = warmup
        self._allow_unavailable_labels = allow_labels_for_unavailable
        self._lock = threading.RLock()
        self._settled = threading.Condition(self._lock)
        self._models: dict[str, _Model] = {}
        self._executor = ThreadPoolExecutor(max_workers=max(1, load_threads), thread_name_prefix="workbench-load")
        self._closed = False
        self._listeners: list[StateListener] = []

    # ----------------------------------------------------------------------------------------- config
    def set_models(self, configs: Iterable[ModelConfig]) -> None:
        """Serve exactly these models (labels are applied separately, once versions have loaded)."""
        configs = list(configs)
        names = {c.name for c in configs}
        with self._lock:
            for config in configs:
                model = self._models.get(config.name)
                if model is None or model.removed:
                    self._models[config.name] = _Model(config=config)
                else:
                    model.config = config
            for name, model in self._models.items():
                if name not in names and not model.removed:
                    model.removed = True
                    model.aspired = {}
                    model.labels = {}
                    self._reconcile(model)

    def configs(self) -> list[ModelConfig]:
        with self._lock:
            return [m.config for m in self._models.values() if not m.removed]

    def set_labels(self, labels_by_model: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the version labels of the given models, all or nothing.

        A label may only point at an AVAILABLE version unless the server allows labels for unavailable
        models (then it can be set before the version has loaded, as TF Serving's flag allows).
        """
        with self._lock:
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
            for name, labels in labels_by_model.items():
                self._models[name].labels = dict(labels)

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
            self._update_aspired(model)

    def _update_aspired(self, model: _Model) -> None:
        """Aspired = what the policy wants, plus what routing needs loaded, minus what was dropped (lock held)."""
        routing = self._routing(model.config.name)
        wanted = (model.policy_versions | routing.required()) - routing.dropped
        model.aspired = {v: model.on_disk[v] for v in sorted(wanted) if v in model.on_disk}
        self._reconcile(model)

    def _routing(self, name: str) -> Routing:
        routing = self._routings.get(name)
        if routing is None:
            routing = self._routings[name] = Routing()
        return routing

    def _reconcile(self, model: _Model) -> None:
        """Start the loads and unloads that move ``model`` towards its aspired versions (lock held)."""
        if self._closed:
            return
        for version, disk in model.aspired.items():
            record = model.versions.get(version)
            retry = (
                record is not None
                and record.state == VersionState.END
                and (record.error is None or record.fingerprint != disk.fingerprint)
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
        self._settled.notify_all()

    def _load(self, model: _Model, record: VersionRecord) -> None:
        name = model.config.name
        started = time.perf_counter()
        try:
            servable = self._loaders[model.config.platform](name, record.version, record.path)
        except BaseException as exc:  # noqa: BLE001 - a load failure must never kill the load thread
            self._finish_load(model, record, None, from_exception(exc))
            return
        if self._warmup is not None:
            try:
                self._warmup(servable)
            except BaseException as exc:  # noqa: BLE001
                servable.unload(drain_timeout=0)
                self._finish_load(model, record, None, from_exception(exc))
                return
        log.info("Loaded %s version %d in %.2fs", name, record.version, time.perf_counter() - started)
        self._finish_load(model, record, servable, None)

    def _finish_load(
        self, model: _Model, record: VersionRecord, servable: Servable | None, error: ServingError | None
    ) -> None:
        discard = None
        with self._lock:
            if error is not None:
                log.error("Failed to load %s version %d: %s", model.config.name, record.version, error.message)
                record.error = error
                self._set_state(model, record, VersionState.END)
            elif self._closed or model.versions.get(record.version) is not record:
                discard = servable
                self._set_state(model, record, VersionState.END)
            else:
                record.servable = servable
                self._set_state(model, record, VersionState.AVAILABLE)
            self._reconcile(model)
        if discard is not None:
            discard.unload()

    def _unload(self, model: _Model, record: VersionRecord) -> None:
        servable = record.servable
        try:
            if servable is not None:
                servable.unload()
        except BaseException as exc:  # noqa: BLE001
            log.error("Unloading %s version %d failed: %s", model.config.name, record.version, exc)
        with self._lock:
            record.servable = None
            self._set_state(model, record, VersionState.END)
            log.info("Unloaded %s version %d", model.config.name, record.version)
            finished = all(r.state == VersionState.END for r in model.versions.values())
            if model.removed and finished and self._models.get(model.config.name) is model:
                del self._models[model.config.name]
            elif not model.removed:
                # Aspired again while it was unloading (a load right after an unload): load it anew. Done under
                # the same lock as END, so a waiter never mistakes this unload's END for a failed load.
                self._reconcile(model)
            self._settled.notify_all()

    def _set_state(self, model: _Model, record: VersionRecord, state: VersionState) -> None:
        record.state = state
        record.since = time.time()
        for listener in list(self._listeners):
            try:
                listener(model.config.name, record.version, state)
            except Exception:  # noqa: BLE001 - listeners must not break the manager
                log.exception("state listener failed")

    def add_listener(self, listener: StateListener) -> None:
        """Call ``listener(model, version, state)`` (under the manager's lock) whenever a version changes state."""
        self._listeners.append(listener)

    # ---------------------------------------------------------------------------- version management
    def promote(self, name: str, version: int, timeout: float = 300.0) -> None:
        """Point ``stable`` at ``version`` (loading it first) and make it the default of ``name``."""
        with self._lock:
            routing = self._routing(name)
            with self._loaded(name, version, timeout):
                if routing.stable != version:
                    if routing.stable is not None:
                        routing.history.append(routing.stable)
                    routing.stable = version
                if routing.canary == version:  # the canary graduated
                    routing.canary, routing.canary_weight = None, 0.0
            self._routing_changed(name)

    def rollback(self, name: str) -> int:
        """Return ``stable`` to the version it pointed at before the last promotion; returns that version."""
        with self._lock:
            model = self._live_model(name)
            routing = self._routing(name)
            while routing.history:
                previous = routing.history.pop()
                record = model.versions.get(previous)
                if record is not None and record.state == VersionState.AVAILABLE:
                    routing.stable = previous
                    self._routing_changed(name)
                    return previous
            raise ServingError(Code.FAILED_PRECONDITION, f"Model {name} has no previous stable version to roll back to")

    def set_canary(self, name: str, version: int, weight: float, timeout: float = 300.0) -> None:
        """Send ``weight`` (0 to 1) of ``name``'s default traffic to ``version``; weight 0 ends the canary."""
        if not 0.0 <= weight <= 1.0:
            raise ServingError(Code.INVALID_ARGUMENT, f"Canary weight must be between 0 and 1, got {weight}")
        with self._lock:
            self._live_model(name)
            routing = self._routing(name)
            if weight == 0:
                if routing.canary in (version, None):
                    routing.canary, routing.canary_weight = None, 0.0
            else:
                with self._loaded(name, version, timeout):
                    routing.canary, routing.canary_weight = version, weight
            self._routing_changed(name)

    def load_version(self, name: str, version: int, timeout: float = 300.0) -> None:
        """Load (pin) ``version`` beyond the model's policy, and keep it loaded."""
        with self._lock:
            with self._loaded(name, version, timeout):
                pass
            self._routing(name).pinned.add(version)
            self._routing_changed(name)

    def unload_version(self, name: str, version: int) -> None:
        """Unload ``version`` (even if the policy wants it) — never the stable, canary or last serving one."""
        with self._lock:
            model = self._live_model(name)
            routing = self._routing(name)
            if version not in model.versions and version not in model.on_disk:
                raise ServingError(Code.NOT_FOUND, f"Model {name} has no version {version}")
            if version in (routing.stable, routing.canary):
                role = "stable" if version == routing.stable else "canary"
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"Version {version} of model {name} is its {role} version: promote another or end the canary first",
                )
            others = [r for r in model.versions.values() if r.state == VersionState.AVAILABLE and r.version != version]
            if not others:
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"Version {version} is the only version of model {name} serving; load another one first",
                )
            routing.pinned.discard(version)
            routing.dropped.add(version)
            if routing.history and routing.history[-1] == version:
                routing.history.pop()  # a rollback target that is gone is no target
            self._routing_changed(name)

    @contextlib.contextmanager
    def _loaded(self, name: str, version: int, timeout: float) -> Iterator[None]:
        """Load ``version`` if it is not serving and wait for it (lock held; the wait releases it).

        The version stays pinned while the ``with`` block gives it a role (stable, canary, pin), so it cannot be
        unloaded in between; a version that fails to load raises with its load error and is left unpinned.
        """
        model = self._live_model(name)
        if version not in model.on_disk:
            record = model.versions.get(version)
            if record is None or record.state != VersionState.AVAILABLE:
                raise ServingError(Code.NOT_FOUND, f"Model {name} has no version {version} in its repository")
        routing = self._routing(name)
        was_pinned = version in routing.pinned
        routing.dropped.discard(version)
        routing.pinned.add(version)
        self._update_aspired(model)

        def settled() -> bool:
            record = model.versions.get(version)
            return record is not None and record.state in (VersionState.AVAILABLE, VersionState.END)

        finished = self._settled.wait_for(settled, timeout=timeout)
        record = model.versions.get(version)
        ok = finished and record is not None and record.state == VersionState.AVAILABLE
        try:
            if ok:
                yield
        finally:
            if not was_pinned:
                routing.pinned.discard(version)
            if not ok:
                self._update_aspired(model)
        if not finished:
            raise ServingError(
                Code.DEADLINE_EXCEEDED, f"Version {version} of model {name} did not load in {timeout:g}s"
            )
        if not ok:
            detail = f": {record.error.message}" if record is not None and record.error is not None else ""
            raise ServingError(Code.FAILED_PRECONDITION, f"Version {version} of model {name} failed to load{detail}")

    def _routing_changed(self, name: str) -> None:
        """Apply a routing change (load/unload what it implies) and persist every model's routing (lock held)."""
        model = self._models.get(name)
        if model is not None and not model.removed:
            self._update_aspired(model)
        self._store.save(self._routings)

    def describe(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every model (or one) with its versions, states, labels, traffic shares and routing, JSON-ready."""
        with self._lock:
            if name is not None:
                models = [self._live_model(name)]
            else:
                models = [m for _, m in sorted(self._models.items()) if not m.removed]
            result = []
            for model in models:
                routing = self._routing(model.config.name)
                available = {v for v, r in model.versions.items() if r.state == VersionState.AVAILABLE}
                shares = routing.shares(available)
                labels = self._labels(model)
                versions = []
                for version in sorted(set(model.versions) | set(model.on_disk), reverse=True):
                    record = model.versions.get(version)
                    versions.append(
                        {
                            "version": version,
                            "state": record.state.name if record is not None else "NOT_LOADED",
                            "error": record.error.message if record is not None and record.error else "",
                            "error_code": record.error.code.name if record is not None and record.error else "OK",
                            "labels": sorted(label for label, v in labels.items() if v == version),
                            "traffic_share": round(shares.get(version, 0.0), 6),
                            "pinned": version in routing.pinned,
                            "dropped": version in routing.dropped,
                            "on_disk": version in model.on_disk,
                        }
                    )
                result.append(
                    {
                        "name": model.config.name,
                        "base_path": model.config.base_path,
                        "platform": model.config.platform,
                        "policy": model.config.policy.describe(),
                        "default_version": routing.stable
                        if routing.stable in available
                        else max(available, default=None),
                        "stable": routing.stable,
                        "previous_stable": routing.history[-1] if routing.history else None,
                        "canary": {"version": routing.canary, "weight": routing.canary_weight}
                        if routing.canary is not None
                        else None,
                        "labels": labels,
                        "versions": versions,
                    }
                )
            return result

    # -------------------------------------------------------------------------------------- queries
    def handle(self, name: str, version: int | None = None, label: str | None = None) -> ServableHandle:
        """Hold the servable a request runs on until the request is answered (it cannot unload meanwhile)."""
        return ServableHandle(self.resolve(name, version, label))

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        """The servable a request for (name, version or label) runs on, already acquired for the caller.

        Resolution and acquisition happen under the manager's lock, where versions also leave AVAILABLE, so
        a version chosen here cannot start unloading before the caller holds it. Callers release it.
        """
        with self._lock:
            model = self._models.get(name)
            if label is not None:
                target = self._labels(model).get(label) if model is not None and not model.removed else None
                if target is None:
                    raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
                version = target
            if model is not None:
                if version is None:
                    available = {
                        r.version: r.servable
                        for r in model.versions.values()
                        if r.state == VersionState.AVAILABLE and r.servable is not None
                    }
                    if available:
                        # TF Serving's default is the latest version; a promotion or a canary changes that.
                        servable = available[self._routing(name).pick(set(available))]
                        if servable is not None and servable.acquire():
                            return servable
                else:
                    record = model.versions.get(version)
                    chosen = record.servable if record is not None and record.state == VersionState.AVAILABLE else None
                    if chosen is not None and chosen.acquire():
                        return chosen
        if version is None:
            raise ServingError(Code.NOT_FOUND, f"Servable not found for request: Latest({name})")
        raise ServingError(Code.NOT_FOUND, f"Servable not found for request: Specific({name}, {version})")

    def version_status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        """Versions of ``name``, newest first, as GetModelStatus reports them."""
        with self._lock:
            model = self._models.get(name)
            records = list(model.versions.values()) if model is not None else []
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

    def _labels(self, model: _Model) -> dict[str, int]:
        """The config's labels, with the ones promotion and canary set on top (lock held)."""
        return {**model.labels, **self._routing(model.config.name).labels()}

    def label_version(self, name: str, label: str) -> int:
        with self._lock:
            model = self._models.get(name)
            version = self._labels(model).get(label) if model is not None and not model.removed else None
        if version is None:
            raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        return version

    def labels(self, name: str) -> dict[str, int]:
        with self._lock:
            model = self._models.get(name)
            return self._labels(model) if model is not None else {}

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
            servables = [
                r.servable for m in self._models.values() for r in m.versions.values() if r.servable is not None
            ]
        self._executor.shutdown(wait=True, cancel_futures=True)
        for servable in servables:
            servable.unload(drain_timeout=5.0)
