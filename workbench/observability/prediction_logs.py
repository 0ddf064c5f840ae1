"""One answered request as TF Serving's ``PredictionLog``: the request, the response and ``LogMetadata``.

The dataplane captures what it ran (decoded numpy inputs, serialized examples, results) in a small entry on
the event loop; the request log's writer thread turns it into protos with :meth:`LogEntry.prediction_log`, so
the serving path never pays for proto building. The records are what warmup replays
(``assets.extra/tf_serving_warmup_requests``), whichever frontend the request came through: a REST request
is logged as the ``PredictRequest``/``ClassificationRequest`` it decodes to, as TF Serving does. A request's
``model_spec`` names the model and the signature that ran; the version that answered is in the response's
and in ``log_metadata.model_spec``. Examples sent with a context are logged merged with it (the way they ran).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from workbench.config.request_logging import RequestLogConfig
from workbench.core.inference import Classifications, InferenceTask
from workbench.core.signatures import CLASSIFY_METHOD
from workbench.protocol.tensor_proto import from_numpy


def tensor_proto(array: np.ndarray, proto: Any) -> Any:
    """Fill ``proto`` with ``array``: numbers as ``tensor_content`` (one copy, compact), strings as values."""
    array = np.asarray(array)
    if array.dtype.kind in "biuf" and array.dtype.isnative:
        import tensorflow as tf

        proto.dtype = tf.as_dtype(array.dtype).as_datatype_enum
        for dim in array.shape:
            proto.tensor_shape.dim.add().size = dim
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
        return proto
    return from_numpy(array, proto)


def _model_spec(target: Any, name: str, version: int | None, signature_name: str) -> None:
    target.name = name
    if version is not None:
        target.version.value = version
    if signature_name:
        target.signature_name = signature_name


def _examples_input(target: Any, examples: Sequence[bytes]) -> None:
    for serialized in examples:
        target.example_list.examples.add().ParseFromString(serialized)


def fill_classifications(result: Any, rows: Classifications) -> None:
    """A ``ClassificationResult`` from (label, score) rows, one row per example."""
    for row in rows:
        classes = result.classifications.add().classes
        for label, score in row:
            entry = classes.add()
            entry.label, entry.score = label, score


def fill_regressions(result: Any, values: Sequence[float]) -> None:
    for value in values:
        result.regressions.add().value = value


@dataclasses.dataclass(frozen=True)
class LogEntry(abc.ABC):
    """What a sampled request ran and answered; references only, no copies (nothing mutates them later)."""

    model: str
    version: int
    METHOD: ClassVar[str]  # the API it ran: "predict", "classify", "regress" or "multi_inference"

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """About how much memory the entry keeps alive while it waits for the writer."""

    @abc.abstractmethod
    def _fill(self, log: Any) -> str:
        """Fill the log's request and response; returns the signature name for the metadata."""

    def prediction_log(self, config: RequestLogConfig, timestamp: float) -> Any:
        from tensorflow_serving.apis import prediction_log_pb2

        log = prediction_log_pb2.PredictionLog()
        signature_name = self._fill(log)
        metadata = log.log_metadata
        _model_spec(metadata.model_spec, self.model, self.version, signature_name)
        metadata.sampling_config.ParseFromString(config.sampling_config)
        metadata.saved_model_tags.append("serve")  # the SavedModel tag TF Serving records
        metadata.timestamp_secs = int(timestamp)
        return log


@dataclasses.dataclass(frozen=True)
class PredictEntry(LogEntry):
    METHOD = "predict"

    signature_name: str
    inputs: Mapping[str, np.ndarray]
    output_filter: Sequence[str]
    outputs: Mapping[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(np.asarray(a).nbytes for a in (*self.inputs.values(), *self.outputs.values()))

    def _fill(self, log: Any) -> str:
        request, response = log.predict_log.request, log.predict_log.response
        _model_spec(request.model_spec, self.model, None, self.signature_name)
        for alias, value in self.inputs.items():
            tensor_proto(value, request.inputs[alias])
        request.output_filter.extend(self.output_filter)
        _model_spec(response.model_spec, self.model, self.version, self.signature_name)
        for alias, value in self.outputs.items():
            tensor_proto(value, response.outputs[alias])
        return self.signature_name


@dataclasses.dataclass(frozen=True)
class ClassifyEntry(LogEntry):
    METHOD = "classify"

    signature_name: str
    examples: Sequence[bytes]
    classifications: Classifications

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.examples)) + 64 * sum(map(len, self.classifications))

    def _fill(self, log: Any) -> str:
        request, response = log.classify_log.request, log.classify_log.response
        _model_spec(request.model_spec, self.model, None, self.signature_name)
        _examples_input(request.input, self.examples)
        _model_spec(response.model_spec, self.model, self.version, self.signature_name)
        fill_classifications(response.result, self.classifications)
        return self.signature_name


@dataclasses.dataclass(frozen=True)
class RegressEntry(LogEntry):
    METHOD = "regress"

    signature_name: str
    examples: Sequence[bytes]
    regressions: Sequence[float]

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.examples)) + 8 * len(self.regressions)

    def _fill(self, log: Any) -> str:
        request, response = log.regress_log.request, log.regress_log.response
        _model_spec(request.model_spec, self.model, None, self.signature_name)
        _examples_input(request.input, self.examples)
        _model_spec(response.model_spec, self.model, self.version, self.signature_name)
        fill_regressions(response.result, self.regressions)
        return self.signature_name


@dataclasses.dataclass(frozen=True)
class MultiInferenceEntry(LogEntry):
    METHOD = "multi_inference"

    tasks: Sequence[InferenceTask]
    examples: Sequence[bytes]
    results: Sequence[tuple[str, Any]]  # (signature name that ran, classifications or regressions), per task

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.examples)) + 64 * len(self.examples) * len(self.tasks)

    def _fill(self, log: Any) -> str:
        request, response = log.multi_inference_log.request, log.multi_inference_log.response
        for task in self.tasks:
            entry = request.tasks.add()
            _model_spec(entry.model_spec, self.model, None, task.signature_name)
            entry.method_name = task.method_name
        _examples_input(request.input, self.examples)
        for task, (signature_name, result) in zip(self.tasks, self.results, strict=True):
            entry = response.results.add()
            _model_spec(entry.model_spec, self.model, self.version, signature_name)
            if task.method_name == CLASSIFY_METHOD:
                fill_classifications(entry.classification_result, result)
            else:
                fill_regressions(entry.regression_result, result)
        return ""  # several signatures ran: the metadata names none
