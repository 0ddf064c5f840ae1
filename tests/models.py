"""Helpers that write model folders and warmup files for the test-suite.

Kept out of conftest.py so tests can import them explicitly and so that the
fixtures stay small; the SavedModel builders themselves live in
``workbench.demo``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

# Where TF Serving looks for warmup records, relative to a version folder.
WARMUP_RELATIVE_PATH = Path("assets.extra") / "tf_serving_warmup_requests"


def _warmup_path(version_dir: str | os.PathLike[str]) -> Path:
    path = Path(version_dir) / WARMUP_RELATIVE_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_warmup_file(
    version_dir: str | os.PathLike[str],
    records: Sequence[prediction_log_pb2.PredictionLog],
) -> Path:
    """Write ``records`` as a TFRecord warmup file into ``version_dir``; return its path."""
    path = _warmup_path(version_dir)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record.SerializeToString())
    return path


def _model_spec(model_name: str, signature_name: str) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(name=model_name, signature_name=signature_name)


def _input(examples: Sequence[Mapping[str, Sequence[float]]]) -> input_pb2.Input:
    """Build an ``Input`` of ``tf.train.Example``s holding float features."""
    protos = [
        tf.train.Example(
            features=tf.train.Features(
                feature={
                    name: tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))
                    for name, values in example.items()
                }
            )
        )
        for example in examples
    ]
    return input_pb2.Input(example_list=input_pb2.ExampleList(examples=protos))


def predict_log(
    model_name: str,
    inputs: Mapping[str, np.ndarray],
    signature_name: str = "serving_default",
) -> prediction_log_pb2.PredictionLog:
    """A warmup record holding a PredictRequest with ``inputs`` as tensors."""
    request = predict_pb2.PredictRequest(model_spec=_model_spec(model_name, signature_name))
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def classify_log(
    model_name: str,
    examples: Sequence[Mapping[str, Sequence[float]]],
    signature_name: str = "classify_x_to_y",
) -> prediction_log_pb2.PredictionLog:
    """A warmup record holding a ClassificationRequest over float-feature examples."""
    request = classification_pb2.ClassificationRequest(
        model_spec=_model_spec(model_name, signature_name), input=_input(examples)
    )
    return prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=request))


def regress_log(
    model_name: str,
    examples: Sequence[Mapping[str, Sequence[float]]],
    signature_name: str = "regress_x_to_y",
) -> prediction_log_pb2.PredictionLog:
    """A warmup record holding a RegressionRequest over float-feature examples."""
    request = regression_pb2.RegressionRequest(
        model_spec=_model_spec(model_name, signature_name), input=_input(examples)
    )
    return prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=request))


def write_bad_warmup_file(version_dir: str | os.PathLike[str]) -> Path:
    """Write a warmup file that is not TFRecord-framed; return its path.

    Seeded bytes keep failures reproducible; the first 8 bytes decode to an
    absurd record length whose CRC cannot match, so readers must reject it.
    """
    path = _warmup_path(version_dir)
    path.write_bytes(random.Random(1234).randbytes(100))
    return path


def write_corrupt_version(version_dir: str | os.PathLike[str]) -> Path:
    """Write a version folder that looks like a SavedModel but whose proto is garbage."""
    path = Path(version_dir)
    (path / "variables").mkdir(parents=True, exist_ok=True)
    (path / "saved_model.pb").write_bytes(b"\xff\xfe this is not a SavedModel proto \x00\x01")
    return path


def write_legacy_export(version_dir: str | os.PathLike[str]) -> Path:
    """Write a pre-SavedModel (SessionBundle-style) export: no saved_model.pb at all."""
    path = Path(version_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "export.meta").write_bytes(b"\x08\x01 legacy meta graph, not parsed by anyone")
    (path / "checkpoint").write_text('model_checkpoint_path: "export"\n')
    return path


def save_multi_io(export_dir: str | os.PathLike[str]) -> Path:
    """A TF2 model with several typed inputs and outputs, for the REST formats' corner cases.

    Inputs: ``a`` float32 [None, 2], ``b`` int64 [None], ``text`` string [None].
    Outputs: ``total`` = sum(a) + b (float32 [None]), ``doubled`` = 2b (int64 [None]),
    ``upper`` = upper-cased text (string [None]) and ``echo_bytes`` = text (string, sent back as b64).
    """
    import tensorflow as tf

    class MultiIO(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="a"),
                tf.TensorSpec([None], tf.int64, name="b"),
                tf.TensorSpec([None], tf.string, name="text"),
            ]
        )
        def serve(self, a: tf.Tensor, b: tf.Tensor, text: tf.Tensor) -> dict[str, tf.Tensor]:
            return {
                "total": tf.reduce_sum(a, axis=1) + tf.cast(b, tf.float32),
                "doubled": b * 2,
                "upper": tf.strings.upper(text),
                "echo_bytes": tf.identity(text),
            }

    module = MultiIO()
    path = Path(export_dir)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def save_tf1_regress_declared_float(export_dir: str | os.PathLike[str]) -> Path:
    """A TF1-era model shaped like TF Serving's saved_model_half_plus_three: a signature mislabels its input.

    A string placeholder ``tf_example`` feeds ``ParseExample`` (feature ``x``, float); ``y = 0.5 * x + 3``.
    Signatures:
      * ``serving_default`` (predict): ``x`` float [None, 1] -> ``y``
      * ``tensorflow/serving/regress`` (regress): ``inputs`` -> ``outputs`` (y)
      * ``tensorflow/serving/classify`` (classify): ``inputs`` -> ``scores`` (y)
    Both example-reading signatures declare their input as DT_FLOAT (with no shape) while the tensor they
    name is the DT_STRING placeholder, exactly as the TF Serving test model does; TF Serving feeds the
    serialized examples to that tensor and never looks at the declared type.
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import meta_graph_pb2

    v1 = tf.compat.v1
    consts = v1.saved_model.signature_constants
    path = Path(export_dir)
    with tf.Graph().as_default(), v1.Session() as session:
        tf_example = v1.placeholder(tf.string, shape=[None], name="tf_example")
        parsed = v1.parse_example(tf_example, {"x": v1.FixedLenFeature([1], tf.float32)})
        x = v1.placeholder_with_default(parsed["x"], shape=[None, 1], name="x")
        y = tf.add(0.5 * x, 3.0, name="y")

        declared_float = meta_graph_pb2.TensorInfo(name=tf_example.name, dtype=types_pb2.DT_FLOAT)
        declared_float.tensor_shape.unknown_rank = True
        y_info = v1.saved_model.utils.build_tensor_info(y)

        def signature(method: str, output: str) -> meta_graph_pb2.SignatureDef:
            sig = meta_graph_pb2.SignatureDef(method_name=method)
            sig.inputs["inputs"].CopyFrom(declared_float)
            sig.outputs[output].CopyFrom(y_info)
            return sig

        predict = v1.saved_model.signature_def_utils.predict_signature_def({"x": x}, {"y": y})
        builder = v1.saved_model.Builder(str(path))
        builder.add_meta_graph_and_variables(
            session,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map={
                consts.DEFAULT_SERVING_SIGNATURE_DEF_KEY: predict,
                consts.REGRESS_METHOD_NAME: signature(consts.REGRESS_METHOD_NAME, consts.REGRESS_OUTPUTS),
                consts.CLASSIFY_METHOD_NAME: signature(consts.CLASSIFY_METHOD_NAME, consts.CLASSIFY_OUTPUT_SCORES),
            },
        )
        builder.save()
    return path


