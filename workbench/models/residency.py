"""Which versions hold memory, what each is counted for, who waits for one, and what was loaded and evicted.

The manager's ledger for ``--memory_budget``, ``--load_on_demand``, ``--unload_after_idle`` and ``--pin``: plain
records changed only under the manager's lock (:class:`~workbench.models.manager.Manager` is their one writer),
turned into the :class:`~workbench.models.memory_policy.Tenant` views the policy decides on, and into the
documents that status, the stats stream and Prometheus read. The decisions themselves are
:mod:`workbench.models.memory_policy`'s; the measuring, :class:`LoadMeter`'s.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from workbench.config.memory_budget import Budget, MemoryOptions
from workbench.core.footprint import Footprint, format_bytes
from workbench.core.servable import Servable
from workbench.models.memory_policy import Tenant, charge_of, pinned, total
from workbench.models.records import DiskVersion, ModelRecord, VersionRecord, VersionState
from workbench.runtime.memory import folder_bytes, gpu_bytes, resident_bytes, return_freed_memory

Key = tuple[str, int]
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Measured:
    """What one load added: filled in when the ``with`` block of :meth:`LoadMeter.measure` ends; and what the
    version loaded says it holds (``Servable.memory_held``), which the loader fills in."""

    footprint: Footprint | None = None  # None: nothing could be measured here
    held: Footprint | None = None  # None: the version does not say


class LoadMeter:
    """Measures what each load adds to the process, one load at a time.

    Loads are measured one after the other (a lock): two loads at once would each see the other's growth. So with
    a memory budget, versions load one at a time, which also keeps the process's peak within what is planned.

    What malloc keeps free is handed back to the system on both sides of a load (``malloc_trim``), so the growth is
    what the version holds: a load's scratch (a file read whole, then copied into tensors) stays in malloc's free
    lists otherwise and is charged to it. Seen with PyTorch: a 19 MB network reloaded after an eviction was measured
    at 38-40 MB without this, twice its first load's figure, and evicted its neighbours for memory it did not hold.
    The other way round, a load may reuse free memory malloc cannot hand back (the top of a thread's arena) and read
    low, even 0: the files' size is then the floor of its charge (:func:`~workbench.models.memory_policy.charge_of`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measured]:
        measured = Measured()
        with self._lock:
            return_freed_memory()
            host_before, gpu_before = resident_bytes(), gpu_bytes()
            yield measured
            return_freed_memory()
            host_after, gpu_after = resident_bytes(), gpu_bytes()
        host = max(0, host_after - host_before) if host_before is not None and host_after is not None else 0
        measured.footprint = Footprint(host, max(0, gpu_after - gpu_before))


def memory_held(servable: Servable) -> Footprint | None:
    """What a loaded version says it holds (None: it does not say, or asking failed, which only the log tells: the
    load itself went well, and its measured growth still counts)."""
    try:
        return servable.memory_held()
    except Exception:
        log.exception("%s version %s: memory_held() failed", servable.name, servable.version)
        return None


@dataclasses.dataclass
class VersionMemory:
    """What the ledger knows of one version; kept across its evictions (its size, its counts)."""

    disk: int = -1  # its files' size (-1: not read yet)
    fingerprint: tuple[int, ...] = ()  # of the files whose size ``disk`` is
    measured: Footprint | None = None  # what its last load added (None: never loaded, or not measurable)
    held: Footprint | None = None  # what its last load says it holds (None: never loaded, or it does not say)
    charge: Footprint = Footprint()  # what it holds of the budget now (0 unless loading, serving or unloading)
    loads: int = 0
    evictions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # by reason
    claims: int = 0  # requests waiting for it to serve (it loads for them, and is not evicted under them)
    refused: bool = False  # its last load was refused for lack of memory (tried again when next asked for)
    asked: bool = False  # a request asked for it since it was last planned: a refused version is tried again
    waiting_since: float = 0.0  # when it began waiting for memory (FIFO among the waiting)
    last_used: float = 0.0  # monotonic: when a request last took it (its harness says, while it serves)


class Residency:
    """The ledger (see the module's docstring); every method runs under the manager's lock."""

    def __init__(
        self,
        options: MemoryOptions,
        clock: Callable[[], float] = time.monotonic,
        on_gpu: Callable[[str, str], bool] = lambda path, platform: False,
    ) -> None:
        """``on_gpu(path, platform)``: whether the version at ``path`` will load onto a GPU (the loader knows)."""
        self.options = options
        self.clock = clock
        self._on_gpu = on_gpu
        self.meter = LoadMeter()
        self.versions: dict[Key, VersionMemory] = {}
        # Versions waiting for memory to load (records in START): asked again whenever memory may have freed.
        self.waiting: dict[Key, tuple[ModelRecord, VersionRecord]] = {}
        # What each load under way was measured to add (and says it holds), by its record's id, until it is charged.
        self.measurements: dict[int, Measured] = {}

    @property
    def active(self) -> bool:
        return self.options.active

    @property
    def budget(self) -> Budget:
        return self.options.budget

    def of(self, name: str, version: int) -> VersionMemory:
        key = (name, version)
        entry = self.versions.get(key)
        if entry is None:
            entry = self.versions[key] = VersionMemory()
        return entry

    # ------------------------------------------------------------------------------------------------- pins
    def pinned(self, model: ModelRecord, version: int) -> bool:
        """Never evicted: ``--pin``, the routing's versions (stable, rollback target, canary, shadow, pinned by a
        management load) and the versions a label names."""
        routed = set(model.routing.required()) | set(model.label_map.values()) | set(model.config.labels.values())
        return pinned(model.config.name, version, self.options.pins, routed)

    def needed(self, model: ModelRecord, version: int) -> bool:
        """Loaded whatever the budget says (evicting others if it must): pinned, held by a management change, or
        asked for by a request."""
        return self.pinned(model, version) or version in model.held or self.of(model.config.name, version).claims > 0

    # ------------------------------------------------------------------------------------------- accounting
    def note_files(self, name: str, version: int, disk: DiskVersion) -> None:
        """Read a version's files' size, again whenever they change (their fingerprint does)."""
        entry = self.of(name, version)
        if entry.disk < 0 or entry.fingerprint != disk.fingerprint:
            entry.disk, entry.fingerprint = folder_bytes(disk.path), disk.fingerprint

    def estimate(self, name: str, version: int, path: str, platform: str = "") -> Footprint:
        """What a version will hold once loaded: its last load's charge, else its files' size (on the GPU where it
        will load onto one, asked only while a GPU budget is set and it never loaded)."""
        entry = self.of(name, version)
        if entry.disk < 0:
            entry.disk = folder_bytes(path)
        never = entry.measured is None and entry.held is None
        on_gpu = never and self.budget.gpu is not None and self._on_gpu(path, platform)
        return charge_of(entry.measured, entry.disk, on_gpu, entry.held)

    def charged(self) -> Footprint:
        return total(entry.charge for entry in self.versions.values())

    def tenants(self, models: Mapping[str, ModelRecord]) -> list[Tenant]:
        """Every version holding memory now, as the policy sees it."""
        tenants = []
        for model in models.values():
            for record in model.versions.values():
                if record.state not in (VersionState.LOADING, VersionState.AVAILABLE, VersionState.UNLOADING):
                    continue
                entry = self.of(model.config.name, record.version)
                harness = record.harness
                resident = record.state == VersionState.AVAILABLE and harness is not None
                tenants.append(
                    Tenant(
                        model=model.config.name,
                        version=record.version,
                        charge=entry.charge,
                        last_used=harness.last_used if harness is not None else entry.last_used,
                        pinned=self.pinned(model, record.version) or record.version in model.held,
                        busy=entry.claims > 0 or (harness is not None and harness.busy),
                        resident=resident,
                        leaving=record.state == VersionState.UNLOADING,
                    )
                )
        return tenants

    def reserve(self, name: str, version: int, need: Footprint) -> None:
        """A load starts: its estimate is held until it is measured."""
        entry = self.of(name, version)
        entry.charge = need
        entry.refused = False
        self.waiting.pop((name, version), None)

    def loaded(self, name: str, version: int, measured: Measured | None) -> Footprint:
        """A load ended well: counted, charged what it was measured to take (and at least what it says it holds);
        returns that charge."""
        entry = self.of(name, version)
        if measured is not None:
            if measured.footprint is not None:
                entry.measured = measured.footprint
            entry.held = measured.held
        entry.loads += 1
        entry.last_used = self.clock()
        entry.charge = charge_of(entry.measured, max(entry.disk, 0), held=entry.held)
        return entry.charge

    def released(self, name: str, version: int) -> None:
        """A version stopped holding memory (unloaded, or its load failed or was refused)."""
        entry = self.of(name, version)
        entry.charge = Footprint()
        self.waiting.pop((name, version), None)

    def evicted(self, name: str, version: int, reason: str) -> None:
        entry = self.of(name, version)
        entry.evictions[reason] += 1

    def forget(self, name: str) -> None:
        """A model left the server: its versions' records go (their counts with them)."""
        for key in [k for k in self.versions if k[0] == name]:
            del self.versions[key]
            self.waiting.pop(key, None)

    # ------------------------------------------------------------------------------------------------ views
    def version_view(self, model: ModelRecord, version: int) -> dict[str, Any]:
        """One version's memory, as ``GET /workbench/v1/models`` shows it beside its state."""
        entry = self.versions.get((model.config.name, version), VersionMemory())
        record = model.versions.get(version)
        state = record.state if record is not None else None
        residency = {
            VersionState.AVAILABLE: "resident",
            VersionState.LOADING: "loading",
            VersionState.UNLOADING: "unloading",
            VersionState.START: "waiting_for_memory",
        }.get(state, "evicted" if entry.loads else "not_loaded")  # type: ignore[arg-type]
        if state == VersionState.END and record is not None and record.error is not None:
            residency = "failed"
        harness = record.harness if record is not None else None
        view: dict[str, Any] = {
            "residency": residency,
            "pinned": self.pinned(model, version),
            "charged_bytes": entry.charge.host,
            "charged_gpu_bytes": entry.charge.gpu,
            "measured_bytes": entry.measured.host if entry.measured is not None else None,
            "measured_gpu_bytes": entry.measured.gpu if entry.measured is not None else None,
            "held_bytes": entry.held.host if entry.held is not None else None,
            "held_gpu_bytes": entry.held.gpu if entry.held is not None else None,
            "disk_bytes": entry.disk if entry.disk >= 0 else None,
            "loads": entry.loads,
            "evictions": sum(entry.evictions.values()),
        }
        if harness is not None:
            view["idle_seconds"] = round(max(0.0, self.clock() - harness.last_used), 3)
        return view

    def summary(self, models: Mapping[str, ModelRecord]) -> dict[str, Any]:
        """The whole ledger: the budget, what is charged, and each version's figures (the stats stream and
        Prometheus read it)."""
        charged = self.charged()
        budget = self.budget
        versions: dict[str, dict[str, Any]] = {}
        for (name, version), entry in sorted(self.versions.items()):
            model = models.get(name)
            if model is None:
                continue
            record = model.versions.get(version)
            resident = record is not None and record.state == VersionState.AVAILABLE
            versions.setdefault(name, {})[str(version)] = {
                "resident": resident,
                "bytes": entry.charge.host,
                "gpu_bytes": entry.charge.gpu,
                "loads": entry.loads,
                "evictions": dict(entry.evictions),
            }
        return {
            "budget_bytes": budget.host,
            "budget_gpu_bytes": budget.gpu,
            "budget": budget.describe() if budget.bounded else "unbounded",
            "charged_bytes": charged.host,
            "charged_gpu_bytes": charged.gpu,
            "charged": format_bytes(charged.host),
            "load_on_demand": self.options.load_on_demand,
            "unload_after_idle": self.options.unload_after_idle,
            "waiting": [f"{name}:{version}" for name, version in self.waiting],
            "loads": sum(e.loads for e in self.versions.values()),
            "evictions": sum(sum(e.evictions.values()) for e in self.versions.values()),
            "versions": versions,
        }


def waiting_order(waiting: Iterable[tuple[Key, VersionMemory]]) -> list[Key]:
    """The versions waiting for memory, first come first."""
    return [key for key, entry in sorted(waiting, key=lambda item: item[1].waiting_since)]
