"""Triton Python models: a ``model.py`` defining ``TritonPythonModel``, served as Triton's Python backend runs it.

Each of the config's instances is one ``TritonPythonModel`` (Triton runs each in a process of its own; here they
share this one), created once and given ``initialize(args)`` with Triton's arguments (``model_config`` as JSON text,
``model_instance_kind``, ``model_instance_name``, ``model_instance_device_id``, ``model_repository``,
``model_version``, ``model_name``). An instance runs one ``execute(requests)`` at a time, so the instance count is
the model's concurrency. Requests the batcher grouped (``dynamic_batching``) arrive as that many requests, each with
its own batch, never merged or padded, and each gets its own response back: a response with an ``error`` answers
its request alone with 400 / INVALID_ARGUMENT (or the code the ``TritonError`` gives). ``finalize()`` runs on unload,
once the ``execute`` calls under way have returned.

A **decoupled** model (``model_transaction_policy { decoupled: true }``) answers a request with 0..n responses, as in
Triton: ``execute([request])`` (each request alone, never batched) returns None, and the model sends the responses
through ``request.get_response_sender()``, then ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, from ``execute`` or from
threads of its own after it returned. ``execute`` runs on a thread of its own holding an instance (only while it
runs, as in Triton), while the dataplane takes the responses one at a time, as the client reads them
(:meth:`TritonPythonServable.run_decoupled`): ``send`` blocks while :data:`MAX_PENDING_RESPONSES` wait, and raises
once the request is over (client gone, deadline passed), when ``is_cancelled()`` says so. A response carrying an
error ends the request with it; so does ``execute`` raising, after what it sent before. Such a model is served over
streams only (gRPC ``ModelStreamInfer``, REST ``/generate_stream``), as workbench's own decoupled models are.

A model with **sequence_batching** runs through workbench's sequence batcher
(:mod:`workbench.batching.sequence_batcher`) with the config's strategy and idle time: each request of a sequence is one
``execute([request])`` with the config's control tensors among its inputs (``[1, 1]`` with a batch dimension, ``[1]``
without) and ``request.correlation_id()`` its sequence's id. The model keeps each sequence's state itself, keyed by that
id, as Triton's Python examples do, or leaves it to the server: with ``state [...]`` (implicit state) each state is
among the request's inputs and the response's tensor of its ``output_name`` is the sequence's next state
(:mod:`workbench.platforms.triton_sequences`).

``model.py`` is repository code: it loads only when the server allows Python models (``--allow_python_models``),
imported under a module name of its own per load; ``import triton_python_backend_utils as pb_utils`` finds
:mod:`workbench.platforms.triton_pb_utils` while any such model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config.batching_parameters import BatchingParameters
from workbench.config.triton_model_config import TritonConfig, TritonTensor, completed_batching, config_json
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls
from workbench.core.servable import FinalResponse, PerRequestServable, streams_only
from workbench.core.signatures import Signature
from workbench.platforms._user_code import call_user, conform, forget_module, import_file, require_python
from workbench.platforms.base import LoadPolicy
from workbench.platforms.triton_backends import config_from_json
from workbench.platforms.triton_pb_utils import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    ModelConfig,
    ResponseQueue,
    Tensor,
    TritonError,
    get_output_tensor_by_name,
    hold_in_sys_modules,
    release_from_sys_modules,
    response_sender,
)
from workbench.platforms.triton_sequences import States, check_one_row, next_states, server_tensors
from workbench.platforms.triton_tensors import batch_rows, model_inputs, output_labels, signature_of, wire_output

log = logging.getLogger(__name__)

MODEL_CLASS = "TritonPythonModel"
# A decoupled request's responses sent but not yet taken by its client: a model that sends more waits in send().
MAX_PENDING_RESPONSES = 4
# On unload, how long finalize() waits for execute calls still under way (a decoupled model's, told it is cancelled).
FINALIZE_WAIT_SECONDS = 30.0

# TritonError codes → workbench's; a response error without one (UNKNOWN) is the request's fault: 400.
_ERROR_CODES = {
    TritonError.INTERNAL: Code.INTERNAL,
    TritonError.NOT_FOUND: Code.NOT_FOUND,
    TritonError.UNAVAILABLE: Code.UNAVAILABLE,
    TritonError.UNSUPPORTED: Code.UNIMPLEMENTED,
    TritonError.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    TritonError.CANCELLED: Code.CANCELLED,
}


def load(name: str, version: int, path: str, policy: LoadPolicy, config: TritonConfig) -> PerRequestServable:
    file = config.model_file(path)
    require_python(policy, file)
    if not file.is_file():
        raise ServingError(Code.NOT_FOUND, f"No {file.name} in {path} (the model file {config.file} names)")
    hold_in_sys_modules()
    module: types.ModuleType | None = None
    instances: list[Any] = []
    try:
        module = import_file(file, "triton", name, version)
        cls = getattr(module, MODEL_CLASS, None)
        if not isinstance(cls, type) or not callable(getattr(cls, "execute", None)):
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{file} defines no class {MODEL_CLASS} with execute(self, requests)"
            )
        file_config = config
        if policy.auto_complete_config and callable(getattr(cls, "auto_complete_config", None)):
            config = _auto_completed(cls, config, name, file)
        if not config.inputs or not config.outputs:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{config.file}: a Python model's config must declare its inputs and outputs (or its "
                f"{MODEL_CLASS}.auto_complete_config add them)",
            )
        model_config = json.dumps(config_json(config, name))
        for index in range(config.instance_count):
            instance = call_user(cls, f"Creating {MODEL_CLASS} in {file}")
            instances.append(instance)
            initialize = getattr(instance, "initialize", None)
            if callable(initialize):
                args = {
                    "model_config": model_config,
                    "model_instance_kind": "CPU",
                    "model_instance_name": f"{name}_{index}",
                    "model_instance_device_id": "0",
                    "model_repository": str(Path(path).parent),
                    "model_version": str(version),
                    "model_name": name,
                }
                call_user(initialize, f"{MODEL_CLASS}.initialize in {file}", args)
        servable = TritonPythonServable(name, version, path, config, module, instances)
        servable.completed_batching = completed_batching(file_config, config)  # set by auto_complete_config
        return servable
    except BaseException:
        _finalize(instances, f"{name} version {version}")
        forget_module(module)
        release_from_sys_modules()
        raise


def _auto_completed(cls: Any, config: TritonConfig, name: str, file: Path) -> TritonConfig:
    """Triton's Python auto-complete: ``auto_complete_config(auto_complete_model_config)``, a static method of the
    model's class, completes the config (inputs, outputs, max_batch_size, dynamic batching, transaction policy)
    before any instance is made; the completed config is read as the file is. Batching parameters come from the
    file (read before the model loads): dynamic batching the method sets is the servable's ``completed_batching``."""
    who = f"{MODEL_CLASS}.auto_complete_config in {file}"
    given = ModelConfig(config_json(config, name))
    completed = call_user(cls.auto_complete_config, who, given)
    if not isinstance(completed, ModelConfig):
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{who} returned {type(completed).__name__}: it must return the config it was given"
        )
    return config_from_json(completed.as_dict(), config.file)


