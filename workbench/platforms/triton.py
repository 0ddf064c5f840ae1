"""Triton models: a version folder whose model folder holds ``config.pbtxt``, served as that config says.

The config (:mod:`workbench.config.triton_model_config`) names the backend (those workbench runs:
:mod:`workbench.platforms.triton_backends`); the version folder holds its file
(``model.onnx``, ``model.savedmodel/``, ``model.py``, ``model.pt``, or ``default_model_filename``), loaded by
workbench's own platform for it. What clients see is the config: the signature's tensors are its inputs and
outputs with their data types and dims (a batch dimension first when ``max_batch_size`` > 0), each input reshaped to
``reshape`` before the model sees it and each output reshaped back to its dims, and at most ``instance_group``'s
count of runs at once. Inputs are checked against their declared shapes before running, as Triton does. A config
without inputs or outputs is completed from an ONNX or TensorFlow model, as Triton's auto-complete does; a PyTorch
(TorchScript) model's config declares them, paired with forward()'s parameters and results as Triton's libtorch
backend pairs them (``INPUT__0``, ``OUTPUT__0``: :func:`workbench.platforms.pytorch.triton_declaration`). Decoupled
models are the Python backend's (:mod:`workbench.platforms.triton_python`); the config refuses them for the others.

A model with ``sequence_batching`` is stateful: its requests run through the server's sequence batcher, which hands
this servable whole batches of steps (:meth:`TritonServable.run_steps`): each step's row with its control tensors
and implicit states (:mod:`workbench.platforms.triton_sequences`), the rows of a batch concatenated into one run of
the model, as Triton's sequence batcher does for its backends.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from workbench.config.batching_parameters import BatchingParameters
from workbench.config.triton_model_config import (
    DynamicBatching,
    TritonConfig,
    TritonTensor,
    completed_batching,
    config_json,
)
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls, Step, StepResult
from workbench.core.servable import Servable
from workbench.core.signatures import (
    DEFAULT_SIGNATURE,
    Signature,
    TensorSpec,
)
from workbench.platforms.base import LoadPolicy
from workbench.platforms.triton_backends import ONNX, PYTHON, PYTORCH, STAND_INS, TENSORFLOW, read_config
from workbench.platforms.triton_sequences import States, check_one_row, next_states, server_tensors
from workbench.platforms.triton_tensors import (
    batch_rows,
    fits,
    model_inputs,
    model_shape,
    output_labels,
    signature_of,
    wire_output,
)


def load(name: str, version: int, path: str, policy: LoadPolicy, platform: str = "") -> Servable:
    """Load version folder ``path`` of the Triton model whose ``config.pbtxt`` is in the folder above it."""
    config = read_config(Path(path).parent, policy.auto_complete_config)
    if platform and platform != config.platform:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'Model {name}: model_platform "{platform}" contradicts {config.file}, which serves it with '
            f"{config.platform}; leave model_platform out",
        )
    if config.platform == PYTHON:
        from workbench.platforms.triton_python import load as load_python

        servable: Servable = load_python(name, version, path, policy, config)
    elif config.platform in STAND_INS:
        from workbench.platforms.triton_stand_ins import load as load_stand_in

        servable = load_stand_in(name, version, path, config)
    else:
        servable = _load_framework(name, version, path, policy, config)
    servable.platform = config.platform
    return servable


def _load_framework(name: str, version: int, path: str, policy: LoadPolicy, config: TritonConfig) -> Servable:
    model_file = config.model_file(path)
    if not model_file.exists():
        raise ServingError(Code.NOT_FOUND, f"No {model_file.name} in {path} (the model file {config.file} names)")
    inner: Servable
    if config.platform == ONNX:
        from workbench.platforms.onnx import OnnxServable

        inner = OnnxServable(name, version, path, model_file.name)
    elif config.platform == TENSORFLOW:
        from workbench.platforms.tensorflow import load_saved_model

        inner = load_saved_model(name, version, str(model_file))
    elif config.platform == PYTORCH:
        from workbench.platforms.pytorch import TorchServable, triton_declaration

        # TorchScript records no types: the config's tensors declare them (Triton's libtorch backend requires them).
        declare = functools.partial(triton_declaration, config.inputs, config.outputs, config.batched)
        inner = TorchServable(name, version, path, policy, model_file.name, declare=declare)
    else:  # pragma: no cover - triton_config only returns the platforms above
        raise ServingError(Code.UNIMPLEMENTED, f"{config.file}: {config.platform} is not supported by workbench")
    try:
        served = _completed_max_batch_size(config, inner) if policy.auto_complete_config else config
        servable = TritonServable(inner, served)
        servable.completed_batching = completed_batching(config, served)
        return servable
    except BaseException:
        inner.close()
        raise


# Triton's --backend-config=default-max-batch-size: what auto-complete gives a model that can batch.
DEFAULT_MAX_BATCH_SIZE = 4


def _completed_max_batch_size(config: TritonConfig, inner: Servable) -> TritonConfig:
    """Triton's auto-complete of ``max_batch_size``: a config that declares no tensors and no batch size, for a
    model whose every input and output has a variable first dimension, gets the default maximum batch size. The
    file's own ``max_batch_size`` always wins. ``dynamic_batching {}`` comes with it, as in Triton (the servable's
    :attr:`~TritonServable.completed_batching`, which the server batches it with). Sequence models keep the file's
    size (their slots are read with the file)."""
    own = inner.signatures.get(DEFAULT_SIGNATURE)
    if own is None or config.max_batch_size or config.inputs or config.outputs or config.sequence_batching:
        return config
    tensors = [*own.inputs.values(), *own.outputs.values()]
    if not tensors or not all(spec.shape is not None and spec.shape[:1] == (-1,) for spec in tensors):
        return config
    from tritonclient.grpc import model_config_pb2

    proto = model_config_pb2.ModelConfig()
    proto.CopyFrom(config.proto)
    proto.max_batch_size = DEFAULT_MAX_BATCH_SIZE
    dynamic = config.dynamic_batching
    if dynamic is None and not config.decoupled:
        proto.dynamic_batching.SetInParent()
        dynamic = DynamicBatching((), 0)
    return dataclasses.replace(config, max_batch_size=DEFAULT_MAX_BATCH_SIZE, dynamic_batching=dynamic, proto=proto)


def own_batching(servable: Servable) -> BatchingParameters | None:
    """The batching a Triton model's config, completed at load, asks for beyond what its file asked for (the
    server reads a model's batching from its files before it loads): what the server batches it with then."""
    own: BatchingParameters | None = getattr(servable, "completed_batching", None)
    return own


