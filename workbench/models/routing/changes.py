"""Management changes of a model's routing: promote, rollback, canary, load (pin) and unload.

Each change is a compare-and-write of the model's stored routing (``routing_state``): it starts from the routing
read afresh from the store (refusing a caller's stale ``generation`` early), decides the new routing with
:mod:`~workbench.models.routing.policy`, keeps any version it gives a role loaded while the write is made, and routes by
what was stored. A write racing another replica's is refused by the store, and this server then routes by the
winner. Mixed into :class:`~workbench.models.manager.Manager`, which owns the models and their loading: this module
only decides and stores routing changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from workbench.core.errors import Code, ServingError
from workbench.models.routing import policy as decisions
from workbench.models.routing.policy import CANARY, STABLE, Routing
from workbench.models.routing.store import RoutingConflict, RoutingStateStore, RoutingStateUnwritable, StoredRouting

if TYPE_CHECKING:
    from workbench.models.manager import _Model


class RoutingChanges:
    """The management operations of :class:`~workbench.models.manager.Manager` (a mixin: it is their home)."""

    if TYPE_CHECKING:  # what the manager provides
        _lock: threading.RLock
        _models: dict[str, _Model]
        _change_locks: dict[str, threading.Lock]

        def _live_model(self, name: str) -> _Model: ...
        @staticmethod
        def _available(model: _Model) -> set[int]: ...
        def _read_routing(self, name: str, store: RoutingStateStore) -> StoredRouting | None: ...
        def _apply_routing(self, model: _Model, stored: StoredRouting) -> None: ...
        def _held(self, name: str, version: int, timeout: float) -> contextlib.AbstractContextManager[None]: ...

    def promote(self, name: str, version: int, timeout: float = 300.0, generation: int | None = None) -> None:
        """Point ``stable`` at ``version`` (loading it first) and make it the default of ``name``.

        ``generation``: the stored routing generation the caller saw; the change is refused (ABORTED) if the
        routing moved on since. Every change below takes it.
        """
        with self._changing(name):
            base = self._begin_change(name, generation, label=STABLE)
            with self._held(name, version, timeout):
                self._commit(name, base, decisions.promote(base.routing, version))

    def rollback(self, name: str, generation: int | None = None) -> int:
        """Return ``stable`` to the version it pointed at before the last promotion; returns that version."""
        with self._changing(name):
            base = self._begin_change(name, generation, label=STABLE)
            with self._lock:
                available = self._available(self._live_model(name))
            routing, previous = decisions.rollback(name, base.routing, available)
            self._commit(name, base, routing)
            return previous

    def set_canary(
        self, name: str, version: int, weight: float, timeout: float = 300.0, generation: int | None = None
    ) -> None:
        """Send ``weight`` (0 to 1) of ``name``'s default traffic to ``version``; weight 0 ends the canary."""
        if not 0.0 <= weight <= 1.0:
            raise ServingError(Code.INVALID_ARGUMENT, f"Canary weight must be between 0 and 1, got {weight}")
        with self._changing(name):
            base = self._begin_change(name, generation, label=CANARY if weight > 0 else None)
            if weight == 0:
                self._commit(name, base, decisions.set_canary(base.routing, version, 0.0))
                return
            with self._held(name, version, timeout):
                self._commit(name, base, decisions.set_canary(base.routing, version, weight))

    def load_version(self, name: str, version: int, timeout: float = 300.0, generation: int | None = None) -> None:
        """Load (pin) ``version`` beyond the model's policy, and keep it loaded."""
        with self._changing(name):
            base = self._begin_change(name, generation)
            with self._held(name, version, timeout):
                self._commit(name, base, decisions.pin(base.routing, version))

    def unload_version(self, name: str, version: int, generation: int | None = None) -> None:
        """Unload ``version`` (even if the policy wants it) — never the stable, canary or last serving one."""
        with self._changing(name):
            base = self._begin_change(name, generation)
            with self._lock:
                model = self._live_model(name)
                if version not in model.versions and version not in model.on_disk:
                    raise ServingError(Code.NOT_FOUND, f"Model {name} has no version {version}")
                available = self._available(model)
            self._commit(name, base, decisions.drop(name, base.routing, version, available))

    @contextlib.contextmanager
    def _changing(self, name: str) -> Iterator[None]:
        """One change of a model at a time in this process (other processes are kept out by the store's lock)."""
        with self._lock:
            self._live_model(name)  # an unknown name is NOT_FOUND here, and leaves no lock behind for each one sent
            change_lock = self._change_locks.setdefault(name, threading.Lock())
        with change_lock:
            yield

    def _begin_change(self, name: str, generation: int | None, label: str | None = None) -> StoredRouting:
        """The stored routing a change starts from, read afresh; refuse early what could not be stored."""
        with self._lock:
            model = self._live_model(name)
            if label is not None:
                decisions.check_label_owner(name, label, model.labels)
            store, epoch = model.store, model.routing_epoch
        try:
            store.check_writable()
        except RoutingStateUnwritable as exc:
            raise _unwritable(name, exc) from None
        stored = self._read_routing(name, store)
        with self._lock:
            if stored is not None and model.routing_epoch == epoch:
                self._apply_routing(model, stored)
            base = model.stored
        if generation is not None and generation != base.generation:
            raise ServingError(
                Code.ABORTED,
                f"The routing of model {name} is at generation {base.generation}, not generation {generation} as "
                f"this change expects ({store.location}); nothing was changed: read the model again and retry",
            )
        return base

    def _commit(self, name: str, base: StoredRouting, routing: Routing) -> None:
        """Store ``routing`` (no lock held while it is written), then route by it."""
        if routing == base.routing:
            return  # nothing changes: nothing to write
        with self._lock:
            model = self._live_model(name)
            store = model.store
        try:
            stored = store.write(routing, base)
        except RoutingConflict as conflict:
            current = conflict.current
            with self._lock:
                if self._models.get(name) is model:
                    self._apply_routing(model, current)
            moved = (
                f"generation {base.generation} was edited in place"
                if current.generation == base.generation
                else f"it was based on generation {base.generation}, and {store.location} is at generation "
                f"{current.generation} now"
            )
            raise ServingError(
                Code.ABORTED,
                f"The routing of model {name} changed while this change was made ({moved}); nothing was written, "
                f"and this server routes by generation {current.generation} now: read the model again and retry",
            ) from None
        except RoutingStateUnwritable as exc:
            raise _unwritable(name, exc) from None
        with self._lock:
            if self._models.get(name) is model:
                self._apply_routing(model, stored)


def _unwritable(name: str, exc: RoutingStateUnwritable) -> ServingError:
    return ServingError(
        Code.FAILED_PRECONDITION,
        f"The routing of model {name} cannot be changed: {exc.location}: {exc.reason}. This server serves the "
        "repository but cannot write its routing state; change it where the repository is writable",
    )
