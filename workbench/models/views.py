"""The JSON view of a model that ``GET /workbench/v1/models`` answers: versions, states, labels, traffic, routing.

Built from a :class:`ModelSnapshot`, plain data the manager copies under its lock (:func:`snapshot_of`), so the view
itself (and its routing decision) is computed with no lock held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from workbench.models.records import ModelRecord
from workbench.models.routing.policy import Routing, decide, labels_of
from workbench.runtime.storage import redact


@dataclasses.dataclass(frozen=True)
class VersionSnapshot:
    version: int
    state: str  # a VersionState name
    error: str = ""
    error_code: str = "OK"
    warnings: tuple[str, ...] = ()  # what its load warned of (see Servable.load_warnings)


@dataclasses.dataclass(frozen=True)
class ModelSnapshot:
    """One model as the manager saw it at one moment."""

    name: str
    base_path: str
    platform: str
    policy: str
    versions: tuple[VersionSnapshot, ...]
    on_disk: frozenset[int]
    policy_versions: frozenset[int]
    held: frozenset[int]
    config_labels: dict[str, int]
    routing: Routing
    generation: int
    routing_state: str  # where the routing is stored (a path or URL)
    error: str = ""  # why the repository could not be listed at the last poll ("" when it could)
    # Under a memory budget: each version's residency and memory (workbench.models.residency), else empty.
    memory: Mapping[int, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # A model whose routing a registry holds (MLflow's aliases): the registry's URI and the version each alias names.
    registry: Mapping[str, Any] | None = None

    def available(self) -> frozenset[int]:
        return frozenset(v.version for v in self.versions if v.state == "AVAILABLE")


def snapshot_of(model: ModelRecord, memory: Mapping[int, Mapping[str, Any]] | None = None) -> ModelSnapshot:
    """``model`` as plain data (the manager's lock held); ``memory``: its versions' memory, under a budget."""
    versions = tuple(
        VersionSnapshot(
            r.version,
            r.state.name,
            r.error.message if r.error else "",
            r.error.code.name if r.error else "OK",
            r.warnings,
        )
        for r in model.versions.values()
    )
    return ModelSnapshot(
        name=model.config.name,
        base_path=redact(model.config.base_path),
        platform=model.config.platform,
        policy=model.config.policy.describe(),
        versions=versions,
        on_disk=frozenset(model.on_disk),
        policy_versions=frozenset(model.policy_versions),
        held=frozenset(model.held),
        config_labels=dict(model.labels),
        routing=model.routing,
        generation=model.stored.generation,
        routing_state=model.store.location,
        error=model.source_error,
        memory=dict(memory or {}),
        registry=model.store.registry_view(model.routing),
    )


def describe_model(model: ModelSnapshot) -> dict[str, Any]:
    routing = model.routing
    decision = decide(
        routing,
        available=model.available(),
        on_disk=model.on_disk,
        policy_versions=model.policy_versions,
        held=model.held,
    )
    labels = labels_of(model.config_labels, routing)
    records = {v.version: v for v in model.versions}
    versions = []
    for version in sorted(set(records) | model.on_disk, reverse=True):
        record = records.get(version, VersionSnapshot(version, "NOT_LOADED"))
        versions.append(
            {
                "version": version,
                "state": record.state,
                "error": record.error,
                "error_code": record.error_code,
                **({"warnings": list(record.warnings)} if record.warnings else {}),
                "labels": sorted(label for label, v in labels.items() if v == version),
                "traffic_share": round(decision.shares.get(version, 0.0), 6),
                "pinned": version in routing.pinned,
                "dropped": version in routing.dropped,
                "on_disk": version in model.on_disk,
                **({"memory": dict(model.memory[version])} if version in model.memory else {}),
            }
        )
    return {
        "name": model.name,
        "base_path": model.base_path,
        "platform": model.platform,
        "policy": model.policy,
        "default_version": decision.default_version,
        "stable": routing.stable,
        "previous_stable": routing.history[-1] if routing.history else None,
        "canary": {"version": routing.canary, "weight": routing.canary_weight} if routing.canary is not None else None,
        "shadow": (
            {"version": routing.shadow, "fraction": routing.shadow_fraction} if routing.shadow is not None else None
        ),
        "labels": labels,
        "versions": versions,
        # The stored routing this server routes by: a change may name the generation it expects (a stale view's
        # change is then refused instead of undoing someone else's).
        "generation": model.generation,
        "routing_state": model.routing_state,
        "error": model.error,
        **({"registry": dict(model.registry)} if model.registry is not None else {}),
    }
