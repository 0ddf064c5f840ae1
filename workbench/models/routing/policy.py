"""Routing decisions: where a request that names no version goes, which versions stay loaded, what a change does.

Every function here is a pure function of the state it is given (no I/O, no locks, no clock), the way TF
Serving's ``AspiredVersionPolicy::GetNextAction`` is fed the versions' states: the manager gathers the state,
calls :func:`decide`, and carries the decision out. Management changes (:func:`promote`, :func:`rollback`,
:func:`set_canary`, :func:`pin`, :func:`drop`) turn one :class:`Routing` into the next, or refuse with the
error a client sees. Where a routing is stored (``routing.json`` in the model's base path) is
``routing_state``'s business; the one mutable thing here is :class:`CanarySplit`'s request counters.

Without a promotion nothing changes from TF Serving: the default is the latest available version.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Collection, Mapping
from typing import Any

from workbench.core.errors import Code, ServingError

STABLE = "stable"
CANARY = "canary"
# Labels the routing state sets; a model config file's version_labels of the same name win (see labels_of).
ROUTING_LABELS = (STABLE, CANARY)


@dataclasses.dataclass(frozen=True)
class Routing:
    """One model's routing: the promoted ``stable`` version (and the ones before it, for rollback), an optional
    canary with its share of default traffic, and versions pinned (loaded beyond the policy) or dropped
    (unloaded although the policy wants them). Immutable: a change makes a new one."""

    stable: int | None = None
    history: tuple[int, ...] = ()
    canary: int | None = None
    canary_weight: float = 0.0
    pinned: frozenset[int] = frozenset()
    dropped: frozenset[int] = frozenset()
    # A version that gets a copy of ``shadow_fraction`` of default traffic, answered to nobody, compared.
    shadow: int | None = None
    shadow_fraction: float = 0.0
    # The last serving version was dropped on request (TorchServe's unregister, Triton's unload: "remove it"), so
    # drops that leave nothing to serve are meant, not a mistake to ignore (see :func:`decide`).
    emptied: bool = False

    def required(self) -> frozenset[int]:
        """Versions that must stay loaded: the stable one, the one a rollback returns to, the canary, the shadow,
        pins."""
        roles = (self.stable, self.history[-1] if self.history else None, self.canary, self.shadow)
        return self.pinned | {v for v in roles if v is not None}

    def labels(self) -> dict[str, int]:
        labels = {}
        if self.stable is not None:
            labels[STABLE] = self.stable
        if self.canary is not None:
            labels[CANARY] = self.canary
        return labels

    def is_default(self) -> bool:
        return self == Routing()

    def to_json(self) -> dict[str, Any]:
        return {
            "stable": self.stable,
            "history": list(self.history),
            "canary": self.canary,
            "canary_weight": self.canary_weight,
            "pinned": sorted(self.pinned),
            "dropped": sorted(self.dropped),
            "shadow": self.shadow,
            "shadow_fraction": self.shadow_fraction,
            # Written only when set: the files of every routing that never emptied its model stay as they were.
            **({"emptied": True} if self.emptied else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Routing:
        """Parse a routing; a wrongly typed value raises ValueError or TypeError (the caller says which file)."""
        if not isinstance(doc, Mapping):
            raise TypeError(f"a routing must be a JSON object, not {type(doc).__name__}")
        weight = doc.get("canary_weight", 0.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
            raise ValueError(f"canary_weight must be a number from 0 to 1, not {weight!r}")
        canary = _version(doc.get("canary"))
        fraction = doc.get("shadow_fraction", 0.0)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"shadow_fraction must be a number from 0 to 1, not {fraction!r}")
        shadow = _version(doc.get("shadow"))
        return cls(
            stable=_version(doc.get("stable")),
            history=tuple(_versions(doc.get("history"), "history")),
            canary=canary,
            canary_weight=float(weight) if canary is not None else 0.0,
            pinned=frozenset(_versions(doc.get("pinned"), "pinned")),
            dropped=frozenset(_versions(doc.get("dropped"), "dropped")),
            shadow=shadow,
            shadow_fraction=float(fraction) if shadow is not None else 0.0,
            emptied=_flag(doc.get("emptied", False), "emptied"),
        )


def _version(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"a version must be a non-negative integer, not {value!r}")
    return value


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{key} must be true or false, not {value!r}")
    return value


def _versions(value: Any, key: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{key} must be a list of versions, not {value!r}")
    return [v for v in map(_version, value) if v is not None]


# ------------------------------------------------------------------------------------------- the decision
@dataclasses.dataclass(frozen=True)
class Decision:
    """What a model's routing means given its versions' states."""

    default_version: int | None  # where a request that names no version goes (ignoring the canary's share)
    shares: Mapping[int, float]  # each available version's share of default traffic
    aspired: frozenset[int]  # the versions to load and keep loaded (all on disk)
    drops_ignored: bool = False  # the drops would have left nothing to serve, so they are not applied


def decide(
    routing: Routing,
    *,
    available: Collection[int],
    on_disk: Collection[int],
    policy_versions: Collection[int],
    held: Collection[int] = (),
) -> Decision:
    """The versions to serve and how default traffic splits between them.

    ``available``: versions loaded and serving; ``on_disk``: versions in the repository; ``policy_versions``: the
    ones the model's version policy picks; ``held``: versions a management change in progress is loading.
    Drops never take a model out of service: if they would leave nothing to load, they are ignored (a
    hand-edited file or two replicas' drops must not stop a model), unless the routing says its model was emptied
    on request (:func:`drop` without ``keep_last``).
    """
    wanted = (frozenset(policy_versions) | routing.required() | frozenset(held)) & frozenset(on_disk)
    aspired = wanted - (routing.dropped - frozenset(held))
    drops_ignored = bool(wanted) and not aspired and not routing.emptied
    if drops_ignored:
        aspired = wanted
    return Decision(
        default_version=default_version(routing, available),
        shares=shares(routing, available),
        aspired=aspired,
        drops_ignored=drops_ignored,
    )


def default_version(routing: Routing, available: Collection[int]) -> int | None:
    """The promoted version while it serves, else TF Serving's default: the latest available one."""
    if routing.stable is not None and routing.stable in available:
        return routing.stable
    return max(available, default=None)


def shares(routing: Routing, available: Collection[int]) -> dict[int, float]:
    """Each available version's share of default traffic (empty when nothing serves)."""
    default = default_version(routing, available)
    if default is None:
        return {}
    result = {v: 0.0 for v in available}
    canary = routing.canary_weight if routing.canary in available and routing.canary != default else 0.0
    result[default] += 1.0 - canary
    if canary:
        result[routing.canary] += canary  # type: ignore[index]
    return result


def labels_of(config_labels: Mapping[str, int], routing: Routing) -> dict[str, int]:
    """Every label of a model: the routing's ``stable``/``canary``, then the model config file's on top.

    A label the config file names is TF Serving's, and the config wins, as ``tensorflow_model_server`` given the
    same file would answer; management refuses to change such a label (:func:`check_label_owner`).
    """
    return {**routing.labels(), **config_labels}


def check_label_owner(name: str, label: str, config_labels: Mapping[str, int]) -> None:
    """Refuse a change of ``label`` when the model config file sets it (it would be overruled, silently)."""
    if label in config_labels:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f'Label "{label}" of model {name} is set by the model config file (version_labels, version '
            f"{config_labels[label]}); change it there, or remove it from the config file to manage it here",
        )


