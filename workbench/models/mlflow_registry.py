"""MLflow as a model source: a registered model's versions are the model's versions, its aliases its routing.

The repository source (:mod:`workbench.models.source`) polls every model; for a base path naming MLflow
(:mod:`workbench.runtime.mlflow_uris`) it asks :meth:`MlflowRegistry.versions` instead of listing a folder, and hands
the manager the aspired versions the model's version policy picks, as for folders:

- ``models:/<name>``: every READY version of the registered model, by its registry number; the routing is the
  model's aliases (:class:`~workbench.models.routing.mlflow_aliases.MlflowAliasStore`), read at every poll, so
  moving an alias in MLflow moves the server within one poll;
- ``models:/<name>/<version>``: that version; ``models:/<name>@<alias>``: the version the alias points at, by its
  number (when the alias moves, the new version loads and the old one goes once it serves);
- ``models:/m-<model_id>`` (MLflow 3's logged models), ``runs:/<run_id>/<path>`` and ``mlflow-artifacts:/...``: one
  logged model, version 1.

A version is listed as its registry URI (``models:/<name>/<version>``); the server's loader downloads it when it loads
(:class:`~workbench.runtime.storage.VersionCache`: into a hidden folder, renamed into ``<slot>/<model>/<version>``
when complete, so nothing half downloaded is ever loaded) and serves the copy by the platform its files name
(an MLflow model folder's ``MLmodel``). A download that fails fails that version's load alone: what serves keeps
serving, the error shows in the version's status, and the version is retried once it changes in the registry (its
fingerprint is its ``last_updated_timestamp``: a tag or description set on it retries it). A registry that cannot be
reached changes nothing: the model keeps its versions, and the next poll asks again.

A poll asks the registry once about each registered model (:meth:`MlflowRegistry.scan`): its versions (one search)
and the registered model itself (its aliases and tags, one get: MLflow has no request answering both), and every
part of that poll shares the answers: the version listing, the alias store's routing read, and every other model of
the server that names the same registered model (``models:/<name>@<alias>``, ``models:/<name>/<version>``). Reads
outside a poll (a management change's compare-and-write) always ask afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from typing import Any

from workbench.config.options import ServerOptions
from workbench.models.records import DiskVersion
from workbench.models.routing.mlflow_aliases import AliasNames, FixedRouting, MlflowAliasStore
from workbench.models.routing.routing_file import RoutingStateStore, routing_store_for
from workbench.runtime import mlflow_uris
from workbench.runtime.mlflow_uris import MlflowSource, is_mlflow_uri
from workbench.runtime.storage import StorageError, redact

DEFAULT_ALIASES = AliasNames()
_PAGE = 1000  # model versions asked for at a time


_UNASKED: Any = object()  # a part of a registered model this poll has not asked for yet


@dataclasses.dataclass
class _Polled:
    """What one poll asked the registry of one registered model: its versions (``search_model_versions``) and the
    registered model (``get_registered_model``, or the MlflowException it raised), each asked at most once."""

    versions: Any = _UNASKED
    registered: Any = _UNASKED


class MlflowRegistry:
    """The MLflow tracking server (and its model registry) that this server's MLflow base paths name."""

    def __init__(
        self, tracking_uri: str = "", aliases: AliasNames = DEFAULT_ALIASES, write_aliases: bool = False
    ) -> None:
        """``tracking_uri``: "" is MLflow's own choice (``MLFLOW_TRACKING_URI``, else its default)."""
        self.tracking_uri = tracking_uri
        self.aliases = aliases
        self.write_aliases = write_aliases
        self._client: Any = None
        self._lock = threading.Lock()
        self._poll = threading.local()  # the answers of the poll running on this thread (see scan())

    @classmethod
    def of(cls, options: ServerOptions) -> MlflowRegistry:
        aliases = AliasNames(options.mlflow_stable_alias, options.mlflow_canary_alias)
        return cls(options.mlflow_tracking_uri, aliases, options.mlflow_write_aliases)

    @property
    def location(self) -> str:
        """The tracking server, for messages (credentials redacted); MLflow itself is not imported to say it."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        return redact(uri) if uri else "MLflow's default tracking store"

    def client(self) -> Any:
        """The ``MlflowClient``, made on first use (MLflow is imported then)."""
        with self._lock:
            if self._client is None:
                self._client = mlflow_uris.client(self.tracking_uri)
            return self._client

    # ---------------------------------------------------------------------------------------------- polls
    @contextlib.contextmanager
    def scan(self) -> Iterator[None]:
        """One poll of the source (on this thread): each registered model is asked about once within it, and its
        answers are shared by every model and routing read of the poll."""
        self._poll.models = {}
        try:
            yield
        finally:
            self._poll.models = None

    def _polled(self, name: str) -> _Polled | None:
        """What this thread's poll asked of ``name`` so far; None outside a poll (ask afresh)."""
        models: dict[str, _Polled] | None = getattr(self._poll, "models", None)
        return None if models is None else models.setdefault(name, _Polled())

    def model_versions(self, name: str) -> list[Any]:
        """Every version of registered model ``name`` (the MLflow ``ModelVersion``s), once per poll."""
        polled = self._polled(name)
        if polled is not None and polled.versions is not _UNASKED:
            return list(polled.versions)
        client = self.client()
        found: list[Any] = []
        token = None
        while True:
            page = client.search_model_versions(_name_filter(name), max_results=_PAGE, page_token=token)
            found += list(page)
            token = page.token
            if not token:
                break
        if polled is not None:
            polled.versions = found
        return found

    def registered_model(self, name: str) -> Any:
        """The registered model ``name`` (its aliases and tags), once per poll; raises as ``get_registered_model``
        does (RESOURCE_DOES_NOT_EXIST for a model not registered yet), and raises it again within the poll."""
        polled = self._polled(name)
        if polled is not None and polled.registered is not _UNASKED:
            if isinstance(polled.registered, BaseException):
                raise polled.registered
            return polled.registered
        from mlflow.exceptions import MlflowException

        try:
            model = self.client().get_registered_model(name)
        except MlflowException as exc:
            if polled is not None:
                polled.registered = exc
            raise
        if polled is not None:
            polled.registered = model
        return model

    # ------------------------------------------------------------------------------------------- versions
    def handles(self, base_path: str) -> bool:
        return is_mlflow_uri(base_path)

    def versions(self, base_path: str) -> dict[int, DiskVersion]:
        """The versions ``base_path`` names now; raises StorageError when the registry cannot be asked."""
        source = mlflow_uris.parse(base_path)
        if not source.name:  # a run's model or an artifact URI: one version
            return {1: DiskVersion(path=source.uri, fingerprint=(1,), contents=f"the MLflow model {source.uri}")}
        try:
            return self._registry_versions(source)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - MlflowException, and requests' own types for a server not reached
            raise StorageError(f"{base_path} at {self.location}", _reason(exc)) from None

    def _registry_versions(self, source: MlflowSource) -> dict[int, DiskVersion]:
        from mlflow.exceptions import MlflowException

        client = self.client()
        shared = None if source.registered else self._shared_version(source)
        if source.registered:
            found = self.model_versions(source.name)
        elif shared is not None:
            found = shared
        else:
            try:
                if source.alias:
                    found = [client.get_model_version_by_alias(source.name, source.alias)]
                else:
                    found = [client.get_model_version(source.name, str(source.version))]
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                if source.alias:  # an alias deleted by mistake must not take the model down: keep what serves
                    raise StorageError(
                        f"{source.uri} at {self.location}", f"the alias {source.alias!r} names no version"
                    ) from None
                return {}
        versions = {}
        for found_version in found:
            if found_version.status != "READY":  # still being registered (or failed to be): not there yet
                continue
            number = int(found_version.version)
            versions[number] = DiskVersion(
                path=source.version_uri(number),
                fingerprint=(number, int(found_version.last_updated_timestamp or 0)),
                contents=f"MLflow model {source.name} version {number} ({found_version.source})",
            )
        return versions

    def _shared_version(self, source: MlflowSource) -> list[Any] | None:
        """Within a poll, the version ``models:/<name>/<version>`` or ``models:/<name>@<alias>`` names, out of the
        registered model's versions and aliases that the poll asks once and shares (with ``models:/<name>`` and its
        routing, where the server serves that too): ``[version]``, or ``[]`` for none. None outside a poll."""
        if self._polled(source.name) is None:
            return None
        from mlflow.exceptions import MlflowException

        number: int | None = source.version
        if source.alias:
            try:
                aliases = dict(self.registered_model(source.name).aliases or {})
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                return []  # not registered (yet): nothing to serve
            named = aliases.get(source.alias)
            if named is None:  # an alias deleted by mistake must not take the model down: keep what serves
                raise StorageError(f"{source.uri} at {self.location}", f"the alias {source.alias!r} names no version")
            number = int(named)
        return [v for v in self.model_versions(source.name) if int(v.version) == number]

    # -------------------------------------------------------------------------------------------- routing
    def routing_store(self, base_path: str) -> RoutingStateStore:
        """The routing store of ``base_path``: a registered model's aliases, else none (one version, nothing to
        route); a plain path's or store's ``routing.json`` where it names no MLflow."""
        if not is_mlflow_uri(base_path):
            return routing_store_for(base_path)
        try:
            source = mlflow_uris.parse(base_path)
        except ValueError:
            source = MlflowSource(base_path)
        if source.registered:
            return MlflowAliasStore(
                self.client,
                source.name,
                self.aliases,
                writable=self.write_aliases,
                registry=self.location,
                registered=self.registered_model,
            )
        if source.alias:
            advice = (
                f"Move the alias in MLflow: this model follows it, or serve models:/{source.name} to route between "
                "its versions"
            )
        else:
            advice = "Serve a registered model (models:/NAME) to route between its versions"
        return FixedRouting(f"{base_path} at {self.location}", "it names one MLflow model version", advice)


def _name_filter(name: str) -> str:
    """MLflow's search filter for the versions of ``name`` (quoted with whichever quote it does not hold)."""
    return f"name = '{name}'" if "'" not in name else f'name = "{name}"'


def _reason(exc: Exception) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return redact(f"{type(exc).__name__}: {message}")
