"""Request logging settings: TF Serving's ``LoggingConfig``, from a model config or a file beside the model.

``logging_config`` inside a model's ``config { … }`` of ``--model_config_file`` is TF Serving's own field. A
model served from a model repository (no config file) may carry the same message as text in
``<model>/logging_config.txt``; a config file's ``logging_config`` wins over that file. A relative
``filename_prefix`` is taken from the config file's folder, or from the model's folder for the file beside it.

TF Serving ships no open-source log collector; workbench's writes TFRecord files of ``PredictionLog`` (see
:mod:`workbench.observability.request_logger`) when ``type`` is empty or ``"tfrecord"``. Two more collectors are
workbench's own (docs/request-logs-and-drift.md): ``"parquet"`` writes Parquet files under ``filename_prefix``, a
folder or an fsspec URL (``s3://``, ``gs://``), partitioned ``model=/version=/hour=``; ``"cloudevents"`` POSTs each
request and response as a CloudEvent, as KServe's logger does, to ``filename_prefix``, an ``http(s)://`` URL.
Anything else is refused rather than ignored.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config.text_config import parse_text_config
from workbench.core.errors import Code, ServingError

LOGGING_FILE_NAME = "logging_config.txt"
COLLECTOR_TYPES = ("", "tfrecord", "parquet", "cloudevents")
TFRECORD, PARQUET, CLOUDEVENTS = "tfrecord", "parquet", "cloudevents"


@dataclasses.dataclass(frozen=True)
class RequestLogConfig:
    """Where one model's sampled requests go, and how many of them."""

    filename_prefix: str  # absolute, or a URL (gs://…) that TensorFlow's file systems can write
    sampling_rate: float  # each request is logged with this probability: 0 logs none, 1 logs all
    sampling_config: bytes = b""  # the serialized SamplingConfig, copied into every record's LogMetadata
    sink: str = TFRECORD  # the collector: TFRecord files, Parquet files, or CloudEvents over HTTP

    def sampling_config_proto(self) -> Any:
        from tensorflow_serving.config import logging_config_pb2

        return logging_config_pb2.SamplingConfig.FromString(self.sampling_config)


def request_log_config_from_proto(proto: Any, where: str, base_dir: Path | None = None) -> RequestLogConfig:
    """Validate a ``LoggingConfig`` message; ``where`` names it in errors ("model digits", a file path)."""

    def refuse(code: Code, detail: str) -> ServingError:
        return ServingError(code, f"Invalid logging_config of {where}: {detail}")

    if proto.HasField("custom_logging_config"):
        raise refuse(Code.UNIMPLEMENTED, "custom_logging_config is not supported")
    collector = proto.log_collector_config
    if collector.type not in COLLECTOR_TYPES:
        raise refuse(
            Code.UNIMPLEMENTED,
            f'log collector type "{collector.type}" is not supported (use "tfrecord" or leave it empty for TFRecord '
            'files, "parquet" for Parquet files, "cloudevents" for CloudEvents over HTTP)',
        )
    sink = collector.type or TFRECORD
    sampling = proto.sampling_config
    if not 0.0 <= sampling.sampling_rate <= 1.0:
        raise refuse(Code.INVALID_ARGUMENT, f"sampling_rate must be from 0 to 1, got {sampling.sampling_rate:g}")
    if sampling.per_task_sampling_configs:
        raise refuse(Code.UNIMPLEMENTED, "per_task_sampling_configs is not supported; use sampling_rate")
    prefix = collector.filename_prefix
    if not prefix:
        raise refuse(Code.INVALID_ARGUMENT, "log_collector_config { filename_prefix } is required")
    if sink == CLOUDEVENTS and not prefix.startswith(("http://", "https://")):
        raise refuse(
            Code.INVALID_ARGUMENT,
            f'a "cloudevents" collector\'s filename_prefix is the URL events are POSTed to (http:// or https://), '
            f"got {prefix!r}",
        )
    if sink == PARQUET and importlib.util.find_spec("pyarrow") is None:
        raise refuse(Code.FAILED_PRECONDITION, 'a "parquet" collector needs pyarrow (pip install pyarrow)')
    if sink == PARQUET and "://" in prefix:
        _check_file_system(prefix, refuse)
    elif sink != CLOUDEVENTS and "://" not in prefix:
        path = Path(prefix).expanduser()
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        # Not resolve(): a prefix is a file name's beginning, not a file; only normalise the folder part.
        prefix = os.path.normpath(path) + (os.sep if prefix.endswith(("/", os.sep)) else "")
    return RequestLogConfig(
        filename_prefix=prefix,
        sampling_rate=sampling.sampling_rate,
        sampling_config=sampling.SerializeToString(deterministic=True),
        sink=sink,
    )


def _check_file_system(url: str, refuse: Callable[[Code, str], ServingError]) -> None:
    """A Parquet folder's URL names a file system fsspec has, with its package installed (s3fs, gcsfs)."""
    import fsspec

    scheme = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise refuse(Code.INVALID_ARGUMENT, f"{url!r}: no file system is known for {scheme}://") from None
    except ImportError as exc:
        raise refuse(Code.FAILED_PRECONDITION, f"{url!r} needs a package that is not installed: {exc}") from None


def parse_request_log_config(text: str, where: str, base_dir: Path | None = None) -> RequestLogConfig:
    """A text-format ``tensorflow.serving.LoggingConfig``."""
    from tensorflow_serving.config import logging_config_pb2

    proto = parse_text_config(text, logging_config_pb2.LoggingConfig(), where)
    return request_log_config_from_proto(proto, where, base_dir)


def logging_file(base_path: str) -> Path:
    return Path(base_path, LOGGING_FILE_NAME)


def read_model_request_log_config(base_path: str) -> RequestLogConfig | None:
    """``<base_path>/logging_config.txt``, if the model has one (relative prefixes start in ``base_path``)."""
    path = logging_file(base_path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"Could not read logging config {path}: {exc.strerror}") from None
    return parse_request_log_config(text, str(path), base_dir=Path(base_path))
