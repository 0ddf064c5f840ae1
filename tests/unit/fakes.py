"""Fakes for the unit tier: servables and a loader that run in the test's process, with no framework and no sockets.

``FakeServable`` answers ``y = x * factor + version`` (so an answer says which version ran it), records every call
(the rows of each batch, the thread), may take ``delay`` seconds, and may be told to fail. ``FakeLoader`` is what a
:class:`~workbench.models.manager.Manager` loads with: it makes a ``FakeServable`` per version folder, and a test
may make a version fail to load, hold its load until the test lets it go, or hold memory once loaded.
``FakeRepository`` puts them together as a server does: version folders, the real repository source, a manager on
the fake loader.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from workbench.config.options import ModelConfig
from workbench.config.version_policy import VersionPolicy
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.core.signatures import PREDICT_METHOD, Signature, TensorSpec
from workbench.models.manager import Manager
from workbench.models.routing.changes import RoutingChanges
from workbench.models.source import RepositorySource

X = TensorSpec(alias="x", name="x", dtype=np.dtype(np.float32), shape=(-1, 1))
Y = TensorSpec(alias="y", name="y", dtype=np.dtype(np.float32), shape=(-1, 1))


def fake_signature(batchable: bool = True) -> Signature:
    """``serving_default``: ``x`` float32 [-1, 1] in, ``y`` float32 [-1, 1] out."""
    return Signature("serving_default", PREDICT_METHOD, {"x": X}, {"y": Y}, batchable=batchable)


class FakeServable(Servable):
    """A model version answering ``y = x * factor + version``; records its calls and whether it was closed."""

    platform = "fake"

    def __init__(
        self,
        name: str = "m",
        version: int = 1,
        path: str = "",
        *,
        factor: float = 1.0,
        delay: float = 0.0,
        batchable: bool = True,
    ) -> None:
        self.name, self.version, self.path = name, version, path
        self.signatures = {"serving_default": fake_signature(batchable)}
        self.factor, self.delay = factor, delay
        self.fail_with: ServingError | None = None  # set: every run raises it
        self.batches: list[int] = []  # the rows of each call, in the order they started
        self.threads: list[str] = []
        self.closed = False
        self.held: mmap.mmap | None = None  # memory it holds, as a model holds its weights (FakeLoader.holding)
        self._lock = threading.Lock()

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        x = np.asarray(inputs["x"], np.float32)
        with self._lock:
            self.batches.append(len(x))
            self.threads.append(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        answer = {"y": x * self.factor + self.version}
        return {name: answer[name] for name in (outputs or answer)}

    def hold(self, size: int) -> None:
        """Hold ``size`` bytes of memory of its own: pages mapped for it and written, so resident. Not from malloc,
        whose free lists may already hold resident pages a load would reuse without the process growing."""
        self.held = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            self.held[offset] = 1

    def close(self) -> None:
        self.closed = True
        if self.held is not None:
            self.held.close()


class FakeLoader:
    """Loads a ``FakeServable`` for each version folder it is asked for; records loads, may fail or hold one."""

    def __init__(self, **servable_options: float | bool) -> None:
        self.options = servable_options
        self.loaded: list[tuple[str, int]] = []  # in the order the loads finished
        self.servables: dict[tuple[str, int], FakeServable] = {}
        self.failing: dict[tuple[str, int], str] = {}  # (model, version) → the load error's message
        self.holding: dict[tuple[str, int], int] = {}  # (model, version) → bytes its servable holds once loaded
        self._gates: dict[tuple[str, int], threading.Event] = {}
        self._lock = threading.Lock()

    def fail(self, model: str, version: int, message: str = "the fake loader was told to fail") -> None:
        self.failing[(model, version)] = message

    def hold(self, model: str, version: int) -> threading.Event:
        """Hold the load of ``model`` ``version`` until the returned event is set."""
        gate = self._gates[(model, version)] = threading.Event()
        return gate

    def __call__(self, name: str, version: int, path: str, platform: str = "") -> Servable:
        gate = self._gates.get((name, version))
        if gate is not None and not gate.wait(timeout=30):
            raise ServingError(Code.DEADLINE_EXCEEDED, f"the test never let {name} version {version} load")
        if (name, version) in self.failing:
            raise ServingError(Code.INVALID_ARGUMENT, self.failing[(name, version)])
        servable = FakeServable(name, version, path, **self.options)  # type: ignore[arg-type]
        if (name, version) in self.holding:
            servable.hold(self.holding[(name, version)])
        with self._lock:
            self.loaded.append((name, version))
            self.servables[(name, version)] = servable
        return servable


def version_folders(base: Path, model: str, *versions: int) -> Path:
    """Make empty version folders ``base/model/<v>`` (what a fake loader loads) and return the model's folder."""
    for version in versions:
        (base / model / str(version)).mkdir(parents=True, exist_ok=True)
    return base / model


class FakeRepository:
    """Model folders under ``root``, served by a :class:`Manager` on a :class:`FakeLoader` and listed by the real
    :class:`RepositorySource`, as a server does: ``configure`` a model, ``serve`` it (configure, scan, wait for
    its loads, apply its labels: the server's ``apply_models``), ``hold`` a version's load. Held loads are let go by
    ``stop`` whatever the test did."""

    LATEST = VersionPolicy()  # TF Serving's default policy: latest(1)
    WAIT = 5.0  # seconds a load may take before a test fails (they take milliseconds)

    def __init__(self, root: Path, **manager_options: bool) -> None:
        self.root = root
        self.loader = FakeLoader()
        self.manager = Manager(self.loader, load_threads=2, **manager_options)  # type: ignore[arg-type]
        self.source = RepositorySource(self.manager, poll_wait_seconds=0)
        # What the control plane makes routing changes with.
        self.routing_changes = RoutingChanges(self.manager, self.manager.served)
        self.configs: dict[str, ModelConfig] = {}
        self.gates: list[threading.Event] = []

    def configure(
        self, name: str, *versions: int, policy: VersionPolicy = LATEST, labels: Mapping[str, int] | None = None
    ) -> None:
        """Make ``name``'s version folders and configure it beside the others; nothing is listed yet."""
        base = version_folders(self.root, name, *versions)
        base.mkdir(parents=True, exist_ok=True)
        self.configs[name] = ModelConfig(name=name, base_path=str(base), policy=policy, labels=dict(labels or {}))
        self.manager.set_models(self.configs.values())

    def serve(
        self, name: str, *versions: int, policy: VersionPolicy = LATEST, labels: Mapping[str, int] | None = None
    ) -> None:
        self.configure(name, *versions, policy=policy, labels=labels)
        self.rescan()
        self.manager.set_labels({name: self.configs[name].labels})

    def rescan(self) -> None:
        self.source.poll_once()
        assert self.manager.served.wait_until_settled(self.WAIT), "the manager did not settle"

    def hold(self, name: str, version: int) -> threading.Event:
        gate = self.loader.hold(name, version)
        self.gates.append(gate)
        return gate

    def servable(self, name: str, version: int) -> FakeServable:
        return self.loader.servables[(name, version)]

    def stop(self) -> None:
        for gate in self.gates:
            gate.set()
        self.manager.stop()
