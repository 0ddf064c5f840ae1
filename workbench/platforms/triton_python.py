"""Triton Python models: a ``model.py`` defining ``TritonPythonModel``, served as Triton's Python backend runs it.

Each of the config's instances is one ``TritonPythonModel`` (Triton runs each in a process of its own; here they
share this one), created once and given ``initialize(args)`` with Triton's arguments (``model_config`` as JSON text,
``model_instance_kind``, ``model_instance_name``, ``model_instance_device_id``, ``model_repository``,
``model_version``, ``model_name``). An instance runs one ``execute(requests)`` at a time, so the instance count is
the model's concurrency. Requests the batcher grouped (``dynamic_batching``) arrive as that many requests, each with
its own batch, never merged or padded, and each gets its own response back: a response with an ``error`` answers
its request alone with 400 / INVALID_ARGUMENT (or the code the ``TritonError`` gives). ``finalize()`` runs on unload.

``model.py`` is repository code: it loads only when the server allows Python models (``--allow_python_models``),
imported under a module name of its own per load; ``import triton_python_backend_utils as pb_utils`` finds
:mod:`workbench.platforms.triton_pb_utils` while any such model is loaded.
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from workbench.engine.servable import PerRequestServable
from workbench.engine.triton_config import TritonConfig, TritonTensor, config_json
from workbench.errors import Code, ServingError
from workbench.platforms import LoadPolicy, triton_pb_utils
from workbench.platforms._user_code import call_user, conform, forget_module, import_file, require_python
from workbench.platforms.triton import batch_rows, model_inputs, signature_of, wire_output
from workbench.signatures import Signature

log = logging.getLogger(__name__)

MODEL_CLASS = "TritonPythonModel"

# TritonError codes → workbench's; a response error without one (UNKNOWN) is the request's fault: 400.
_ERROR_CODES = {
    triton_pb_utils.TritonError.INTERNAL: Code.INTERNAL,
    triton_pb_utils.TritonError.NOT_FOUND: Code.NOT_FOUND,
    triton_pb_utils.TritonError.UNAVAILABLE: Code.UNAVAILABLE,
    triton_pb_utils.TritonError.UNSUPPORTED: Code.UNIMPLEMENTED,
    triton_pb_utils.TritonError.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    triton_pb_utils.TritonError.CANCELLED: Code.CANCELLED,
}

# ``triton_python_backend_utils`` is in sys.modules while at least one Triton Python model is loaded.
_users = 0
_users_lock = threading.Lock()


def _use_pb_utils() -> None:
    global _users
    with _users_lock:
        _users += 1
        sys.modules.setdefault(triton_pb_utils.MODULE_NAME, triton_pb_utils)


def _release_pb_utils() -> None:
    global _users
    with _users_lock:
        _users -= 1
        if _users == 0 and sys.modules.get(triton_pb_utils.MODULE_NAME) is triton_pb_utils:
            del sys.modules[triton_pb_utils.MODULE_NAME]


def load(name: str, version: int, path: str, policy: LoadPolicy, config: TritonConfig) -> PerRequestServable:
    file = config.model_file(path)
    require_python(policy, file)
    if not file.is_file():
        raise ServingError(Code.NOT_FOUND, f"No {file.name} in {path} (the model file {config.file} names)")
    if not config.inputs or not config.outputs:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{config.file}: a Python model's config must declare its inputs and outputs"
        )
    _use_pb_utils()
    module: types.ModuleType | None = None
    instances: list[Any] = []
    try:
        module = import_file(file, "triton", name, version)
        cls = getattr(module, MODEL_CLASS, None)
        if not isinstance(cls, type) or not callable(getattr(cls, "execute", None)):
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{file} defines no class {MODEL_CLASS} with execute(self, requests)"
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
        return TritonPythonServable(name, version, path, config, module, instances)
    except BaseException:
        _finalize(instances, f"{name} version {version}")
        forget_module(module)
        _release_pb_utils()
        raise


def _finalize(instances: Sequence[Any], label: str) -> None:
    for instance in instances:
        finalize = getattr(instance, "finalize", None)
        if callable(finalize):
            try:
                finalize()
            except Exception:  # noqa: BLE001 - an unload must finish; the model's own error is only logged
                log.exception("%s: finalize() failed", label)


class TritonPythonServable(PerRequestServable):
    def __init__(
        self, name: str, version: int, path: str, config: TritonConfig, module: types.ModuleType, instances: list[Any]
    ) -> None:
        self.name, self.version, self.path = name, version, path
        self._config = config
        self._module = module
        self._label = f"Model {name} version {version} ({MODEL_CLASS})"
        self._inputs = {t.name: t for t in config.inputs}
        self._outputs = {t.name: t for t in config.outputs}
        self.signatures = {"serving_default": signature_of(config, config.inputs, config.outputs)}
        self.model_config = config_json(config, name)
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

    def run_requests(
        self, signature: Signature, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
    ) -> list[dict[str, np.ndarray] | ServingError]:
        answers: list[dict[str, np.ndarray] | ServingError | None] = [None] * len(feeds)
        requests: list[triton_pb_utils.InferenceRequest] = []
        asked: list[int] = []  # which feed each request is
        for index, feed in enumerate(feeds):
            try:
                inputs = model_inputs(self._config, signature, self._inputs, feed)
            except ServingError as exc:  # this request's inputs are wrong; the others still run
                answers[index] = exc
                continue
            tensors = [triton_pb_utils.Tensor(alias, value) for alias, value in inputs.items()]
            requests.append(triton_pb_utils.InferenceRequest(tensors, outputs, self.name, self.version))
            asked.append(index)
        if requests:
            who = f"{self._label}.execute"
            with self._instance() as instance:
                responses = call_user(instance.execute, who, requests)
            if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
                got = f"{len(responses)} responses" if isinstance(responses, (list, tuple)) else repr(responses)
                raise ServingError(
                    Code.INTERNAL, f"{who} returned {got} for {len(requests)} requests: it must return one per request"
                )
            for index, response in zip(asked, responses, strict=True):
                answers[index] = self._answer(response, feeds[index], outputs, who)
        return [a for a in answers if a is not None]

    def _answer(
        self, response: Any, feed: Mapping[str, np.ndarray], outputs: Sequence[str], who: str
    ) -> dict[str, np.ndarray] | ServingError:
        if not isinstance(response, triton_pb_utils.InferenceResponse):
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
            tensor = triton_pb_utils.get_output_tensor_by_name(response, alias)
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
            _finalize(self._all, self._label)
        finally:
            forget_module(self._module)
            _release_pb_utils()
