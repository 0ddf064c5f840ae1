"""``triton_python_backend_utils`` for Triton Python models served by workbench (``import ... as pb_utils``).

The part of Triton's module that a ``model.py`` written for Triton's Python backend uses: tensors, requests and
responses, errors, and the config helpers. It is importable under Triton's name only while a Triton Python model
is loaded (:func:`workbench.platforms.triton_python.load` puts it into ``sys.modules``), so nothing else in the
process sees a module by that name. Tensors live in this process as numpy arrays (strings as object arrays of
``bytes``, as Triton gives them); there is no DLPack, BLS or decoupled sending here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.engine.triton_config import DATA_TYPES

MODULE_NAME = "triton_python_backend_utils"


class TritonModelException(Exception):  # noqa: N818 - Triton's name
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
    """One client request as ``execute`` gets it."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        model_name: str = "",
        model_version: int = -1,
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._model_name, self._model_version = model_name, model_version
        self._request_id = request_id
        self._parameters = dict(parameters or {})

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def parameters(self) -> str:
        """The request's parameters as a JSON object (Triton's form); workbench passes none through yet."""
        return json.dumps(self._parameters)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int:
        return 0

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def is_cancelled(self) -> bool:
        return False


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