# ------------------------------------------------------------------------------------------- shapes
def _completed(
    config: TritonConfig, specs: Mapping[str, TensorSpec], kind: str, server_given: frozenset[str] = frozenset()
) -> tuple[TritonTensor, ...]:
    """Tensors the config does not declare, taken from the model (Triton's auto-complete); ``server_given``, the
    sequence batcher's control and state tensors, are not the clients'."""
    from workbench.protocol.v2_types import to_datatype

    tensors = []
    for spec in specs.values():
        if spec.alias in server_given:
            continue
        shape = spec.shape if spec.shape is not None else (-1,)
        if config.batched:
            if not shape or shape[0] != -1:
                raise ServingError(
                    Code.INVALID_ARGUMENT,
                    f"{config.file}: max_batch_size is {config.max_batch_size} but the model's {kind} {spec.alias} "
                    f"has no batch dimension ({spec.describe()}); declare the {kind}s, or set max_batch_size: 0",
                )
            shape = shape[1:]
        datatype = to_datatype(spec.dtype)
        tensors.append(
            TritonTensor(spec.alias, spec.dtype, "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}", shape)
        )
    return tuple(tensors)


def _check_against(
    config: TritonConfig, tensors: Sequence[TritonTensor], specs: Mapping[str, TensorSpec], kind: str
) -> None:
    for tensor in tensors:
        spec = specs.get(tensor.name)
        if spec is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: {kind} "{tensor.name}" is not one of the model\'s {kind}s '
                f"({', '.join(specs) or 'none'})",
            )
        if spec.dtype != tensor.dtype:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: {kind} "{tensor.name}" is declared {tensor.data_type} but the model\'s is '
                f"{spec.dtype_name}",
            )
        if not fits(model_shape(tensor, config), spec.shape):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: {kind} "{tensor.name}" is declared with shape {list(model_shape(tensor, config))} '
                f"(batch dimension, then {'reshape' if tensor.reshape is not None else 'dims'}) but the model's is "
                f"{spec.describe()}",
            )


def _check_sequence_tensors(config: TritonConfig, own: Signature) -> None:
    """The sequence batcher's control and state tensors must be the model's, of the types the config gives them."""
    sequence = config.sequence_batching
    assert sequence is not None
    given = [(c.name, c.dtype, "control_input") for c in sequence.controls]
    given += [(s.input_name, s.dtype, "state input_name") for s in sequence.states]
    for name, dtype, what in given:
        spec = own.inputs.get(name)
        if spec is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: sequence_batching {what} "{name}" is not one of the model\'s inputs '
                f"({', '.join(own.inputs) or 'none'})",
            )
        if spec.dtype != dtype:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: sequence_batching {what} "{name}" gives {dtype} but the model\'s input is '
                f"{spec.dtype_name}",
            )
    for state in sequence.states:
        if state.output_name not in own.outputs:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{config.file}: sequence_batching state output_name "{state.output_name}" is not one of the '
                f"model's outputs ({', '.join(own.outputs) or 'none'})",
            )


