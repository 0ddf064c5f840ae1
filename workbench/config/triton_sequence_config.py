"""``sequence_batching`` of a Triton ``config.pbtxt``: how the server's sequence batcher runs a stateful model.

In Triton the sequence batcher belongs to the server, not to the backend, and so it does here: for every platform (ONNX
Runtime, TensorFlow, PyTorch, Python) the batcher (:mod:`workbench.batching.sequence_batcher`) keeps each sequence on
one version and in order, gives the model the ``control_input`` tensors it asks for (START, END, READY, CORRID in the
config's data types and false/true values), and keeps the sequence's **implicit state** (``state [...]``): each state
starts as zeros (variable dims as 1) or as its ``initial_state``, is given to the model as the input ``input_name``,
replaced by the model's output ``output_name`` after each request, and dropped when the sequence ends or idles out.

Strategies, as Triton schedules them:

- **Direct** (Triton's default): each instance holds ``max(1, max_batch_size)`` sequence slots; a sequence keeps its
  slot from start to end; a batch runs the slots with a request waiting, and waits up to Direct's
  ``max_queue_delay_microseconds`` for ``minimum_slot_utilization`` of the slots to have one.
- **Oldest**: up to ``max_candidate_sequences`` sequences per instance are held at once (a new one waits for one to
  end, as Triton's backlog); a batch takes the oldest waiting request of each sequence, at most ``max_batch_size``,
  runs at once at a ``preferred_batch_size`` and otherwise waits up to ``max_queue_delay_microseconds`` for more.

Checked as Triton checks them, in Triton's words where Triton has words: one control per tensor, each kind once,
controls and states not declared as inputs, CORRID's data type, ``initial_state``'s data type, name and dims.
Refused (UNIMPLEMENTED): ``iterative_sequence`` and sequence batching of a decoupled model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config.triton_data_types import DATA_TYPES, data_type_name
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls, SequenceSettings, Strategy

# Triton's default max_sequence_idle_microseconds (SEQUENCE_IDLE_DEFAULT_MICROSECONDS): one second.
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

# The folder beside the version folders that initial_state's data_file names a file in (Triton's kInitialStateFolder).
INITIAL_STATE_FOLDER = "initial_state"

# Control kinds by Triton's enum name, as workbench names them (``Controls``' fields); START, END and READY are
# flags given as the config's false/true values, CORRID is the sequence's id in the config's data type.
CONTROL_KINDS: Mapping[str, str] = {
    "CONTROL_SEQUENCE_START": "START",
    "CONTROL_SEQUENCE_END": "END",
    "CONTROL_SEQUENCE_READY": "READY",
    "CONTROL_SEQUENCE_CORRID": "CORRID",
}
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
_FLAG_TYPES = {"int32_false_true": "TYPE_INT32", "fp32_false_true": "TYPE_FP32", "bool_false_true": "TYPE_BOOL"}

Fail = Callable[..., ServingError]


@dataclasses.dataclass(frozen=True)
class SequenceControl:
    """One ``control_input``: the tensor the sequence batcher gives the model with each request of a sequence."""

    name: str
    kind: str  # START, END, READY or CORRID (CONTROL_KINDS)
    data_type: str  # Triton's name: TYPE_INT32, TYPE_FP32, TYPE_BOOL for flags; CORRID's is the config's
    false_true: tuple[Any, Any] = (0, 1)  # a flag's values for false and true

    @property
    def dtype(self) -> np.dtype[Any]:
        return DATA_TYPES[self.data_type]

    def value(self, controls: Controls) -> np.ndarray:
        """This control's one value for a request, as a 1-element array of its data type."""
        if self.kind != "CORRID":
            flag = {"START": controls.start, "END": controls.end, "READY": controls.ready}[self.kind]
            return np.array([self.false_true[int(flag)]], self.dtype)
        corrid = controls.correlation_id
        if self.data_type == "TYPE_STRING":
            return np.array([str(corrid).encode()], object)
        if isinstance(corrid, str):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'sequence id "{corrid}" is a string, but the model\'s CONTROL_SEQUENCE_CORRID input "{self.name}" '
                f"is {self.data_type}: send a number",
            )
        limits = np.iinfo(self.dtype)
        if not limits.min <= corrid <= limits.max:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'sequence id {corrid} does not fit the model\'s CONTROL_SEQUENCE_CORRID input "{self.name}" '
                f"({self.data_type})",
            )
        return np.array([corrid], self.dtype)


