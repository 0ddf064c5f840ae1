"""``triton_python_backend_utils`` for Triton Python models served by workbench (``import ... as pb_utils``).

The part of Triton's module that a ``model.py`` written for Triton's Python backend uses: tensors, requests and
responses, errors, the config helpers, and a decoupled model's response sender (``request.get_response_sender()``,
``InferenceResponseSender.send``, ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``). It is importable under Triton's name
only while a Triton Python model is loaded (:func:`workbench.platforms.triton_python.load` holds it in
``sys.modules`` with :func:`hold_in_sys_modules`), so nothing else in the process sees a module by that name.
Tensors live in this process as numpy arrays (strings as object arrays of ``bytes``, as Triton gives
them); there is no DLPack or BLS here.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.config.triton_model_config import DATA_TYPES

MODULE_NAME = "triton_python_backend_utils"

# InferenceResponseSender.send's flags: this response (or, alone, this call) is the request's last.
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonModelException(Exception):  # Triton's name
    """What Triton's stub raises for a failed call into the server (Python models catch it by this name)."""


class TritonError:
    """An error for one request: ``InferenceResponse(error=TritonError("..."))`` answers that request only."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = UNKNOWN) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r})"


class Tensor:
    """A named numpy array (Triton's ``pb_utils.Tensor``)."""

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(name, str) or not name:
            raise TritonModelException(f"A tensor's name must be a non-empty string, not {name!r}")
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._array.dtype} {list(self._array.shape)})"


class InferenceRequest:
    """One client request as ``execute`` gets it; ``correlation_id`` is its sequence's id (a sequence model's),
    ``response_sender`` where a decoupled model sends its responses."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        model_name: str = "",
        model_version: int = -1,
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
        correlation_id: int | str = 0,
        response_sender: InferenceResponseSender | None = None,
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._model_name, self._model_version = model_name, model_version
        self._request_id = request_id
        self._parameters = dict(parameters or {})
        self._correlation_id = correlation_id
        self._sender = response_sender

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def parameters(self) -> str:
        """The request's parameters as a JSON object (Triton's form); workbench passes none through yet."""
        return json.dumps(self._parameters)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        """The id of the sequence the request belongs to, as the client sent it (a number or a string); 0 for a
        model without sequence batching."""
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def get_response_sender(self) -> InferenceResponseSender:
        """Where a decoupled model sends this request's responses (the same sender every call)."""
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for decoupled models (model_transaction_policy { decoupled: true }); "
                "this model answers each request with the response execute returns for it"
            )
        return self._sender

    def is_cancelled(self) -> bool:
        """Whether the request is over before its final response: its client left or its deadline passed."""
        return self._sender is not None and self._sender.is_cancelled()


