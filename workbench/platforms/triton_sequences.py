"""A Triton model's sequences as every backend gets them: the tensors the server adds to each request of a sequence.

Triton's sequence batcher belongs to the server, so every backend (:mod:`workbench.platforms.triton` for ONNX Runtime,
TensorFlow and PyTorch, :mod:`workbench.platforms.triton_python` for Python) gets the same: the request's own
inputs, one row; the ``control_input`` tensors (``[1, 1]`` with a batch dimension, ``[1]`` without); the sequence's
implicit states as their ``input_name`` tensors. After the run, each state's ``output_name`` output is the
sequence's next state. The state a sequence holds is a dict of arrays without the batch dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.config.triton_model_config import TritonConfig
from workbench.config.triton_sequence_config import SequenceBatching
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls
from workbench.platforms.triton_tensors import batch_rows

States = dict[str, np.ndarray]  # a sequence's implicit states by input_name, without the batch dimension


def check_one_row(feed: Mapping[str, np.ndarray], config: TritonConfig, model: str) -> None:
    """Triton's sequence batcher takes requests of one row only; so does workbench's, in Triton's words."""
    rows = batch_rows(feed, config)
    if rows is not None and rows > 1:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher",
        )


def server_tensors(
    sequence: SequenceBatching, config: TritonConfig, controls: Controls, states: States | None
) -> dict[str, np.ndarray]:
    """The tensors the server gives one request of a sequence: its controls, then its states (None: it starts)."""
    shape = (1, 1) if config.batched else (1,)
    tensors = {control.name: np.broadcast_to(control.value(controls), shape).copy() for control in sequence.controls}
    held = states if states is not None else first_states(sequence)
    for state in sequence.states:
        value = held[state.input_name]
        tensors[state.input_name] = value[np.newaxis] if config.batched else value
    return tensors


def first_states(sequence: SequenceBatching) -> States:
    return {state.input_name: state.start_value() for state in sequence.states}


def next_states(
    sequence: SequenceBatching, config: TritonConfig, produced: Mapping[str, Any], held: States | None
) -> States | None:
    """The states after a request: each state's output as the model gave it (one row; a state the model did not
    give keeps its value). None when the model keeps no implicit state."""
    if not sequence.states:
        return None
    before = held if held is not None else first_states(sequence)
    after: States = {}
    for state in sequence.states:
        value = produced.get(state.output_name)
        if value is None:
            after[state.input_name] = before[state.input_name]
            continue
        array = np.asarray(value)
        if config.batched:
            if array.ndim == 0 or array.shape[0] != 1:
                raise ServingError(
                    Code.INTERNAL,
                    f"state output '{state.output_name}' of model '{config.name}' has shape {list(array.shape)}: "
                    "one row was expected (the request's)",
                )
            array = array[0]
        after[state.input_name] = np.ascontiguousarray(array, dtype=state.dtype)
    return after
