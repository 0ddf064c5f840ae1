"""TorchServe's inference and management APIs, once for both of their transports (REST and gRPC).

:mod:`~workbench.frontends.torchserve_rest` and :mod:`~workbench.frontends.torchserve_grpc` parse their requests
and write their answers; what an API call does (which version a TorchServe version string names, what describe
shows, what register loads) is here, so the two cannot drift apart. Every prediction goes through the data plane and
every change through the control plane, so batching, versions, labels and metrics are the same as over the other
APIs. Errors are :class:`TorchServeError` (TorchServe's HTTP status and exception name) or the engine's
:class:`~workbench.core.errors.ServingError`; each transport answers them in its own shape.

workbench has no worker processes per model: a scale request is recorded and shown by describe (``minWorkers``,
``maxWorkers``), and requests run on the server's inference threads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.platforms import torchserve as ts_platform
from workbench.platforms import torchserve_archives as model_archives
from workbench.platforms.torchserve_download import download_archive
from workbench.runtime import archive_download

DEFAULT_LIMIT = 100  # TorchServe's list: at most 100 models a page
# The largest archive register-by-URL downloads (TorchServe has no limit; a server must have one).
MAX_ARCHIVE_BYTES = 16 * 1024**3
_STARTED = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())

# TorchServe's exception names (its clients read "type") by HTTP status, and workbench's codes to its statuses.
TYPES = {
    400: "BadRequestException",
    401: "InvalidKeyException",
    403: "InvalidModelVersionException",
    404: "ModelNotFoundException",
    405: "MethodNotAllowedException",
    408: "RequestTimeoutException",
    409: "ConflictStatusException",
    413: "BadRequestException",
    500: "InternalServerException",
    501: "MethodNotAllowedException",
    503: "ServiceUnavailableException",
    507: "InternalServerException",
}
STATUS = {
    Code.INVALID_ARGUMENT: 400,
    Code.FAILED_PRECONDITION: 400,
    Code.OUT_OF_RANGE: 400,
    Code.UNAUTHENTICATED: 401,
    Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404,
    Code.DEADLINE_EXCEEDED: 408,
    Code.ALREADY_EXISTS: 409,
    Code.ABORTED: 409,
    Code.RESOURCE_EXHAUSTED: 413,
    Code.UNIMPLEMENTED: 501,
    Code.UNAVAILABLE: 503,
}


def http_status(error: ServingError) -> int:
    """The HTTP status TorchServe's REST API answers an engine error with."""
    if error.code == Code.RESOURCE_EXHAUSTED and "larger than" not in error.message:
        return 503  # a full queue: TorchServe's "Model ... has no worker to serve inference request"
    return STATUS.get(error.code, 500)


class TorchServeError(Exception):
    """An answer in TorchServe's error shape: its HTTP status, its exception name and its message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A handler's answer to one request: the bytes, the content type and the status it set."""

    body: bytes
    content_type: str
    status: int


@dataclasses.dataclass
class _Workers:
    min_workers: int = 1
    max_workers: int = 1


