"""huggingface_tracing: a trace is kept only where it answers as the eager module on the other inputs it is checked
on; a module whose forward branches in Python on its inputs, or that cannot be traced, stays eager with the reason."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from transformers.utils import ModelOutput

from workbench.platforms import huggingface_tracing as tracing


def tokenize(texts: Sequence[str]) -> dict[str, torch.Tensor]:
    """Word counts as tokens: ids 5 per word, padded with 0, and the attention mask."""
    width = max(len(t.split()) for t in texts)
    ids = torch.zeros((len(texts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, text in enumerate(texts):
        ids[row, : len(text.split())] = 5
        mask[row, : len(text.split())] = 1
    return {"input_ids": ids, "attention_mask": mask, "offsets": [0] * len(texts)}


def model_inputs(encoded: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in encoded.items() if isinstance(v, torch.Tensor)}


class Pooled(torch.nn.Module):
    """Mean of the embedded tokens under the mask: shape-generic, so its trace answers as it does."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        weights = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * weights).sum(1) / weights.sum(1)
        return ModelOutput(pooled=pooled, hidden=self.embed(input_ids))


class SkipsTheMaskWithoutPadding(Pooled):
    """Skips the mask when no row is padded, as transformers' attention does: a trace taken with padding keeps the
    mask, and a trace taken without it would drop it."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        if bool(attention_mask.all()):
            return ModelOutput(pooled=self.embed(input_ids).mean(1) + 1, hidden=self.embed(input_ids))
        return super().forward(input_ids, attention_mask)


class AnswersATuple(Pooled):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return (self.embed(input_ids),)


def test_a_shape_generic_forward_is_traced_and_answers_as_the_module():
    module = Pooled().eval()
    traced, outcome = tracing.trace(module, tokenize, model_inputs)
    assert outcome == "traced" and traced is not None
    assert traced.names == ("input_ids", "attention_mask")
    for texts in (["a b c d e f g h i j"], ["a", "a b c", "a b"]):
        inputs = model_inputs(tokenize(texts))
        got, want = traced(inputs), module(**inputs)
        assert type(got) is ModelOutput and list(got) == ["pooled", "hidden"]
        torch.testing.assert_close(got["pooled"], want["pooled"])
        torch.testing.assert_close(got[1], want["hidden"])  # indexable as transformers' outputs are
    assert traced.takes({"input_ids": 1, "attention_mask": 2})
    assert not traced.takes({"input_ids": 1})
    assert not traced.takes({"input_ids": 1, "attention_mask": 2, "token_type_ids": 3})


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (SkipsTheMaskWithoutPadding(), "the trace answered differently on a batch of 1: pooled by up to 1"),
        (AnswersATuple(), "its forward answers a tuple, not a model output"),
    ],
)
def test_a_forward_the_trace_cannot_follow_stays_eager_with_the_reason(module, reason):
    traced, outcome = tracing.trace(module.eval(), tokenize, model_inputs)
    assert traced is None
    assert outcome == reason


def test_a_forward_that_fails_to_trace_stays_eager():
    class TakesAString(Pooled):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
            return ModelOutput(name=str(input_ids.shape[0]))  # strings have no trace

    traced, outcome = tracing.trace(TakesAString().eval(), tokenize, model_inputs)
    assert traced is None
    assert outcome.startswith("TorchScript cannot trace it (")
