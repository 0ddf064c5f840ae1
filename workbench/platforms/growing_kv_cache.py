"""A KV cache with spare room for columns and rows: a decode step writes its one column, a row joins or leaves by
copying its own columns, instead of every step or every join copying them all.

``transformers``' ``DynamicCache`` appends a step's keys and values with ``torch.cat``, which copies every column
of every layer on every step: on a small model that copy was 15 % of a decode step's time (16 rows of 100 columns).
:class:`GrowingLayer` keeps each layer in a buffer with room for more columns and more rows and hands the model a
view of the rows and columns in use (``[:rows, :, start:end]``), so a step costs one column's copy, and the buffer
is copied only when it is full (it then grows by half, at least :data:`SPARE_COLUMNS`).

The batched decoder (``huggingface_decoding.py``) moves rows in place: a row that leaves has the last row moved into
its slot (:meth:`GrowingLayer.move_rows`, one row's columns copied), the columns no row uses any more are dropped by
moving the view's start (:meth:`GrowingLayer.drop_left`), and the rows of a finished prompt are written after the
last (:meth:`GrowingLayer.append_rows`). Under sustained load a row leaves and another joins every few steps; each
re-indexing the whole cache, then copying it again into a new buffer, cost about a tenth of the generation thread.
Code that replaces a layer's ``keys`` and ``values`` (an encoder-decoder's rows leaving or joining, transformers'
own ``batch_select_indices``) still works: the layer notices (they are no longer its view) and adopts them at its
next update or row move, with one copy.

Columns a row does not use (its left padding, a former row's columns) hold finite values, never uninitialised
memory: buffers start zeroed and are only ever written with the model's own keys and values, so the attention
mask's zero weights leave them out exactly (a NaN there would not be: 0 x NaN is NaN).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

if TYPE_CHECKING:
    import torch

SPARE_COLUMNS = 64
SPARE_ROWS = 8


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` and ``values`` are views of buffers with spare columns and rows."""

    _view: torch.Tensor | None = None  # the keys it handed out: anything else in ``keys`` was put there by others
    _key_room: torch.Tensor
    _value_room: torch.Tensor
    _rows = 0
    _start = 0
    _end = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if not self._holds_states():
            self._regrow(key_states.shape[0], 0, new, key_states, value_states)
        elif self._end + new > self._key_room.shape[-2]:
            self._regrow(self._rows, 0, new, key_states, value_states)
        end = self._end + new
        self._key_room[: self._rows, :, self._end : end] = key_states
        self._value_room[: self._rows, :, self._end : end] = value_states
        self._end = end
        return self._refresh()

    # ----------------------------------------------------------------------------------------------- rows move
    def move_rows(self, into: torch.Tensor, source: torch.Tensor, rows: int) -> None:
        """Copy rows ``source`` into slots ``into`` (as many), then keep the first ``rows``."""
        if not self._holds_states():
            return
        if into.numel():
            columns = slice(self._start, self._end)
            self._key_room[into, :, columns] = self._key_room[source, :, columns]
            self._value_room[into, :, columns] = self._value_room[source, :, columns]
        self._rows = rows
        self._refresh()

    def drop_left(self, columns: int) -> None:
        """Forget the first ``columns`` columns of every row (no row uses them any more)."""
        if columns and self._holds_states():
            self._start += columns
            self._refresh()

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows after the last, their columns aligned on the right (every row's next token goes in the same
        column); rows wider than the layer widen it on the left."""
        if not self._holds_states():
            self.keys, self.values = keys, values  # nothing held yet: adopted at the next update
            return
        added, width = keys.shape[0], keys.shape[-2]
        wider = max(0, width - (self._end - self._start))
        if self._rows + added > self._key_room.shape[0] or wider > self._start:
            self._regrow(self._rows + added, wider, 0, keys, values)
        self._start -= wider
        rows = slice(self._rows, self._rows + added)
        if width < self._end - self._start:  # their left padding, which may hold a former row's columns
            padding = slice(self._start, self._end - width)
            self._key_room[rows, :, padding] = 0
            self._value_room[rows, :, padding] = 0
        self._key_room[rows, :, self._end - width : self._end] = keys
        self._value_room[rows, :, self._end - width : self._end] = values
        self._rows += added
        self._refresh()

    # ----------------------------------------------------------------------------------------------- the buffers
    def _holds_states(self) -> bool:
        """Whether the buffers hold the layer's keys and values, adopting (one copy) those someone else put in
        ``keys`` and ``values``; False while there are none."""
        keys, values = self.keys, self.values
        if keys is None or values is None or not keys.numel():
            return False
        if keys is not self._view:
            self._view = None
            self._regrow(keys.shape[0], 0, keys.shape[-2], keys, values)
            self._key_room[: self._rows, :, : keys.shape[-2]] = keys
            self._value_room[: self._rows, :, : values.shape[-2]] = values
            self._end = keys.shape[-2]
            self._refresh()
        return True

    def _regrow(self, rows: int, left: int, right: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """New zeroed buffers for ``rows`` rows (and spare, once rows join), ``left`` more columns before the start
        and ``right`` after the end (and spare); the columns held (none, unless the layer holds states) move in
        after ``left``."""
        held = self._view is not None
        used = self._end - self._start if held else 0
        columns = left + used + right
        columns += max(SPARE_COLUMNS, columns // 2)
        capacity = self._key_room.shape[0] if held else rows  # a new cache's rows (a prefill's) stay as they are
        if rows > capacity:  # rows join: room for the next ones too
            capacity = rows + max(SPARE_ROWS, rows // 2)
        key_room = keys.new_zeros((capacity, keys.shape[1], columns, keys.shape[-1]))
        value_room = values.new_zeros((capacity, values.shape[1], columns, values.shape[-1]))
        if used:
            old = slice(self._start, self._end)
            key_room[: self._rows, :, left : left + used] = self._key_room[: self._rows, :, old]
            value_room[: self._rows, :, left : left + used] = self._value_room[: self._rows, :, old]
        else:
            self._rows = rows
        self._key_room, self._value_room = key_room, value_room
        self._start, self._end = left, left + used

    def _refresh(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = self._view = self._key_room[: self._rows, :, self._start : self._end]
        self.values = self._value_room[: self._rows, :, self._start : self._end]
        return self.keys, self.values

    def reset(self) -> None:
        super().reset()
        self._view = None


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of :class:`GrowingLayer` s (one a model layer, made as the model first writes it)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
