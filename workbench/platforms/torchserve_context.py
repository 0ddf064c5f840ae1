"""The ``context`` a TorchServe handler gets: TorchServe's ``ts.context.Context``, attribute for attribute.

Handlers read ``context.system_properties`` (``model_dir``, ``gpu_id``, ``batch_size``, ``server_name``…),
``context.manifest``, request headers (``get_request_header(idx, name)``), set per-request answers
(``set_response_status``, ``set_response_content_type``) and record metrics (``context.metrics.add_time``…). This
class is written here rather than taken from the ``torchserve`` package so that archives with the built-in default
handlers serve without it; it keeps the same names and behaviour, so handlers written against
``ts.context.Context`` (and the real ``ts.torch_handler.base_handler.BaseHandler``, when installed) work with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

SERVER_NAME = "MMS"  # what TorchServe's own Context says (its frontend's ancestor, Multi Model Server)


class RequestProcessor:
    """One request's headers in, and the status and headers of its answer out (``ts.context.RequestProcessor``)."""

    def __init__(self, request_header: Mapping[str, str]) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = dict(request_header)

    def get_request_property(self, key: str) -> str | None:
        return self._request_header.get(key)

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)

    def get_request_properties(self) -> dict[str, str]:
        return self._request_header


class _Metric:
    """A metric a handler asked for by name; its updates go to the debug log (workbench's own metrics count
    every request already)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def add_or_update(self, value: Any, dimension_values: Any = None, request_id: Any = None) -> None:
        log.debug("handler metric %s: %s", self.name, value)

    def update(self, value: Any, request_id: Any = None, dimensions: Any = None) -> None:
        log.debug("handler metric %s: %s", self.name, value)


class HandlerMetrics:
    """``context.metrics``: the calls of TorchServe's metrics cache (``add_time``, ``add_counter``…), logged."""

    def __init__(self) -> None:
        self.request_ids: Any = None

    def set_request_ids(self, request_ids: Any) -> None:
        self.request_ids = request_ids

    def _add(self, name: str, value: Any) -> _Metric:
        log.debug("handler metric %s: %s", name, value)
        return _Metric(name)

    def add_metric(self, name: str, value: Any, *args: Any, **kwargs: Any) -> _Metric:
        return self._add(name, value)

    def add_counter(self, name: str, value: Any, *args: Any, **kwargs: Any) -> _Metric:
        return self._add(name, value)

    def add_time(self, name: str, value: Any, *args: Any, **kwargs: Any) -> _Metric:
        return self._add(name, value)

    def add_size(self, name: str, value: Any, *args: Any, **kwargs: Any) -> _Metric:
        return self._add(name, value)

    def add_percent(self, name: str, value: Any, *args: Any, **kwargs: Any) -> _Metric:
        return self._add(name, value)

    def add_error(self, name: str, value: Any, *args: Any, **kwargs: Any) -> _Metric:
        return self._add(name, value)

    def get_metric(self, metric_name: str, metric_type: Any = None) -> _Metric:
        return _Metric(metric_name)


class Context:
    """What TorchServe's worker hands ``initialize(context)`` and ``handle(data, context)``."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: Mapping[str, Any],
        batch_size: int,
        gpu: int | None,
        server_version: str,
        model_yaml_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = dict(manifest)
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": SERVER_NAME,
            "server_version": server_version,
            "limit_max_image_pixels": True,
        }
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] = []
        self.metrics = HandlerMetrics()
        self.model_yaml_config: dict[str, Any] = dict(model_yaml_config or {})
        self.stopping_criteria: Any = None
        self.cl_socket: Any = None
        self.header_key_sequence_id = "ts_request_sequence_id"

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    @property
    def request_processor(self) -> list[RequestProcessor]:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, request_processor: list[RequestProcessor]) -> None:
        self._request_processor = request_processor

    def get_request_id(self, idx: int = 0) -> str | None:
        return None if self.request_ids is None else self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self._request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self._request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._request_processor[idx]
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if 0 <= idx < len(self._request_processor):
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self._request_processor:
            processor.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._request_processor[idx].get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._request_processor[idx].add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> str | None:
        return self._request_processor[idx].get_request_property(self.header_key_sequence_id)