class TorchServeApi:
    """The calls of TorchServe's two APIs, on the two planes."""

    def __init__(
        self,
        dataplane: Dataplane,
        controlplane: ControlPlane,
        token: str = "",
        model_store: str = "",
        max_archive_bytes: int = MAX_ARCHIVE_BYTES,
        allowed_urls: str = "",
    ) -> None:
        """``token``: the management token (management calls need it when set); ``model_store``: the model
        repository's folder, where register-by-URL downloads archives ("" or a remote one: no downloads);
        ``allowed_urls``: TorchServe's allowed_urls, the URLs a registration may name (--torchserve_allowed_urls)."""
        self.dataplane = dataplane
        self.controlplane = controlplane
        self.token = token
        self.model_store = model_store
        self.max_archive_bytes = max_archive_bytes
        self.allowed_urls = archive_download.allowed_urls(allowed_urls)
        self._workers: dict[str, _Workers] = {}
        self._download_lock = asyncio.Lock()

    # ------------------------------------------------------------------------------------- versions
    def known(self, model: str) -> None:
        # An unregistered model (its last version removed) is gone to TorchServe, though workbench keeps its config.
        if not self.dataplane.knows(model) or self.dataplane.emptied(model):
            raise TorchServeError(404, "ModelNotFoundException", f"Model not found: {model}")

    def version_number(self, model: str, version: str) -> int:
        """TorchServe's version string of ``model`` ("1.0"), or workbench's number, as the version number."""
        for number in self.dataplane.available_versions(model):
            if self.version_string(model, number) == version:
                return number
        if version.isdigit() and int(version) in self.dataplane.available_versions(model):
            return int(version)
        raise TorchServeError(
            404, "ModelVersionNotFoundException", f"Model version: {version} does not exist for model: {model}"
        )

    def version_string(self, model: str, number: int) -> str:
        with self.dataplane.handle(ModelSpec(model, number)) as servable:
            return str(getattr(servable, "model_version", number))

    def default_version(self, model: str) -> int:
        number = self.dataplane.default_version(model)
        if number is None:
            raise TorchServeError(404, "ModelNotFoundException", f"Model not found: {model}")
        return number

    async def _off_the_loop(self, change: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, change)

    # ------------------------------------------------------------------------------------- inference
    def healthy(self) -> bool:
        # Healthy while the server serves: a model that failed to load is one TorchServe would not have registered.
        return self.dataplane.readiness().status not in ("starting", "draining")

    async def predict(
        self,
        model: str,
        version: str | None,
        data: bytes,
        meta: bytes,
        protocol: str,
        timeout: float | None,
        key: str | None = None,
    ) -> Prediction:
        """One request through the archive's handler: ``data`` its input, ``meta`` what the frontend knows of it
        (:func:`workbench.platforms.torchserve.request_meta`)."""
        if self.dataplane.waits(model):  # else loaded() would return at once: skipped on every request
            await self.dataplane.loaded(model, timeout)
        self.known(model)
        number = self.version_number(model, version) if version else None
        spec = ModelSpec(model, version=number, key=key)
        with await self.dataplane.admit(spec, "predict", protocol, timeout) as call:
            if ts_platform.TORCHSERVE_SIGNATURE not in call.servable.signatures:
                raise TorchServeError(
                    400,
                    "BadRequestException",
                    f"Model {model} is not a TorchServe model archive: query it with the TF Serving (/v1) or v2 APIs",
                )
            feed = {ts_platform.DATA: np.array([data], dtype=object), ts_platform.REQUEST: np.array([meta], object)}
            wanted = [ts_platform.OUTPUT, ts_platform.CONTENT_TYPE, ts_platform.STATUS]
            _, outputs = await self.dataplane.predict(
                call, ts_platform.TORCHSERVE_SIGNATURE, feed, wanted, timeout=timeout
            )
        content_type = outputs[ts_platform.CONTENT_TYPE].reshape(-1)[0]
        return Prediction(
            bytes(outputs[ts_platform.OUTPUT].reshape(-1)[0]),
            _text(content_type) or ts_platform.JSON_TYPE,
            int(outputs[ts_platform.STATUS].reshape(-1)[0]),
        )

    # ------------------------------------------------------------------------------------- management
    def authorize(self, authorization: str) -> None:
        from workbench.frontends.auth import bearer_matches

        if self.token and not bearer_matches(authorization, self.token):
            raise TorchServeError(
                401,
                "InvalidKeyException",
                "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
            )

    def list_models(self, limit: int, token: int) -> dict[str, Any]:
        """A page of the models (by name) with their default version's archive: TorchServe's ListModelsResponse."""
        if limit > DEFAULT_LIMIT or limit < 0:
            limit = DEFAULT_LIMIT
        token = max(token, 0)
        names = sorted(n for n in self.dataplane.model_names() if self.dataplane.available_versions(n))
        last = min(token + limit, len(names))
        page: dict[str, Any] = {}
        if last < len(names):
            page["nextPageToken"] = str(last)
        models = []
        for name in names[token:last]:
            default = self.dataplane.default_version(name)
            url = self.describe_one(name, default)["modelUrl"] if default is not None else ""
            models.append({"modelName": name, "modelUrl": url})
        page["models"] = models
        return page

    async def describe(self, model: str, version: str | None, timeout: float | None) -> list[dict[str, Any]]:
        """TorchServe's DescribeModelResponse of the default version, of ``version``, or of every one ("all")."""
        await self.dataplane.loaded(model, timeout)
        self.known(model)
        if version == "all":
            numbers = sorted(self.dataplane.available_versions(model))
        else:
            numbers = [self.version_number(model, version) if version else self.default_version(model)]
        return [self.describe_one(model, number) for number in numbers]

    def describe_one(self, model: str, number: int) -> dict[str, Any]:
        with self.dataplane.handle(ModelSpec(model, number)) as servable:
            version = str(getattr(servable, "model_version", number))
            url = str(getattr(servable, "model_url", ""))
            manifest = getattr(servable, "manifest", None)
            archive_batch = getattr(servable, "batch_size", None)
        params = self.controlplane.batching_for(model)
        workers = self._workers.get(model, _Workers())
        ready = any(s.version == number and s.state.name == "AVAILABLE" for s in self.dataplane.model_status(model))
        return {
            "modelName": model,
            "modelVersion": version,
            "modelUrl": url,
            "runtime": manifest.runtime if manifest is not None else "python",
            "minWorkers": workers.min_workers,
            "maxWorkers": workers.max_workers,
            "batchSize": params.max_batch_size if params is not None else (archive_batch or 1),
            "maxBatchDelay": params.batch_timeout_micros // 1000 if params is not None else 0,
            "loadedAtStartup": True,
            "workers": [
                {
                    "id": str(os.getpid()),
                    "startTime": _STARTED,
                    "status": "READY" if ready else "UNLOADING",
                    "memoryUsage": 0,
                    "pid": os.getpid(),
                    "gpu": False,
                    "gpuUsage": "N/A",
                }
            ],
            "jobQueueStatus": {"remainingCapacity": 100, "pendingRequests": 0},
        }

    async def register(self, url: str, workers: int, model_name: str = "") -> str:
        """Load the version of an archive: one of the model store (its file name), or one an http(s) URL names,
        downloaded into the store first. Returns TorchServe's status message."""
        if not url:
            raise TorchServeError(400, "BadRequestException", "Parameter url is required.")
        if "://" in url:  # TorchServe checks a file or web URL against allowed_urls before anything else
            try:
                archive_download.check_allowed(url, self.allowed_urls)
            except archive_download.DownloadError as exc:
                raise TorchServeError(exc.status, exc.kind, exc.message) from None
        if archive_download.is_download_url(url):
            file_name = await self._download(url)
        elif "://" in url:
            raise TorchServeError(
                404,
                "ModelNotFoundException",
                f"Model not found at: {url} (workbench downloads http:// and https:// archive URLs; copy others into "
                "the model store and register them by file name)",
            )
        elif "/" in url or "\\" in url or not url.endswith(model_archives.ARCHIVE_SUFFIX):
            raise TorchServeError(
                400,
                "BadRequestException",
                f"Give an http(s) URL of a .mar or the file name of a .mar in the model store, not {url}",
            )
        else:
            file_name = url
        await self._off_the_loop(self.controlplane.rescan)
        found = model_archives.find_archive(file_name)
        if found is None:
            raise TorchServeError(404, "ModelNotFoundException", f"Model not found in model store: {url}")
        model, number, version = found
        if model_name and model_name != model:
            raise TorchServeError(
                400,
                "BadRequestException",
                f"{file_name} holds model {model}: workbench serves an archive under its manifest's modelName, "
                f"not {model_name}",
            )
        await self._off_the_loop(functools.partial(self.controlplane.load_version, model, number))
        self._workers[model] = _Workers(workers, max(workers, 1))
        return f'Model "{model}" Version: {version} registered with {workers} initial workers'

    async def _download(self, url: str) -> str:
        store = self.model_store
        if not store or "://" in store or not os.path.isdir(store):
            raise TorchServeError(
                400, "BadRequestException", "Archives are downloaded into a model store: serve a local folder of them"
            )
        async with self._download_lock:  # one download at a time: the store's file names are checked, then taken
            download = functools.partial(download_archive, url, store, self.max_archive_bytes, self.allowed_urls)
            try:
                name = str(await self._off_the_loop(download))
            except archive_download.DownloadError as exc:
                raise TorchServeError(exc.status, exc.kind, exc.message) from None
            path = os.path.join(store, name)
            manifest = model_archives.archive_manifest(Path(path))  # read when downloaded
            model = manifest.model_name or name[: -len(model_archives.ARCHIVE_SUFFIX)]
            served = model_archives.find_version(model, manifest.model_version)
            if served is not None and served != name:  # the store serves that version already, from another file
                os.remove(path)
                raise TorchServeError(
                    409,
                    "ConflictStatusException",
                    f"Model version {manifest.model_version} for model {model} already registered.",
                )
            return name

    async def unregister(self, model: str, version: str | None) -> str:
        """Remove a version (the default one without ``version``). As in TorchServe, the default version goes only
        when it is the model's last, and then the model goes with it."""
        self.known(model)
        number = self.version_number(model, version) if version else self.default_version(model)
        if len(self.dataplane.available_versions(model)) > 1 and number == self.dataplane.default_version(model):
            raise TorchServeError(
                403, "InvalidModelVersionException", f"Cannot remove default version for model {model}"
            )
        await self._off_the_loop(functools.partial(self.controlplane.remove_version, model, number))
        return f'Model "{model}" unregistered'

    def scale(self, model: str, version: str | None, min_workers: int, max_workers: int, synchronous: bool) -> str:
        """Record the workers asked for; TorchServe's message (the REST API answers 202 unless ``synchronous``)."""
        self.known(model)
        if version:
            self.version_number(model, version)
        if max_workers < min_workers:
            raise TorchServeError(400, "BadRequestException", "max_worker cannot be less than min_worker.")
        self._workers[model] = _Workers(min_workers, max_workers)
        if not synchronous:
            return "Processing worker updates..."
        message = f"Workers scaled to {min_workers} for model: {model}"
        return message + (f", version: {version}" if version else "")

    async def set_default(self, model: str, version: str) -> str:
        self.known(model)
        number = self.version_number(model, version)
        await self._off_the_loop(functools.partial(self.controlplane.promote, model, number))
        return f'Default version successfully updated for model "{model}" to "{version}"'


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
