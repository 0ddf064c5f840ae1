"""The model side of continuous batching for a Hugging Face generator: batched KV caches that rows join and leave.

Sequences decode together in a :class:`RowBatch`: one KV cache for all its rows (``[rows, heads, columns, dim]`` per
layer, a ``DynamicCache`` whose columns grow into spare room: ``growing_kv_cache.py``), **left-padded** so every row's
next token goes in the same column, with the mask of each row's real columns and each row's own position ids. Padding is
masked out and positions count real tokens only, so a row computes what it would alone: a greedy generation batched with
others gives exactly the tokens it gives alone. A causal model's rows leave and join in place (``growing_kv_cache.py``):
a leaving row's slot takes the last row, the columns no row uses any more are dropped on the left, and the rows of a
finished prompt are written after the last. An encoder-decoder's rows leave by indexing the cache and join by
padding both caches to the same width and concatenating them.

A prompt is prefilled apart (a :class:`PrefillGroup`: the prompts admitted together, left-padded to the widest), in
chunks of columns the scheduler sizes to its token budget, then its rows join the decode batch. An encoder-decoder
model (text2text) runs its encoder on the prompts whole, then decodes the same way, its cross-attention cache and
encoder states padded on the right. Models whose decoder positions come from the cache column rather than the row's
tokens (BART and its kin: only T5's relative positions and causal models' ``position_ids`` are per row) keep each
group of rows that started together as a batch of its own (a cohort), decoded one forward per cohort.

Why not ``transformers``' ``ContinuousBatchingManager``: see docs/huggingface.md (per-request seeds, greedy and
sampled rows in one batch, top log-probabilities and encoder-decoder models).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from workbench.core.text_generation import SamplingParameters
from workbench.platforms.generation_requests import TokenDraw
from workbench.platforms.token_sampling import RowSampling, draw_tokens, row_sampling

if TYPE_CHECKING:
    import torch
    from transformers import Cache, PreTrainedModel


class DecodingJob(Protocol):
    """What the engine reads of a request."""

    @property
    def prompt_ids(self) -> list[int]: ...

    @property
    def params(self) -> SamplingParameters: ...

    @property
    def top_logprobs(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class ModelCalls:
    """How this model's forward is called, read once at load."""

    seq2seq: bool
    cache_argument: str  # "cache" (transformers 5) or "past_key_values"
    logits_to_keep: bool  # the forward computes the last column's logits only when asked
    rows_pad_freely: bool  # rows at different lengths may share a batch (positions are per row)
    pad_token: int
    decoder_start: int  # seq2seq: the token the decoder starts from

    @classmethod
    def of(cls, model: PreTrainedModel, seq2seq: bool) -> ModelCalls:
        parameters = inspect.signature(model.forward).parameters
        config = model.config
        pad = getattr(config, "pad_token_id", None)
        if pad is None:
            pad = 0
        if seq2seq:
            start = getattr(config, "decoder_start_token_id", None)
            start = pad if start is None else start
            # T5's decoder positions are relative (query minus key), so left padding leaves them as they were.
            pads_freely = hasattr(config, "relative_attention_num_buckets")
        else:
            start = pad
            pads_freely = "position_ids" in parameters
        return cls(
            seq2seq=seq2seq,
            cache_argument="cache" if "cache" in parameters else "past_key_values",
            logits_to_keep="logits_to_keep" in parameters,
            rows_pad_freely=pads_freely,
            pad_token=int(pad),
            decoder_start=int(start),
        )


@dataclasses.dataclass
class RowBatch:
    """Sequences past their prompt, decoded together."""

    jobs: list[Any]
    sampling: list[RowSampling]
    cache: Cache
    mask: torch.Tensor  # [rows, columns]: 1 where the cache holds a real token of the row
    positions: torch.Tensor  # [rows]: the position id of each row's next token
    tokens: torch.Tensor  # [rows]: each row's last token, the next step's input
    encoder_states: torch.Tensor | None = None  # seq2seq: [rows, encoder columns, hidden]
    encoder_mask: torch.Tensor | None = None  # seq2seq: [rows, encoder columns]


@dataclasses.dataclass
class PrefillGroup:
    """Prompts admitted together, left-padded to the widest, prefilled a chunk of columns at a time."""

    jobs: list[Any]
    sampling: list[RowSampling]
    ids: torch.Tensor  # [rows, width]
    mask: torch.Tensor  # [rows, width]
    positions: torch.Tensor  # [rows, width]
    cache: Cache
    done: int = 0  # columns prefilled so far


