"""Request logging settings: TF Serving's ``LoggingConfig``, from a model config or a file beside the model.

``logging_config`` inside a model's ``config { … }`` of ``--model_config_file`` is TF Serving's own field. A
model served from a model repository (no config file) may carry the same message as text in
``<model>/logging_config.txt``; a config file's ``logging_config`` wins over that file. A relative
``filename_prefix`` is taken from the config file's folder, or from the model's folder for the file beside it.

TF Serving ships no open-source log collector; workbench's writes TFRecord files of ``PredictionLog`` (see
:mod:`workbench.observability.request_logger`), so ``type`` may be empty or ``"tfrecord"``, and anything else is refused
rather than ignored.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from workbench.config.text_config import parse_text_config
from workbench.core.errors import Code, ServingError

LOGGING_FILE_NAME = "logging_config.txt"
COLLECTOR_TYPES = ("", "tfrecord")


@dataclasses.dataclass(frozen=True)
class RequestLogConfig:
    """Where one model's sampled requests go, and how many of them."""

    filename_prefix: str  # absolute, or a URL (gs://…) that TensorFlow's file systems can write
    sampling_rate: float  # each request is logged with this probability: 0 logs none, 1 logs all
    sampling_config: bytes = b""  # the serialized SamplingConfig, copied into every record's LogMetadata

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
            f'log collector type "{collector.type}" is not supported (workbench writes TFRecord files: '
            'leave type empty or set it to "tfrecord")',
        )
    sampling = proto.sampling_config
    if not 0.0 <= sampling.sampling_rate <= 1.0:
        raise refuse(Code.INVALID_ARGUMENT, f"sampling_rate must be from 0 to 1, got {sampling.sampling_rate:g}")
    if sampling.per_task_sampling_configs:
        raise refuse(Code.UNIMPLEMENTED, "per_task_sampling_configs is not supported; use sampling_rate")
    prefix = collector.filename_prefix
    if not prefix:
        raise refuse(Code.INVALID_ARGUMENT, "log_collector_config { filename_prefix } is required")
    if "://" not in prefix:
        path = Path(prefix).expanduser()
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        # Not resolve(): a prefix is a file name's beginning, not a file; only normalise the folder part.
        prefix = os.path.normpath(path) + (os.sep if prefix.endswith(("/", os.sep)) else "")
    return RequestLogConfig(
        filename_prefix=prefix,
        sampling_rate=sampling.sampling_rate,
        sampling_config=sampling.SerializeToString(deterministic=True),
    )


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
