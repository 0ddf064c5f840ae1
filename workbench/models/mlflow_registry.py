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
"""

from __future__ import annotations

import os
import threading
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
        if source.registered:
            found = []
            token = None
            while True:
                page = client.search_model_versions(_name_filter(source.name), max_results=_PAGE, page_token=token)
                found += list(page)
                token = page.token
                if not token:
                    break
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
                self.client, source.name, self.aliases, writable=self.write_aliases, registry=self.location
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
