"""The KV cache whose columns grow into spare room holds what transformers' DynamicCache holds, step after step,
through the decoder's replacing its tensors, and a model decodes the same tokens with it; rows leave and join it in
place (moved, dropped on the left, appended on the right) holding what re-indexing would."""

from __future__ import annotations

from typing import Any

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


def _layer_with(rows: int, columns: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    cache = GrowingCache()
    keys, values = _states(rows, columns, 7)
    cache.update(keys, values, 0)
    return cache.layers[0], keys.clone(), values.clone()


def test_rows_leave_in_place_the_last_row_taking_a_leaving_rows_slot() -> None:
    layer, keys, values = _layer_with(4, 6)
    layer.move_rows(torch.tensor([0]), torch.tensor([3]), 3)  # row 0 leaves, row 3 takes its slot
    assert torch.equal(layer.keys, keys[[3, 1, 2]]) and torch.equal(layer.values, values[[3, 1, 2]])
    layer.move_rows(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), 2)  # the last leaves
    assert torch.equal(layer.keys, keys[[3, 1]])
    layer.drop_left(2)  # no row uses its first two columns any more
    assert torch.equal(layer.keys, keys[[3, 1], :, 2:]) and torch.equal(layer.values, values[[3, 1], :, 2:])
    step_keys, step_values = _states(2, 1, 8)
    got_keys, got_values = layer.update(step_keys, step_values)
    assert torch.equal(got_keys, torch.cat([keys[[3, 1], :, 2:], step_keys], dim=2))
    assert torch.equal(got_values, torch.cat([values[[3, 1], :, 2:], step_values], dim=2))


def test_joining_rows_are_aligned_on_the_right_and_widen_the_layer_on_the_left() -> None:
    layer, keys, values = _layer_with(2, 6)
    narrow_keys, narrow_values = _states(1, 4, 9)
    layer.append_rows(narrow_keys, narrow_values)  # narrower: its padding on the left is zeros
    assert layer.keys.shape == (3, 2, 6, 8)
    assert torch.equal(layer.keys[:2], keys) and torch.equal(layer.values[:2], values)
    assert torch.equal(layer.keys[2, :, 2:], narrow_keys[0]) and not layer.keys[2, :, :2].any()
    wide_keys, wide_values = _states(SPARE_COLUMNS, 9, 10)  # wider, and more rows than the room: both grow
    layer.append_rows(wide_keys, wide_values)
    assert layer.keys.shape == (3 + SPARE_COLUMNS, 2, 9, 8)
    assert torch.equal(layer.keys[:2, :, 3:], keys) and torch.equal(layer.values[:2, :, 3:], values)
    assert torch.equal(layer.keys[2, :, 5:], narrow_keys[0]) and torch.equal(layer.values[2, :, 5:], narrow_values[0])
    assert torch.equal(layer.keys[3:], wide_keys) and torch.equal(layer.values[3:], wide_values)
    assert torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all()  # what the mask leaves out


def test_the_columns_a_joining_row_does_not_use_hold_no_former_rows_nan() -> None:
    layer, keys, _ = _layer_with(2, 5)
    layer.keys[1] = float("nan")  # a row whose states were NaN, as a broken model could write
    layer.values[1] = float("nan")
    layer.move_rows(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), 1)
    short_keys, short_values = _states(1, 2, 11)
    layer.append_rows(short_keys, short_values)  # takes the slot the NaN row left
    assert torch.equal(layer.keys[0], keys[0]) and torch.equal(layer.keys[1, :, 3:], short_keys[0])
    assert not layer.keys[1, :, :3].any() and not layer.values[1, :, :3].any()
