"""Management changes of a model's routing: promote, rollback, canary, load (pin) and unload.

Each change is a compare-and-write of the model's stored routing (``routing_state``): it starts from the routing
read afresh from the store (refusing a caller's stale ``generation`` early), decides the new routing with
:mod:`~workbench.models.routing.policy`, keeps any version it gives a role loaded while the write is made, and routes by
what was stored. A write racing another replica's is refused by the store, and this server then routes by the
winner. :class:`RoutingChanges` *uses* the models' manager (:class:`~workbench.models.manager.Manager`, through the
public methods :class:`RoutedModels` names, and its reads, :class:`ModelQueries`), which owns the models and their
loading: this module only decides and stores routing changes. The server's control plane
(:mod:`workbench.planes.controlplane`) holds the one instance; every routing change goes through it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

from workbench.core.errors import Code, ServingError
from workbench.models.routing import policy as decisions
from workbench.models.routing.policy import CANARY, STABLE, Routing
from workbench.models.routing.routing_file import (
    RoutingConflict,
    RoutingStateStore,
    RoutingStateUnwritable,
    StoredRouting,
)


class RoutedModels(Protocol):
    """What a routing change has the manager do (each raises NOT_FOUND for a model not in the config)."""

    def change_lock(self, name: str) -> threading.Lock:
        """The lock that lets one change of ``name`` run at a time in this process."""
        ...

    def reread_routing(self, name: str) -> StoredRouting:
        """Read ``name``'s stored routing afresh, route by it, and return what it routes by now."""
        ...

    def route_by(self, name: str, stored: StoredRouting, store: RoutingStateStore) -> None:
        """Route ``name`` by ``stored``, read from or written to ``store`` (not if the model has another store now)."""
        ...

    def hold_loaded(self, name: str, version: int, timeout: float) -> contextlib.AbstractContextManager[None]:
        """Load ``version`` and keep it loaded for the ``with`` block (raises when it does not load)."""
        ...


class ModelQueries(Protocol):
    """What a routing change reads of the served models (each raises NOT_FOUND for a model not in the config)."""

    def config_labels(self, name: str) -> dict[str, int]:
        """The model config file's version labels of ``name``."""
        ...

    def routing_store(self, name: str) -> RoutingStateStore: ...

    def available_versions(self, name: str) -> set[int]: ...

    def has_version(self, name: str, version: int) -> bool:
        """Whether ``version`` of ``name`` is known (loaded once, or on disk)."""
        ...


class RoutingChanges:
    """The management operations on the routing of the models a :class:`RoutedModels` (the manager) loads."""

    def __init__(self, manager: RoutedModels, models: ModelQueries) -> None:
        """``models``: the manager's reads (:class:`~workbench.models.served.ServedModels`)."""
        self._manager = manager
        self._models = models

    def promote(self, name: str, version: int, timeout: float = 300.0, generation: int | None = None) -> None:
        """Point ``stable`` at ``version`` (loading it first) and make it the default of ``name``.

        ``generation``: the stored routing generation the caller saw; the change is refused (ABORTED) if the
        routing moved on since. Every change below takes it.
        """
        with self._changing(name):
            base = self._begin_change(name, generation, label=STABLE)
            with self._manager.hold_loaded(name, version, timeout):
                self._commit(name, base, decisions.promote(base.routing, version))

    def rollback(self, name: str, generation: int | None = None) -> int:
        """Return ``stable`` to the version it pointed at before the last promotion; returns that version."""
        with self._changing(name):
            base = self._begin_change(name, generation, label=STABLE)
            available = self._models.available_versions(name)
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
            with self._manager.hold_loaded(name, version, timeout):
                self._commit(name, base, decisions.set_canary(base.routing, version, weight))

    def set_shadow(
        self, name: str, version: int, fraction: float, timeout: float = 300.0, generation: int | None = None
    ) -> None:
        """Copy ``fraction`` (0 to 1) of ``name``'s default traffic to ``version`` (answered to nobody, compared);
        fraction 0 ends the shadow."""
        if not 0.0 <= fraction <= 1.0:
            raise ServingError(Code.INVALID_ARGUMENT, f"Shadow fraction must be between 0 and 1, got {fraction}")
        with self._changing(name):
            base = self._begin_change(name, generation)
            if fraction == 0:
                self._commit(name, base, decisions.set_shadow(base.routing, version, 0.0))
                return
            with self._manager.hold_loaded(name, version, timeout):
                self._commit(name, base, decisions.set_shadow(base.routing, version, fraction))

    def load_version(self, name: str, version: int, timeout: float = 300.0, generation: int | None = None) -> None:
        """Load (pin) ``version`` beyond the model's policy, and keep it loaded."""
        with self._changing(name):
            base = self._begin_change(name, generation)
            with self._manager.hold_loaded(name, version, timeout):
                self._commit(name, base, decisions.pin(base.routing, version))

    def unload_version(self, name: str, version: int, generation: int | None = None, *, keep_last: bool = True) -> None:
        """Unload ``version`` (even if the policy wants it) — never the stable, canary or shadow one while another
        serves, and with ``keep_last`` never the last serving one (:func:`~workbench.models.routing.policy.drop`)."""
        with self._changing(name):
            base = self._begin_change(name, generation)
            if not self._models.has_version(name, version):
                raise ServingError(Code.NOT_FOUND, f"Model {name} has no version {version}")
            available = self._models.available_versions(name)
            self._commit(name, base, decisions.drop(name, base.routing, version, available, keep_last=keep_last))

    @contextlib.contextmanager
    def _changing(self, name: str) -> Iterator[None]:
        """One change of a model at a time in this process (other processes are kept out by the store's lock)."""
        with self._manager.change_lock(name):  # an unknown name is NOT_FOUND here
            yield

    def _begin_change(self, name: str, generation: int | None, label: str | None = None) -> StoredRouting:
        """The stored routing a change starts from, read afresh; refuse early what could not be stored."""
        store = self._models.routing_store(name)
        if label is not None:
            decisions.check_label_owner(name, label, self._models.config_labels(name))
        try:
            store.check_writable()
        except RoutingStateUnwritable as exc:
            raise _unwritable(name, exc) from None
        base = self._manager.reread_routing(name)
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
        store = self._models.routing_store(name)
        try:
            stored = store.write(routing, base)
        except RoutingConflict as conflict:
            current = conflict.current
            self._manager.route_by(name, current, store)
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
        self._manager.route_by(name, stored, store)


def _unwritable(name: str, exc: RoutingStateUnwritable) -> ServingError:
    advice = exc.advice or (
        "This server serves the repository but cannot write its routing state; change it where the repository is "
        "writable"
    )
    return ServingError(
        Code.FAILED_PRECONDITION,
        f"The routing of model {name} cannot be changed: {exc.location}: {exc.reason}. {advice}",
    )
