"""Reading a model's stored routing: what the store holds, or the model's initial routing when it holds none.

A state that cannot be read (damaged, unreachable) reads as None, and the model keeps routing as before; each
problem is logged once per model, not at every poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from workbench.models.routing.policy import Routing
from workbench.models.routing.routing_file import DamagedRoutingState, RoutingStateStore, StoredRouting

# Logged as the manager, which routes by what is read here (its log lines keep their name).
log = logging.getLogger("workbench.models.manager")


class RoutingReader:
    """Reads stored routings; ``initial_routing`` is each model's routing while its store holds none (an older
    workbench's state file, migrated on the first change)."""

    def __init__(self, initial_routing: Mapping[str, Routing] | None = None) -> None:
        self._initial = dict(initial_routing or {})
        self._lock = threading.Lock()
        self._problems: dict[str, str] = {}  # model → the routing read error last logged (logged once)

    def initial(self, name: str) -> StoredRouting:
        return StoredRouting(self._initial.get(name, Routing()))

    def read(self, name: str, store: RoutingStateStore) -> StoredRouting | None:
        """The stored routing of ``name`` (its initial routing when none is stored), or None if unreadable."""
        try:
            stored = store.read()
        except (DamagedRoutingState, OSError) as exc:
            problem = str(exc)
            with self._lock:
                first = self._problems.get(name) != problem
                self._problems[name] = problem
            if first:
                log.error("Model %s keeps its routing: the routing state cannot be read: %s", name, problem)
            return None
        with self._lock:
            self._problems.pop(name, None)
        return stored if stored is not None else self.initial(name)
