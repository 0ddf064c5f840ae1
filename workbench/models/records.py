"""What the manager keeps of each model and version: plain records, changed only under the manager's lock.

:class:`~workbench.models.manager.Manager` owns them; :mod:`~workbench.models.routes` builds what requests resolve
against from them, :mod:`~workbench.models.composites` reads them for the pipelines waiting on their members, and
:mod:`~workbench.models.views` copies them into plain snapshots.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import threading
import time

from workbench.config.options import ModelConfig
from workbench.core.errors import ServingError
from workbench.core.servable import Servable
from workbench.models.harness import Harness
from workbench.models.routing.policy import CanarySplit, Routing
from workbench.models.routing.routing_file import RoutingStateStore, StoredRouting
from workbench.runtime.storage import redact


class VersionState(enum.IntEnum):
    """ModelVersionStatus.State, with the proto's numbers."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclasses.dataclass(frozen=True)
class DiskVersion:
    """A version folder as the source saw it; the fingerprint changes when its files do."""

    path: str
    fingerprint: tuple[int, ...] = ()
    # What it held, in a few words ("2 files (saved_model.pb, variables/variables.index; 24,191 bytes)"), for the
    # status of a load that fails: a version copied half-way shows what it lacked. Not part of its identity.
    contents: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass
class VersionRecord:
    version: int
    path: str
    fingerprint: tuple[int, ...]
    contents: str = ""  # what its folder held when it was listed for this load (DiskVersion.contents)
    state: VersionState = VersionState.START
    error: ServingError | None = None
    harness: Harness | None = None
    # A composite version (a pipeline) and the models it runs on that were not serving when it loaded: it waits,
    # loaded and ``parked`` (LOADING), while one of them is on its way, else it ends with that error and is
    # retried once they all serve.
    awaiting: frozenset[str] = frozenset()
    parked: Servable | None = None
    since: float = dataclasses.field(default_factory=time.time)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the load of the servable it holds warned of (none while it holds none)."""
        return self.harness.servable.load_warnings if self.harness is not None else ()

    @classmethod
    def of(cls, version: int, disk: DiskVersion) -> VersionRecord:
        """A load of ``version`` as the source listed it."""
        return cls(version=version, path=disk.path, fingerprint=disk.fingerprint, contents=disk.contents)

    def failed(self, error: ServingError) -> ServingError:
        """The load's ``error``, saying what was tried: TF Serving's ``status.error_message`` is all a client sees,
        and a version loaded while it was being copied shows there which files it held (an empty folder has
        nothing to add)."""
        if not self.contents:
            return error
        tried = f"loaded from {redact(self.path)}, which held {self.contents}; retried when any of its files changes"
        return ServingError(error.code, f"{error.message} [{tried}]")


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """A snapshot of one version for status APIs (never holds the servable)."""

    version: int
    state: VersionState
    error: ServingError | None
    since: float
    warnings: tuple[str, ...] = ()  # the loaded servable's load_warnings


@dataclasses.dataclass
class ModelRecord:
    config: ModelConfig
    store: RoutingStateStore
    stored: StoredRouting  # the routing this server routes by, as last read from (or written to) the store
    aspired: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    on_disk: dict[int, DiskVersion] = dataclasses.field(default_factory=dict)
    policy_versions: set[int] = dataclasses.field(default_factory=set)
    versions: dict[int, VersionRecord] = dataclasses.field(default_factory=dict)
    # A serving version's new load, when its files changed (config.reload_changed): it replaces the version's record
    # once it serves, and the old servable is unloaded; one that failed stays here (the old one serves on) until the
    # files change again.
    replacing: dict[int, VersionRecord] = dataclasses.field(default_factory=dict)
    labels: dict[str, int] = dataclasses.field(default_factory=dict)  # the model config file's version_labels
    label_map: dict[str, int] = dataclasses.field(default_factory=dict)  # every label: labels_of(labels, routing)
    # Versions a management change in progress is loading: kept loaded until the change is stored (or failed).
    held: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    split: CanarySplit = dataclasses.field(default_factory=CanarySplit)
    split_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # the split's counters
    # Bumped whenever ``stored`` is replaced, so a read that started before a newer state arrived is dropped.
    routing_epoch: int = 0
    drops_ignored: bool = False  # the routing's drops would leave nothing to serve (warned once)
    source_error: str = ""  # why its repository could not be listed at the last poll (an object store)
    removed: bool = False
    scanned: bool = False  # the source has listed its versions at least once
    # The model config's version labels have not been applied yet (they come once its versions have loaded).
    labels_pending: bool = False
    # Some of those labels name versions that failed to load: set once they serve (Manager.apply_pending_labels).
    labels_waiting: bool = False

    @property
    def routing(self) -> Routing:
        return self.stored.routing

    def available(self) -> set[int]:
        """The versions that serve."""
        return {v for v, r in self.versions.items() if r.state == VersionState.AVAILABLE}
