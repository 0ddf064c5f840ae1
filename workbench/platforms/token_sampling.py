"""Choosing each sequence's next token from a batch's logits, every row by its own request's parameters.

Rows of one batch may ask for different things: greedy (temperature 0) beside sampled, each its own temperature,
top_p and seed. A seeded row draws from a ``torch.Generator`` of its own, one uniform number per token, so its
tokens are the same whether it ran alone or batched with others (the draw is an inverse-CDF lookup on its own
probabilities). Log-probabilities are the model's own (before temperature and top_p), as OpenAI's and vLLM's are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from workbench.platforms.generation_requests import TokenDraw

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass
class RowSampling:
    """How one row chooses: ``temperature`` 0 is greedy; ``logprobs`` None computes none, n the top n beside."""

    temperature: float
    top_p: float
    generator: torch.Generator
    logprobs: int | None = None


def row_sampling(
    device: torch.device, temperature: float, top_p: float, seed: int | None, logprobs: int | None
) -> RowSampling:
    """A row's sampling, its generator seeded from ``seed`` (reproducible) or from fresh entropy."""
    import torch

    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return RowSampling(temperature, top_p, generator, logprobs)


def draw_tokens(logits: torch.Tensor, rows: Sequence[RowSampling]) -> list[TokenDraw]:
    """One token per row of ``logits`` (``[rows, vocabulary]``)."""
    import torch

    logits = logits.float()
    chosen = logits.argmax(dim=-1)
    sampled = [i for i, row in enumerate(rows) if row.temperature > 0]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        temperatures = torch.tensor([rows[i].temperature for i in sampled], device=logits.device)
        probs = torch.softmax(logits[index] / temperatures[:, None], dim=-1)
        top_ps = [rows[i].top_p for i in sampled]
        if any(p < 1.0 for p in top_ps):
            probs = _nucleus(probs, torch.tensor(top_ps, device=logits.device))
        uniforms = torch.stack([torch.rand((), generator=rows[i].generator, device=logits.device) for i in sampled])
        cdf = probs.cumsum(dim=-1)
        picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None]).squeeze(-1)
        picks = picks.clamp(max=probs.shape[-1] - 1)
        chosen = chosen.index_copy(0, index, picks)
    tokens: list[int] = chosen.tolist()
    wanting = [i for i, row in enumerate(rows) if row.logprobs is not None]
    if not wanting:
        return [TokenDraw(token) for token in tokens]
    draws = [TokenDraw(token) for token in tokens]
    index = torch.tensor(wanting, device=logits.device)
    logprobs = torch.log_softmax(logits[index], dim=-1)
    chosen_logprobs = logprobs.gather(1, chosen[index][:, None]).squeeze(-1).tolist()
    most = max(rows[i].logprobs or 0 for i in wanting)
    top_values, top_ids = logprobs.topk(most, dim=-1) if most else (None, None)
    for k, i in enumerate(wanting):
        count = rows[i].logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if count and top_values is not None and top_ids is not None:
            top = tuple(zip(top_ids[k, :count].tolist(), top_values[k, :count].tolist(), strict=True))
        draws[i] = TokenDraw(tokens[i], chosen_logprobs[k], top)
    return draws


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``probs`` with each row kept to its smallest set of most likely tokens whose mass reaches its top_p."""
    import torch

    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # the mass of the more likely tokens
    keep_sorted = before < top_p[:, None]
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep
