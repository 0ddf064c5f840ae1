"""What the v2 frontends (REST and gRPC) share beyond the wire: which model a request names, and the repository
extension's load and unload.

Both frontends answer the same questions the same way through this class, so a rule about v2 lives in one place:
a version string of digits is a version, any other a label (unknown: NOT_FOUND, as an unknown version is in v2);
repository load and unload are the control plane's (:meth:`ControlPlane.repository_load
<workbench.planes.controlplane.ControlPlane.repository_load>`: they follow the server's model control mode), run off
the event loop; a management token, when the server has one, guards them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable

from workbench.config.model_control import FILE_PREFIX, Overrides
from workbench.core.errors import Code, ServingError
from workbench.frontends.auth import bearer_matches
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol.v2_dialects import dialect_of
from workbench.protocol.v2_models import RepositoryRow, parse_version


class V2Repository:
    """Model resolution and the repository extension, for both v2 frontends."""

    def __init__(self, dataplane: Dataplane, controlplane: ControlPlane, management_token: str = "") -> None:
        self.dataplane = dataplane
        self.controlplane = controlplane
        self._token = management_token
        # Version names (MLServer's "v0.1.0") of the versions listed so far, to list an unloaded model by them.
        self._version_names: dict[str, dict[int, str]] = {}

    # ------------------------------------------------------------------------------------- resolution
    def spec(self, model: str, version: str | None, key: str | None = None) -> ModelSpec:
        """What a request's model and version string select, once its label (if any) is known; ``key``: its
        stickiness key."""
        if not model:
            raise ServingError(Code.INVALID_ARGUMENT, "A model name is required")
        if not self.dataplane.knows(model):  # Triton's words, which its users match on, for a model it never heard of
            raise ServingError(Code.NOT_FOUND, f"Request for unknown model: '{model}' is not found")
        number, label = parse_version(version or "")
        if label is not None and label not in self.dataplane.labels(model):
            self.known(model)
            # Triton's words (its clients and users match on them): to Triton a version is a number, to workbench
            # any other text names a label.
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"failed to get model version from specified version string '{label}': it is neither a version "
                f"number nor a version label of model {model}",
            )
        return ModelSpec(model, version=number, label=label, key=key)

    async def loaded_spec(
        self, model: str, version: str | None, timeout: float | None, key: str | None = None
    ) -> ModelSpec:
        """:meth:`spec`, once the model's first load is over (its labels are known only then), and the first load
        of the version it names (or a version evicted under a memory budget loaded again): see
        :meth:`Dataplane.loaded <workbench.planes.dataplane.Dataplane.loaded>`."""
        dataplane = self.dataplane
        if not dataplane.waits(model):  # nearly always: nothing to wait for, read at once
            spec = self.spec(model, version, key)
            if not dataplane.waits(model, spec):
                return spec
        loop = asyncio.get_running_loop()
        started = loop.time()
        await dataplane.loaded(model, timeout)
        spec = self.spec(model, version, key)
        left = None if timeout is None else max(0.0, timeout - (loop.time() - started))
        await dataplane.loaded(model, left, spec)
        return spec

    def version_of(self, spec: ModelSpec) -> int | None:
        """The version number ``spec`` names (its label's), or None for the default traffic."""
        return self.dataplane.label_version(spec.name, spec.label) if spec.label is not None else spec.version

    def known(self, model: str) -> str:
        if model not in self.dataplane.model_names():
            raise ServingError(
                Code.NOT_FOUND,
                f"Unknown model: {model}. workbench loads the models of its model config or model repository",
            )
        return model

    def available_versions(self, model: str) -> list[int]:
        return self.dataplane.available_versions(model)

    # ------------------------------------------------------------------------------------- repository
    def authorize(self, authorization: str) -> None:
        """``authorization`` is the request's ``Authorization`` header (or gRPC metadata) value."""
        if not self._token:
            return
        if not bearer_matches(authorization, self._token):
            raise ServingError(Code.UNAUTHENTICATED, "Repository load and unload need the server's management token")

    async def load(self, model: str, version: int | None, overrides: Overrides | None = None) -> None:
        """Load (and keep) ``version``; without one, re-read the model's folder and succeed once a version serves
        (in explicit mode: serve the whole model, with Triton's config and file ``overrides`` when given)."""
        await _off_the_loop(functools.partial(self.controlplane.repository_load, model, version, overrides))

    def index(self) -> list[RepositoryRow]:
        """The repository index: every version the server knows, and in explicit mode the repository's models that
        are not loaded (unloaded by request: UNAVAILABLE, "unloaded"; never loaded: no state).

        A version its own server names (MLServer's ``"v0.1.0"``) is listed by that name, and once unloaded by it
        too, with no reason, as MLServer's index lists it."""
        rows = [self._named(row) for row in self.dataplane.repository()]
        not_loaded = [r for row in self.controlplane.not_loaded_rows() for r in self._named_unloaded(row)]
        if not not_loaded:
            return rows
        return sorted(rows + not_loaded, key=lambda row: (row.name, "" if row.version is None else str(row.version)))

    def _named(self, row: RepositoryRow) -> RepositoryRow:
        if row.version is None or not isinstance(row.version, int):
            return row
        try:
            with self.dataplane.handle(ModelSpec(row.name, version=row.version)) as servable:
                dialect = dialect_of(servable)
        except ServingError:  # not loaded (yet): listed by number
            return row
        if dialect is None:
            return row
        self._version_names.setdefault(row.name, {})[row.version] = dialect.version_name
        # MLServer's index has no reason for a loaded model; what its load warned of is kept (an MLflow model's
        # environment mismatches), as for every other loaded version.
        return dataclasses.replace(row, version=dialect.version_name or None)

    def _named_unloaded(self, row: RepositoryRow) -> list[RepositoryRow]:
        names = self._version_names.get(row.name)
        if not names or row.version is not None:
            return [row]
        return [dataclasses.replace(row, version=name or None, reason="") for name in names.values()]

    async def unload(
        self, model: str, version: int | None, how_to_name_it: str, unload_dependents: bool = False
    ) -> None:
        """Remove ``version`` (its model's last serving one too); in explicit mode, without a version, the whole
        model (and, with ``unload_dependents``, the models that run on it)."""
        unload = self.controlplane.repository_unload
        await _off_the_loop(functools.partial(unload, model, version, how_to_name_it, unload_dependents))


def unsupported_parameters(names: list[str], action: str) -> ServingError | None:
    """The error for repository parameters neither workbench nor Triton knows (load: version, config, file:…;
    unload: version, unload_dependents)."""
    known = ("version", "unload_dependents") if action == "unload" else ("version", "config")
    unsupported = sorted(n for n in names if n not in known and not (action == "load" and n.startswith(FILE_PREFIX)))
    if not unsupported:
        return None
    return ServingError(
        Code.INVALID_ARGUMENT,
        f"Repository {action} takes no parameter {', '.join(unsupported)}",
    )


async def _off_the_loop(change: Callable[[], object]) -> None:
    """Run a repository change, which may wait for versions to load or drain, off the event loop."""
    await asyncio.get_running_loop().run_in_executor(None, change)
