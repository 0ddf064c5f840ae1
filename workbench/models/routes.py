"""What requests resolve against: each model's serving versions, labels and canary split, as one immutable route.

The manager builds a model's :class:`Route` under its lock (:func:`route_of`) whenever a version enters or leaves
AVAILABLE, the labels change or the routing does, and swaps it in whole; requests read it without any lock. The
labels' bookkeeping lives here too: which labels a model config may set (:func:`check_labels`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.models.harness import Harness
from workbench.models.records import ModelRecord, VersionState
from workbench.models.routing import policy as decisions
from workbench.models.routing.policy import CanarySplit, Routing


@dataclasses.dataclass(frozen=True, eq=False)
class Route:
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
    # The version a request naming none wants, among the versions aspired to whether they serve or not (the latest,
    # or the promoted one): with versions loaded on demand, a request for it waits for it rather than taking another.
    wanted: int | None = None

    def pick(self, key: str | None = None) -> Harness | None:
        """The version a request that names none runs on (None when nothing serves); with a stickiness ``key``,
        the one that key always gets under this split (see :func:`~workbench.models.routing.policy.sticky_pick`)."""
        if self.default is not None or not self.serving:
            return self.default
        if key is not None:
            return self.serving[decisions.sticky_pick(self.routing, self.serving.keys(), key)]
        with self.split_lock:  # the canary's exact share counts every request once
            return self.serving[self.split.pick(self.routing, self.serving.keys())]


def route_of(model: ModelRecord) -> Route:
    """``model``'s requests routed by its state as it is now (lock held)."""
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
    return Route(
        serving=serving,
        labels=dict(model.label_map),
        routing=routing,
        split=model.split,
        split_lock=model.split_lock,
        default=serving[default] if default is not None and not canary_shares else None,
        wanted=decisions.default_version(routing, set(model.aspired) | set(serving)),
    )


def check_labels(model: ModelRecord, labels: Mapping[str, int], allow_unavailable: bool) -> None:
    """Refuse labels that name versions not AVAILABLE (unless allowed) or are empty (lock held)."""
    name = model.config.name
    for label, version in labels.items():
        record = model.versions.get(version)
        available = record is not None and record.state == VersionState.AVAILABLE
        if not available and not allow_unavailable:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Request to assign label to version {version} of model {name}, which is not "
                "currently available for inference",
            )
        if not label:
            raise ServingError(Code.INVALID_ARGUMENT, f"Empty version label for model {name}")


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
