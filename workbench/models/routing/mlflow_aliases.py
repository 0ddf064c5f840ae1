"""A registered MLflow model's routing, stored in the registry itself: its aliases and tags.

The registry drives the versions, and its aliases are the routing: ``--mlflow_stable_alias`` (``champion``) is the
``stable`` version and ``--mlflow_canary_alias`` (``challenger``) the canary. Moving an alias in MLflow moves every
replica within one poll, since every replica reads the registry; workbench's own changes (promote, canary, rollback)
set the aliases when ``--mlflow_write_aliases`` allows it, and are refused otherwise, so that the registry and the
server never disagree.

What an alias cannot hold lives in the registered model's tags:

- ``workbench.canary_weight``: the canary's share of default traffic. An alias names a version and nothing more, and
  the weight must be what every replica reads and what survives restarts, beside the alias it qualifies: kept
  anywhere else (a ``routing.json`` of this server), a replica reading only the registry would route differently,
  and a person moving the challenger in MLflow would have no way to say how much traffic it gets. Without the tag a
  challenger gets none: it is loaded and answers requests for the ``canary`` label alone.
- ``workbench.routing``: the rest of workbench's routing (the promotion history a rollback returns along, pins,
  drops, the shadow) as JSON, with the generation of the last write by workbench, the stable version it wrote and a
  token naming the write. A stable alias found elsewhere than the tag's stable was moved in MLflow: the version it
  left is added to the history, so a rollback after a hand promotion returns to it.

MLflow has no conditional writes, so a concurrent writer is detected rather than locked out: the fingerprint
(``etag``) of a read covers both aliases and both tags, and a write first compares it with the registry's now
(any change since, by workbench or by hand in MLflow's UI, refuses the write as a :class:`RoutingConflict`, nothing
written), writes the routing tag with a token of its own first and the aliases after it, and reads the registry
back: another writer's token there means two writes interleaved, and this one reports a conflict (the registry then
holds the later writer's routing tag, and every replica routes by what the registry holds).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from workbench.models.routing.policy import Routing
from workbench.models.routing.routing_file import (
    NOTHING_STORED,
    DamagedRoutingState,
    RoutingConflict,
    RoutingStateUnwritable,
    StoredRouting,
)
from workbench.runtime.storage import StorageError

log = logging.getLogger(__name__)

CANARY_WEIGHT_TAG = "workbench.canary_weight"
ROUTING_TAG = "workbench.routing"
# The fields of a Routing that the routing tag holds: the stable and canary versions are the aliases.
_TAGGED = ("history", "pinned", "dropped", "shadow", "shadow_fraction", "emptied")


@dataclasses.dataclass(frozen=True)
class AliasNames:
    """The aliases that are a registered model's stable version and its canary."""

    stable: str = "champion"
    canary: str = "challenger"


