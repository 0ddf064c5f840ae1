"""The replicas of one Ray Serve application answering as one server: stats, metrics and health of them all.

A request for ``/workbench/v1/stats``, its stream, the Prometheus metrics or the health reaches one replica
through Ray's HTTP proxy; like one worker of ``--num_workers`` (:mod:`workbench.observability.whole_server`), it
answers for every replica. Replicas have no addresses of their own to ask each other at request time, so each one
publishes its views to Ray's key-value store in the GCS (the store Ray's own libraries keep their state in) every
:data:`EXCHANGE_EVERY_S`, and reads its peers' back in the same thread. The replica that takes a request answers at
once from memory, never from the event loop waiting on the GCS: its own figures are current, its peers' are at
most a couple of seconds old. A replica that stops publishing (it died, or its node went) is left out once its
entry has not changed for :data:`STALE_AFTER_S`, measured on the reader's clock, so clocks of different nodes
never need to agree.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from ray.experimental import internal_kv

from workbench.observability.whole_server import VIEWS, LocalViews, PeerId, Peers

log = logging.getLogger(__name__)

NAMESPACE = "workbench"
EXCHANGE_EVERY_S = 1.0
STALE_AFTER_S = 10.0


def _prefix(app: str) -> str:
    return f"replicas/{app}/"


class ReplicaPeers(Peers):
    """This replica's place among the replicas of Ray Serve application ``app``."""

    def __init__(self, app: str, replica: str, views: LocalViews) -> None:
        super().__init__(replica, views)
        self._prefix = _prefix(app)
        self._key = f"{self._prefix}{replica}"
        self._sequence = 0
        self._peers: dict[str, dict[str, Any]] = {}  # replaced whole by the exchange thread: readers need no lock
        self._seen: dict[str, tuple[int, float]] = {}  # peer → (its sequence, when this replica saw it change)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._exchange_until_stopped, name="workbench-peers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            internal_kv._internal_kv_del(self._key, namespace=NAMESPACE)  # noqa: SLF001 - Ray's key-value store has no public API
        except Exception:  # Ray is going away too: the entry goes stale instead
            log.debug("Could not remove this replica's views", exc_info=True)

    def gather(self, view: str) -> list[tuple[PeerId, bytes | None]]:
        answers: list[tuple[PeerId, bytes | None]] = [(self.index, self.views.answer(view))]
        answers.extend((peer, entry[view].encode()) for peer, entry in sorted(self._peers.items()))
        return answers

    def _exchange_until_stopped(self) -> None:
        while True:
            try:
                self._exchange()
            except Exception:  # the GCS may be restarting: try again at the next turn
                log.warning("Could not exchange views with the other replicas", exc_info=True)
            if self._stopping.wait(EXCHANGE_EVERY_S):
                return

    def _exchange(self) -> None:
        self._sequence += 1
        own = {"sequence": self._sequence, **{view: self.views.answer(view).decode() for view in VIEWS}}
        internal_kv._internal_kv_put(self._key, json.dumps(own), namespace=NAMESPACE)  # noqa: SLF001 - Ray's key-value store has no public API
        now = time.monotonic()
        peers: dict[str, dict[str, Any]] = {}
        for key in internal_kv._internal_kv_list(self._prefix, namespace=NAMESPACE):  # noqa: SLF001
            peer = key.decode()[len(self._prefix) :]
            if peer == self.index:
                continue
            value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)  # noqa: SLF001
            if value is None:  # removed since listed
                continue
            entry = json.loads(value)
            sequence, changed_at = self._seen.get(peer, (-1, now))
            if entry["sequence"] != sequence:
                changed_at = now
            self._seen[peer] = (entry["sequence"], changed_at)
            if now - changed_at <= STALE_AFTER_S:
                peers[peer] = entry
        self._peers = peers


def forget_replicas(app: str) -> None:
    """Remove every published view of application ``app`` (it was deleted)."""
    internal_kv._internal_kv_del(_prefix(app), del_by_prefix=True, namespace=NAMESPACE)  # noqa: SLF001 - Ray's key-value store has no public API
