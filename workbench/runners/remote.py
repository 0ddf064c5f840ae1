"""What a frontend holds of the versions its model runners serve, and how its requests reach them.

The frontend's manager loads versions as it always does, through :class:`RunnerLoader`: the runners load the model
and the manager gets a :class:`RunnerServable`, which has the version's signatures and metadata and no weights. So
versions, labels, canaries, availability-preserving swaps and routing stay the manager's, in every frontend alike.
The data plane runs requests through :class:`RunnerDispatch`, its batcher here: a runner's servable goes to a runner
(:class:`RunnerPool` picks the least busy), anything the frontend loaded itself to the local batcher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.batching.interest import CURRENT_INTEREST, Interest
from workbench.batching.scheduler import BatchRecord, BatchScheduler
from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError
from workbench.core.footprint import Footprint
from workbench.core.servable import Loader, Servable
from workbench.core.signatures import Signature
from workbench.observability import tracing
from workbench.runners.link import RunnerLink
from workbench.runners.runner import LOCAL, Key, socket_path


class RunnerPool:
    """This frontend's links to the ``count`` runners of ``run_dir``; every version is held by each of them."""

    def __init__(self, run_dir: str | Path, count: int, on_batch: Callable[[BatchRecord], None]) -> None:
        self.links = [RunnerLink(socket_path(run_dir, index), index, on_batch) for index in range(count)]
        self._loop: asyncio.AbstractEventLoop | None = None

    async def connect(self) -> None:
        self._loop = asyncio.get_running_loop()
        await asyncio.gather(*(link.connect() for link in self.links))

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links))

    def load(self, key: Key, platform: str) -> Any:
        """Load ``key`` on every runner (from a load thread): its description, or LOCAL."""
        answers = [link.load(key, platform) for link in self.links]
        first = answers[0]
        if first == LOCAL:
            return first
        # Each runner holds a copy: a memory budget counts them all (where every runner says what its copy holds).
        held = [answer.get("memory_held") for answer in answers]
        total = sum(held, Footprint()) if all(h is not None for h in held) else None
        return {**first, "memory_held": total}

    def unload(self, key: Key) -> None:
        for link in self.links:
            link.unload(key)

    def link_for(self) -> RunnerLink:
        """The runner a request goes to: a ready one with the fewest requests in flight."""
        links = self.links
        if len(links) == 1:
            return links[0]
        ready = [link for link in links if link.ready] or links
        return min(ready, key=lambda link: link.outstanding)

    def outstanding_rows(self) -> dict[tuple[str, int], int]:
        rows: dict[tuple[str, int], int] = {}
        for link in self.links:
            for key, count in link.outstanding_rows().items():
                rows[key] = rows.get(key, 0) + count
        return rows

    def run_sync(self, key: Key, signature: Signature, feed: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Any:
        """A request from a thread other than the loop's (warmup of a composite, MultiInference)."""
        assert self._loop is not None
        link = self.link_for()
        call = link.infer(key, signature.name, feed, outputs, None, None)
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ServingError(Code.CANCELLED, "Cancelled") from None


class RunnerServable(Servable):
    """A version a runner serves, as the frontend's manager holds it: its signatures and metadata, no weights."""

    def __init__(self, pool: RunnerPool, key: Key, description: Mapping[str, Any]) -> None:
        self.pool = pool
        self.key = key
        self.name, self.version, self.path = key
        self.platform = description["platform"]
        self.signatures = description["signatures"]
        self.model_config = description["model_config"]
        self.load_warnings = tuple(description.get("load_warnings", ()))
        self._signature_defs: bytes | None = description["signature_defs"]
        self._memory_held: Footprint | None = description.get("memory_held")
        self._closed = False

    @property
    def signature_defs(self) -> Mapping[str, Any] | None:
        """A SavedModel's own SignatureDefs (None for other platforms), parsed when metadata first asks."""
        if self._signature_defs is None:
            return None
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import get_model_metadata_pb2

        definitions = get_model_metadata_pb2.SignatureDefMap()
        definitions.ParseFromString(self._signature_defs)
        return definitions.signature_def

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        result: dict[str, np.ndarray] = self.pool.run_sync(self.key, signature, inputs, outputs)
        return result

    def memory_held(self) -> Footprint | None:
        """What the runners' copies of the version say they hold, all together."""
        return self._memory_held

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.unload(self.key)


class RunnerLoader:
    """The manager's loader in a frontend: a version loads in the runners; one they cannot serve for the frontends
    (state between requests, streams, code that calls back into the server) loads here with ``local``."""

    def __init__(self, pool: RunnerPool, local: Loader) -> None:
        self.pool, self.local = pool, local

    def __call__(self, name: str, version: int, path: str, platform: str = "") -> Servable:
        key = (name, version, path)
        description = self.pool.load(key, platform)
        if description == LOCAL:
            return self.local(name, version, path, platform)
        return RunnerServable(self.pool, key, description)


class RunnerDispatch:
    """The data plane's batcher in a frontend with runners: each request to the batcher that serves its version."""

    def __init__(
        self,
        local: BatchScheduler,
        pool: RunnerPool,
        batching_for: Callable[[str], BatchingParameters | None],
    ) -> None:
        self.local, self.pool = local, pool
        self._batching_for = batching_for

    async def run(
        self,
        servable: Servable,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        interest: Interest | None = None,
        one_client: bool = False,
        requests: int = 1,
    ) -> dict[str, np.ndarray]:
        if not isinstance(servable, RunnerServable):
            return await self.local.run(servable, signature, feed, outputs, interest, one_client, requests)
        if interest is None:
            interest = CURRENT_INTEREST.get()
        link = self.pool.link_for()
        params = self._batching_for(servable.name)
        traced = tracing.active is not None and interest is not None and tracing.active.recording(interest.trace)
        started = time.perf_counter() if traced else 0.0
        records: list[Any] | None = [] if traced else None  # the runner's queue, batch and model run, as it saw them
        try:
            return await link.infer(servable.key, signature.name, feed, outputs, interest, params, records)
        finally:
            # The runner (another process) queued, batched and ran it: a span here, with what it recorded under it.
            if traced and tracing.active is not None and interest is not None:
                tracing.active.ran_remotely(interest.trace, f"runner-{link.index}", started, records or ())

    def run_now(
        self,
        servable: Servable,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        one_client: bool = False,
    ) -> dict[str, np.ndarray] | None:
        """A version this process serves itself may answer at once (:meth:`BatchScheduler.run_now`); a runner's never
        does: its answer comes from another process."""
        if isinstance(servable, RunnerServable):
            return None
        return self.local.run_now(servable, signature, feed, outputs, one_client)

    def largest_batch(self, servable: Servable) -> int:
        """A runner's version takes no group (0): the runner merges the requests it is sent itself, knowing which
        of its models must see each request on its own; a version served here batches as the local batcher does."""
        if not isinstance(servable, RunnerServable):
            return self.local.largest_batch(servable)
        return 0

    def queue_depths(self) -> list[tuple[str, int, int]]:
        """Rows waiting here and in flight to the runners, per model version."""
        depths = {(model, version): rows for model, version, rows in self.local.queue_depths()}
        for key, rows in self.pool.outstanding_rows().items():
            depths[key] = depths.get(key, 0) + rows
        return [(model, version, rows) for (model, version), rows in depths.items()]
