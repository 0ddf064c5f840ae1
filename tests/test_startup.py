"""Start-up without TensorFlow: a server whose repository holds no TensorFlow model never imports it.

TF Serving's generated protos import TensorFlow's, and Python runs ``tensorflow/__init__`` (seconds) before any
of them; workbench/protocol/tf_protos.py loads them without it. These tests run ``workbench serve`` as users do,
in a child process that reports its own ``sys.modules`` on request, after answering every API that touches
TF Serving's protos; and check that TensorFlow imported after those protos is whole and shares them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
import tabular_models as tm
import tritonclient.grpc as triton_grpc
from replica import REPO_ROOT, START_TIMEOUT_S
from waiting import wait_until

from workbench.platforms import sklearn as sklearn_platform

# `workbench serve` in a process that writes its loaded tensorflow* modules (JSON) to argv[1] when stdin gets a line.
CHILD = textwrap.dedent(
    """
    import json, sys, threading
    from workbench.cli import main

    def report() -> None:
        sys.stdin.readline()
        names = sorted(m for m in list(sys.modules) if m.split(".")[0] == "tensorflow")
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
        child.proc.terminate()
        try:
            child.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait(timeout=30)


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
    # Only TensorFlow's generated protos (and their packages) came in, through TF Serving's.
    packages = {m.rsplit(".", 1)[0] for m in loaded}
    assert [m for m in loaded if not m.endswith("_pb2") and m not in packages] == []
    assert "tensorflow.core.framework.tensor_pb2" in loaded


def test_a_server_of_tensorflow_models_imports_tensorflow_after_the_protos_and_answers(make_repo, serve_child):
    base = make_repo("half_plus_two", {1: "hp2_tf2"})
    server = serve_child(f"--model_base_path={base}", "--model_name=half_plus_two")
    answer = requests.post(f"{server.rest_url}/v1/models/half_plus_two:predict", json={"instances": [[1.0], [3.0]]})
    assert answer.json() == {"predictions": [[2.5], [3.5]]}
    with tm.stub_for(server) as stub:
        got = tm.grpc_predict(stub, "half_plus_two", {"x": np.array([[2.0]], np.float32)})
        assert got["y"].tolist() == [[3.0]]
    assert "tensorflow" in server.tensorflow_modules()


def test_tensorflow_imported_after_the_protos_shares_them():
    script = textwrap.dedent(
        """
        import sys
        import workbench.protocol.tf_protos
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