class InferenceResponse:
    """``execute``'s answer to one request: its output tensors, or an error for that request."""

    def __init__(self, output_tensors: Sequence[Tensor] | None = None, error: TritonError | None = None) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class ModelConfig:
    """What Triton's ``TritonPythonModel.auto_complete_config(auto_complete_model_config)`` gets: the model's config
    as Triton's JSON, completed by the model before it loads (``workbench.platforms.triton_python``)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = json.loads(json.dumps(config))  # a copy the model may change

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        given = int(self._config.get("max_batch_size", 0) or 0)
        if given and given != max_batch_size:
            raise TritonModelException(
                f"configuration specified max_batch_size {given}, but in auto-complete-config function for model "
                f"'{self._config.get('name', '')}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: Mapping[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: Mapping[str, Any]) -> None:
        """A tensor the config does not declare is added; one it declares must agree (Triton refuses otherwise)."""
        if not isinstance(tensor, Mapping) or "name" not in tensor:
            raise TritonModelException(f"auto-complete-config: an {kind} must be a dict with a 'name'")
        tensors = self._config.setdefault(kind, [])
        existing = next((t for t in tensors if t.get("name") == tensor["name"]), None)
        if existing is None:
            tensors.append(dict(tensor))
            return
        for key in ("data_type", "dims"):
            if (
                key in tensor
                and key in existing
                and existing[key]
                and list(np.atleast_1d(existing[key])) != list(np.atleast_1d(tensor[key]))
            ):
                raise TritonModelException(
                    f"model '{self._config.get('name', '')}', tensor '{tensor['name']}': the model's {key} "
                    f"{tensor[key]} does not match the config's {existing[key]}"
                )


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input ``name``; None when it was not sent (an optional input)."""
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of ``model_config["input"]`` (the JSON ``initialize`` got, loaded) named ``name``."""
    return next((dict(t) for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((dict(t) for t in model_config.get("output", []) if t.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the config (the JSON ``initialize`` got, loaded) makes the model decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> type:
    """``"TYPE_FP32"`` → ``numpy.float32`` (``TYPE_STRING`` → ``numpy.object_``)."""
    try:
        return DATA_TYPES[triton_type_string].type
    except KeyError:
        raise TritonModelException(f"{triton_type_string} is not a Triton data type workbench serves") from None


def numpy_to_triton_type(dtype: Any) -> str | None:
    wanted = np.dtype(dtype)
    if wanted.kind in "SU":
        wanted = np.dtype(object)
    return next((name for name, known in DATA_TYPES.items() if known == wanted), None)


# ------------------------------------------------------------------------------------------ decoupled models
class ResponseQueue:
    """One decoupled request's responses on their way from the model's ``send`` to the client (workbench's side).

    Bounded: ``put`` blocks while ``bound`` responses wait, so a model is held back by a slow client rather than
    filling memory. The request is over once the final flag was sent, the run failed (:meth:`fail`), or the client
    left (:meth:`cancel`); a send after that raises, and one blocked in ``put`` is woken to raise.
    """

    def __init__(self, bound: int) -> None:
        self._items: collections.deque[tuple[InferenceResponse | None, bool]] = collections.deque()
        self._bound = max(1, bound)
        self._changed = threading.Condition()
        self._final = False  # the final flag was sent: nothing may follow
        self._cancelled = False  # the client left, or the run ended early
        self._failure: BaseException | None = None  # the run's error, raised after what was sent before it

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def put(self, response: InferenceResponse | None, final: bool) -> None:
        """Queue a response (None: the final flag alone), waiting while the queue is full."""
        with self._changed:
            while len(self._items) >= self._bound and not self._over():
                self._changed.wait()
            if self._cancelled:
                raise TritonModelException("Unable to send the response: the request was cancelled")
            if self._over():
                raise TritonModelException(
                    "Unable to send the response: the request is over (its final response was sent, or its run failed)"
                )
            self._items.append((response, final))
            self._final = final
            self._changed.notify_all()

    def take(self) -> tuple[InferenceResponse | None, bool]:
        """The next response and whether it is the last (``(None, True)``: the final flag alone, or the request was
        cancelled), waiting for the model; the run's failure is raised once what came before it was taken."""
        with self._changed:
            while not self._items and self._failure is None and not self._cancelled:
                self._changed.wait()
            if self._items:
                item = self._items.popleft()
                self._changed.notify_all()
                return item
            if self._failure is not None and not self._cancelled:
                failure, self._failure = self._failure, None
                self._cancelled = True
                raise failure
            return None, True

    def fail(self, error: BaseException) -> None:
        """End the request with ``error`` after what was already sent; nothing once it is over."""
        with self._changed:
            if not self._over():
                self._failure = error
                self._changed.notify_all()

    def cancel(self) -> None:
        """The request is over (the client left): what waits is dropped, and every send from now on raises."""
        with self._changed:
            self._cancelled = True
            self._items.clear()
            self._changed.notify_all()

    def _over(self) -> bool:
        return self._final or self._cancelled or self._failure is not None


class InferenceResponseSender:
    """Where a decoupled model sends one request's responses (``request.get_response_sender()``).

    ``send`` 0..n responses, then once with ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (with a last response, or
    alone), from ``execute`` or from a thread of the model's own after ``execute`` returned. ``send`` waits while the
    client has not taken the responses before it (a bounded queue), and raises :class:`TritonModelException` once
    the request is over: its final flag was sent, or it was cancelled (the client left, its deadline passed, an
    earlier response carried an error), which :meth:`is_cancelled` then says.
    """

    def __init__(self, responses: ResponseQueue) -> None:
        self._responses = responses

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"send() takes a pb_utils.InferenceResponse, not {type(response).__name__}")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException(f"send() flags must be 0 or TRITONSERVER_RESPONSE_COMPLETE_FINAL, not {flags!r}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is None and not final:
            raise TritonModelException("send() needs a response, unless flags is TRITONSERVER_RESPONSE_COMPLETE_FINAL")
        self._responses.put(response, final)

    def is_cancelled(self) -> bool:
        return self._responses.cancelled


def response_sender(responses: ResponseQueue, on_dropped: Any) -> InferenceResponseSender:
    """A sender for ``responses``; ``on_dropped()`` runs once the model lets go of it (nothing references it any
    more), so that a request whose model will never send its final flag ends instead of waiting forever."""
    sender = InferenceResponseSender(responses)
    weakref.finalize(sender, on_dropped).atexit = False
    return sender


# Held under MODULE_NAME in sys.modules while at least one Triton Python model is loaded. The module puts itself
# there (it names itself by ``__name__``), so the platform that loads such models needs only these two functions.
_holders = 0
_holders_lock = threading.Lock()


def hold_in_sys_modules() -> None:
    """Make this module importable as ``triton_python_backend_utils`` (one more loaded model uses it)."""
    global _holders
    with _holders_lock:
        _holders += 1
        sys.modules.setdefault(MODULE_NAME, sys.modules[__name__])


def release_from_sys_modules() -> None:
    """One loaded model less uses it; with none left, the name ``triton_python_backend_utils`` is gone again."""
    global _holders
    with _holders_lock:
        _holders -= 1
        if _holders == 0 and sys.modules.get(MODULE_NAME) is sys.modules[__name__]:
            del sys.modules[MODULE_NAME]