class BatchedDecoder:
    """A :class:`~workbench.platforms.generation_scheduler.StepEngine` over a Hugging Face model (one thread)."""

    def __init__(self, model: PreTrainedModel, calls: ModelCalls, device: torch.device) -> None:
        self.model = model
        self.calls = calls
        self.device = device
        self.batches: list[RowBatch] = []
        self.prefilling: PrefillGroup | None = None
        self.widest = 0  # the most rows one decode step ran (tests and stats read it)

    def decoding(self) -> int:
        return sum(len(batch.jobs) for batch in self.batches)

    def prefill_rows(self) -> int:
        return 0 if self.prefilling is None else len(self.prefilling.jobs)

    def begin_prefill(self, jobs: Sequence[DecodingJob]) -> None:
        import torch

        width = max(len(job.prompt_ids) for job in jobs)
        pad = self.calls.pad_token
        if self.calls.seq2seq:  # encoders take their padding on the right, as their tokenizers pad
            rows = [[*job.prompt_ids, *[pad] * (width - len(job.prompt_ids))] for job in jobs]
            real = [[1] * len(job.prompt_ids) + [0] * (width - len(job.prompt_ids)) for job in jobs]
        else:
            rows = [[*[pad] * (width - len(job.prompt_ids)), *job.prompt_ids] for job in jobs]
            real = [[0] * (width - len(job.prompt_ids)) + [1] * len(job.prompt_ids) for job in jobs]
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask = torch.tensor(real, dtype=torch.long, device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        sampling = [
            row_sampling(self.device, job.params.temperature, job.params.top_p, job.params.seed, job.top_logprobs)
            for job in jobs
        ]
        self.prefilling = PrefillGroup(list(jobs), sampling, ids, mask, positions, self._new_cache())

    def _new_cache(self) -> Cache:
        from transformers import DynamicCache, EncoderDecoderCache

        from workbench.platforms.growing_kv_cache import GrowingCache

        if self.calls.seq2seq:  # the cross-attention cache is written once, by the prefill
            return EncoderDecoderCache(GrowingCache(), DynamicCache())
        return GrowingCache()

    def prefill(self, columns: int) -> list[tuple[Any, TokenDraw]]:
        import torch

        with torch.inference_mode():
            return self._prefill(columns)

    def _prefill(self, columns: int) -> list[tuple[Any, TokenDraw]]:
        import torch

        group = self.prefilling
        assert group is not None
        if self.calls.seq2seq:
            batch, logits = self._encode(group)
        else:
            end = min(group.done + columns, group.ids.shape[1])
            arguments: dict[str, Any] = {
                "input_ids": group.ids[:, group.done : end],
                "attention_mask": group.mask[:, :end],
                "position_ids": group.positions[:, group.done : end],
                self.calls.cache_argument: group.cache,
                "use_cache": True,
            }
            if self.calls.logits_to_keep:
                arguments["logits_to_keep"] = 1
            output = self.model(**arguments)
            group.done = end
            if end < group.ids.shape[1]:
                return []
            logits = output.logits[:, -1]
            batch = RowBatch(
                group.jobs,
                group.sampling,
                group.cache,
                group.mask,
                group.positions[:, -1] + 1,
                torch.zeros(len(group.jobs), dtype=torch.long, device=self.device),
            )
        self.prefilling = None
        draws = draw_tokens(logits, batch.sampling)
        batch.tokens = torch.tensor([d.token for d in draws], dtype=torch.long, device=self.device)
        self._join(batch)
        return list(zip(batch.jobs, draws, strict=True))

    def _encode(self, group: PrefillGroup) -> tuple[RowBatch, torch.Tensor]:
        """An encoder-decoder's prefill: the encoder on the whole prompts, then the decoder's first step."""
        import torch

        rows = len(group.jobs)
        encoded = self.model.get_encoder()(input_ids=group.ids, attention_mask=group.mask)
        start = torch.full((rows, 1), self.calls.decoder_start, dtype=torch.long, device=self.device)
        decoder_mask = torch.ones((rows, 1), dtype=torch.long, device=self.device)
        output = self.model(
            encoder_outputs=encoded,
            attention_mask=group.mask,
            decoder_input_ids=start,
            decoder_attention_mask=decoder_mask,
            use_cache=True,
            **{self.calls.cache_argument: group.cache},
        )
        batch = RowBatch(
            group.jobs,
            group.sampling,
            group.cache,
            decoder_mask,
            torch.ones(rows, dtype=torch.long, device=self.device),
            start[:, 0],
            encoder_states=encoded.last_hidden_state,
            encoder_mask=group.mask,
        )
        return batch, output.logits[:, -1]

    def _join(self, batch: RowBatch) -> None:
        if not self.batches or not self.calls.rows_pad_freely:
            self.batches.append(batch)
        elif self.calls.seq2seq:
            self.batches[0] = _concatenate(self.batches[0], batch)
        else:
            self.batches[0] = _append(self.batches[0], batch)

    def decode(self) -> list[tuple[Any, TokenDraw]]:
        import torch

        drawn: list[tuple[Any, TokenDraw]] = []
        with torch.inference_mode():  # a thread's mode: set on the scheduler's, for every step
            for batch in self.batches:
                drawn += self._decode(batch)
        return drawn

    def _decode(self, batch: RowBatch) -> list[tuple[Any, TokenDraw]]:
        import torch

        rows = len(batch.jobs)
        self.widest = max(self.widest, rows)
        mask = torch.cat([batch.mask, torch.ones((rows, 1), dtype=batch.mask.dtype, device=self.device)], dim=1)
        arguments: dict[str, Any] = {self.calls.cache_argument: batch.cache, "use_cache": True}
        if self.calls.seq2seq:
            from transformers.modeling_outputs import BaseModelOutput

            arguments.update(
                encoder_outputs=BaseModelOutput(last_hidden_state=batch.encoder_states),
                attention_mask=batch.encoder_mask,
                decoder_input_ids=batch.tokens[:, None],
                decoder_attention_mask=mask,
            )
        else:
            arguments.update(
                input_ids=batch.tokens[:, None], attention_mask=mask, position_ids=batch.positions[:, None]
            )
            if self.calls.logits_to_keep:
                arguments["logits_to_keep"] = 1
        output = self.model(**arguments)
        batch.mask = mask
        batch.positions = batch.positions + 1
        draws = draw_tokens(output.logits[:, -1], batch.sampling)
        batch.tokens = torch.tensor([d.token for d in draws], dtype=torch.long, device=self.device)
        return list(zip(batch.jobs, draws, strict=True))

    def release(self, jobs: Collection[Any]) -> None:
        import torch

        with torch.inference_mode():  # the caches are inference tensors, moved in place
            self._release(set(jobs))

    def _release(self, gone: set[Any]) -> None:
        kept_batches = []
        for batch in self.batches:
            keep = [i for i, job in enumerate(batch.jobs) if job not in gone]
            if len(keep) == len(batch.jobs):
                kept_batches.append(batch)
            elif keep:
                kept_batches.append(_select(batch, keep) if self.calls.seq2seq else _leave(batch, keep))
        self.batches = kept_batches
        group = self.prefilling
        if group is not None:
            keep = [i for i, job in enumerate(group.jobs) if job not in gone]
            if not keep:
                self.prefilling = None
            elif len(keep) < len(group.jobs):
                self.prefilling = _select_prefill(group, keep)

    def reset(self) -> None:
        self.batches = []
        self.prefilling = None


def _layers(cache: Cache) -> list[tuple[Any, bool]]:
    """Each cache layer, and whether it is a cross-attention layer (columns of the encoder, padded on the right)."""
    from transformers import EncoderDecoderCache

    if isinstance(cache, EncoderDecoderCache):
        return [(layer, False) for layer in cache.self_attention_cache.layers] + [
            (layer, True) for layer in cache.cross_attention_cache.layers
        ]
    return [(layer, False) for layer in cache.layers]  # type: ignore[attr-defined]


def _index_rows(cache: Cache, index: torch.Tensor) -> None:
    for layer, _ in _layers(cache):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)