class TritonServable(Servable):
    """An ONNX, TensorFlow or TorchScript model served as its config.pbtxt describes it."""

    # Batching its config asks for once completed at load, where the file alone asked for none (auto-complete's
    # dynamic_batching): the server batches it so (workbench.planes.controlplane.ControlPlane.batching_of).
    completed_batching: BatchingParameters | None = None

    def __init__(self, inner: Servable, config: TritonConfig) -> None:
        self.name, self.version, self.path = inner.name, inner.version, inner.path
        self._inner = inner
        self._config = config
        own = inner.signatures.get(DEFAULT_SIGNATURE)
        if own is None:
            raise ServingError(Code.FAILED_PRECONDITION, f"{inner.path} has no {DEFAULT_SIGNATURE} signature to serve")
        self._own = own
        sequence = config.sequence_batching
        given = sequence.given_inputs if sequence is not None else frozenset()
        kept = sequence.state_outputs if sequence is not None else frozenset()
        inputs = config.inputs or _completed(config, own.inputs, "input", given)
        outputs = config.outputs or _completed(config, own.outputs, "output", kept)
        _check_against(config, inputs, own.inputs, "input")
        if sequence is not None:
            _check_sequence_tensors(config, own)
            self.sequence = sequence.settings
        _check_against(config, outputs, own.outputs, "output")
        self._inputs = {t.name: t for t in inputs}
        self._outputs = {t.name: t for t in outputs}
        self.signatures = {DEFAULT_SIGNATURE: signature_of(config, inputs, outputs)}
        self.model_config = config_json(config, inner.name, inputs, outputs)
        self.labels = output_labels(config, outputs)
        # Triton's instances: at most this many runs at once (each instance runs one request or batch at a time).
        self._instances = threading.BoundedSemaphore(config.instance_count)

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feed = model_inputs(self._config, signature, self._inputs, inputs)
        rows = batch_rows(inputs, self._config)
        with self._instances:
            result = self._inner.run(self._own, feed, outputs)
        return {alias: wire_output(result[alias], self._outputs[alias], self._config, rows) for alias in outputs}

    # -------------------------------------------------------------------------------------- sequences
    def run_step(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        state: States | None,
        controls: Controls,
    ) -> StepResult:
        (answer,) = self.run_steps([Step(signature, inputs, outputs, state, controls)])
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def run_steps(self, steps: Sequence[Step]) -> list[StepResult | BaseException]:
        """A batch of the sequence batcher: each step's row with its controls and states, rows whose tensors have
        the same shapes concatenated into one run of the model (a model without a batch dimension runs each alone),
        then each row's outputs and next states. A step whose inputs are wrong fails alone."""
        sequence = self._config.sequence_batching
        assert sequence is not None
        answers: list[StepResult | BaseException | None] = [None] * len(steps)
        feeds: list[tuple[int, dict[str, np.ndarray]]] = []
        for index, step in enumerate(steps):
            try:
                check_one_row(step.inputs, self._config, self.name)
                feed = model_inputs(self._config, step.signature, self._inputs, step.inputs)
                feed.update(server_tensors(sequence, self._config, step.controls, step.state))
            except ServingError as exc:
                answers[index] = exc
                continue
            feeds.append((index, feed))
        wanted = sorted({*sequence.state_outputs, *(alias for step in steps for alias in step.outputs)})
        for group in self._groups(feeds):
            try:
                rows = self._run_rows([feed for _, feed in group], wanted)
            except BaseException as exc:  # noqa: BLE001 - the group's error, each of its steps answers it
                for index, _ in group:
                    answers[index] = exc
                continue
            for (index, _), produced in zip(group, rows, strict=True):
                step = steps[index]
                try:
                    answer = {
                        alias: wire_output(
                            produced[alias], self._outputs[alias], self._config, 1 if self._config.batched else None
                        )
                        for alias in step.outputs
                    }
                    answers[index] = (answer, next_states(sequence, self._config, produced, step.state))
                except ServingError as exc:
                    answers[index] = exc
        return [answer for answer in answers if answer is not None]

    def _groups(self, feeds: list[tuple[int, dict[str, np.ndarray]]]) -> list[list[tuple[int, dict[str, np.ndarray]]]]:
        """Steps that can share a run: with a batch dimension, those whose tensors have the same shapes."""
        if not self._config.batched:
            return [[item] for item in feeds]
        groups: dict[tuple[object, ...], list[tuple[int, dict[str, np.ndarray]]]] = {}
        for item in feeds:
            key = tuple(sorted((name, value.shape[1:], value.dtype.str) for name, value in item[1].items()))
            groups.setdefault(key, []).append(item)
        return list(groups.values())

    def _run_rows(self, feeds: list[dict[str, np.ndarray]], wanted: Sequence[str]) -> list[dict[str, np.ndarray]]:
        """One run of the model for ``feeds`` (one row each); each row's outputs."""
        if len(feeds) == 1:
            merged = feeds[0]
        else:
            merged = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
        with self._instances:
            result = self._inner.run(self._own, merged, wanted)
        if not self._config.batched:
            return [result]
        return [{alias: value[row : row + 1] for alias, value in result.items()} for row in range(len(feeds))]

    def close(self) -> None:
        self._inner.close()
