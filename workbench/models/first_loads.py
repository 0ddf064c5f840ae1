"""Requests that wait for a model's first load, rather than being told it does not exist.

TF Serving opens its ports only once the initial models have loaded; workbench opens them earlier, so a request for
a configured model whose first load is not over waits for it (:meth:`FirstLoads.when_over`). The manager says
when a model is expected and, under its lock, when its state changed (:meth:`FirstLoads.settle`).

A model's first load is over once one version serves, but TF Serving's clients never saw the others still loading
either: the versions its first listing started loading each have a first load of their own, which a request naming
one waits for (:meth:`FirstLoads.when_version_over`). Versions found by later listings do not: TF Serving answers
NOT_FOUND for them while they load, and so does workbench.
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
        # Per model, the versions of its first listing still loading (replaced whole, never changed: read lock-free).
        self._versions: dict[str, frozenset[int]] = {}
        self._version_waiting: dict[tuple[str, int], list[Callable[[], None]]] = {}

    def expect(self, name: str) -> None:
        """``name`` was just configured: its first load is under way."""
        self._waiting.setdefault(name, [])

    def expect_versions(self, model: ModelRecord) -> None:
        """``model`` was just listed for the first time: the versions it started loading are in their first load."""
        loading = frozenset(v for v, r in model.versions.items() if r.state == VersionState.LOADING)
        if loading:
            self._versions[model.config.name] = loading

    def loading(self, name: str) -> bool:
        return name in self._waiting

    def versions_loading(self, name: str) -> frozenset[int]:
        """The versions of ``name``'s first listing whose first load is not over (lock-free; nearly always none)."""
        return self._versions.get(name, frozenset())

    def when_over(self, name: str, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` once ``name``'s first load is over; False when it already is (never called then)."""
        waiting = self._waiting.get(name)
        if waiting is None:
            return False
        waiting.append(callback)
        return True

    def when_version_over(self, name: str, version: int, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` once ``version``'s first load is over; False when it is not in one (never called)."""
        if version not in self.versions_loading(name):
            return False
        self._version_waiting.setdefault((name, version), []).append(callback)
        return True

    def settle(self, model: ModelRecord) -> None:
        """Wake what waits for ``model``'s first load, or a version's, once it is over (``model`` is the current
        record)."""
        name = model.config.name
        self._settle_versions(model)
        if name not in self._waiting or not first_load_over(model):
            return
        _call(self._waiting.pop(name))

    def _settle_versions(self, model: ModelRecord) -> None:
        name = model.config.name
        loading = self._versions.get(name)
        if loading is None:
            return
        over = frozenset(v for v in loading if not version_loading(model, v))
        if not over:
            return
        if over == loading:
            del self._versions[name]
        else:
            self._versions[name] = loading - over
        for version in sorted(over):
            _call(self._version_waiting.pop((name, version), []))


def _call(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # a waiter must not break the manager
            log.exception("first-load callback failed")


def version_loading(model: ModelRecord, version: int) -> bool:
    """Whether ``version`` of ``model`` is still loading (a model that left the config loads nothing any more)."""
    record = model.versions.get(version)
    return not model.removed and record is not None and record.state == VersionState.LOADING


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