def _select(batch: RowBatch, keep: list[int]) -> RowBatch:
    """The rows ``keep`` of ``batch``, without the columns none of them uses any more."""
    import torch

    index = torch.tensor(keep, device=batch.mask.device)
    _index_rows(batch.cache, index)
    mask = batch.mask.index_select(0, index)
    first = int(mask.any(dim=0).nonzero()[0])  # the left padding every remaining row has
    encoder_states, encoder_mask = batch.encoder_states, batch.encoder_mask
    last = None
    if encoder_mask is not None and encoder_states is not None:
        encoder_mask = encoder_mask.index_select(0, index)
        last = int(encoder_mask.any(dim=0).nonzero()[-1]) + 1  # the right padding every remaining row has
        encoder_mask = encoder_mask[:, :last]
        encoder_states = encoder_states.index_select(0, index)[:, :last]
    for layer, cross in _layers(batch.cache):
        if getattr(layer, "keys", None) is None or not layer.keys.numel():
            continue
        if cross and last is not None:
            layer.keys, layer.values = layer.keys[:, :, :last], layer.values[:, :, :last]
        elif not cross and first:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    return _rows_of(batch, keep, index, mask[:, first:], encoder_states, encoder_mask)


def _leave(batch: RowBatch, keep: list[int]) -> RowBatch:
    """A causal batch's rows ``keep``, moved in place: each row that leaves has a kept row from the end moved into
    its slot (one row's columns copied, not the whole cache re-indexed), and the columns none of them uses any more
    are dropped from the left."""
    import torch

    kept, rows = set(keep), len(keep)
    holes = [i for i in range(rows) if i not in kept]
    movers = [i for i in range(rows, len(batch.jobs)) if i in kept]
    order = list(range(rows))
    for hole, mover in zip(holes, movers, strict=True):
        order[hole] = mover
    device = batch.mask.device
    into = torch.tensor(holes, dtype=torch.long, device=device)
    source = torch.tensor(movers, dtype=torch.long, device=device)
    layers = [layer for layer, _ in _layers(batch.cache)]
    for layer in layers:
        layer.move_rows(into, source, rows)
    index = torch.tensor(order, device=device)
    mask = batch.mask.index_select(0, index)
    first = int(mask.any(dim=0).nonzero()[0])  # the left padding every remaining row has
    for layer in layers:
        layer.drop_left(first)
    return _rows_of(batch, order, index, mask[:, first:])


