"""The models a manager serves, as records under one lock, and every question those records answer.

:class:`ServedState` is the state itself (the lock, the model records, the routes requests resolve against, the first
loads under way, the memory ledger); :class:`ServedModels` reads it and answers the queries (status, views,
resolution). The :class:`~workbench.models.manager.Manager` owns the state and a :class:`ServedModels` over it, and
is its one writer, with :class:`~workbench.models.budgeted_loads.BudgetedLoads` for the memory budget's part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from workbench.config.memory_budget import MemoryOptions
from workbench.config.options import ModelConfig
from workbench.core.errors import Code, ServingError
from workbench.models import composites
from workbench.models.first_loads import FirstLoads
from workbench.models.harness import Harness
from workbench.models.records import ModelRecord, VersionState, VersionStatus
from workbench.models.residency import Residency
from workbench.models.routes import Route, ServableHandle
from workbench.models.routing import policy as decisions
from workbench.models.routing.routing_file import RoutingStateStore
from workbench.models.views import ModelSnapshot, describe_model, snapshot_of


class ServedState:
    """What the parts of the manager share: the records and routes under one lock (written only by the manager)."""

    def __init__(self, memory: Residency | None = None) -> None:
        """``memory``: the ledger of the memory budget (none: no budget)."""
        self.memory = memory or Residency(MemoryOptions())
        self.lock = threading.RLock()
        self.settled = threading.Condition(self.lock)  # notified whenever a version's state may have settled
        self.models: dict[str, ModelRecord] = {}  # changed in place, never replaced: the parts hold it
        self.routes: dict[str, Route] = {}  # by model name; each route replaced (never changed) under the lock
        self.first_loads = FirstLoads()  # see :meth:`ServedModels.when_first_loaded`

    def live_model(self, name: str) -> ModelRecord:
        """``name``'s record, NOT_FOUND unless it is configured (lock held)."""
        model = self.models.get(name)
        if model is None or model.removed:
            raise ServingError(Code.NOT_FOUND, f"Model {name} is not in the server's config")
        return model


