"""TF Serving config protos that the ``tensorflow-serving-api`` wheel does not ship.

``MonitoringConfig``, ``BatchingParameters`` and ``SSLConfig`` are declared here with TF Serving's package, field
names and numbers, so their text files parse with protobuf's own ``text_format`` exactly as tensorflow_model_server
parses them: wrapper fields read ``max_batch_size { value: 128 }``, and a typo is a parse error naming the line.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, wrappers_pb2
from google.protobuf.message_factory import GetMessageClass

_F = descriptor_pb2.FieldDescriptorProto


def _build() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    file = descriptor_pb2.FileDescriptorProto(
        name="workbench/tf_serving_config.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )

    # tensorflow_serving/config/monitoring_config.proto
    prometheus = file.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_BOOL)
    prometheus.field.add(name="path", number=2, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
    monitoring = file.message_type.add(name="MonitoringConfig")
    monitoring.field.add(
        name="prometheus_config",
        number=1,
        label=_F.LABEL_OPTIONAL,
        type=_F.TYPE_MESSAGE,
        type_name=".tensorflow.serving.PrometheusConfig",
    )

    # tensorflow_serving/servables/tensorflow/session_bundle_config.proto
    batching = file.message_type.add(name="BatchingParameters")
    for name, number, wrapper in [
        ("max_batch_size", 1, "Int64Value"),
        ("batch_timeout_micros", 2, "Int64Value"),
        ("thread_pool_name", 3, "StringValue"),
        ("num_batch_threads", 4, "Int64Value"),
        ("max_enqueued_batches", 5, "Int64Value"),
        ("pad_variable_length_inputs", 7, "BoolValue"),
        ("enable_large_batch_splitting", 8, "BoolValue"),
        ("max_execution_batch_size", 9, "Int64Value"),
    ]:
        batching.field.add(
            name=name,
            number=number,
            label=_F.LABEL_OPTIONAL,
            type=_F.TYPE_MESSAGE,
            type_name=f".google.protobuf.{wrapper}",
        )
    batching.field.add(name="allowed_batch_sizes", number=6, label=_F.LABEL_REPEATED, type=_F.TYPE_INT64)

    # tensorflow_serving/config/ssl_config.proto (--ssl_config_file): the PEM texts themselves, not file names
    ssl_config = file.message_type.add(name="SSLConfig")
    for name, number, kind in [
        ("server_key", 1, _F.TYPE_STRING),
        ("server_cert", 2, _F.TYPE_STRING),
        ("custom_ca", 3, _F.TYPE_STRING),
        ("client_verify", 4, _F.TYPE_BOOL),
    ]:
        ssl_config.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL, type=kind)
    pool.Add(file)
    return pool


_POOL = _build()


def _message(name: str) -> Any:
    return GetMessageClass(_POOL.FindMessageTypeByName(f"tensorflow.serving.{name}"))


MonitoringConfig = _message("MonitoringConfig")
BatchingParameters = _message("BatchingParameters")
SSLConfig = _message("SSLConfig")