def _rows_of(
    batch: RowBatch,
    rows: list[int],
    index: torch.Tensor,
    mask: torch.Tensor,
    encoder_states: torch.Tensor | None = None,
    encoder_mask: torch.Tensor | None = None,
) -> RowBatch:
    """``batch``'s rows ``rows`` (``index``: the same, as a tensor on the batch's device) over its cache, with
    ``mask`` (already taken for those rows) and, for a seq2seq batch, its encoder's states and mask."""
    return RowBatch(
        [batch.jobs[i] for i in rows],
        [batch.sampling[i] for i in rows],
        batch.cache,
        mask,
        batch.positions.index_select(0, index),
        batch.tokens.index_select(0, index),
        encoder_states,
        encoder_mask,
    )


def _append(into: RowBatch, joining: RowBatch) -> RowBatch:
    """A causal batch with ``joining``'s rows written after its last: their cache columns copied once, aligned on
    the right (wider rows widen every row's columns on the left, masked out for the rows already there)."""
    import torch
    from torch.nn import functional

    for (layer, _), (other, _) in zip(_layers(into.cache), _layers(joining.cache), strict=True):
        layer.append_rows(other.keys, other.values)
    width = max(into.mask.shape[1], joining.mask.shape[1])
    masks = [functional.pad(m, (width - m.shape[1], 0)) if m.shape[1] < width else m for m in (into.mask, joining.mask)]
    return RowBatch(
        into.jobs + joining.jobs,
        into.sampling + joining.sampling,
        into.cache,
        torch.cat(masks),
        torch.cat([into.positions, joining.positions]),
        torch.cat([into.tokens, joining.tokens]),
    )


def _select_prefill(group: PrefillGroup, keep: list[int]) -> PrefillGroup:
    import torch

    index = torch.tensor(keep, device=group.ids.device)
    _index_rows(group.cache, index)
    return PrefillGroup(
        [group.jobs[i] for i in keep],
        [group.sampling[i] for i in keep],
        group.ids.index_select(0, index),
        group.mask.index_select(0, index),
        group.positions.index_select(0, index),
        group.cache,
        group.done,
    )


def _concatenate(into: RowBatch, joining: RowBatch) -> RowBatch:
    """The rows of both batches as one: decoder columns padded on the left, encoder columns on the right."""
    import torch
    from torch.nn import functional

    width = max(into.mask.shape[1], joining.mask.shape[1])

    def left(tensor: torch.Tensor, dim_from_end: int) -> torch.Tensor:
        missing = width - tensor.shape[-dim_from_end]
        return tensor if not missing else functional.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0))

    encoder_width = 0
    if into.encoder_mask is not None and joining.encoder_mask is not None:
        encoder_width = max(into.encoder_mask.shape[1], joining.encoder_mask.shape[1])

    def right(tensor: torch.Tensor, dim_from_end: int) -> torch.Tensor:
        missing = encoder_width - tensor.shape[-dim_from_end]
        return tensor if not missing else functional.pad(tensor, (0, 0) * (dim_from_end - 1) + (0, missing))

    for (layer, cross), (other, _) in zip(_layers(into.cache), _layers(joining.cache), strict=True):
        pad = right if cross else left
        layer.keys = torch.cat([pad(layer.keys, 2), pad(other.keys, 2)])
        layer.values = torch.cat([pad(layer.values, 2), pad(other.values, 2)])
    encoder_states = encoder_mask = None
    if into.encoder_states is not None and joining.encoder_states is not None:
        encoder_states = torch.cat([right(into.encoder_states, 2), right(joining.encoder_states, 2)])
    if into.encoder_mask is not None and joining.encoder_mask is not None:
        encoder_mask = torch.cat([right(into.encoder_mask, 1), right(joining.encoder_mask, 1)])
    return RowBatch(
        into.jobs + joining.jobs,
        into.sampling + joining.sampling,
        into.cache,
        torch.cat([left(into.mask, 1), left(joining.mask, 1)]),
        torch.cat([into.positions, joining.positions]),
        torch.cat([into.tokens, joining.tokens]),
        encoder_states,
        encoder_mask,
    )
