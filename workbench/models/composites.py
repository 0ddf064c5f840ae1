"""Composite versions (pipelines, handlers) and the models they run on, read from the manager's records.

A composite version becomes AVAILABLE only once its members serve: while one of them is on its way it waits,
loaded and *parked*; when none is coming it ends with :func:`members_error` and is retried once they serve. These
functions answer the manager's questions about that, under its lock; the manager acts on the answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Composite, Servable
from workbench.models.records import ModelRecord, VersionRecord, VersionState

Models = Mapping[str, ModelRecord]


def serves(models: Models, name: str) -> bool:
    model = models.get(name)
    return model is not None and not model.removed and bool(model.available())


def unserved(models: Models, names: Iterable[str]) -> frozenset[str]:
    return frozenset(n for n in names if not serves(models, n))


def coming(models: Models, name: str) -> bool:
    """Whether ``name`` may serve soon: configured but not listed yet, or a version of it loading."""
    model = models.get(name)
    if model is None or model.removed:
        return False
    if not model.scanned and not model.source_error:
        return True
    loading = (VersionState.START, VersionState.LOADING)
    return any(r.state in loading and r.parked is None for r in model.versions.values())


def members_error(models: Models, name: str, missing: frozenset[str]) -> ServingError:
    reasons = []
    for member in sorted(missing):
        model = models.get(member)
        reasons.append(f"{member} ({'no version AVAILABLE' if model and not model.removed else 'not served'})")
    return ServingError(
        Code.FAILED_PRECONDITION,
        f"Model {name} runs on models that are not serving: {', '.join(reasons)}; it loads once they serve",
    )


def unparked(models: Models) -> list[tuple[ModelRecord, VersionRecord, Servable]]:
    """The parked composites whose members now serve, or have stopped coming: taken off parking, to admit again."""
    ready = []
    for model in models.values():
        for record in model.versions.values():
            servable = record.parked
            if servable is None or any(coming(models, m) and not serves(models, m) for m in record.awaiting):
                continue
            record.parked = None
            ready.append((model, record, servable))
    return ready


def waiting_for(models: Models, name: str) -> list[ModelRecord]:
    """The models with a composite version that failed for lack of ``name`` (to retry now that it serves)."""
    return [
        model
        for model in list(models.values())
        if not model.removed and any(name in r.awaiting and r.parked is None for r in model.versions.values())
    ]


def dependents(models: Models, name: str) -> set[str]:
    """The models with a version (serving or waiting to) that runs on ``name``: its pipelines and handlers."""
    found = set()
    for model in models.values():
        for record in model.versions.values():
            servable = record.parked or (record.harness.servable if record.harness is not None else None)
            if isinstance(servable, Composite) and name in servable.members():
                found.add(model.config.name)
    return found
