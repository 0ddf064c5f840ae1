"""The KV cache whose columns grow into spare room holds what transformers' DynamicCache holds, step after step,
through the decoder's replacing its tensors (rows leaving), and a model decodes the same tokens with it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from workbench.platforms.growing_kv_cache import SPARE_COLUMNS, GrowingCache  # noqa: E402


def _states(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, columns, 8, generator=generator), torch.randn(rows, 2, columns, 8, generator=generator)


def test_updates_hold_what_a_dynamic_cache_holds_across_growth_and_replaced_tensors() -> None:
    growing, dynamic = GrowingCache(), transformers.DynamicCache()
    steps = [(3, 5)] + [(3, 1)] * (SPARE_COLUMNS + 10)  # a prompt, then past the first buffer's room
    for seed, (rows, columns) in enumerate(steps):
        keys, values = _states(rows, columns, seed)
        got = growing.update(keys, values, 0)
        want = dynamic.update(keys, values, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert growing.get_seq_length() == dynamic.get_seq_length() == 5 + SPARE_COLUMNS + 10
    # a row leaves (the decoder indexes the layers' tensors): the layer adopts the new ones at its next update
    for cache in (growing, dynamic):
        layer = cache.layers[0]
        layer.keys, layer.values = layer.keys[[0, 2]], layer.values[[0, 2]]
    keys, values = _states(2, 1, 99)
    got, want = growing.update(keys, values, 0), dynamic.update(keys, values, 0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_model_decodes_the_same_tokens_with_either_cache() -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=128)
    config.bos_token_id = config.eos_token_id = None
    model = transformers.GPT2LMHeadModel(config).eval()
    prompt = torch.randint(0, 50, (3, 7))

    def greedy(cache: object) -> torch.Tensor:
        tokens = [prompt]
        with torch.inference_mode():
            step = prompt
            for _ in range(SPARE_COLUMNS + 5):
                logits = model(input_ids=step, cache=cache, use_cache=True).logits
                step = logits[:, -1:].argmax(-1)
                tokens.append(step)
        return torch.cat(tokens, dim=1)

    assert torch.equal(greedy(GrowingCache()), greedy(transformers.DynamicCache()))
