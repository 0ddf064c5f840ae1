"""What the v2 frontends (REST and gRPC) share beyond the wire: which model a request names, and the repository
extension's load and unload on workbench's version management.

Both frontends answer the same questions the same way through this class, so a rule about v2 lives in one place:
a version string of digits is a version, any other a label (unknown: NOT_FOUND, as an unknown version is in v2);
repository load and unload follow the server's model control mode (:mod:`workbench.config.model_control`): on
versions by default (a whole model leaves only with the model config), on whole models in explicit mode, refused in
Triton's words in none and poll modes; a management token, when the server has one, guards them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from workbench.config.model_control import FILE_PREFIX, ModelControl, Overrides
from workbench.core.errors import Code, ServingError
from workbench.frontends.auth import bearer_matches
from workbench.models.manager import VersionState
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol.v2_models import RepositoryRow, parse_version


class V2Repository:
    """Model resolution and the repository extension, for both v2 frontends."""

    def __init__(
        self,
        dataplane: Dataplane,
        rescan: Callable[[], None],
        management_token: str = "",
        control: ModelControl | None = None,
    ) -> None:
        """``rescan`` re-reads the model folders and waits until their versions settle (a load without a version);
        ``control``: the server's model control (None: workbench's own, on versions)."""
        self.dataplane = dataplane
        self.manager = dataplane.manager
        self._rescan = rescan
        self._token = management_token
        self.control = control

    # ------------------------------------------------------------------------------------- resolution
    def spec(self, model: str, version: str | None) -> ModelSpec:
        """What a request's model and version string select, once its label (if any) is known."""
        if not model:
            raise ServingError(Code.INVALID_ARGUMENT, "A model name is required")
        if not self.manager.knows(model):  # Triton's words, which its users match on, for a model it never heard of
            raise ServingError(Code.NOT_FOUND, f"Request for unknown model: '{model}' is not found")
        number, label = parse_version(version or "")
        if label is not None and label not in self.manager.labels(model):
            self.known(model)
            # Triton's words (its clients and users match on them): to Triton a version is a number, to workbench
            # any other text names a label.
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"failed to get model version from specified version string '{label}': it is neither a version "
                f"number nor a version label of model {model}",
            )
        return ModelSpec(model, version=number, label=label)

    async def loaded_spec(self, model: str, version: str | None, timeout: float | None) -> ModelSpec:
        """:meth:`spec`, once the model's first load is over (its labels are known only then): see
        :meth:`Dataplane.loaded <workbench.planes.dataplane.Dataplane.loaded>`."""
        await self.dataplane.loaded(model, timeout)
        return self.spec(model, version)

    def version_of(self, spec: ModelSpec) -> int | None:
        """The version number ``spec`` names (its label's), or None for the default traffic."""
        return self.manager.label_version(spec.name, spec.label) if spec.label is not None else spec.version

    def known(self, model: str) -> str:
        if model not in self.manager.model_names():
            raise ServingError(
                Code.NOT_FOUND,
                f"Unknown model: {model}. workbench loads the models of its model config or model repository",
            )
        return model

    def available_versions(self, model: str) -> list[int]:
        statuses = self.manager.version_status(model)
        return sorted(s.version for s in statuses if s.state == VersionState.AVAILABLE)

    # ------------------------------------------------------------------------------------- repository
    def authorize(self, authorization: str) -> None:
        """``authorization`` is the request's ``Authorization`` header (or gRPC metadata) value."""
        if not self._token:
            return
        if not bearer_matches(authorization, self._token):
            raise ServingError(Code.UNAUTHENTICATED, "Repository load and unload need the server's management token")

    async def load(self, model: str, version: int | None, overrides: Overrides | None = None) -> None:
        """Load (and keep) ``version``; without one, re-read the model's folder and succeed once a version serves.

        In explicit mode a load without a version serves the whole model out of the repository, with Triton's
        config and file ``overrides`` when given."""
        control = self.control
        if control is not None:
            control.refuse_unless_explicit()
            if control.explicit and version is None:
                await _off_the_loop(functools.partial(control.load, model, overrides))
                self._loaded(model)
                return
        if overrides:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "Triton's config and file overrides load a whole model: they need --model_control_mode=explicit "
                "and no version parameter",
            )
        self.known(model)
        if version is not None:  # waits until the version serves: never on the event loop
            await _off_the_loop(functools.partial(self.manager.load_version, model, version))
            return
        await _off_the_loop(self._rescan)
        if self.available_versions(model):
            return
        statuses = self.manager.version_status(model)
        reasons = "; ".join(f"version {s.version}: {s.error.message}" for s in statuses if s.error is not None)
        raise ServingError(
            Code.UNAVAILABLE, f"Model {model} has no version that serves" + (f" ({reasons})" if reasons else "")
        )

    def index(self) -> list[RepositoryRow]:
        """The repository index: every version the server knows, and in explicit mode the repository's models that
        are not loaded (unloaded by request: UNAVAILABLE, "unloaded"; never loaded: no state)."""
        rows = self.dataplane.repository()
        control = self.control
        if control is None or not control.explicit:
            return rows
        unloaded = set(control.unloaded())
        for name in control.not_loaded(self.manager.model_names()):
            state, reason = ("END", "unloaded") if name in unloaded else ("", "")
            rows.append(RepositoryRow(name, None, state, reason))
        return sorted(rows, key=lambda row: (row.name, -1 if row.version is None else row.version))

    def _loaded(self, model: str) -> None:
        """After an explicit load: Triton's "failed to load" with each version's reason, unless a version serves."""
        if self.available_versions(model):
            return
        statuses = self.manager.version_status(model) if self.manager.knows(model) else []
        versions = ",".join(str(s.version) for s in sorted(statuses, key=lambda s: s.version)) or "none found"
        reasons = "; ".join(f"version {s.version}: {s.error.message}" for s in statuses if s.error is not None)
        message = f"failed to load '{model}', versions that are not available: {versions}"
        raise ServingError(Code.UNAVAILABLE, message + (f" ({reasons})" if reasons else ""))

    async def unload(
        self, model: str, version: int | None, how_to_name_it: str, unload_dependents: bool = False
    ) -> None:
        """Unload ``version`` (not the one serving the default traffic, nor the last that serves); in explicit
        mode, without a version, the whole model (and, with ``unload_dependents``, the models that run on it)."""
        control = self.control
        if control is not None:
            control.refuse_unless_explicit()
            if control.explicit and version is None:
                if not self.manager.knows(model):
                    raise ServingError(Code.NOT_FOUND, f"failed to unload '{model}': it is not loaded")
                names = {model, *(self.manager.dependents(model) if unload_dependents else ())}
                await _off_the_loop(functools.partial(control.unload, names))
                return
        self.known(model)
        if version is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Name the version of {model} to unload: {how_to_name_it}. workbench serves every model of its "
                "model config; remove a model from the config to stop serving it",
            )
        await _off_the_loop(functools.partial(self.manager.unload_version, model, version))


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
