"""MLServer's custom runtimes (``class MyModel(MLModel)`` named by a ``model-settings.json``), served unchanged.

:func:`load` reads the settings file (``implementation``: ``models.NumpyroModel`` is class ``NumpyroModel`` of
``models.py`` beside the file; ``parameters.uri`` relative to it), imports the runtime under
:mod:`workbench.mlserver_api.mlserver_imports` (so ``import mlserver`` is workbench's layer where the real package
is missing), makes the model from its settings and awaits its ``load()``. The servable answers v2 requests whole
(:class:`~workbench.core.whole_requests.WholeRequestServable`): a request becomes ``mlserver.types.InferenceRequest``
with its parameters and each input's (their ``content_type`` chooses the codecs), ``predict`` answers, and the
response's outputs and parameters are what the frontends send. ``predict_stream`` answers streams (REST
``infer_stream``/``generate_stream``, gRPC ``ModelStreamInfer`` in MLServer's message shape). Runtimes run on a loop of
their own (:mod:`workbench.platforms.model_loop`). A runtime's errors answer as MLServer answers them: an
``MLServerError`` with its status code, a ``ValueError``/``TypeError`` 400, anything else 500.

The runtime is Python from the repository: it loads only where the server runs repository code (allow_python).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.core.whole_requests import RequestedOutput, Tensor, WholeRequest, WholeRequestServable, WholeResponse
from workbench.platforms._user_code import forget_module, import_file, require_python
from workbench.platforms.base import LoadPolicy
from workbench.platforms.model_loop import ModelLoop
from workbench.protocol.v2_types import BF16, to_datatype, to_numpy_dtype

DECODED = "_decoded_payload"  # where MLServer's codecs keep what they decoded: never answered
# HTTP statuses of MLServerError → the engine's codes (frontends translate them back).
_CODES = {
    400: Code.INVALID_ARGUMENT,
    404: Code.NOT_FOUND,
    422: Code.INVALID_ARGUMENT,
    409: Code.ALREADY_EXISTS,
    501: Code.UNIMPLEMENTED,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}


def load(name: str, version: int, settings_file: Path, policy: LoadPolicy) -> WholeRequestServable:
    """The runtime ``settings_file`` names, loaded (its ``load()`` awaited) as version ``version`` of ``name``."""
    document = read_settings(settings_file)
    implementation = document["implementation"]
    module_path = implementation_file(settings_file, implementation)
    require_python(policy, module_path)
    from workbench.mlserver_api import mlserver_imports

    mlserver_imports.hold()  # released when the servable closes (or here, if the load fails)
    module: ModuleType | None = None
    model_loop: ModelLoop | None = None
    try:
        module = _import(module_path, settings_file.parent, name, version)
        runtime_class = getattr(module, implementation.rpartition(".")[2], None)
        api = _api()
        if not isinstance(runtime_class, type) or not issubclass(runtime_class, api.MLModel):
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{settings_file}: {implementation} is not an MLModel class in {module_path}"
            )
        settings = _settings(api, document, name, settings_file, runtime_class)
        model_loop = ModelLoop(name)
        servable = MLServerServable(name, version, settings_file, runtime_class, settings, model_loop, module)
        model_loop.call(servable.load_model())
        return servable
    except BaseException:
        if model_loop is not None:
            model_loop.close()
        forget_module(module)
        mlserver_imports.release()
        raise


def read_settings(settings_file: Path) -> dict[str, Any]:
    """The settings file as JSON, with the ``implementation`` a custom runtime needs."""
    try:
        document = json.loads(settings_file.read_text())
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"{settings_file} cannot be read: {exc}") from None
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{settings_file} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ServingError(Code.INVALID_ARGUMENT, f"{settings_file} must hold a JSON object")
    implementation = document.get("implementation")
    if not isinstance(implementation, str) or "." not in implementation:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'{settings_file} needs "implementation": the runtime\'s module and class, e.g. "models.MyModel"',
        )
    return document


def implementation_file(settings_file: Path, implementation: str) -> Path:
    """``a.b.Class`` → ``a/b.py`` (or ``a/b/__init__.py``) beside the settings file."""
    parts = implementation.split(".")[:-1]
    folder = settings_file.parent
    for candidate in (folder.joinpath(*parts).with_suffix(".py"), folder.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    raise ServingError(
        Code.NOT_FOUND,
        f"{settings_file}: the implementation {implementation} needs {'/'.join(parts)}.py beside the settings file",
    )


def _import(module_path: Path, folder: Path, name: str, version: int) -> ModuleType:
    """The runtime's module. Its folder is on ``sys.path`` while it imports, as MLServer's is, so a runtime split
    across files (``from helpers import ...``) imports its siblings."""
    added = str(folder) not in sys.path
    if added:
        sys.path.insert(0, str(folder))
    try:
        return import_file(module_path, "mlserver", name, version)
    finally:
        if added:
            sys.path.remove(str(folder))


def _api() -> Any:
    """The ``mlserver`` package runtimes import: the real one where installed, else workbench's layer."""
    import importlib

    return importlib.import_module("mlserver")


