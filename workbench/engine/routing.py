"""Version management beyond TF Serving: promote, roll back, canary, and pinned or dropped versions.

Each model has a :class:`Routing`: the ``stable`` version a promotion chose (and the ones before it, for
rollback), an optional canary version with its share of default traffic, and versions pinned (loaded beyond
the policy) or dropped (unloaded although the policy wants them). It decides where a request that names no
version goes, and which versions must stay loaded. A :class:`RoutingStore` keeps every model's routing in
one JSON file, written atomically, so a restarted server routes as before.

Without a promotion nothing changes from TF Serving: the default is the latest available version.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STABLE = "stable"
CANARY = "canary"


@dataclasses.dataclass
class Routing:
    stable: int | None = None
    history: list[int] = dataclasses.field(default_factory=list)
    canary: int | None = None
    canary_weight: float = 0.0
    pinned: set[int] = dataclasses.field(default_factory=set)
    dropped: set[int] = dataclasses.field(default_factory=set)
    # Deterministic split: the canary gets a request whenever its count falls behind weight * requests, so over
    # N requests it gets floor(N * weight) of them (integers: no float drift), without a random draw's noise.
    _requests: int = dataclasses.field(default=0, repr=False, compare=False)
    _canary_hits: int = dataclasses.field(default=0, repr=False, compare=False)

    def required(self) -> set[int]:
        """Versions that must stay loaded: the stable one, the one a rollback returns to, the canary, pins."""
        keep = set(self.pinned)
        for version in (self.stable, self.history[-1] if self.history else None, self.canary):
            if version is not None:
                keep.add(version)
        return keep

    def labels(self) -> dict[str, int]:
        labels = {}
        if self.stable is not None:
            labels[STABLE] = self.stable
        if self.canary is not None:
            labels[CANARY] = self.canary
        return labels

    def pick(self, available: set[int]) -> int:
        """The version a request that names none runs on (``available`` is not empty)."""
        if self.canary in available and self.canary_weight > 0:
            self._requests += 1
            # Exact in integers: weights are compared in millionths.
            if (self._canary_hits + 1) * 1_000_000 <= self._requests * round(self.canary_weight * 1_000_000):
                self._canary_hits += 1
                return self.canary  # type: ignore[return-value]
        if self.stable in available:
            return self.stable  # type: ignore[return-value]
        return max(available)

    def shares(self, available: set[int]) -> dict[int, float]:
        """Each available version's share of default traffic."""
        if not available:
            return {}
        default = self.stable if self.stable in available else max(available)
        shares = {v: 0.0 for v in available}
        canary = self.canary_weight if self.canary in available else 0.0
        shares[default] += 1.0 - canary
        if canary:
            shares[self.canary] += canary  # type: ignore[index]
        return shares

    def is_default(self) -> bool:
        return self.stable is None and self.canary is None and not self.pinned and not self.dropped

    def to_json(self) -> dict[str, Any]:
        return {
            "stable": self.stable,
            "history": self.history,
            "canary": self.canary,
            "canary_weight": self.canary_weight,
            "pinned": sorted(self.pinned),
            "dropped": sorted(self.dropped),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Routing:
        """Parse one model's entry; a wrongly typed value raises ValueError/TypeError (the store ignores the file)."""

        def version(value: Any) -> int | None:
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"a version must be an integer, not {value!r}")
            return value

        return cls(
            stable=version(doc.get("stable")),
            history=[int(v) for v in doc.get("history", [])],
            canary=version(doc.get("canary")),
            canary_weight=float(doc.get("canary_weight", 0.0)),
            pinned={int(v) for v in doc.get("pinned", [])},
            dropped={int(v) for v in doc.get("dropped", [])},
        )


class RoutingStore:
    """Every model's routing in one JSON file (or nowhere, when no path is given)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None

    def load(self) -> dict[str, Routing]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
            return {name: Routing.from_json(entry) for name, entry in doc.get("models", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            # A damaged file must not stop the server: start from TF Serving's defaults, say so loudly.
            log.error("Ignoring unreadable routing state %s: %s", self.path, exc)
            return {}

    def save(self, routings: Mapping[str, Routing]) -> None:
        if self.path is None:
            return
        doc = {"models": {name: r.to_json() for name, r in sorted(routings.items()) if not r.is_default()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".routing-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=2)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