class ServedModels:
    """The models' records and routes, and the queries on them (status, views, resolution); read-only."""

    def __init__(self, state: ServedState) -> None:
        self._state = state  # shared with the manager's other parts; only the manager writes

    def configs(self) -> list[ModelConfig]:
        with self._state.lock:
            return [m.config for m in self._state.models.values() if not m.removed]

    # ---------------------------------------------------------------- what a routing change reads
    def config_labels(self, name: str) -> dict[str, int]:
        """The model config file's version labels of ``name``."""
        with self._state.lock:
            return dict(self._state.live_model(name).labels)

    def routing_store(self, name: str) -> RoutingStateStore:
        with self._state.lock:
            return self._state.live_model(name).store

    def available_versions(self, name: str) -> set[int]:
        with self._state.lock:
            return self._state.live_model(name).available()

    def has_version(self, name: str, version: int) -> bool:
        """Whether ``name`` has ``version``: loaded (or tried) here, or in its repository."""
        with self._state.lock:
            model = self._state.live_model(name)
            return version in model.versions or version in model.on_disk

    # ---------------------------------------------------------------- first loads: requests that wait for them
    def knows(self, name: str) -> bool:
        """Whether ``name`` is one of the server's models (lock-free: asked on every v2 request)."""
        model = self._state.models.get(name)
        return model is not None and not model.removed

    def dependents(self, name: str) -> set[str]:
        """The models with a version (serving or waiting to) that runs on ``name``: its pipelines and handlers."""
        with self._state.lock:
            return composites.dependents(self._state.models, name)

    def loading_first(self, name: str) -> bool:
        """Whether ``name`` is configured and its first load is not over yet (lock-free: asked on every request).

        A request for such a model waits for that load (:meth:`when_first_loaded`) instead of being told the model
        does not exist, as TF Serving never says: it opens its ports only once the initial models have loaded.
        """
        return self._state.first_loads.loading(name)

    def version_loading_first(self, name: str, version: int | None, label: str | None = None) -> int | None:
        """The version a request naming ``version`` (or ``label``) of ``name`` names, when that version is one of the
        model's first listing and still in its first load; None otherwise (lock-free: asked on every request that
        names a version, and nearly always answered by one dictionary lookup).

        TF Serving opens its ports only once every initial version has loaded, so a request for one of them waits
        (:meth:`when_version_loaded`) rather than being told it does not exist; a version that does not exist, or one
        a later listing found, is answered as it stands.
        """
        loading = self._state.first_loads.versions_loading(name)
        if not loading:
            return None
        if label is not None:
            route = self._state.routes.get(name)
            version = route.labels.get(label) if route is not None else None
        return version if version in loading else None

    def when_version_loaded(self, name: str, version: int, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` (from any thread, under the lock) once ``version``'s first load is over; False when it
        already is, or it never had one (then ``callback`` is never called)."""
        with self._state.lock:
            return self._state.first_loads.when_version_over(name, version, callback)

    def when_first_loaded(self, name: str, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` (from any thread, under the lock) once ``name``'s first load is over; False when it
        already is (then ``callback`` is never called)."""
        with self._state.lock:
            return self._state.first_loads.when_over(name, callback)

    def why_not_serving(self, name: str, version: int | None = None) -> str:
        """Why a configured ``name`` (or its ``version``) does not serve: load errors or its source's problem
        ("" when there is nothing to tell: an unknown model, or versions on their way)."""
        with self._state.lock:
            model = self._state.models.get(name)
            if model is None or model.removed:
                return ""
            if model.source_error:
                return f"its repository cannot be listed: {model.source_error}"
            failed = {v: r.error.message for v, r in sorted(model.versions.items()) if r.error is not None}
            if version is not None:
                return f"version {version} failed to load: {failed[version]}" if version in failed else ""
            if failed and not model.available():
                return "; ".join(f"version {v} failed to load: {message}" for v, message in failed.items())
            if model.scanned and not model.versions:
                return "no version found in its base path"
            return ""

    # ----------------------------------------------------------------------------------------- views
    def snapshots(self, name: str | None = None) -> list[ModelSnapshot]:
        """Every model (or one) as plain data, copied under the lock; views are built from it without it."""
        with self._state.lock:
            if name is not None:
                models = [self._state.live_model(name)]
            else:
                models = [m for _, m in sorted(self._state.models.items()) if not m.removed]
            return [snapshot_of(m, self._memory_views(m)) for m in models]

    def _memory_views(self, model: ModelRecord) -> dict[int, dict[str, Any]]:
        """Each version's residency and memory, under a memory budget (lock held; empty without one)."""
        if not self._state.memory.active:
            return {}
        return {v: self._state.memory.version_view(model, v) for v in set(model.versions) | set(model.on_disk)}

    def memory_summary(self) -> dict[str, Any] | None:
        """The memory budget's ledger: budget, charged bytes, each version's figures, loads and evictions (None:
        no budget, no loading on demand, no idle unloading)."""
        with self._state.lock:
            return self._state.memory.summary(self._state.models) if self._state.memory.active else None

    def emptied(self, name: str) -> bool:
        """Whether ``name`` serves no version because its last one was removed on request (TorchServe's unregister,
        Triton's unload) and none is wanted since: it is meant to serve nothing."""
        with self._state.lock:
            model = self._state.models.get(name)
            return model is not None and not model.removed and model.routing.emptied and not model.aspired

    def serves_on_demand(self, name: str) -> bool:
        """Whether ``name`` answers requests though none of its versions is loaded: they load when asked for."""
        with self._state.lock:
            model = self._state.models.get(name)
            return self._state.memory.active and model is not None and not model.removed and bool(model.aspired)

    def describe(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every model (or one) with its versions, states, labels, traffic shares and routing, JSON-ready."""
        return [describe_model(snapshot) for snapshot in self.snapshots(name)]

    # -------------------------------------------------------------------------------------- queries
    def handle(self, name: str, version: int | None = None, label: str | None = None) -> ServableHandle:
        """Hold the servable a request runs on until the request is answered (it cannot unload meanwhile)."""
        return ServableHandle(self.resolve(name, version, label))

    def resolve(
        self, name: str, version: int | None = None, label: str | None = None, key: str | None = None
    ) -> Harness:
        """The servable a request for (name, version or label) runs on, already acquired for the caller; ``key``:
        the request's stickiness key, which keeps it on one side of a canary split.

        Lock-free: it reads the model's current :class:`~workbench.models.routes.Route`. A version leaves the route
        (under the lock) before its unload starts, so when the harness refuses (it is unloading), a newer route is
        already in place and resolution starts over from it. Callers release what they get.
        """
        route = self._state.routes.get(name)
        if label is not None:
            version = route.labels.get(label) if route is not None else None
            if version is None:
                raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        while route is not None:
            chosen = route.pick(key) if version is None else route.serving.get(version)
            if chosen is None:
                break
            if chosen.acquire():
                return chosen
            newer = self._state.routes.get(name)
            route = newer if newer is not route else None
        # TF Serving's words, which clients match on; then why, when the model is configured and failed to load.
        wanted = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        why = self.why_not_serving(name, version)
        raise ServingError(Code.NOT_FOUND, f"Servable not found for request: {wanted}" + (f": {why}" if why else ""))

    def routed_one_way(self, name: str) -> bool:
        """Whether every request for ``name`` naming no version goes to one version now: one serves it, and no canary
        takes a share (lock-free)."""
        route = self._state.routes.get(name)
        return route is not None and route.default is not None

    def shadow_of(self, name: str) -> tuple[int, float] | None:
        """The version that gets a copy of ``name``'s default traffic and its share, while it serves (lock-free)."""
        route = self._state.routes.get(name)
        if route is None or route.routing.shadow is None or route.routing.shadow not in route.serving:
            return None
        return route.routing.shadow, route.routing.shadow_fraction

    def default_version(self, name: str) -> int | None:
        """Where ``name``'s requests naming no version go (before a canary's share)."""
        route = self._state.routes.get(name)
        return decisions.default_version(route.routing, route.serving.keys()) if route is not None else None

    def version_status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        """Versions of ``name``, newest first, as GetModelStatus reports them."""
        with self._state.lock:
            model = self._state.models.get(name)
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
            VersionStatus(r.version, r.state, r.error, r.since, r.warnings)
            for r in sorted(records, key=lambda r: r.version, reverse=True)
        ]

    def version_state(self, name: str, version: int) -> VersionState | None:
        """The state of the current record of ``version`` (None: never loaded); a listener may call it."""
        with self._state.lock:
            model = self._state.models.get(name)
            record = model.versions.get(version) if model is not None else None
            return record.state if record is not None else None

    def label_version(self, name: str, label: str) -> int:
        with self._state.lock:
            model = self._state.models.get(name)
            version = model.label_map.get(label) if model is not None and not model.removed else None
        if version is None:
            raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        return version

    def labels(self, name: str) -> dict[str, int]:
        with self._state.lock:
            model = self._state.models.get(name)
            return dict(model.label_map) if model is not None else {}

    def model_names(self) -> list[str]:
        with self._state.lock:
            return sorted(n for n, m in self._state.models.items() if not m.removed)

    def _settled_locked(self) -> bool:
        for model in self._state.models.values():
            for record in [*model.versions.values(), *model.replacing.values()]:
                if record.state in (VersionState.START, VersionState.LOADING, VersionState.UNLOADING):
                    return False
        return True

    def wait_until_settled(self, timeout: float | None = None) -> bool:
        """Block until no version is loading or unloading (True), or ``timeout`` passes (False)."""
        with self._state.lock:
            return self._state.settled.wait_for(self._settled_locked, timeout=timeout)