def save_dense(export_dir: str | os.PathLike[str], width: int = 4) -> Path:
    """A TF2 model whose graph needs its declared width: ``features`` float32 [None, width] → ``logits`` [None, 2].

    A matrix product, so a row of another width fails in TensorFlow itself (``Matrix size-incompatible``),
    the way a Keras Dense layer does; ``logits`` is the sum of the row and the sum of twice the row.
    """

    class Dense(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = tf.Variable(np.tile(np.array([[1.0, 2.0]], np.float32), (width, 1)))

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="features")])
        def serve(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"logits": tf.matmul(features, self.kernel)}

    module = Dense()
    path = Path(export_dir)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def save_gated(export_dir: str | os.PathLike[str], gate: str | os.PathLike[str], held: str | os.PathLike[str]) -> Path:
    """A TF2 model that holds each call while the file ``gate`` exists: ``x`` float32 [None] → ``y`` = 2x.

    Lets a test keep requests inside a server (running, or queued behind running ones) for as long as it needs,
    then release them all by deleting ``gate``; no sleep decides the outcome. A held call writes a file into the
    folder ``held`` (one per call, written each 20 ms while it waits), so the test can count calls being held.
    Everything is graph ops (no ``tf.py_function``), so the model works in a ``workbench serve`` process.
    """
    from tensorflow.python.data.experimental.ops import testing as tf_data_testing

    gate, held = str(gate), str(held)

    def pause() -> tf.Tensor:
        """Sleep 20 ms inside the graph (a one-element dataset with a sleep, reduced)."""
        dataset = tf.data.Dataset.range(1).apply(tf_data_testing.sleep(20_000))
        return dataset.reduce(tf.constant(0, tf.int64), lambda total, item: total + item)

    def random_text() -> tf.Tensor:
        return tf.strings.as_string(tf.random.uniform([], maxval=2**62, dtype=tf.int64))

    class Gated(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            marker = tf.strings.join([held, "/", random_text()])

            def gate_exists(waited: tf.Tensor) -> tf.Tensor:
                # The pattern depends on a random op, so grappler cannot fold the check into a constant.
                pattern = tf.strings.join([gate, tf.strings.substr(random_text(), 0, 0)])
                return tf.size(tf.io.matching_files(pattern)) > 0

            def wait(waited: tf.Tensor) -> list[tf.Tensor]:
                with tf.control_dependencies([tf.io.write_file(marker, "")]):
                    return [waited + pause() + 1]

            (waited,) = tf.while_loop(gate_exists, wait, [tf.constant(0, tf.int64)])
            with tf.control_dependencies([waited]):
                return {"y": x * 2.0}

    module = Gated()
    path = Path(export_dir)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def save_weighty(export_dir: str | os.PathLike[str], offset: float, weights_mib: int = 16) -> Path:
    """``x`` float32 [None, 1] → ``y`` = x + ``offset``, computed from a ``weights_mib`` MiB variable.

    For the reload-memory test and benchmark: the weights are what a load allocates and an unload must give
    back; each column of the kernel sums to ``offset``, so an answer says which version gave it.
    """

    class Weighty(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            rows = weights_mib * 2**20 // (4 * 1024)
            self.kernel = tf.Variable(np.full((rows, 1024), offset / rows, np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x + tf.reduce_sum(self.kernel[:, :1])}

    module = Weighty()
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.serve})
    return Path(export_dir)
