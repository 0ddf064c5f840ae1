"""Start-up without ``tensorflow/__init__``: a server imports only the TensorFlow it runs.

TF Serving's generated protos import TensorFlow's, and Python runs ``tensorflow/__init__`` (seconds: all of
TensorFlow's Python API, Keras) before any of them; workbench/runtime/tensorflow_protos.py loads them without it, so a
repository without TensorFlow models never imports TensorFlow. A repository of SavedModels imports only what runs
them in sessions (workbench/runtime/tensorflow_runtime.py's saved_model_runtime). These tests run ``workbench
serve`` as users do, in a child process that reports its own ``sys.modules`` on request, after answering every
API; and check that TensorFlow imported after those protos, or after that runtime, is whole, shares them and
behaves as it would have.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import models
import numpy as np
import pytest
import requests
import tabular_models as tm
import tensorflow as tf
import tritonclient.grpc as triton_grpc
from replica import REPO_ROOT, START_TIMEOUT_S, stop_process
from tensorflow_serving.apis import classification_pb2, predict_pb2
from waiting import wait_until

from workbench.platforms import sklearn as sklearn_platform

# `workbench serve` in a process that writes its loaded tensorflow*, keras* and mlflow* modules (JSON) to argv[1]
# whenever stdin gets a line.
CHILD = textwrap.dedent(
    """
    import json, sys, threading
    from workbench.cli import main

    def report() -> None:
        for _ in sys.stdin:
            names = sorted(m for m in list(sys.modules) if m.split(".")[0] in ("tensorflow", "keras", "mlflow"))
            with open(sys.argv[1] + ".tmp", "w") as f:
                json.dump(names, f)
            import os
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])

    threading.Thread(target=report, daemon=True).start()
    sys.exit(main(sys.argv[2:]))
    """
)


@dataclass
class ServeChild:
    proc: subprocess.Popen[bytes]
    report_file: Path
    log_path: Path
    rest_url: str = ""
    grpc_target: str = ""

    def tensorflow_modules(self) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"report\n")
        self.proc.stdin.flush()
        wait_until(self.report_file.exists, timeout=30, what="the server's module report")
        return json.loads(self.report_file.read_text())  # type: ignore[no-any-return]


@pytest.fixture
def serve_child(tmp_path: Path) -> Iterator[ServeChild]:
    """``start(*flags)``: ``workbench serve FLAGS`` as a child, once it answers (ready file)."""
    children: list[ServeChild] = []

    def start(*flags: str) -> ServeChild:
        ready = tmp_path / "ready.json"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        log_path = tmp_path / "server.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(tmp_path / "modules.json"), "serve", "--port=0",
                 "--rest_api_port=-1", f"--ready_file={ready}", *flags],
                cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        child = ServeChild(proc, tmp_path / "modules.json", log_path)
        children.append(child)

        def answering() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"workbench serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            return ready.exists()

        wait_until(answering, timeout=START_TIMEOUT_S, interval=0.05, what="workbench serve to answer")
        ports = json.loads(ready.read_text())
        child.rest_url = f"http://127.0.0.1:{ports['rest_port']}"
        child.grpc_target = f"127.0.0.1:{ports['grpc_port']}"
        return child

    yield start
    for child in children:
        stop_process(child.proc)


def test_a_server_of_scikit_learn_models_answers_every_api_without_importing_tensorflow(tmp_path, serve_child):
    from sklearn.linear_model import LogisticRegression

    x, y = tm.digits()
    classifier = LogisticRegression(max_iter=300).fit(x, y)
    version = tmp_path / "models" / "digits" / "1"
    version.mkdir(parents=True)
    sklearn_platform.write(classifier, version)

    server = serve_child(f"--model_repository={tmp_path / 'models'}")
    tm.available(server, "digits")
    rows = x[:5]
    expected = classifier.predict(rows)

    # TF Serving's REST API: predict, classify (tf.Example's protos) and metadata (SignatureDef protos).
    assert tm.rest_answer(server, "digits", {"instances": rows.tolist()}) == {"predictions": expected.tolist()}
    classified = tm.rest(server, "digits", "classify", {"examples": tm.row_examples(rows)})
    assert classified.status_code == 200, classified.text
    assert "predict_proba" in tm.rest_signatures(server, "digits")
    # TF Serving's gRPC API: Predict, Classify, GetModelMetadata, GetModelStatus.
    with tm.stub_for(server) as stub:
        assert np.array_equal(tm.grpc_predict(stub, "digits", {"x": rows})["predictions"], expected)
        assert len(tm.grpc_classify(stub, "digits", tm.row_examples(rows))) == len(rows)
        assert "predict_proba" in tm.grpc_signatures(stub, "digits")
    # The Open Inference Protocol, REST and gRPC.
    v2 = requests.post(
        f"{server.rest_url}/v2/models/digits/infer",
        json={"inputs": [{"name": "x", "shape": list(rows.shape), "datatype": "FP64", "data": rows.ravel().tolist()}]},
        timeout=60,
    )
    assert v2.status_code == 200, v2.text
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        assert client.is_model_ready("digits")
        request = triton_grpc.InferInput("x", list(rows.shape), "FP64")
        request.set_data_from_numpy(rows.astype(np.float64))
        result = client.infer("digits", [request])
        assert np.array_equal(result.as_numpy(result.get_response().outputs[0].name), expected)

    loaded = server.tensorflow_modules()
    assert "tensorflow" not in loaded, "a server without TensorFlow models imported TensorFlow"
    assert "mlflow" not in loaded, "a server without MLflow models imported MLflow"
    # Only TensorFlow's generated protos (and their packages) came in, through TF Serving's.
    packages = {m.rsplit(".", 1)[0] for m in loaded}
    assert [m for m in loaded if not m.endswith("_pb2") and m not in packages] == []
    assert "tensorflow.core.framework.tensor_pb2" in loaded


def test_a_server_of_tensorflow_models_runs_them_without_tensorflow_init_until_something_imports_it(
    tmp_path, model_store, serve_child
):
    repository = tmp_path / "models"
    for name, stored in (("hp2_tf1", "hp2_tf1"), ("hp2_tf2", "hp2_tf2"), ("multi_io", "multi_io")):
        shutil.copytree(model_store / stored, repository / name / "1")
    # A warmup file too: replaying it must not need TensorFlow's Python API either.
    models.write_warmup_file(
        repository / "hp2_tf2" / "1", [models.predict_log("hp2_tf2", {"x": np.array([[1.0]], np.float32)})]
    )
    server = serve_child(f"--model_repository={repository}")
    for name in ("hp2_tf1", "hp2_tf2", "multi_io"):
        tm.available(server, name)

    def answers() -> None:
        # TF1 (variables restored by its Saver, an asset, tf.Example parsing) and TF2 SavedModels, REST and gRPC.
        for name in ("hp2_tf1", "hp2_tf2"):
            assert tm.rest_answer(server, name, {"instances": [[1.0], [3.0]]}) == {"predictions": [[2.5], [3.5]]}
        multi = tm.rest_answer(server, "multi_io", {"instances": [{"a": [1.0, 2.0], "b": 3, "text": "ab"}]})
        [row] = multi["predictions"]
        assert (row["total"], row["doubled"], row["upper"]) == (6.0, 6, "AB")
        with tm.stub_for(server) as stub:
            assert tm.grpc_predict(stub, "hp2_tf2", {"x": np.array([[2.0]], np.float32)})["y"].tolist() == [[3.0]]
            request = classification_pb2.ClassificationRequest()
            request.model_spec.name, request.model_spec.signature_name = "hp2_tf1", "classify_x_to_y"
            request.input.example_list.examples.add().features.feature["x"].float_list.value.append(4.0)
            classified = stub.Classify(request, timeout=60).result.classifications
            assert [c.score for c in classified[0].classes] == [4.0]
        v2 = requests.post(
            f"{server.rest_url}/v2/models/hp2_tf2/infer",
            json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [6.0]}]},
            timeout=60,
        )
        assert v2.json()["outputs"][0]["data"] == [5.0], v2.text

    answers()
    loaded = server.tensorflow_modules()
    assert "tensorflow.python.client.session" in loaded
    assert "tensorflow" not in loaded, "tensorflow/__init__ ran for SavedModels that do not need it"
    assert [m for m in loaded if m.split(".")[0] == "keras" or m.startswith("tensorflow._api")] == []

    # A request that needs TensorFlow's Python API (a bfloat16 TensorProto, which numpy has no type for:
    # tf.make_ndarray) imports all of it, the genuine tensorflow/__init__, beside the sessions that serve; they go on
    # serving. (Sent to a float input, it is refused before any import: the signature says it cannot be that.)
    with tm.stub_for(server) as stub:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "hp2_tf2"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.bfloat16))
        error = tm.grpc_error(lambda: stub.Predict(request, timeout=60))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        server.report_file.unlink()
        assert "tensorflow" not in server.tensorflow_modules()
        del request.inputs["x"]
        request.inputs["not_an_input"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.bfloat16))
        error = tm.grpc_error(lambda: stub.Predict(request, timeout=60))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    server.report_file.unlink()
    loaded = server.tensorflow_modules()
    assert {"tensorflow", "tensorflow._api.v2.compat.v1"} <= set(loaded)
    answers()


def test_tensorflow_imported_after_the_protos_shares_them():
    script = textwrap.dedent(
        """
        import sys
        import workbench.runtime.tensorflow_protos
        assert "tensorflow" not in sys.modules
        from tensorflow_serving.apis import predict_pb2
        from tensorflow.core.framework import tensor_pb2
        assert "tensorflow" not in sys.modules

        import tensorflow as tf
        proto = tf.make_tensor_proto([1.0, 2.0])
        assert type(proto) is tensor_pb2.TensorProto
        request = predict_pb2.PredictRequest()
        request.inputs["x"].CopyFrom(proto)  # one TensorProto class, one descriptor pool
        assert tf.make_ndarray(request.inputs["x"]).tolist() == [1.0, 2.0]
        assert float(tf.reduce_sum(tf.constant([1.0, 2.0]))) == 3.0
        print("ok")
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == b"ok", done.stderr.decode()[-3000:]