# ----------------------------------------------------------------------------------------- the changes
def promote(routing: Routing, version: int) -> Routing:
    """``stable`` points at ``version``; the old stable becomes the rollback target; a promoted canary graduates."""
    history = routing.history
    if routing.stable is not None and routing.stable != version:
        history = (*history, routing.stable)
    graduated = routing.canary == version
    return dataclasses.replace(
        routing,
        stable=version,
        history=history,
        canary=None if graduated else routing.canary,
        canary_weight=0.0 if graduated else routing.canary_weight,
        dropped=routing.dropped - {version},
    )


def rollback(name: str, routing: Routing, available: Collection[int]) -> tuple[Routing, int]:
    """``stable`` returns to the newest previous stable version that serves; returns the new routing and it."""
    history = list(routing.history)
    while history:
        previous = history.pop()
        if previous in available:
            return dataclasses.replace(routing, stable=previous, history=tuple(history)), previous
    raise ServingError(Code.FAILED_PRECONDITION, f"Model {name} has no previous stable version to roll back to")


def set_canary(routing: Routing, version: int, weight: float) -> Routing:
    """Send ``weight`` (0 to 1) of default traffic to ``version``; weight 0 ends the canary (if it is that one)."""
    if not 0.0 <= weight <= 1.0:
        raise ServingError(Code.INVALID_ARGUMENT, f"Canary weight must be between 0 and 1, got {weight}")
    if weight == 0:
        if routing.canary in (version, None):
            return dataclasses.replace(routing, canary=None, canary_weight=0.0)
        return routing
    return dataclasses.replace(routing, canary=version, canary_weight=weight, dropped=routing.dropped - {version})


def set_shadow(routing: Routing, version: int, fraction: float) -> Routing:
    """Copy ``fraction`` (0 to 1) of default traffic to ``version``, answered to nobody; 0 ends the shadow (if it is
    that one)."""
    if not 0.0 <= fraction <= 1.0:
        raise ServingError(Code.INVALID_ARGUMENT, f"Shadow fraction must be between 0 and 1, got {fraction}")
    if fraction == 0:
        if routing.shadow in (version, None):
            return dataclasses.replace(routing, shadow=None, shadow_fraction=0.0)
        return routing
    return dataclasses.replace(routing, shadow=version, shadow_fraction=fraction, dropped=routing.dropped - {version})


