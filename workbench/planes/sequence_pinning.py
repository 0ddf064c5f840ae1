"""Stateful models' sequences: each sequence runs on the version it started on, through that version's sequence
batcher (:class:`~workbench.batching.sequence_batcher.SequenceBatcher`), until it ends or the version unloads."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np

from workbench.batching.interest import deadline_exceeded
from workbench.batching.sequence_batcher import SequenceBatcher
from workbench.core import inference
from workbench.core.sequence_contract import SequenceId, SequenceRequest, missing_correlation_id
from workbench.core.servable import Servable
from workbench.core.signatures import Signature
from workbench.planes.calls import ModelSpec, RequestInFlight


class Sequences:
    """A sequence batcher per stateful version, and the version each sequence started on."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._sequence_batchers: dict[tuple[str, int], SequenceBatcher] = {}
        self._pinned: dict[tuple[str, SequenceId], int] = {}

    async def step(
        self,
        call: RequestInFlight,
        signature_name: str,
        inputs: Mapping[str, np.ndarray],
        output_filter: Sequence[str],
        timeout: float | None,
        sequence: SequenceRequest | None,
    ) -> tuple[Signature, dict[str, np.ndarray]]:
        """One request of a sequence of a stateful model, on the version the sequence started on (a promotion or a
        canary since then does not move it), through that version's sequence batcher."""
        if sequence is None:
            raise missing_correlation_id(call.model)
        key = (call.model, sequence.id)
        pinned = self._pinned.get(key)
        if sequence.start:
            self._pinned.pop(key, None)
        elif pinned is not None and pinned != call.version:
            call.switch(ModelSpec(call.model, version=pinned))
        servable = call.servable
        signature = inference.predict_signature(servable, signature_name)
        feed, outputs = inference.prepare_predict(signature, inputs, output_filter)
        batcher = self._sequence_batcher(servable)
        if sequence.start:
            self._pinned[key] = servable.version
        work = asyncio.ensure_future(batcher.run(signature, feed, outputs, sequence))
        call.hold_until_done(work)  # the version stays held until the step ran, even when the caller gave up
        try:
            result = await asyncio.wait_for(asyncio.shield(work), timeout)
        except asyncio.TimeoutError:
            raise deadline_exceeded() from None
        return signature, result

    def _sequence_batcher(self, servable: Servable) -> SequenceBatcher:
        key = (servable.name, servable.version)
        batcher = self._sequence_batchers.get(key)
        if batcher is None or batcher.servable is not servable:
            assert servable.sequence is not None
            model = servable.name

            def released(sequence_id: SequenceId) -> None:
                self._pinned.pop((model, sequence_id), None)

            stateful: Any = servable  # a servable with a sequence implements run_step (StatefulServable)
            batcher = SequenceBatcher(stateful, servable.sequence, self._executor, on_release=released)
            self._sequence_batchers[key] = batcher
        return batcher

    def forget_version(self, model: str, version: int) -> None:
        """``version`` of ``model`` unloaded: its sequences end (from any thread)."""
        batcher = self._sequence_batchers.pop((model, version), None)
        if batcher is not None:
            batcher.close_soon()
