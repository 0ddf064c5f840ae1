"""The TorchServe platform: an unpacked model archive (``.mar``) served through its handler.

A version folder holding ``MAR-INF/MANIFEST.json`` (:mod:`workbench.platforms.torchserve_archives` unpacks a model
store's archives into such folders) loads as TorchServe's worker loads it:

- the manifest's ``handler`` is a Python file of the archive (``my_handler.py``, or ``my_handler.py:fn`` for a
  function), imported with the archive's modules importable by their plain names, at load time and at request time
  (:mod:`~workbench.platforms.torchserve_imports`: each archive's own, as TorchServe's worker per model gives them);
  else one of TorchServe's default handlers by name
  (``image_classifier``, ``image_segmenter``, ``object_detector``, ``text_classifier``: workbench's own, in
  :mod:`~workbench.platforms.torchserve_handlers`). A module with a function ``handle`` (or the one named after the
  colon) is a function entry point, called once as ``handle(None, context)`` to initialise; otherwise the module's
  one class is created and its ``initialize(context)`` called, and its ``handle(data, context)`` serves.
- ``handle(data, context)`` gets a list of requests, each a dict holding the request's input under ``data`` and
  ``body`` (bytes; parsed JSON for ``application/json``; text for ``text/*``), and returns one answer per request.

Custom handlers usually subclass ``ts.torch_handler.base_handler.BaseHandler``: that is the ``torchserve``
package's own class (``pip install torchserve``: its Python part imports without Java and without torchvision), not a
copy, so they behave exactly as under TorchServe; TorchServe's own default handler classes need torchvision and
captum, which a handler that subclasses them must have.

The servable's signatures: ``serving_default`` (what TF Serving's and v2's clients use) takes ``data`` (string [-1],
one request per element); ``torchserve`` (what TorchServe's frontend uses) takes ``data`` and ``request`` (string
[-1], per element a JSON object of what the frontend knows of the request: ``name`` of its input, ``content_type``,
``headers``). Both answer ``output`` (string: the answer as TorchServe encodes
it: bytes as they are, text as UTF-8, anything else as JSON), ``content_type`` (what the handler set, default
``application/json``) and ``status`` (int32: the status the handler set, default 200). Requests the batcher groups
reach one ``handle`` call, at most ``batchSize`` of them when the archive's ``model-config.yaml`` sets one.

Running an archive's Python (a handler file, a ``modelFile``) needs ``--allow_python_models``, as ``model.py`` does;
an archive of a default handler and a TorchScript ``.pt`` runs no Python of its own and loads without it.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.servable import PerRequestServable
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.platforms._user_code import require_python
from workbench.platforms.base import LoadPolicy
from workbench.platforms.torchserve_archives import ArchiveError, Manifest, read_manifest, read_source
from workbench.platforms.torchserve_imports import ArchiveModules
from workbench.runtime.version import __version__ as WORKBENCH_VERSION  # noqa: N812 - a constant here

log = logging.getLogger(__name__)

DATA = "data"
REQUEST = "request"
OUTPUT = "output"
CONTENT_TYPE = "content_type"
STATUS = "status"
JSON_TYPE = "application/json"
TORCHSERVE_SIGNATURE = "torchserve"

# An archive's modules live in a package of its own (workbench.platforms.torchserve_imports); while one loads, its
# plain names ("model") are in sys.modules for importlib's and pickle's sake, so loads take turns.
_import_lock = threading.Lock()


def places_on_gpu(policy: LoadPolicy) -> bool:
    """Whether archives load onto a GPU (a memory budget's estimate before a first load): TorchServe gives a worker
    GPU 0 wherever there is one, unless the archive's ``model-config.yaml`` says ``deviceType: cpu``."""
    from workbench.runtime.memory import gpu_seen

    return gpu_seen()


def signature(name: str = DEFAULT_SIGNATURE) -> Signature:
    """``serving_default`` takes the requests' inputs alone (what TF Serving's and v2's clients send);
    :data:`TORCHSERVE_SIGNATURE`, which TorchServe's frontend uses, also what it knows of each request."""
    text = np.dtype(object)
    inputs = {DATA: TensorSpec(DATA, DATA, text, (-1,))}
    if name == TORCHSERVE_SIGNATURE:
        inputs[REQUEST] = TensorSpec(REQUEST, REQUEST, text, (-1,))
    return Signature(
        name=name,
        method_name=PREDICT_METHOD,
        inputs=inputs,
        outputs={
            OUTPUT: TensorSpec(OUTPUT, OUTPUT, text, (-1,)),
            CONTENT_TYPE: TensorSpec(CONTENT_TYPE, CONTENT_TYPE, text, (-1,)),
            STATUS: TensorSpec(STATUS, STATUS, np.dtype(np.int32), (-1,)),
        },
    )


def request_meta(
    name: str = "body",
    content_type: str = "",
    headers: Mapping[str, str] | None = None,
    more: Mapping[str, bytes] | None = None,
) -> bytes:
    """The ``request`` input's element for one request, as TorchServe's frontend describes it to its worker:
    the input's ``name``, its content type, the request's headers, and ``more`` inputs of the request beside the
    ``data`` element (a gRPC request's other input entries; base64 in the JSON)."""
    meta: dict[str, Any] = {"name": name, "content_type": content_type, "headers": dict(headers or {})}
    if more:
        meta["more"] = {key: base64.b64encode(value).decode("ascii") for key, value in more.items()}
    return json.dumps(meta).encode()


def encode_answer(value: Any) -> bytes:
    """One handler answer as TorchServe's worker puts it on the wire: bytes as they are, text as UTF-8, a tensor
    as ``torch.save`` writes it, anything else as JSON (indented by 2, as TorchServe writes it)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        import torch

        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    try:
        return json.dumps(value, indent=2).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ServingError(Code.INTERNAL, f"Unable to serialize model output: {exc}") from None


def decode_input(value: bytes, content_type: str) -> Any:
    """A request's input as TorchServe's worker hands it over: JSON parsed, text decoded, else bytes."""
    if content_type == JSON_TYPE:
        try:
            return json.loads(value.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return value
    if content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


class TorchServeServable(PerRequestServable):
    """One loaded archive: its handler, its context, and one ``handle`` call at a time (a TorchServe worker)."""

    def __init__(
        self,
        name: str,
        version: int,
        path: str,
        manifest: Manifest,
        entry: Callable[[Any, Any], Any],
        context: Any,
        batch_size: int | None,
        modules: ArchiveModules,
    ) -> None:
        self.name, self.version, self.path = name, version, path
        self.manifest = manifest
        self.model_version = manifest.model_version  # TorchServe's version string ("1.0")
        self.model_url = str(read_source(path).get("modelUrl") or f"{name}.mar")
        self.batch_size = batch_size
        self.signatures = {name: signature(name) for name in (DEFAULT_SIGNATURE, TORCHSERVE_SIGNATURE)}
        self._entry = entry
        self._context = context
        self._modules = modules
        self._lock = threading.Lock()
        self._serial = 0

    def run_requests(
        self, signature: Signature, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
    ) -> list[dict[str, np.ndarray] | ServingError]:
        requests: list[tuple[Any, Mapping[str, Any]]] = []
        sizes = []
        for feed in feeds:
            data = feed[DATA]
            meta = feed.get(REQUEST)
            if data.ndim != 1 or (meta is not None and meta.shape != data.shape):
                raise ServingError(
                    Code.INVALID_ARGUMENT,
                    f'Input "{DATA}" is one element per request, and "{REQUEST}" (optional) one per element of it',
                )
            sizes.append(len(data))
            for i, value in enumerate(data):
                requests.append((value, _meta(meta[i]) if meta is not None else {}))
        answers = []
        step = self.batch_size or len(requests) or 1
        for start in range(0, len(requests), step):
            answers.extend(self._handle(requests[start : start + step]))
        results: list[dict[str, np.ndarray] | ServingError] = []
        at = 0
        for size in sizes:
            chunk = answers[at : at + size]
            at += size
            every = {
                OUTPUT: np.array([a[0] for a in chunk], dtype=object).reshape(size),
                CONTENT_TYPE: np.array([a[1] for a in chunk], dtype=object).reshape(size),
                STATUS: np.array([a[2] for a in chunk], dtype=np.int32).reshape(size),
            }
            results.append({k: every[k] for k in outputs})
        return results

    def _handle(self, requests: list[tuple[Any, Mapping[str, Any]]]) -> list[tuple[bytes, bytes, int]]:
        """One ``handle`` call on a batch: each answer encoded, with its content type and status."""
        from workbench.platforms.torchserve_context import RequestProcessor

        data = []
        processors = []
        for value, meta in requests:
            raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
            decoded = decode_input(raw, str(meta.get("content_type") or ""))
            name = str(meta.get("name") or "body")
            # TorchServe's worker names the input after its form field ("data") or "body" for a raw body; handlers
            # read row.get("data") or row.get("body"), so a request without a name gets both.
            row = {name: decoded} if meta else {"data": decoded, "body": decoded}
            more = meta.get("more")
            if isinstance(more, dict):  # a gRPC request's other input entries, as bytes (they have no content type)
                row.update({str(k): _base64(v) for k, v in more.items()})
            data.append(row)
            headers = meta.get("headers")
            processors.append(RequestProcessor(headers if isinstance(headers, dict) else {}))
        label = f"Model {self.name} version {self.model_version} ({self.manifest.handler})"
        with self._lock:  # one worker: TorchServe runs a worker's batches one after another
            self._serial += 1
            ids = {i: f"{self.name}-{self._serial}-{i}" for i in range(len(data))}
            context = self._context
            context.request_ids = ids
            context.request_processor = processors
            context.metrics.set_request_ids(ids)
            try:
                with self._modules.active():  # the handler may import its archive's modules now (lazily)
                    answer = self._entry(data, context)
            except MemoryError:
                raise ServingError(Code.RESOURCE_EXHAUSTED, f"{label}: Out of resources") from None
            except ServingError:
                raise
            except Exception as exc:  # noqa: BLE001 - the handler's failure is this batch's answer
                raise _prediction_error(label, exc) from None
            statuses = [context.get_response_status(i) for i in range(len(data))]
            types = [context.get_response_content_type(i) or JSON_TYPE for i in range(len(data))]
        if not isinstance(answer, list):
            raise ServingError(
                Code.UNAVAILABLE, f"{label}: Invalid model predict output: handle returned {type(answer).__name__}"
            )
        if len(answer) != len(data):
            raise ServingError(
                Code.UNAVAILABLE,
                f"{label}: number of batch response mismatched, expect: {len(data)}, got: {len(answer)}",
            )
        return [
            (encode_answer(value), content_type.encode(), int(status[0] or 200))
            for value, content_type, status in zip(answer, types, statuses, strict=True)
        ]

    def close(self) -> None:
        self._modules.close()


def _base64(value: Any) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise ServingError(Code.INVALID_ARGUMENT, f'Input "{REQUEST}": "more" holds base64 values') from None


def _meta(value: Any) -> Mapping[str, Any]:
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        meta = json.loads(text) if text else {}
    except (UnicodeDecodeError, ValueError):
        raise ServingError(Code.INVALID_ARGUMENT, f'Input "{REQUEST}" holds a JSON object per request') from None
    if not isinstance(meta, dict):
        raise ServingError(Code.INVALID_ARGUMENT, f'Input "{REQUEST}" holds a JSON object per request')
    return meta


# TorchServe's PredictionException(message, error_code) answers with its own status; workbench's codes for them.
_STATUS_CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    408: Code.DEADLINE_EXCEEDED,
    409: Code.ABORTED,
    429: Code.RESOURCE_EXHAUSTED,
    501: Code.UNIMPLEMENTED,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
    507: Code.RESOURCE_EXHAUSTED,
}


def _prediction_error(label: str, exc: Exception) -> ServingError:
    """A handler's exception: a PredictionException keeps its status; a ValueError or TypeError is a bad request
    (workbench's rule for user code); anything else is TorchServe's 503 "Prediction failed"."""
    error_code = getattr(exc, "error_code", None)
    if type(exc).__name__ == "PredictionException" and isinstance(error_code, int):
        code = _STATUS_CODES.get(error_code, Code.INTERNAL)
        return ServingError(code, f"{label}: {getattr(exc, 'message', exc)}")
    if isinstance(exc, (ValueError, TypeError)):
        return ServingError(Code.INVALID_ARGUMENT, f"{label}: {type(exc).__name__}: {exc}")
    return ServingError(Code.UNAVAILABLE, f"{label}: Prediction failed: {type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------------------ loading
def _handler_file(manifest: Manifest, folder: Path) -> tuple[Path | None, str | None]:
    """The archive's handler file and function name ("h.py:fn"), or (None, None) for a default handler's name."""
    module_part, _, function = manifest.handler.partition(":")
    module_name = module_part[:-3] if module_part.endswith(".py") else module_part
    module_name = module_name.split("/")[-1]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", module_name):
        return None, None
    candidate = folder / f"{module_name}.py"
    return (candidate if candidate.is_file() else None), (function or None)


def _model_yaml(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """The archive's ``model-config.yaml`` (torch-model-archiver's ``--config-file``), or {}."""
    if not manifest.config_file:
        return {}
    import yaml

    path = folder / manifest.config_file
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{path.name} of the archive cannot be read: {exc}") from None
    return document if isinstance(document, dict) else {}


def _batch_size(config: Mapping[str, Any], where: str) -> int | None:
    value = config.get("batchSize")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ServingError(Code.INVALID_ARGUMENT, f"{where}: batchSize must be a whole number >= 1, not {value!r}")
    return value


def load(name: str, version: int, path: str, policy: LoadPolicy) -> TorchServeServable:
    folder = Path(path)
    source = read_source(folder)
    archive = source.get("modelUrl") or folder.name
    if source.get("error"):
        raise ServingError(Code.INVALID_ARGUMENT, f"The model archive {source['error']}")
    try:
        manifest = read_manifest(folder)
    except ArchiveError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
    if manifest.runtime != "python":
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"{archive}: runtime {manifest.runtime!r} is not served (workbench runs archives of the python runtime)",
        )
    handler_file, function = _handler_file(manifest, folder)
    uses_python = handler_file is not None or bool(manifest.model_file)
    if uses_python:
        require_python(policy, folder / (handler_file.name if handler_file else manifest.model_file))
    else:
        from workbench.platforms.torchserve_handlers import DEFAULT_HANDLERS

        if _default_handler(manifest) not in DEFAULT_HANDLERS:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{archive}: handler {manifest.handler!r} is neither a file of the archive nor one of TorchServe's "
                f"default handlers ({', '.join(sorted(DEFAULT_HANDLERS))})",
            )
    config = _model_yaml(manifest, folder)
    batch_size = _batch_size(config, archive)
    import torch

    from workbench.platforms.torchserve_context import Context

    gpu = 0 if torch.cuda.is_available() and config.get("deviceType", "gpu") != "cpu" else None
    context = Context(name, str(folder.resolve()), manifest.document, batch_size or 1, gpu, WORKBENCH_VERSION, config)
    label = f"{archive} (model {name} version {manifest.model_version})"
    modules = ArchiveModules(folder)
    try:
        with _import_lock, modules.active():
            entry = _entry_point(manifest, modules, handler_file, function, context, label)
    except BaseException:
        modules.close()
        raise
    return TorchServeServable(name, version, path, manifest, entry, context, batch_size, modules)


def _default_handler(manifest: Manifest) -> str:
    """The default handler a manifest names ("image_classifier" for "image_classifier.py:handle")."""
    return manifest.handler.split(":")[0].removesuffix(".py")


def _entry_point(
    manifest: Manifest, modules: ArchiveModules, file: Path | None, function: str | None, context: Any, label: str
) -> Callable[[Any, Any], Any]:
    """Import the handler and initialise it (on the caller's thread, the archive's modules importable)."""
    if file is None:
        from workbench.platforms.torchserve_handlers import DEFAULT_HANDLERS

        handler = DEFAULT_HANDLERS[_default_handler(manifest)]()
        _initialise(lambda: handler.initialize(context), label)
        return handler.handle
    module = _import_handler(modules, file, label)
    name = function or "handle"
    if hasattr(module, name):
        entry = getattr(module, name)
        if not callable(entry):
            raise ServingError(Code.INVALID_ARGUMENT, f"{label}: {file.name}'s {name} is not a function")
        _initialise(lambda: entry(None, context), label)
        return entry  # type: ignore[no-any-return]
    from workbench.platforms.torchserve_handlers import model_classes

    classes = model_classes(module)
    if len(classes) != 1:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"{label}: Expected only one class in custom service code or a function entry point; {file.name} "
            f"defines {', '.join(c.__name__ for c in classes) or 'none'}",
        )
    service = _initialise(classes[0], label)
    if not callable(getattr(service, "handle", None)):
        raise ServingError(Code.INVALID_ARGUMENT, f"{label}: Expect handle method in class {classes[0].__name__}")
    initialize = getattr(service, "initialize", None)
    if callable(initialize):
        _initialise(lambda: initialize(context), label)
    return service.handle  # type: ignore[no-any-return]


def _import_handler(modules: ArchiveModules, file: Path, label: str) -> ModuleType:
    try:
        module = modules.import_module(file.stem)
    except Exception as exc:  # noqa: BLE001 - a broken handler fails its own load, never the server
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "ts":
            hint = " (handlers that import ts.* need the torchserve package's Python part: pip install torchserve)"
        elif isinstance(exc, ModuleNotFoundError) and exc.name in ("torchvision", "captum"):
            hint = f" ({exc.name} is not installed; TorchServe's own default handler classes need it)"
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{label}: importing handler {file.name} failed: {type(exc).__name__}: {exc}{hint}"
        ) from None
    return module


def _initialise(step: Callable[[], Any], label: str) -> Any:
    try:
        return step()
    except ServingError:
        raise
    except Exception as exc:  # noqa: BLE001 - a handler that cannot initialise fails its own load
        raise ServingError(
            Code.FAILED_PRECONDITION, f"{label}: the handler failed to initialize: {type(exc).__name__}: {exc}"
        ) from None