def pin(routing: Routing, version: int) -> Routing:
    """Keep ``version`` loaded beyond the policy (and undo a drop of it; an emptied model serves again)."""
    return dataclasses.replace(
        routing, pinned=routing.pinned | {version}, dropped=routing.dropped - {version}, emptied=False
    )


def drop(name: str, routing: Routing, version: int, available: Collection[int], *, keep_last: bool = True) -> Routing:
    """Unload ``version`` even if the policy wants it: never the stable, the canary or the shadow while another
    version serves.

    ``keep_last`` (workbench's own management API) refuses the last serving version too: there, an unload tunes
    which versions serve. Without it (TorchServe's unregister, Triton's unload, whose meaning is "remove it") the last
    one goes with whatever role it had, and the routing records that its model was emptied on purpose.
    """
    last = not set(available) - {version}
    if last and not keep_last:
        return _emptied(routing, version)
    if version in (routing.stable, routing.canary, routing.shadow):
        role = STABLE if version == routing.stable else CANARY if version == routing.canary else "shadow"
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"Version {version} of model {name} is its {role} version: promote another or end the {role} first",
        )
    if last:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"Version {version} is the only version of model {name} serving; load another one first",
        )
    history = routing.history
    if history and history[-1] == version:
        history = history[:-1]  # a rollback target that is gone is no target
    return dataclasses.replace(
        routing, pinned=routing.pinned - {version}, dropped=routing.dropped | {version}, history=history
    )


def _emptied(routing: Routing, version: int) -> Routing:
    """``routing`` with its last serving ``version`` dropped: no role may name a version that is gone."""
    canary = routing.canary if routing.canary != version else None
    shadow = routing.shadow if routing.shadow != version else None
    return dataclasses.replace(
        routing,
        stable=routing.stable if routing.stable != version else None,
        history=tuple(v for v in routing.history if v != version),
        canary=canary,
        canary_weight=routing.canary_weight if canary is not None else 0.0,
        shadow=shadow,
        shadow_fraction=routing.shadow_fraction if shadow is not None else 0.0,
        pinned=routing.pinned - {version},
        dropped=routing.dropped | {version},
        emptied=True,
    )


# ------------------------------------------------------------------------------------ per-request choice
def sticky_pick(routing: Routing, available: Collection[int], key: str) -> int:
    """The version a request with stickiness ``key`` runs on: the canary when the key's hash, as a fraction in
    [0, 1), falls below the canary's weight, else the default.

    The hash (BLAKE2b of the key with the split's versions) is the same in every process and on every replica, so a
    key lands on the same version everywhere for as long as the split stands, and over many keys the canary's share
    is its weight. The split's versions are hashed in: a new canary deals the keys afresh; a weight raised keeps
    every key that had the canary on it (its fraction is still below).
    """
    default = default_version(routing, available)
    assert default is not None, "sticky_pick() needs an available version"
    canary, weight = routing.canary, routing.canary_weight
    if canary is None or canary == default or canary not in available or weight <= 0:
        return default
    digest = hashlib.blake2b(f"{default}/{canary}/{key}".encode(), digest_size=8).digest()
    return canary if int.from_bytes(digest, "big") / 2**64 < weight else default


class CanarySplit:
    """Picks each default request's version: the canary's share exactly, without a random draw's noise.

    The canary gets a request whenever its count falls behind ``weight * requests``, so over N requests it gets
    floor(N * weight) of them (integers: no float drift). The counters restart when the canary changes.
    Not thread-safe: callers serialize their picks (the manager holds a lock per model for it).
    """

    __slots__ = ("_key", "_requests", "_canary_hits")

    def __init__(self) -> None:
        self._key: tuple[int | None, float] = (None, 0.0)
        self._requests = 0
        self._canary_hits = 0

    def pick(self, routing: Routing, available: Collection[int]) -> int:
        """The version a request that names none runs on (``available`` is not empty)."""
        default = default_version(routing, available)
        assert default is not None, "pick() needs an available version"
        canary, weight = routing.canary, routing.canary_weight
        if canary is None or canary == default or canary not in available or weight <= 0:
            return default
        if (canary, weight) != self._key:
            self._key, self._requests, self._canary_hits = (canary, weight), 0, 0
        self._requests += 1
        # Exact in integers: weights are compared in millionths.
        if (self._canary_hits + 1) * 1_000_000 <= self._requests * round(weight * 1_000_000):
            self._canary_hits += 1
            return canary
        return default
