"""Requests that wait for a model's first load, rather than being told it does not exist.

TF Serving opens its ports only once the initial models have loaded; workbench opens them earlier, so a request for
a configured model whose first load is not over waits for it (:meth:`FirstLoads.when_over`). The manager says
when a model is expected and, under its lock, when its state changed (:meth:`FirstLoads.settle`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from workbench.models.records import ModelRecord, VersionState

log = logging.getLogger(__name__)


class FirstLoads:
    """Models whose first load is under way → what to call when it is over.

    :meth:`loading` reads without a lock, on every request; the rest runs under the manager's lock.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, list[Callable[[], None]]] = {}

    def expect(self, name: str) -> None:
        """``name`` was just configured: its first load is under way."""
        self._waiting.setdefault(name, [])

    def loading(self, name: str) -> bool:
        return name in self._waiting

    def when_over(self, name: str, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` once ``name``'s first load is over; False when it already is (never called then)."""
        waiting = self._waiting.get(name)
        if waiting is None:
            return False
        waiting.append(callback)
        return True

    def settle(self, model: ModelRecord) -> None:
        """Wake what waits for ``model``'s first load once it is over (``model`` is the current record)."""
        name = model.config.name
        if name not in self._waiting or not first_load_over(model):
            return
        for callback in self._waiting.pop(name):
            try:
                callback()
            except Exception:  # noqa: BLE001 - a waiter must not break the manager
                log.exception("first-load callback failed")


def first_load_over(model: ModelRecord) -> bool:
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