@dataclasses.dataclass(frozen=True)
class ImplicitState:
    """One ``state``: a tensor the server keeps per sequence, given as ``input_name``, replaced by ``output_name``."""

    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]  # without the batch dimension; -1 for a size the model decides
    initial: np.ndarray | None = dataclasses.field(default=None, compare=False)  # initial_state's data, dims shaped

    @property
    def dtype(self) -> np.dtype[Any]:
        return DATA_TYPES[self.data_type]

    def start_value(self) -> np.ndarray:
        """The state a sequence starts with: ``initial_state``'s data, or zeros with each variable dim 1 (Triton)."""
        if self.initial is not None:
            return self.initial.copy()
        shape = tuple(1 if d == -1 else d for d in self.dims)
        if self.dtype == np.dtype(object):
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class SequenceBatching:
    """``sequence_batching``: how workbench's sequence batcher runs the model, the control tensors it gives and the
    implicit states it keeps."""

    settings: SequenceSettings
    controls: tuple[SequenceControl, ...]
    states: tuple[ImplicitState, ...] = ()

    @property
    def given_inputs(self) -> frozenset[str]:
        """The model inputs the server gives, never the client: control tensors and state inputs."""
        return frozenset([c.name for c in self.controls] + [s.input_name for s in self.states])

    @property
    def state_outputs(self) -> frozenset[str]:
        return frozenset(s.output_name for s in self.states)


def read_sequence_batching(
    proto: Any,
    declared_inputs: frozenset[str],
    instance_count: int,
    model_folder: Path,
    fail: Fail,
) -> SequenceBatching:
    """``proto.sequence_batching`` (of a parsed ``ModelConfig``) as workbench's sequence batcher runs it."""
    batching = proto.sequence_batching
    if batching.iterative_sequence:
        raise fail("sequence_batching's iterative_sequence is not supported by workbench", Code.UNIMPLEMENTED)
    if proto.model_transaction_policy.decoupled:
        raise fail("sequence_batching with a decoupled model is not supported by workbench", Code.UNIMPLEMENTED)
    controls = tuple(_control(entry, fail) for entry in batching.control_input)
    _check_controls(controls, declared_inputs, fail)
    batched = proto.max_batch_size > 0
    states = tuple(_state(entry, batched, model_folder, fail) for entry in batching.state)
    _check_states(states, controls, declared_inputs, fail)
    return SequenceBatching(_settings(proto, instance_count), controls, states)


def _settings(proto: Any, instance_count: int) -> SequenceSettings:
    batching = proto.sequence_batching
    idle = (batching.max_sequence_idle_microseconds or SEQUENCE_IDLE_DEFAULT_MICROSECONDS) / 1e6
    per_instance = max(1, proto.max_batch_size)
    if batching.WhichOneof("strategy_choice") == "oldest":
        oldest = batching.oldest
        return SequenceSettings(
            strategy=Strategy.OLDEST,
            max_idle_seconds=idle,
            max_batch_size=per_instance,
            max_queue_delay_seconds=oldest.max_queue_delay_microseconds / 1e6,
            max_sequences=(oldest.max_candidate_sequences or per_instance) * instance_count,
            preferred_batch_sizes=tuple(sorted(size for size in oldest.preferred_batch_size if size > 0)),
        )
    direct = batching.direct  # direct {}, or no strategy: Triton's default is Direct
    slots = per_instance * instance_count
    return SequenceSettings(
        strategy=Strategy.DIRECT,
        max_idle_seconds=idle,
        max_batch_size=slots,
        run_batch_size=per_instance,
        max_queue_delay_seconds=direct.max_queue_delay_microseconds / 1e6,
        min_ready=math.ceil(direct.minimum_slot_utilization * per_instance)
        if direct.max_queue_delay_microseconds
        else 0,
    )


def _control(entry: Any, fail: Fail) -> SequenceControl:
    """One ``control_input``: a tensor name and the one control it carries."""
    from tritonclient.grpc import model_config_pb2

    if not entry.name:
        raise fail("every sequence_batching control_input needs a name")
    if len(entry.control) != 1:
        raise fail(
            f'sequence_batching control_input "{entry.name}" must give exactly one control (it gives '
            f"{len(entry.control)}): a tensor carries one control value"
        )
    (control,) = entry.control
    kind_name = model_config_pb2.ModelSequenceBatching.Control.Kind.Name(control.kind)
    kind = CONTROL_KINDS[kind_name]
    given = {
        field: list(getattr(control, field))
        for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
        if len(getattr(control, field))
    }
    where = f'sequence_batching control_input "{entry.name}" ({kind_name})'
    if kind == "CORRID":
        if given:
            raise fail(f"{where} takes data_type, not {' or '.join(given)}")
        data_type = data_type_name(control.data_type)
        if data_type not in CORRID_TYPES:
            raise fail(f"{where}: data_type must be one of {', '.join(CORRID_TYPES)}, not {data_type}")
        return SequenceControl(entry.name, kind, data_type)
    if len(given) != 1:
        raise fail(f"{where} must give exactly one of int32_false_true, fp32_false_true and bool_false_true")
    ((field, values),) = given.items()
    if len(values) != 2:
        raise fail(f"{where}: {field} must have exactly 2 entries (the false value, then the true one)")
    return SequenceControl(entry.name, kind, _FLAG_TYPES[field], (values[0], values[1]))