class MlflowAliasStore:
    """The routing of registered model ``name``, read from and written to the registry ``client()`` reaches."""

    def __init__(
        self,
        client: Callable[[], Any],
        name: str,
        aliases: AliasNames,
        *,
        writable: bool,
        registry: str,
        registered: Callable[[str], Any] | None = None,
    ) -> None:
        """``client``: an ``MlflowClient`` (made on first use: MLflow is imported only then); ``writable``:
        ``--mlflow_write_aliases``; ``registry``: the (redacted) tracking URI, for messages; ``registered``: how
        the registered model is read (the registry's, which a poll asks once and shares with its version listing),
        else ``client().get_registered_model``."""
        self._client = client
        self._registered_model = registered
        self.name = name
        self.aliases = aliases
        self.writable = writable
        self._location = f"the aliases of MLflow model {name} ({registry})"

    @property
    def location(self) -> str:
        return self._location

    def registry_view(self, routing: Routing) -> dict[str, Any]:
        """What a model's description shows of the registry (the dashboard reads it there): the registered model's URI
        and the version each of the routing's aliases names, as the routing last read them (an alias not set is
        left out)."""
        named = {self.aliases.stable: routing.stable, self.aliases.canary: routing.canary}
        return {
            "uri": f"models:/{self.name}",
            "aliases": {alias: version for alias, version in named.items() if version is not None},
        }

    # ------------------------------------------------------------------------------------------ reading
    def _registered(self) -> tuple[dict[str, str], dict[str, str]] | None:
        """The model's aliases and tags, or None when it is not registered (yet)."""
        from mlflow.exceptions import MlflowException

        try:
            fetch = self._registered_model or self._client().get_registered_model
            model = fetch(self.name)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise StorageError(self.location, str(exc.message)) from None
        except Exception as exc:  # noqa: BLE001 - a tracking server that cannot be reached raises requests' own types
            raise StorageError(self.location, f"{type(exc).__name__}: {exc}") from None
        return {str(k): str(v) for k, v in (model.aliases or {}).items()}, dict(model.tags or {})

    def read(self) -> StoredRouting | None:
        registered = self._registered()
        if registered is None:
            return None
        aliases, tags = registered
        mine = {
            "aliases": {a: aliases.get(a) for a in (self.aliases.stable, self.aliases.canary)},
            "tags": {t: tags.get(t) for t in (CANARY_WEIGHT_TAG, ROUTING_TAG)},
        }
        if not any(mine["aliases"].values()) and not any(mine["tags"].values()):
            return None
        etag = hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).hexdigest()[:16]
        try:
            return StoredRouting(*self._routing(aliases, tags), etag=etag)
        except (ValueError, TypeError) as exc:
            raise DamagedRoutingState(f"{self.location} are not a routing: {exc}") from None

    def _routing(self, aliases: dict[str, str], tags: dict[str, str]) -> tuple[Routing, int]:
        stable = _alias_version(aliases, self.aliases.stable)
        canary = _alias_version(aliases, self.aliases.canary)
        tagged = json.loads(tags[ROUTING_TAG]) if ROUTING_TAG in tags else {}
        if not isinstance(tagged, dict):
            raise TypeError(f"the tag {ROUTING_TAG} must be a JSON object")
        weight = float(tags.get(CANARY_WEIGHT_TAG) or 0.0) if canary is not None else 0.0
        routing = Routing.from_json(
            {
                **{k: tagged[k] for k in _TAGGED if k in tagged},
                "stable": stable,
                "canary": canary,
                "canary_weight": weight,
            }
        )
        written_stable = tagged.get("stable")
        if isinstance(written_stable, int) and written_stable != stable and stable is not None:
            # The stable alias was moved in MLflow: a rollback returns to the version it left.
            history = [v for v in routing.history if v != stable] + [written_stable]
            routing = dataclasses.replace(routing, history=tuple(history))
        generation = tagged.get("generation", 0)
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise TypeError(f"generation must be a non-negative integer, not {generation!r}")
        return routing, generation

    # ------------------------------------------------------------------------------------------ writing
    def check_writable(self) -> None:
        if not self.writable:
            raise RoutingStateUnwritable(
                self.location,
                "the MLflow registry owns this model's routing, and this server does not write it "
                "(--mlflow_write_aliases is off)",
                f"Move the model's aliases in MLflow ({self.aliases.stable!r} is the stable version, "
                f"{self.aliases.canary!r} the canary, with its share of traffic in the tag {CANARY_WEIGHT_TAG}): "
                "every replica follows within a poll. Or start the server with --mlflow_write_aliases to let "
                "workbench move them",
            )

    def write(self, routing: Routing, based_on: StoredRouting) -> StoredRouting:
        self.check_writable()
        try:
            current = self.read() or NOTHING_STORED
        except DamagedRoutingState as exc:
            log.error("Replacing a damaged routing state: %s", exc)
            current = based_on
        if (current.generation, current.etag) != (based_on.generation, based_on.etag):
            raise RoutingConflict(based_on, current)
        token = uuid.uuid4().hex
        tagged = {
            **{k: v for k, v in routing.to_json().items() if k in _TAGGED},
            "generation": based_on.generation + 1,
            "stable": routing.stable,
            "written_by": token,
        }
        client = self._client()
        try:
            client.set_registered_model_tag(self.name, ROUTING_TAG, json.dumps(tagged, sort_keys=True))
            self._set_alias(client, self.aliases.stable, routing.stable)
            self._set_alias(client, self.aliases.canary, routing.canary)
            if routing.canary is not None:
                client.set_registered_model_tag(self.name, CANARY_WEIGHT_TAG, repr(routing.canary_weight))
            else:
                self._delete_tag(client, CANARY_WEIGHT_TAG)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - MlflowException (permissions, a version not in the registry), requests'
            raise RoutingStateUnwritable(self.location, f"{type(exc).__name__}: {exc}") from None
        stored = self.read() or NOTHING_STORED
        if self._writer() != token:
            raise RoutingConflict(based_on, stored)
        return stored

    def _writer(self) -> str:
        registered = self._registered()
        if registered is None or ROUTING_TAG not in registered[1]:
            return ""
        try:
            return str(json.loads(registered[1][ROUTING_TAG]).get("written_by", ""))
        except (ValueError, AttributeError):
            return ""

    def _set_alias(self, client: Any, alias: str, version: int | None) -> None:
        if version is not None:
            client.set_registered_model_alias(self.name, alias, str(version))
            return
        from mlflow.exceptions import MlflowException

        try:
            client.delete_registered_model_alias(self.name, alias)
        except MlflowException as exc:  # no such alias: nothing to delete
            if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise

    def _delete_tag(self, client: Any, tag: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            client.delete_registered_model_tag(self.name, tag)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise


def _alias_version(aliases: dict[str, str], alias: str) -> int | None:
    value = aliases.get(alias)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise ValueError(f"the alias {alias!r} names {value!r}, not a version number")
    return int(value)


class FixedRouting:
    """The routing store of a base path that names one MLflow version (``models:/<name>/<version>``, an alias's,
    a run's model): nothing to route between, so nothing is stored, and a change says where routing is changed."""

    def __init__(self, location: str, reason: str, advice: str) -> None:
        self._location = location
        self._reason = reason
        self._advice = advice

    @property
    def location(self) -> str:
        return self._location

    def read(self) -> StoredRouting | None:
        return None

    def registry_view(self, routing: Routing) -> None:
        return None  # one version, named by its URI: no aliases route it

    def check_writable(self) -> None:
        raise RoutingStateUnwritable(self._location, self._reason, self._advice)

    def write(self, routing: Routing, based_on: StoredRouting) -> StoredRouting:
        self.check_writable()
        return based_on
