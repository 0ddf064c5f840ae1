"""Whether a server should get traffic: the answer behind ``GET /readyz`` and the gRPC health service.

A server is ready once start-up has loaded its models, while every configured model has at least one AVAILABLE
version, and until it starts draining. Reading it takes the models' lock for a moment per model and runs no
model, so probes stay cheap however busy the server is.
"""

from __future__ import annotations

import dataclasses
import enum

from workbench.core.errors import ServingError
from workbench.models.records import VersionState, VersionStatus
from workbench.models.served import ServedModels


class Phase(enum.IntEnum):
    """Where a server is in its life; it only moves forward."""

    STARTING = 1  # the ports are open, the initial models are loading
    SERVING = 2
    DRAINING = 3  # shutting down: accepted requests finish, nothing new should come


@dataclasses.dataclass(frozen=True)
class Readiness:
    ready: bool
    status: str  # "ready", or why not: "starting", "draining", "unavailable"
    reason: str = ""

    def body(self) -> dict[str, str]:
        """What ``/readyz`` answers: ``{"status": "ready"}``, or the status and the reason."""
        return {"status": self.status} if self.ready else {"status": self.status, "reason": self.reason}


class ServerReadiness:
    """A server's phase, and its readiness computed from the phase and the models' states when asked."""

    def __init__(self, models: ServedModels) -> None:
        self._models = models
        self.phase = Phase.STARTING

    def enter(self, phase: Phase) -> None:
        self.phase = max(self.phase, phase)

    def __call__(self) -> Readiness:
        if self.phase == Phase.STARTING:
            return Readiness(False, "starting", "loading models at start-up")
        if self.phase == Phase.DRAINING:
            return Readiness(False, "draining", "shutting down: finishing accepted requests, taking no new ones")
        problems = [problem for name in self._models.model_names() if (problem := self._unavailable(name))]
        if problems:
            return Readiness(False, "unavailable", "; ".join(problems))
        return Readiness(True, "ready")

    def _unavailable(self, name: str) -> str:
        """Why model ``name`` cannot answer requests; "" when one of its versions is AVAILABLE, or loads when asked
        for (--load_on_demand, --memory_budget), or when it was emptied on request (TorchServe's unregister, Triton's
        unload): a model removed on purpose is no reason to take the server out of traffic."""
        if self._models.serves_on_demand(name) or self._models.emptied(name):
            return ""
        try:
            versions = self._models.version_status(name)
        except ServingError:  # no version found yet (or the model went away meanwhile)
            return f"model {name} has no version yet"
        if any(v.state == VersionState.AVAILABLE for v in versions):
            return ""
        return f"model {name} has no AVAILABLE version ({', '.join(map(_describe, versions))})"


def _describe(status: VersionStatus) -> str:
    error = f": {status.error.message}" if status.error is not None else ""
    return f"version {status.version} {status.state.name}{error}"