def _check_controls(controls: tuple[SequenceControl, ...], declared: frozenset[str], fail: Fail) -> None:
    """Each control once, each on a tensor of its own that the config does not also declare as an input (the
    batcher gives the model control tensors; clients never send them)."""
    names: set[str] = set()
    kinds: set[str] = set()
    for control in controls:
        if control.name in names:
            raise fail(f'sequence batching control tensor "{control.name}" is given for several controls')
        if control.kind in kinds:
            raise fail(f"sequence batching gives several CONTROL_SEQUENCE_{control.kind} tensors")
        if control.name in declared:
            raise fail(
                f'"{control.name}" is both an input and a sequence_batching control_input: leave it out of input '
                "[...] (the sequence batcher gives it; clients do not send it)"
            )
        names.add(control.name)
        kinds.add(control.kind)


def _state(entry: Any, batched: bool, model_folder: Path, fail: Fail) -> ImplicitState:
    """One ``state``, its initial data read and checked in Triton's words (GenerateInitialStateData)."""
    if not entry.input_name or not entry.output_name:
        raise fail("every sequence_batching state needs an input_name and an output_name")
    data_type = data_type_name(entry.data_type)
    if data_type not in DATA_TYPES:
        raise fail(
            f'sequence_batching state "{entry.input_name}" has data_type {data_type}, which workbench cannot serve',
            Code.UNIMPLEMENTED,
        )
    dims = tuple(int(d) for d in entry.dims)
    if not dims:
        raise fail(f'sequence_batching state "{entry.input_name}" needs dims')
    if len(entry.initial_state) > 1:
        raise fail(
            f"initial_state field for state input '{entry.input_name}' must contain exactly one or zero element. "
            f"Found '{len(entry.initial_state)}' elements."
        )
    initial = _initial_state(entry, data_type, dims, model_folder, fail) if entry.initial_state else None
    return ImplicitState(entry.input_name, entry.output_name, data_type, dims, initial)


def _initial_state(entry: Any, data_type: str, dims: tuple[int, ...], folder: Path, fail: Fail) -> np.ndarray:
    (initial,) = entry.initial_state
    name = entry.input_name
    if initial.data_type != entry.data_type:
        raise fail(
            f"The data type used for 'initial_state' field of state '{name}' does not match the state data type."
        )
    if not initial.name:
        raise fail(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    shape = tuple(int(d) for d in initial.dims)
    if len(shape) != len(dims):
        raise fail(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            f"'{name}'. {len(shape)} != {len(dims)}"
        )
    for given, declared in zip(shape, dims, strict=True):
        if given == -1:
            raise fail(f"'initial_state' field for state input name '{name}' contains variable dimensions.")
        if declared != -1 and given != declared:
            raise fail(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. "
                f"{given} != {declared}"
            )
    dtype = DATA_TYPES[data_type]
    which = initial.WhichOneof("state_data")
    if which == "zero_data" or which is None:
        return np.full(shape, b"", dtype=object) if dtype == np.dtype(object) else np.zeros(shape, dtype)
    file = folder / INITIAL_STATE_FOLDER / initial.data_file
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise fail(f"initial_state of state input '{name}': could not read {file}: {exc.strerror}") from None
    if dtype == np.dtype(object):
        from workbench.protocol.bytes_codec import MalformedBytes, unpack_bytes

        try:
            values = unpack_bytes(data)
        except MalformedBytes as exc:
            raise fail(
                f"initial_state of state input '{name}': {file} is not a serialized BYTES tensor: {exc}"
            ) from None
        if values.size != math.prod(shape):
            raise fail(f"initial_state of state input '{name}': {file} holds {values.size} strings, dims {list(shape)}")
        return values.reshape(shape)
    size = math.prod(shape) * dtype.itemsize
    if size > len(data):
        raise fail(
            f"initial_state setting expects {size} bytes, but the data provided from {initial.data_file} only has "
            f"{len(data)} bytes."
        )
    return np.frombuffer(data[:size], dtype).reshape(shape).copy()


def _check_states(
    states: tuple[ImplicitState, ...],
    controls: tuple[SequenceControl, ...],
    declared_inputs: frozenset[str],
    fail: Fail,
) -> None:
    """Each state's names once, its input not also an input clients send (a state's output may be asked for)."""
    inputs: set[str] = {control.name for control in controls}
    outputs: set[str] = set()
    for state in states:
        if state.input_name in inputs:
            raise fail(f"State input name '{state.input_name}' specified more than once.")
        if state.output_name in outputs:
            raise fail(f"State output name '{state.output_name}' specified more than once.")
        if state.input_name in declared_inputs:
            raise fail(
                f'"{state.input_name}" is both an input and a sequence_batching state input_name: leave it out of '
                "input [...] (the server keeps and gives the state; clients do not send it)"
            )
        inputs.add(state.input_name)
        outputs.add(state.output_name)