def _finalize(instances: Sequence[Any], label: str) -> None:
    for instance in instances:
        finalize = getattr(instance, "finalize", None)
        if callable(finalize):
            try:
                finalize()
            except Exception:  # an unload must finish; the model's own error is only logged
                log.exception("%s: finalize() failed", label)


class TritonPythonServable(PerRequestServable):
    # Batching auto_complete_config asked for where the file asked for none (see workbench.platforms.triton).
    completed_batching: BatchingParameters | None = None

    def __init__(
        self, name: str, version: int, path: str, config: TritonConfig, module: types.ModuleType, instances: list[Any]
    ) -> None:
        self.name, self.version, self.path = name, version, path
        self._config = config
        self._module = module
        self._label = f"Model {name} version {version} ({MODEL_CLASS})"
        self._inputs = {t.name: t for t in config.inputs}
        self._outputs = {t.name: t for t in config.outputs}
        signature = signature_of(config, config.inputs, config.outputs)
        self.decoupled = config.decoupled
        if self.decoupled:  # each request is its own execute: requests share no batch
            signature = dataclasses.replace(signature, batchable=False)
        self.signatures = {"serving_default": signature}
        if config.sequence_batching is not None:
            self.sequence = config.sequence_batching.settings
        self.model_config = config_json(config, name)
        self.labels = output_labels(config, config.outputs)
        self._all = list(instances)
        # Free instances: a run takes one (waiting while all are busy) and gives it back.
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for instance in instances:
            self._free.put(instance)

    @contextmanager
    def _instance(self) -> Iterator[Any]:
        instance = self._free.get()
        try:
            yield instance
        finally:
            self._free.put(instance)

    # ------------------------------------------------------------------------------------ requests
    def _request(
        self,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        controls: Controls | None = None,
        sender: InferenceResponseSender | None = None,
        states: States | None = None,
    ) -> InferenceRequest:
        """The request ``execute`` gets: the feed as the model takes it, a sequence's control tensors and implicit
        states, a sender."""
        inputs = model_inputs(self._config, signature, self._inputs, feed)
        correlation_id: int | str = 0
        if controls is not None and self._config.sequence_batching is not None:
            check_one_row(feed, self._config, self.name)
            inputs.update(server_tensors(self._config.sequence_batching, self._config, controls, states))
            correlation_id = controls.correlation_id
        tensors = [Tensor(alias, value) for alias, value in inputs.items()]
        return InferenceRequest(
            tensors, outputs, self.name, self.version, correlation_id=correlation_id, response_sender=sender
        )

    def _execute(self, requests: list[InferenceRequest]) -> Sequence[Any]:
        """``execute(requests)`` on a free instance: one response per request."""
        who = f"{self._label}.execute"
        with self._instance() as instance:
            responses = call_user(instance.execute, who, requests)
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = f"{len(responses)} responses" if isinstance(responses, (list, tuple)) else repr(responses)
            raise ServingError(
                Code.INTERNAL, f"{who} returned {got} for {len(requests)} requests: it must return one per request"
            )
        return responses

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        if self.decoupled:
            raise streams_only(self._label)
        return super().run(signature, inputs, outputs)

    def run_requests(
        self, signature: Signature, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
    ) -> list[dict[str, np.ndarray] | ServingError]:
        answers: list[dict[str, np.ndarray] | ServingError | None] = [None] * len(feeds)
        requests: list[InferenceRequest] = []
        asked: list[int] = []  # which feed each request is
        for index, feed in enumerate(feeds):
            try:
                requests.append(self._request(signature, feed, outputs))
            except ServingError as exc:  # this request's inputs are wrong; the others still run
                answers[index] = exc
                continue
            asked.append(index)
        if requests:
            who = f"{self._label}.execute"
            responses = self._execute(requests)
            for index, response in zip(asked, responses, strict=True):
                answers[index] = self._answer(response, feeds[index], outputs, who)
        return [a for a in answers if a is not None]

    def run_step(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        state: Any,
        controls: Controls,
    ) -> tuple[dict[str, np.ndarray], Any]:
        """One request of a sequence: ``execute([request])`` with the control tensors, the implicit states and the
        sequence's id; the response's state outputs are the sequence's next states (None: the model keeps its
        sequences' state itself, keyed by ``correlation_id()``)."""
        sequence = self._config.sequence_batching
        assert sequence is not None
        (response,) = self._execute([self._request(signature, inputs, outputs, controls, states=state)])
        answer = self._answer(response, inputs, outputs, f"{self._label}.execute")
        if isinstance(answer, ServingError):
            raise answer
        produced = {
            name: tensor.as_numpy()
            for name in sequence.state_outputs
            if (tensor := get_output_tensor_by_name(response, name)) is not None
        }
        return answer, next_states(sequence, self._config, produced, state)

    def run_decoupled(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        """A decoupled request's responses, each converted as ``execute``'s answers are (see the module's doc)."""
        return _DecoupledRun(self, signature, inputs, outputs)

    def _start_decoupled(
        self,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        responses: ResponseQueue,
    ) -> None:
        """Run ``execute`` for a decoupled request on a thread of its own; its responses go to ``responses``."""
        who = f"{self._label}.execute"

        def dropped() -> None:  # nothing holds the sender any more: no final flag can come
            responses.fail(
                ServingError(
                    Code.INTERNAL,
                    f"{who} let go of the request's response sender without sending "
                    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
                )
            )

        sender = response_sender(responses, dropped)
        request = self._request(signature, feed, outputs, sender=sender)
        del sender  # the request holds it: once the model lets go of both, the request ends
        thread = threading.Thread(target=self._execute_decoupled, args=([request], responses), name=who, daemon=True)
        del request
        thread.start()

    def _execute_decoupled(self, requests: list[InferenceRequest], responses: ResponseQueue) -> None:
        who = f"{self._label}.execute"
        failure: ServingError | None = ServingError(Code.INTERNAL, f"{who} did not return")
        try:
            with self._instance() as instance:
                if responses.cancelled:  # the client left while the request waited for an instance
                    return
                returned = call_user(instance.execute, who, list(requests))  # the model may keep its list
            failure = None
            if returned is not None:
                failure = ServingError(
                    Code.INTERNAL,
                    f"{who} returned {type(returned).__name__}: a decoupled model's execute returns None and sends "
                    "its responses with request.get_response_sender()",
                )
        except ServingError as exc:
            failure = exc
        finally:
            if failure is not None:
                responses.fail(failure)
            # The model's own threads may still hold the request; this thread lets go of it (after saying why the
            # request failed, if it did: letting go may be what ends it).
            requests.clear()

    # ------------------------------------------------------------------------------------- answers
    def _answer(
        self, response: Any, feed: Mapping[str, np.ndarray], outputs: Sequence[str], who: str
    ) -> dict[str, np.ndarray] | ServingError:
        if not isinstance(response, InferenceResponse):
            return ServingError(
                Code.INTERNAL, f"{who} returned {type(response).__name__}, not pb_utils.InferenceResponse"
            )
        error = response.error()
        if error is not None:
            code = _ERROR_CODES.get(error.code(), Code.INVALID_ARGUMENT)
            return ServingError(code, f"{self.name}: {error.message()}")
        rows = batch_rows(feed, self._config)
        answer: dict[str, np.ndarray] = {}
        for alias in outputs:
            tensor = get_output_tensor_by_name(response, alias)
            if tensor is None:
                given = ", ".join(t.name() for t in response.output_tensors()) or "none"
                return ServingError(Code.INTERNAL, f'{who} gave no output "{alias}" (it gave {given})')
            try:
                answer[alias] = self._wire(tensor.as_numpy(), self._outputs[alias], rows, who)
            except ServingError as exc:  # this response's fault: the others of the batch still answer
                return exc
        return answer

    def _wire(self, value: np.ndarray, tensor: TritonTensor, rows: int | None, who: str) -> np.ndarray:
        spec = self.signatures["serving_default"].outputs[tensor.name]
        array = wire_output(conform(spec, value, who), tensor, self._config, rows)
        if rows is not None and (array.ndim == 0 or array.shape[0] != rows):
            raise ServingError(
                Code.INTERNAL,
                f'{who}: output "{tensor.name}" has shape {list(array.shape)}; its batch dimension must be the '
                f"request's {rows}",
            )
        return array

    def close(self) -> None:
        try:
            self._wait_for_executes()
            _finalize(self._all, self._label)
        finally:
            forget_module(self._module)
            release_from_sys_modules()

    def _wait_for_executes(self) -> None:
        """Take every instance back before finalize: an ``execute`` still runs where a decoupled request's client left
        (it was told: its sends raise, ``is_cancelled()`` is true). A model that never returns is finalized anyway."""
        deadline = time.monotonic() + FINALIZE_WAIT_SECONDS
        for taken in range(len(self._all)):
            try:
                self._free.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                log.warning(
                    "%s: %d execute calls still run after %gs; finalizing anyway",
                    self._label,
                    len(self._all) - taken,
                    FINALIZE_WAIT_SECONDS,
                )
                return


class _DecoupledRun:
    """One decoupled request as the dataplane iterates it: ``execute`` starts on the first ``next`` (on a worker
    thread; creating this on the event loop does nothing), and each ``next`` waits for the model's next response.

    ``close()`` (the client left, the stream ended early) and ``cancel()`` (the same, said from the event loop while a
    ``next`` still waits) end the request: the responses not taken are dropped, the model's sends raise from then on
    and ``is_cancelled()`` is true. A response with an error, or ``execute`` failing, ends it the same way.
    """

    def __init__(
        self,
        servable: TritonPythonServable,
        signature: Signature,
        feed: Mapping[str, np.ndarray],
        outputs: Sequence[str],
    ) -> None:
        self._servable = servable
        self._signature, self._feed, self._outputs = signature, feed, outputs
        self._responses = ResponseQueue(MAX_PENDING_RESPONSES)
        self._started = False
        self._over = False

    def __iter__(self) -> _DecoupledRun:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._over or self._responses.cancelled:
            raise StopIteration
        if not self._started:
            self._started = True
            self._servable._start_decoupled(self._signature, self._feed, self._outputs, self._responses)  # noqa: SLF001 - the servable's own request
        try:
            response, final = self._responses.take()
        except BaseException:
            self._over = True
            raise
        self._over = final
        if response is None:  # the final flag alone (or cancelled while waiting)
            raise StopIteration
        answer = self._servable._answer(response, self._feed, self._outputs, f"{self._servable._label}.execute")  # noqa: SLF001 - the servable's own request
        if isinstance(answer, ServingError):  # the request ends with its error: the model hears so on its next send
            self.cancel()
            raise answer
        return FinalResponse(answer) if final else answer

    def cancel(self) -> None:
        self._over = True
        self._responses.cancel()

    def close(self) -> None:
        self.cancel()
