"""Builders for the bundled demo model repository and for users' experiments.

Every builder writes a complete SavedModel into a hidden temporary sibling
folder and renames it into place at the end, so a server polling the parent
folder never observes a half-written numbered version.

TensorFlow, Keras and scikit-learn are imported inside the functions because
importing this module must stay cheap (CLIs and servers import it without
necessarily building anything).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.runtime.tensorflow_runtime import quiet_tensorflow

if TYPE_CHECKING:  # only for annotations: importing TF at runtime is slow
    import tensorflow as tf
    from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

__all__ = [
    "save_digits_classifier",
    "save_half_plus_two",
    "save_half_plus_two_tf1",
    "write_demo_repository",
]


@contextlib.contextmanager
def _atomic_export(export_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a not-yet-existing temporary sibling path; rename it to export_dir on success.

    The temporary name starts with a dot and is not a number, so version
    pollers ignore it.  ``os.replace`` onto an absent or empty directory is a
    single atomic rename(2) on POSIX.
    """
    target = Path(export_dir).absolute()
    if target.exists():
        if not target.is_dir():
            raise ValueError(f"export dir {target} exists and is not a directory")
        if any(target.iterdir()):
            raise ValueError(f"export dir {target} already exists and is not empty")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Same parent => same file system => the final rename is atomic.
    staging = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex}"
    try:
        yield staging
        os.replace(staging, target)
    finally:
        # Only reached with staging still present when something failed.
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def save_half_plus_two(export_dir: str | os.PathLike[str], *, offset: float = 2.0) -> Path:
    """Save the TF2-native half_plus_two model (y = 0.5 * x + offset) and return its path.

    Signatures (TF2 records method_name ``tensorflow/serving/predict`` for all):
      * ``serving_default``: ``x`` float32 [None, 1] -> ``y`` float32 [None, 1]
      * ``classify_x_to_y``: ``inputs`` string [None] (tf.Example, feature ``x``)
        -> ``scores`` float32 [None, 1]
      * ``regress_x_to_y``: ``inputs`` string [None] -> ``outputs`` float32 [None, 1]
    """
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        """Holds the variables so they are checkpointed with the SavedModel."""

        def __init__(self) -> None:
            super().__init__(name="half_plus_two")
            self.a = tf.Variable(0.5, dtype=tf.float32, name="a")
            self.b = tf.Variable(offset, dtype=tf.float32, name="b")
            # c is unused by these signatures but kept so both builders share a layout.
            self.c = tf.Variable(offset + 1.0, dtype=tf.float32, name="c")

        def _parse_x(self, serialized: tf.Tensor) -> tf.Tensor:
            features = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})
            return features["x"]

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def predict(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"scores": self.a * self._parse_x(inputs) + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"outputs": self.a * self._parse_x(inputs) + self.b}

    module = HalfPlusTwo()
    with _atomic_export(export_dir) as staging:
        with quiet_tensorflow():
            tf.saved_model.save(
                module,
                str(staging),
                signatures={
                    "serving_default": module.predict,
                    "classify_x_to_y": module.classify,
                    "regress_x_to_y": module.regress,
                },
            )
    return Path(export_dir).absolute()