def _settings(api: Any, document: dict[str, Any], name: str, source: Path, runtime_class: type) -> Any:
    settings_module = sys.modules[api.ModelSettings.__module__]
    known = {k: v for k, v in document.items() if k != "implementation"}
    known.setdefault("name", name)
    try:
        settings = settings_module.ModelSettings(**known, implementation=document["implementation"])
    except ValueError as exc:  # pydantic's ValidationError
        raise ServingError(Code.INVALID_ARGUMENT, f"{source}: {exc}") from None
    settings._source = str(source)  # noqa: SLF001 - MLServer's record of the file, which parameters.uri is relative to
    if hasattr(settings, "_implementation"):
        settings._implementation = runtime_class  # noqa: SLF001
    return settings


def _signature(settings: Any) -> dict[str, Signature]:
    def specs(tensors: Sequence[Any]) -> dict[str, TensorSpec]:
        return {
            t.name: TensorSpec(t.name, t.name, _numpy_dtype(str(t.datatype)) or np.dtype(object), (-1, *t.shape[1:]))
            for t in tensors
        }

    inputs, outputs = specs(settings.inputs or ()), specs(settings.outputs or ())
    return {DEFAULT_SIGNATURE: Signature(DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs, batchable=False)}


class MLServerServable(WholeRequestServable):
    streams_as_responses = True

    def __init__(
        self,
        name: str,
        version: int,
        settings_file: Path,
        runtime_class: type,
        settings: Any,
        model_loop: ModelLoop,
        module: ModuleType,
    ) -> None:
        self.name = name
        self.version = version
        self.path = str(settings_file.parent)
        self.platform = "mlserver"
        self.signatures = _signature(settings)
        self._runtime_class = runtime_class
        self._settings = settings
        self._loop = model_loop
        self._module = module
        self._api = _api()
        self._model: Any = None
        self._closed = False
        self.v2_dialect = RuntimeVersionName(str(getattr(settings.parameters, "version", None) or ""))

    # ---------------------------------------------------------------------------------------- lifecycle
    async def load_model(self) -> None:
        """Make the model and await its ``load()`` (on the model's loop); one that says False does not serve."""
        who = f"{self._runtime_class.__name__}.load()"
        try:
            self._model = self._runtime_class(self._settings)
            ready = await self._model.load()
        except Exception as exc:  # noqa: BLE001 - the runtime's failure is the load's answer
            raise _runtime_error(who, exc) from None
        if ready is False:
            raise ServingError(Code.FAILED_PRECONDITION, f"{who} returned False: the model is not ready")
        self._model.ready = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        from workbench.mlserver_api import mlserver_imports

        try:
            if self._model is not None:
                # An unload that fails still frees the version.
                with contextlib.suppress(Exception):
                    self._loop.call(self._model.unload())
        finally:
            self._loop.close()
            forget_module(self._module)
            mlserver_imports.release()

    # ---------------------------------------------------------------------------------------- requests
    async def answer(self, request: WholeRequest) -> WholeResponse:
        return await self._loop.run(self._predict(request))

    async def _predict(self, request: WholeRequest) -> WholeResponse:
        payload = _inference_request(self._api.types, request)
        try:
            response = await self._model.predict(payload)
        except Exception as exc:  # noqa: BLE001
            raise _runtime_error(f"{self._runtime_class.__name__}.predict()", exc) from None
        return _whole_response(response, "predict()")

    async def answer_stream(self, requests: AsyncIterator[WholeRequest]) -> AsyncGenerator[WholeResponse, None]:
        """The responses of ``predict_stream`` to ``requests``. Both sides pull: the model's loop asks this loop for
        the next request when the runtime reads one, and this loop asks the model's for the next response."""
        import asyncio

        server_loop = asyncio.get_running_loop()
        types_module = self._api.types

        async def payloads() -> AsyncIterator[Any]:
            while True:
                future = asyncio.run_coroutine_threadsafe(_next_or_end(requests), server_loop)
                item = await asyncio.wrap_future(future)
                if item is _END:
                    return
                yield _inference_request(types_module, item)

        responses = self._model.predict_stream(payloads())
        who = f"{self._runtime_class.__name__}.predict_stream()"
        try:
            while True:
                try:
                    response = await self._loop.run(_next_or_end(responses))
                except Exception as exc:  # noqa: BLE001
                    raise _runtime_error(who, exc) from None
                if response is _END:
                    return
                yield _whole_response(response, "predict_stream()")
        finally:
            if not self._loop.loop.is_closed():
                await self._loop.run(responses.aclose())

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """A request of numpy inputs (TF Serving's APIs, warmup): each input a tensor of its datatype, and the outputs
        asked for (all the runtime answers when none are) as arrays of their shapes."""
        tensors = tuple(Tensor(a, to_datatype(v.dtype), v.shape, v.reshape(-1)) for a, v in inputs.items())
        response = self._loop.call(self._predict(WholeRequest(tensors, tuple(RequestedOutput(o) for o in outputs))))
        answered = {t.name: t for t in response.outputs}
        missing = [name for name in outputs if name not in answered]
        if missing:
            raise ServingError(Code.INTERNAL, f"{self._runtime_class.__name__}.predict() answered no {missing[0]!r}")
        return {
            t.name: t.data.reshape(t.shape) if t.data.size == math.prod(t.shape) else t.data
            for t in response.outputs
            if not outputs or t.name in outputs
        }


