"""The one place the server is *changed*, for every frontend: which models serve, their versions and their routing.

Beside the data plane (:mod:`workbench.planes.dataplane`), which resolves and runs requests and answers what the
server serves, the frontends get this object for everything that changes it:

- the model config: :meth:`ControlPlane.apply_models` realises a list of models (the start-up, the config file
  watcher, gRPC's ``HandleReloadConfigRequest``, a Triton load or unload); :meth:`ControlPlane.rescan` re-reads the
  repository now;
- the routing of a model's versions (the management API, the v2 repository API's version loads and unloads):
  promote, rollback, canary, shadow, load (pin) and unload, each a compare-and-write of the routing stored beside
  the model (:class:`~workbench.models.routing.changes.RoutingChanges`, the one path every routing change takes),
  and the rule of a promotion that must be earned (``only_if``: its shadow record meets a condition);
- Triton's model control (``--model_control_mode``): loading and unloading whole models of the repository.

It owns the repository source (which polls the repository for the manager) and each model's batching parameters,
which follow the model config. Its methods block (a load waits for versions to load): frontends call them off the
event loop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from workbench.config import triton_model_config as triton_config
from workbench.config.batching_parameters import (
    BATCHING_FILE_NAME,
    BatchingParameters,
    model_batching_parameters,
    parse_batching_parameters,
)
from workbench.config.model_control import ControlMode, ModelControl, Overrides
from workbench.config.options import ModelConfig, ServerOptions
from workbench.core import conditions
from workbench.core.errors import Code, ServingError
from workbench.models.configs import discover_models, initial_models
from workbench.models.manager import Manager, VersionState
from workbench.models.routing.changes import RoutingChanges
from workbench.models.source import RepositorySource, VersionRegistry
from workbench.observability.request_logger import RequestLogger
from workbench.planes import shadowing
from workbench.planes.response_cache import ResponseCache
from workbench.protocol.v2_models import RepositoryRow
from workbench.runtime.storage import is_remote

log = logging.getLogger(__name__)

# What a promotion's condition looks like, for a request whose condition is none.
CONDITION_HELP = '"if" is a condition, e.g. "agreement >= 0.99 and p99_ms <= 20"'


class ControlPlane:
    """What changes the server: model configs, routing changes and Triton's model control, on one manager."""

    def __init__(
        self,
        manager: Manager,
        options: ServerOptions,
        *,
        request_log: RequestLogger,
        cache: ResponseCache | None = None,
        on_models_changed: Callable[[], None] = lambda: None,
        shadow_records: Callable[[], object] = lambda: None,
        registry: VersionRegistry | None = None,
    ) -> None:
        """``on_models_changed``: called after a model config was applied (a model may have come or gone without
        any version changing state); ``shadow_records``: each shadowed model's comparison with its primary, by model
        (the whole server's, as its statistics show them), which a promotion's condition is checked against;
        ``registry``: where base paths naming a model registry (MLflow's ``models:/``) list their versions."""
        self._manager = manager
        self._shadow_records = shadow_records
        self._models = manager.served
        self._request_log = request_log
        self._cache = cache
        self._on_models_changed = on_models_changed
        self._routing = RoutingChanges(manager, manager.served)
        self._default_batching = options.batching_parameters()
        self._batching: dict[str, BatchingParameters | None] = {}
        self._apply_lock = threading.Lock()
        discover = (lambda: discover_models(options.model_repository)) if options.model_repository else None
        # Which of the repository's models serve, and whether clients may change that (--model_control_mode).
        self.model_control = ModelControl(
            ControlMode.parse(options.model_control_mode), discover, self.apply_models, options.load_model
        )
        poll_wait = options.file_system_poll_wait_seconds
        if self.model_control.mode in (ControlMode.NONE, ControlMode.EXPLICIT) and poll_wait > 0:
            poll_wait = 0  # Triton's none and explicit modes read the repository at start-up and when a load asks
        self.source = RepositorySource(
            manager,
            poll_wait,
            discover=self.model_control.discover if discover is not None else None,
            on_scan=request_log.configure,
            registry=registry,
        )

    # -------------------------------------------------------------------------------------- batching
    def batching_for(self, model: str) -> BatchingParameters | None:
        """``model``'s batching parameters (None: it does not batch), as its config last said."""
        return self._batching.get(model)

    def set_batching(self, name: str, text: str | None) -> None:
        """Batch ``name``'s requests with these parameters from now on (TF Serving's text format; None: back to
        what its config says without a file of its own), written as the model's ``batching_parameters.txt`` so that
        a restart, and every worker at its next config reload, finds them. Its base path must be local."""
        config = next((m for m in self._models.configs() if m.name == name), None)
        if config is None:
            raise ServingError(Code.NOT_FOUND, f"No model {name} is configured")
        if is_remote(config.base_path):
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Model {name} is served from {config.base_path}: put its {BATCHING_FILE_NAME} there",
            )
        path = Path(config.base_path, BATCHING_FILE_NAME)
        if text is None:
            path.unlink(missing_ok=True)
            params = triton_config.batching_parameters(config.base_path, self._default_batching)
        else:
            params = parse_batching_parameters(text, f"the batching parameters for {name}")
            temporary = path.with_name(f".{BATCHING_FILE_NAME}.tmp")
            temporary.write_text(text)
            os.replace(temporary, path)
        with self._apply_lock:
            self._batching[name] = params
        self._on_models_changed()

    def batching_models(self) -> dict[str, bool]:
        """Whether each model configured so far batches (the health view)."""
        return {name: params is not None for name, params in self._batching.items()}

    # -------------------------------------------------------------------------------------- models
    def initial_models(self, options: ServerOptions) -> list[ModelConfig]:
        """The models to serve at start-up (raises on a malformed config, before anything starts)."""
        return self.model_control.select(initial_models(options))

    def name_models(self, models: list[ModelConfig]) -> None:
        """Configure ``models`` without waiting for anything: a request for one of them sent before its first load is
        over waits for it (:meth:`Dataplane.loaded <workbench.planes.dataplane.Dataplane.loaded>`)."""
        self._manager.set_models(models)

    def apply_models(self, models: list[ModelConfig], wait_timeout: float | None = None) -> None:
        """Realise exactly ``models``: load what is new, unload what went, then set their labels.

        Like TF Serving, labels are applied once the versions have finished loading, so a label may point
        at a version that the same config brings in.
        """
        with self._apply_lock:  # the config-file watcher and gRPC's HandleReloadConfigRequest take turns
            # Per-model batching parameters sit beside the model (<base_path>/batching_parameters.txt); a Triton
            # model's config.pbtxt (its dynamic_batching) decides for it otherwise.
            batching = {
                m.name: model_batching_parameters(m.base_path)
                or triton_config.batching_parameters(m.base_path, self._default_batching)
                for m in models
            }
            self._batching.update(batching)
            self._opt_into_cache(models)
            self._manager.set_models(models)
            self._request_log.configure(models)
            self.source.poll_once()
            self._models.wait_until_settled(wait_timeout)
            self._manager.set_labels({m.name: m.labels for m in models})
        self._on_models_changed()

    def reload_config(self, models: list[ModelConfig]) -> None:
        """gRPC's ``HandleReloadConfigRequest``: serve exactly ``models`` from now on."""
        self.apply_models(models)

    def _opt_into_cache(self, models: list[ModelConfig]) -> None:
        """Triton models whose config.pbtxt says ``response_cache { enable: true }`` join the response cache."""
        for model in models:
            if not triton_config.response_cache_enabled(model.base_path):
                continue
            if self._cache is None:
                log.warning("Model %s asks for the response cache, which is off (--response_cache_bytes)", model.name)
            else:
                self._cache.enable(model.name)

    def rescan(self, timeout: float | None = 300.0) -> None:
        """Re-read every model's folder now and wait until the versions it finds have loaded (or failed)."""
        self.source.poll_once()
        self._models.wait_until_settled(timeout)

    def start_polling(self) -> None:
        self.source.start_polling()

    def stop_polling(self) -> None:
        self.source.stop()

    def close(self) -> None:
        """The server stops: what model control made (override folders) goes."""
        self.model_control.close()

    # ------------------------------------------------------------------------------ routing changes
    def promote(
        self,
        name: str,
        version: int,
        timeout: float = 300.0,
        generation: int | None = None,
        *,
        only_if: str | None = None,
    ) -> None:
        """See :meth:`RoutingChanges.promote <workbench.models.routing.changes.RoutingChanges.promote>`; each change
        takes the ``generation`` of the routing the caller saw, and is refused (ABORTED) if it moved on since.

        ``only_if``: a condition on the version's shadow record (``"agreement >= 0.99 and p99_ms <= 20"``,
        :mod:`workbench.core.conditions`); the promotion is refused (FAILED_PRECONDITION, with the record's figures)
        unless the record meets it."""
        if only_if is not None:
            self._check_earned(name, version, only_if)
        self._routing.promote(name, version, timeout, generation)

    def _check_earned(self, name: str, version: int, condition: str) -> None:
        """Refuse a promotion, with the figures, unless ``version``'s shadow record meets ``condition``."""
        if not condition.strip():
            raise ServingError(Code.INVALID_ARGUMENT, CONDITION_HELP)
        records = self._shadow_records()
        record = records.get(name) if isinstance(records, dict) else None
        if not isinstance(record, dict) or record.get("version") != version:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Version {version} of model {name} has no shadow record to check {condition!r} against: shadow it "
                "first (:shadow), and let it see traffic",
            )
        figures = shadowing.figures(record)
        try:
            earned = conditions.check(condition, figures)
        except conditions.ConditionError as exc:
            raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
        if not earned:
            shown = ", ".join(f"{key} {value}" for key, value in figures.items() if value is not None)
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Not promoted: version {version} of model {name} does not meet {condition!r} as its shadow ({shown})",
            )

    def rollback(self, name: str, generation: int | None = None) -> int:
        return self._routing.rollback(name, generation)

    def set_canary(
        self, name: str, version: int, weight: float, timeout: float = 300.0, generation: int | None = None
    ) -> None:
        self._routing.set_canary(name, version, weight, timeout, generation)

    def set_shadow(
        self, name: str, version: int, fraction: float, timeout: float = 300.0, generation: int | None = None
    ) -> None:
        self._routing.set_shadow(name, version, fraction, timeout, generation)

    def load_version(self, name: str, version: int, timeout: float = 300.0, generation: int | None = None) -> None:
        self._routing.load_version(name, version, timeout, generation)

    def unload_version(self, name: str, version: int, generation: int | None = None) -> None:
        """workbench's own unload: tunes which versions serve, so the last serving version is refused."""
        self._routing.unload_version(name, version, generation)

    def remove_version(self, name: str, version: int, generation: int | None = None) -> None:
        """TorchServe's unregister and Triton's unload, whose meaning is "remove it": the last serving version goes
        too, and the model then serves nothing (and keeps the server ready) until a version is loaded again."""
        self._routing.unload_version(name, version, generation, keep_last=False)

    # ----------------------------------------------------------------------- the v2 repository extension
    def repository_load(self, model: str, version: int | None, overrides: Overrides | None = None) -> None:
        """Load (and keep) ``version``; without one, re-read the model's folder and succeed once a version serves.

        Follows the model control mode: refused in Triton's words in none and poll modes; in explicit mode a load
        without a version serves the whole model out of the repository, with Triton's config and file
        ``overrides`` when given."""
        control = self.model_control
        control.refuse_unless_explicit()
        if control.explicit and version is None:
            control.load(model, overrides)
            self._loaded(model)
            return
        if overrides:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "Triton's config and file overrides load a whole model: they need --model_control_mode=explicit "
                "and no version parameter",
            )
        self._known(model)
        if version is not None:  # waits until the version serves
            self.load_version(model, version)
            return
        self.rescan()
        if self._serving(model):
            return
        statuses = self._models.version_status(model)
        reasons = "; ".join(f"version {s.version}: {s.error.message}" for s in statuses if s.error is not None)
        raise ServingError(
            Code.UNAVAILABLE, f"Model {model} has no version that serves" + (f" ({reasons})" if reasons else "")
        )

    def repository_unload(
        self, model: str, version: int | None, how_to_name_it: str, unload_dependents: bool = False
    ) -> None:
        """Remove ``version`` (its last serving version too: Triton's unload removes what it names); in explicit
        mode, without a version, the whole model (and, with ``unload_dependents``, the models that run on it).
        ``how_to_name_it``: how a request names a version, for the error that asks for one."""
        control = self.model_control
        control.refuse_unless_explicit()
        if control.explicit and version is None:
            if not self._models.knows(model):
                raise ServingError(Code.NOT_FOUND, f"failed to unload '{model}': it is not loaded")
            control.unload({model, *(self._models.dependents(model) if unload_dependents else ())})
            return
        self._known(model)
        if version is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Name the version of {model} to unload: {how_to_name_it}. workbench serves every model of its "
                "model config; remove a model from the config to stop serving it",
            )
        self.remove_version(model, version)

    def not_loaded_rows(self) -> list[RepositoryRow]:
        """In explicit mode, the repository's models that do not serve, as rows of the repository index (unloaded
        by request: END, "unloaded"; never loaded: no state)."""
        control = self.model_control
        if not control.explicit:
            return []
        unloaded = set(control.unloaded())
        rows = []
        for name in control.not_loaded(self._models.model_names()):
            state, reason = ("END", "unloaded") if name in unloaded else ("", "")
            rows.append(RepositoryRow(name, None, state, reason))
        return rows

    def _known(self, model: str) -> None:
        if model not in self._models.model_names():
            raise ServingError(
                Code.NOT_FOUND,
                f"Unknown model: {model}. workbench loads the models of its model config or model repository",
            )

    def _serving(self, model: str) -> bool:
        return any(s.state == VersionState.AVAILABLE for s in self._models.version_status(model))

    def _loaded(self, model: str) -> None:
        """After an explicit load: Triton's "failed to load" with each version's reason, unless a version serves."""
        if self._serving(model):  # (NOT_FOUND when the model has no version at all)
            return
        statuses = self._models.version_status(model) if self._models.knows(model) else []
        versions = ",".join(str(s.version) for s in sorted(statuses, key=lambda s: s.version)) or "none found"
        reasons = "; ".join(f"version {s.version}: {s.error.message}" for s in statuses if s.error is not None)
        message = f"failed to load '{model}', versions that are not available: {versions}"
        raise ServingError(Code.UNAVAILABLE, message + (f" ({reasons})" if reasons else ""))