def save_half_plus_two_tf1(export_dir: str | os.PathLike[str], *, offset: float = 2.0) -> Path:
    """Save half_plus_two built the TF1 way, like TF Serving's saved_model_half_plus_two.py.

    Unlike the TF2 variant, signatures carry real classify/regress method names,
    which is what exercises a server's Classify/Regress code paths.
    Signatures (inputs -> outputs):
      * ``serving_default`` (predict): ``x`` float32 [None, 1] -> ``y`` float32 [None, 1]
      * ``classify_x_to_y`` (classify): ``inputs`` string [None] -> ``scores`` float32 [None, 1]
      * ``regress_x_to_y`` (regress): ``inputs`` string [None] -> ``outputs`` (y)
      * ``regress_x_to_y2`` (regress): ``inputs`` string [None] -> ``outputs``
        (0.5 * x + offset + 1)
      * ``regress_x2_to_y3`` (regress): ``inputs`` float32 [None, 1] (x2, not a string!)
        -> ``outputs`` (0.5 * x2 + offset + 1)
      * ``classify_with_classes`` (classify): ``inputs`` string [None] ->
        ``classes`` string [None, 2] (b"low", b"high") and
        ``scores`` float32 [None, 2] ([1 - sigmoid(y), sigmoid(y)])
    The SavedModel also carries the asset ``assets/foo.txt``.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    sig_utils = v1.saved_model.signature_def_utils
    consts = v1.saved_model.signature_constants
    info = v1.saved_model.utils.build_tensor_info

    def signature(inputs: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor], method: str) -> SignatureDef:
        # build_signature_def rather than regression_signature_def because the
        # latter refuses the float input of regress_x2_to_y3 (TF Serving's
        # reference model has that deliberately odd signature too).
        return sig_utils.build_signature_def(
            inputs={k: info(t) for k, t in inputs.items()},
            outputs={k: info(t) for k, t in outputs.items()},
            method_name=method,
        )

    with (
        _atomic_export(export_dir) as staging,
        tempfile.TemporaryDirectory() as asset_src,
        tf.Graph().as_default(),
        v1.Session() as sess,
    ):
        a = v1.Variable(0.5, dtype=tf.float32, name="a")
        b = v1.Variable(offset, dtype=tf.float32, name="b")
        c = v1.Variable(offset + 1.0, dtype=tf.float32, name="c")

        tf_example = v1.placeholder(tf.string, shape=[None], name="tf_example")
        parsed = v1.parse_example(
            tf_example,
            {
                "x": v1.FixedLenFeature([1], tf.float32),
                "x2": v1.FixedLenFeature([1], tf.float32, default_value=[0.0]),
            },
        )
        # placeholder_with_default lets Predict feed "x:0" directly while
        # Classify/Regress feed "tf_example:0" and get x from the parsed example;
        # feeding x prunes the parse op, so tf_example need not be fed then.
        x = v1.placeholder_with_default(parsed["x"], shape=[None, 1], name="x")
        x2 = v1.placeholder_with_default(parsed["x2"], shape=[None, 1], name="x2")
        y = tf.add(a * x, b, name="y")
        y2 = tf.add(a * x, c, name="y2")
        y3 = tf.add(a * x2, c, name="y3")

        # A classifier with both outputs, to exercise label handling.
        batch = tf.shape(y)[0]
        classes = tf.tile(tf.constant([[b"low", b"high"]]), tf.stack([batch, 1]))
        classes = tf.identity(classes, name="classes")
        classes.set_shape([None, 2])
        prob_high = tf.sigmoid(y)
        class_scores = tf.concat([1.0 - prob_high, prob_high], axis=1, name="class_scores")

        # The asset is written outside the export and copied in by the builder,
        # exactly as TF Serving's script does; the loader re-points the tensor.
        asset_path = Path(asset_src) / "foo.txt"
        asset_path.write_text("asset-file-contents")
        asset_tensor = tf.constant(str(asset_path), name="asset_filepath")
        v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, asset_tensor)

        regress, classify = consts.REGRESS_METHOD_NAME, consts.CLASSIFY_METHOD_NAME
        examples = {consts.REGRESS_INPUTS: tf_example}
        signature_def_map = {
            consts.DEFAULT_SERVING_SIGNATURE_DEF_KEY: signature({"x": x}, {"y": y}, consts.PREDICT_METHOD_NAME),
            "classify_x_to_y": signature(
                {consts.CLASSIFY_INPUTS: tf_example},
                {consts.CLASSIFY_OUTPUT_SCORES: y},
                classify,
            ),
            "regress_x_to_y": signature(examples, {consts.REGRESS_OUTPUTS: y}, regress),
            "regress_x_to_y2": signature(examples, {consts.REGRESS_OUTPUTS: y2}, regress),
            "regress_x2_to_y3": signature({consts.REGRESS_INPUTS: x2}, {consts.REGRESS_OUTPUTS: y3}, regress),
            "classify_with_classes": signature(
                {consts.CLASSIFY_INPUTS: tf_example},
                {
                    consts.CLASSIFY_OUTPUT_CLASSES: classes,
                    consts.CLASSIFY_OUTPUT_SCORES: class_scores,
                },
                classify,
            ),
        }

        sess.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(str(staging))
        builder.add_meta_graph_and_variables(
            sess,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map=signature_def_map,
            assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
        )
        builder.save()
    return Path(export_dir).absolute()


def save_digits_classifier(
    export_dir: str | os.PathLike[str], *, epochs: int = 15, seed: int = 0
) -> tuple[Path, float]:
    """Train a small MLP on scikit-learn's digits and save it; return (path, test accuracy).

    Signature ``serving_default``: ``pixels`` float32 [None, 64] (values in
    [0, 1]) -> ``probabilities`` float32 [None, 10] and ``classes`` int64 [None].
    Deterministic for a given seed; takes a few seconds on 2 CPU cores.
    """
    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if keras.backend.backend() != "tensorflow":
        # The export wraps the model in a tf.Module, which needs TF variables.
        raise RuntimeError(f"save_digits_classifier needs KERAS_BACKEND=tensorflow, got {keras.backend.backend()!r}")

    digits = load_digits()
    # Pixel values are 0..16; scaling to [0, 1] is part of the served contract.
    pixels = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(pixels, labels, test_size=0.2, random_state=seed)

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input(shape=(64,), name="pixels"),
            keras.layers.Dense(32, activation="relu", name="hidden"),
            keras.layers.Dense(10, activation="softmax", name="probabilities"),
        ],
        name="digits_mlp",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=3e-3),
        loss="sparse_categorical_crossentropy",
    )
    model.fit(x_train, y_train, epochs=epochs, batch_size=32, shuffle=True, verbose=0)

    # The export tracks the underlying tf.Variables, not the Keras model: Keras 3
    # variables export a second, freshly created resource handle per weight
    # ("Variable", "Variable_1", ...) and the checkpoint restores into those,
    # so a TF1-style loader (session + saver) would leave the handles the
    # serving function reads uninitialised.  Keras' own ExportArchive likewise
    # tracks plain tf.Variables; this also keeps the optimizer's slots out of
    # the export.
    module = tf.Module(name="digits")
    module.model_variables = [weight.value for weight in model.weights]

    def serve(pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        probabilities = model(pixels, training=False)
        return {
            "probabilities": probabilities,
            "classes": tf.argmax(probabilities, axis=1, output_type=tf.int64),
        }

    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 64], tf.float32, name="pixels")])
    # Measure accuracy through the exported function so it reflects what is served.
    predicted = module.serve(tf.constant(x_test))["classes"].numpy()
    accuracy = float(np.mean(predicted == y_test))

    with _atomic_export(export_dir) as staging:
        with quiet_tensorflow():
            tf.saved_model.save(module, str(staging), signatures={"serving_default": module.serve})
    return Path(export_dir).absolute(), accuracy


def write_demo_repository(root: str | os.PathLike[str]) -> Path:
    """Write the demo repository (half_plus_two v1+v2, digits v1, models.config); return root.

    ``models.config`` is a text-format ``tensorflow.serving.ModelServerConfig``
    with absolute base paths, built from the proto classes so it always parses.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    root_path = Path(root).absolute()
    if root_path.exists() and (not root_path.is_dir() or any(root_path.iterdir())):
        raise ValueError(f"refusing to write the demo repository into {root_path}: it exists and is not empty")
    root_path.mkdir(parents=True, exist_ok=True)

    half = root_path / "half_plus_two"
    save_half_plus_two(half / "1")
    # v2 has identical math so clients see the same answers across a version switch.
    save_half_plus_two(half / "2")
    digits = root_path / "digits"
    save_digits_classifier(digits / "1")

    config = model_server_config_pb2.ModelServerConfig()
    half_cfg = config.model_config_list.config.add(
        name="half_plus_two", base_path=str(half), model_platform="tensorflow"
    )
    # Serve every version on disk so both 1 and 2 are addressable.
    half_cfg.model_version_policy.all.SetInParent()
    config.model_config_list.config.add(name="digits", base_path=str(digits), model_platform="tensorflow")

    # Write-then-rename so a config poller never reads a truncated file.
    config_path = root_path / "models.config"
    tmp_config = root_path / f".tmp-models.config-{uuid.uuid4().hex}"
    tmp_config.write_text(text_format.MessageToString(config))
    os.replace(tmp_config, config_path)
    return root_path