# TensorFlow's global behaviour, as a process sees it once `import tensorflow` has run.
TENSORFLOW_STATE = textwrap.dedent(
    """
    def tensorflow_state():
        import tensorflow as tf
        from tensorflow.python import tf2
        from tensorflow.python.client import session
        from tensorflow.python.framework import tensor, tensor_shape
        from tensorflow.python.ops import control_flow_util, resource_variables_toggle

        return {
            "tf2": tf2.enabled(),
            "eager": tf.executing_eagerly(),
            "resource_variables": resource_variables_toggle.resource_variables_enabled(),
            "control_flow_v2": control_flow_util.ENABLE_CONTROL_FLOW_V2,
            "tensor_equality": tensor.Tensor._USE_EQUALITY,
            "v2_tensorshape": tensor_shape._TENSORSHAPE_V2_OVERRIDE,
            "one_session_class": tf.compat.v1.Session is session.Session,
            "sum": float(tf.reduce_sum(tf.constant([1.0, 2.0]))),
            "function": float(tf.function(lambda x: x * 2)(tf.constant(2.0))),
            "keras": type(tf.keras.layers.Dense(1)).__name__,
        }
    """
)


def test_tensorflow_imported_after_the_saved_model_runtime_is_whole_and_behaves_as_if_imported_first(model_store):
    serve_then_import = TENSORFLOW_STATE + textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from workbench.platforms.tensorflow import SavedModelServable
        from workbench.runtime.tensorflow_runtime import mark_server_process

        mark_server_process()  # as `workbench serve` does: the light import is a server's

        def answer(servable):
            signature = servable.signatures["serving_default"]
            return servable.run(signature, {"x": np.array([[2.0]], np.float32)}, ["y"])["y"].tolist()

        servable = SavedModelServable("hp2", 1, sys.argv[1])
        assert answer(servable) == [[3.0]]
        assert "tensorflow" not in sys.modules and "keras" not in sys.modules, "tensorflow/__init__ ran"
        state = tensorflow_state()
        assert answer(servable) == [[3.0]]
        assert answer(SavedModelServable("hp2", 2, sys.argv[1])) == [[3.0]]  # and loads as before
        print(json.dumps(state))
        """
    )
    import_first = TENSORFLOW_STATE + "import json; print(json.dumps(tensorflow_state()))"
    states = []
    for script in (serve_then_import, import_first):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        done = subprocess.run(
            [sys.executable, "-c", script, str(model_store / "hp2_tf2")],
            cwd=REPO_ROOT, env=env, capture_output=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        states.append(json.loads(done.stdout.decode().strip().splitlines()[-1]))
    assert states[0] == states[1]
    assert states[0]["tf2"] and states[0]["eager"] and states[0]["one_session_class"] and states[0]["sum"] == 3.0


KERAS_AFTER_A_SAVED_MODEL = textwrap.dedent(
    """
    import sys
    import numpy as np
    from workbench.platforms.tensorflow import SavedModelServable

    if sys.argv[2] == "server":
        from workbench.runtime.tensorflow_runtime import import_all_of_tensorflow, mark_server_process

        mark_server_process()
    servable = SavedModelServable("hp2", 1, sys.argv[1])
    signature = servable.signatures["serving_default"]
    assert servable.run(signature, {"x": np.array([[2.0]], np.float32)}, ["y"])["y"].tolist() == [[3.0]]
    if sys.argv[2] == "server":
        assert "tensorflow" not in sys.modules
        import_all_of_tensorflow()  # what a server does before a Python model's code runs
    import keras  # first, not through `import tensorflow`: Keras imports tensorflow.python modules directly

    print(type(keras.layers.Dense(1)).__name__)
    """
)


@pytest.mark.parametrize("process", ["notebook", "server"])
def test_keras_imports_after_a_saved_model_served_in_the_process(model_store, process):
    """A notebook kernel that ran a SavedModel in-process (a batch job), or a server about to run a Python model,
    then imports Keras: TensorFlow must be whole by then (in a notebook it is imported whole from the start)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", KERAS_AFTER_A_SAVED_MODEL, str(model_store / "hp2_tf2"), process],
        cwd=REPO_ROOT, env=env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().strip().splitlines()[-1] == "Dense"