class RuntimeVersionName:
    """The v2 dialect of a custom runtime, for what v2 says of the version (metadata, the repository index): its
    settings' version string. Its requests are whole (:meth:`MLServerServable.answer`), never fed a signature."""

    def __init__(self, version_name: str) -> None:
        self.version_name = version_name

    def feed(self, request: Any) -> tuple[dict[str, np.ndarray], list[str]]:
        raise ServingError(Code.INTERNAL, "a custom MLServer runtime answers whole requests")

    def answer(
        self, request: Any, outputs: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        return dict(outputs), {}  # never asked: its answers are whole, encoded by the runtime's own codecs


_END = object()


async def _next_or_end(iterator: AsyncIterator[Any]) -> Any:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END


def _inference_request(types_module: Any, request: WholeRequest) -> Any:
    """``mlserver.types.InferenceRequest`` of a v2 request: each input's elements flat, as MLServer's gRPC gives."""
    parameters = types_module.Parameters
    return types_module.InferenceRequest(
        id=request.id,
        parameters=parameters(**request.parameters) if request.parameters else None,
        inputs=[
            types_module.RequestInput(
                name=tensor.name,
                shape=list(tensor.shape),
                datatype=tensor.datatype,
                data=tensor.data.tolist(),
                parameters=parameters(**tensor.parameters) if tensor.parameters else None,
            )
            for tensor in request.inputs
        ],
        outputs=[
            types_module.RequestOutput(
                name=output.name, parameters=parameters(**output.parameters) if output.parameters else None
            )
            for output in request.outputs
        ]
        or None,
    )


def _parameters(parameters: Any) -> dict[str, Any]:
    if parameters is None:
        return {}
    values = parameters.model_dump(exclude_none=True) if hasattr(parameters, "model_dump") else dict(parameters)
    values.pop(DECODED, None)
    return values


def _whole_response(response: Any, who: str) -> WholeResponse:
    """The runtime's ``InferenceResponse`` as the frontends send it; one that is not one is the runtime's bug."""
    if not hasattr(response, "outputs"):
        raise ServingError(Code.INTERNAL, f"{who} returned {type(response).__name__}, not an InferenceResponse")
    outputs = tuple(_tensor(output, who) for output in response.outputs)
    version = getattr(response, "model_version", None)
    return WholeResponse(outputs, getattr(response, "id", None), _parameters(response.parameters), version)


def _numpy_dtype(datatype: str) -> np.dtype[Any] | None:
    """The numpy type of a datatype MLServer's types name (v2's, BF16 aside, as MLServer has none), or None."""
    if datatype == BF16:
        return None
    try:
        return to_numpy_dtype(datatype)
    except ServingError:
        return None


def _tensor(output: Any, who: str) -> Tensor:
    datatype = str(getattr(output.datatype, "value", output.datatype))
    dtype = _numpy_dtype(datatype)
    if dtype is None:
        raise ServingError(Code.INTERNAL, f'{who}: output "{output.name}" has the unknown datatype {datatype!r}')
    elements = _flat(getattr(output.data, "root", output.data))
    try:
        if datatype == "BYTES":
            data = np.empty(len(elements), dtype=object)
            data[:] = [e.encode() if isinstance(e, str) else bytes(e) for e in elements]
        else:
            data = np.asarray([math.nan if e is None else e for e in elements], dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ServingError(Code.INTERNAL, f'{who}: output "{output.name}" is not {datatype}: {exc}') from None
    shape = tuple(int(d) for d in output.shape)
    return Tensor(output.name, datatype, shape, data, _parameters(output.parameters))


def _flat(root: Any) -> list[Any]:
    if isinstance(root, np.ndarray):
        return list(root.reshape(-1).tolist())
    if isinstance(root, (bytes, str)) or not isinstance(root, (list, tuple)):
        return [root]
    flat: list[Any] = []
    for item in root:
        flat.extend(_flat(item) if isinstance(item, (list, tuple, np.ndarray)) else [item])
    return flat


def _runtime_error(who: str, exc: Exception) -> ServingError:
    """A runtime's exception as MLServer answers it: an MLServerError with its status, ValueError/TypeError (pydantic's
    validation errors among them) 400, anything else 500."""
    if isinstance(exc, ServingError):
        return exc
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and type(exc).__name__ != "HTTPException":
        code = _CODES.get(status, Code.INVALID_ARGUMENT if 400 <= status < 500 else Code.INTERNAL)
        return ServingError(code, f"{who}: {exc}")
    if isinstance(exc, (ValueError, TypeError)):
        return ServingError(Code.INVALID_ARGUMENT, f"{who}: {type(exc).__name__}: {exc}")
    error = from_exception(exc)
    return ServingError(error.code, f"{who}: {error.message}")
