"""Warmup replay: ``assets.extra/tf_serving_warmup_requests`` runs once before a version is AVAILABLE.

The file is a TFRecord of ``tensorflow.serving.PredictionLog`` (predict, classify, regress and
multi_inference logs), at most 1000 records, as in TF Serving. A framing error (DATA_LOSS), an unparsable
record or too many records (INVALID_ARGUMENT) fails the version's load; the versions already serving stay.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from workbench.core import inference
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Servable
from workbench.protocol.examples import serialized_examples
from workbench.protocol.tensor_proto import to_numpy
from workbench.protocol.tfrecord import CorruptRecord, read_records

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000


def warmup_path(version_path: str) -> str:
    return os.path.join(version_path, WARMUP_FILE)


def read_warmup_records(path: str) -> Iterator[Any]:
    """PredictionLogs of a warmup file, failing fast on framing errors and on too many records.

    Read with workbench's own TFRecord reader (same framing and checksums as TensorFlow's, and its words for what
    is wrong), so a model's warmup does not import all of TensorFlow before the model serves.
    """
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import prediction_log_pb2

    try:
        # One record past the maximum is enough to refuse the file.
        records = list(itertools.islice(read_records(path), MAX_WARMUP_RECORDS + 1))
    except CorruptRecord as exc:
        raise ServingError(Code.DATA_LOSS, f"Failed to read warmup file {path}: {exc.reason}") from None
    except OSError as exc:
        err = from_exception(exc)
        raise ServingError(err.code, f"Failed to read warmup file {path}: {err.message}") from None
    if len(records) > MAX_WARMUP_RECORDS:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS}) at {path}",
        )
    for i, record in enumerate(records):
        log = prediction_log_pb2.PredictionLog()
        try:
            log.ParseFromString(record)
        except Exception:  # noqa: BLE001 - whatever protobuf raises, the record is refused
            raise ServingError(
                Code.INVALID_ARGUMENT, f"Failed to parse warmup record {i} of {path} as PredictionLog"
            ) from None
        yield log


def replay(servable: Servable, log: Any) -> None:
    """Run one PredictionLog's request against ``servable`` (its answer is discarded)."""
    kind = log.WhichOneof("log_type")
    if kind == "predict_log":
        request = log.predict_log.request
        signature = inference.predict_signature(servable, request.model_spec.signature_name)
        inputs = {alias: to_numpy(proto, alias) for alias, proto in request.inputs.items()}
        inference.predict(servable, signature, inputs, list(request.output_filter))
    elif kind == "classify_log":
        request = log.classify_log.request
        inference.classify(servable, request.model_spec.signature_name, serialized_examples(request.input))
    elif kind == "regress_log":
        request = log.regress_log.request
        inference.regress(servable, request.model_spec.signature_name, serialized_examples(request.input))
    elif kind == "multi_inference_log":
        request = log.multi_inference_log.request
        tasks = [inference.InferenceTask(t.model_spec.signature_name, t.method_name) for t in request.tasks]
        inference.multi_inference(servable, tasks, serialized_examples(request.input))
    else:
        raise ServingError(Code.UNIMPLEMENTED, f"Unsupported log_type for warmup: {kind}")


def warm_up(servable: Servable) -> None:
    """Replay the version's warmup file, if it has one."""
    path = warmup_path(servable.path)
    if not os.path.exists(path):
        return
    for i, log in enumerate(read_warmup_records(path)):
        try:
            replay(servable, log)
        except ServingError as exc:
            raise ServingError(exc.code, f"Warmup request {i} failed: {exc.message}") from None
