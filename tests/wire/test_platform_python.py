"""Python models (``model.py``): served over REST and gRPC like any model, refused unless allowed, exported."""

from __future__ import annotations

import concurrent.futures
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

import workbench
from workbench.config.options import ServerOptions
from workbench.core.errors import ServingError
from workbench.platforms import python
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

SCALER = '''
import numpy as np
import workbench

instances = 0  # module state: each version's model.py must have its own


class Scaler(workbench.PythonModel):
    """y = x * factor, the factor read from the version folder; also counts the loads of this module."""

    inputs = {"x": ("float32", [-1, 3])}
    outputs = {"y": ("float32", [-1, 3]), "loads": ("int64", [-1])}
    signatures = {"total": {"inputs": {"x": ("float", [-1, 3])}, "outputs": {"sum": ("double", [-1])}}}

    def load(self, path):
        global instances
        instances += 1
        self.factor = float((path / "factor.txt").read_text())

    def predict(self, inputs):
        x = inputs["x"]
        if x.ndim != 2 or x.shape[1] != 3:
            raise ValueError(f"x must be rows of 3 numbers, not {list(x.shape)}")
        return {"y": x * self.factor, "loads": np.full(len(x), instances)}

    def total(self, inputs):
        return {"sum": inputs["x"].sum(axis=1)}  # float32 sums, declared double: cast on the way out
'''

# No workbench import at all: a class named Model with the same attributes is the model.
SHOUTER = """
import numpy as np


class Model:
    inputs = {"text": ("string", [-1])}
    outputs = {"loud": ("string", [-1])}
    batchable = False
    thread_safe = False

    def predict(self, inputs):
        return {"loud": np.array([t.decode().upper() + "!" for t in inputs["text"]])}
"""


def write_model(folder: Path, source: str, **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python-models")
    write_model(root / "scaler" / "1", SCALER, factor_txt="2")
    write_model(root / "shouter" / "1", SHOUTER)
    write_model(root / "empty" / "1", "import numpy as np\n")
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerThread]:
    options = ServerOptions(
        rest_api_port=-1, port=0, model_repository=str(repo), allow_python_models=True, enable_batching=True
    )
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def post(server: ServerThread, path: str, body: Any) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{path}", json=body, timeout=30)


def in_process(folder: Path, name: str = "m") -> Any:
    """The same model.py loaded here, outside any server: what the server's answers must equal."""
    return python.load(name, 1, str(folder), LoadPolicy(allow_python=True))


X = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 8.0]], np.float32)


def test_rest_row_and_columnar_answers_equal_the_in_process_model(server: ServerThread, repo: Path) -> None:
    local = in_process(repo / "scaler" / "1")
    expected = local.run(local.signatures["serving_default"], {"x": X}, ["y"])["y"]
    rows = post(server, "scaler:predict", {"instances": [{"x": row} for row in X.tolist()]})
    assert rows.status_code == 200, rows.text
    assert np.array_equal(np.array([p["y"] for p in rows.json()["predictions"]], np.float32), expected)
    columns = post(server, "scaler:predict", {"inputs": {"x": X.tolist()}})
    assert columns.status_code == 200, columns.text
    assert np.array_equal(np.array(columns.json()["outputs"]["y"], np.float32), expected)
    total = post(server, "scaler:predict", {"signature_name": "total", "inputs": {"x": X.tolist()}})
    assert total.json() == {"outputs": [6.0, 4.5]}
    local.close()


def test_grpc_predict_and_metadata(server: ServerThread, stub: Any) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "scaler"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(X))
    response = stub.Predict(request, timeout=30)
    y = np.array(response.outputs["y"].float_val, np.float32).reshape(2, 3)
    assert np.array_equal(y, X * 2)
    assert list(response.outputs["loads"].int64_val) == [1, 1]

    meta = get_model_metadata_pb2.GetModelMetadataRequest()
    meta.model_spec.name = "scaler"
    meta.metadata_field.append("signature_def")
    answer = stub.GetModelMetadata(meta, timeout=30)
    defs = get_model_metadata_pb2.SignatureDefMap()
    answer.metadata["signature_def"].Unpack(defs)
    default = defs.signature_def["serving_default"]
    assert [d.size for d in default.inputs["x"].tensor_shape.dim] == [-1, 3]
    assert set(default.outputs) == {"y", "loads"}
    assert set(defs.signature_def) == {"serving_default", "total"}


def test_rest_metadata_describes_the_declared_signature(server: ServerThread) -> None:
    r = requests.get(f"{server.rest_url}/v1/models/shouter/metadata", timeout=30)
    assert r.status_code == 200, r.text
    inputs = r.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["text"]["dtype"] == "DT_STRING"


def test_strings_in_and_out_on_a_model_that_does_not_import_workbench(server: ServerThread) -> None:
    r = post(server, "shouter:predict", {"instances": ["hi", "héllo"]})
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": ["HI!", "HÉLLO!"]}


def test_concurrent_batched_requests_get_their_own_rows(server: ServerThread) -> None:
    def ask(i: int) -> list[list[float]]:
        rows = [[float(i), float(i + 1), float(i + 2)]] * (1 + i % 3)
        r = post(server, "scaler:predict", {"inputs": {"x": rows}})
        assert r.status_code == 200, r.text
        return r.json()["outputs"]["y"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(48)))
    for i, answer in enumerate(answers):
        assert answer == [[2.0 * i, 2.0 * (i + 1), 2.0 * (i + 2)]] * (1 + i % 3)


def test_a_value_error_is_a_clear_400_and_invalid_argument(server: ServerThread, stub: Any) -> None:
    r = post(server, "scaler:predict", {"inputs": {"x": [[1.0, 2.0]]}})
    assert r.status_code == 400
    assert "x must be rows of 3 numbers, not [1, 2]" in r.json()["error"]
    assert "Model scaler version 1 (Scaler).predict: ValueError" in r.json()["error"]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "scaler"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((1, 2), np.float32)))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_model_py_without_a_model_fails_its_load_with_the_reason(server: ServerThread) -> None:
    status = requests.get(f"{server.rest_url}/v1/models/empty", timeout=30).json()["model_version_status"][0]
    assert status["state"] == "END"
    assert "defines no model" in status["status"]["error_message"]


def test_two_versions_never_share_module_state(tmp_path: Path) -> None:
    base = tmp_path / "repo" / "scaler"
    write_model(base / "1", SCALER, factor_txt="2")
    write_model(base / "2", SCALER, factor_txt="3")
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "scaler" base_path: "{base}" model_platform: "python" '
        "model_version_policy { all {} } } }"
    )
    options = ServerOptions(rest_api_port=-1, port=0, model_config_file=str(config), allow_python_models=True)
    with ServerThread(options) as running:
        for version, factor in ((1, 2.0), (2, 3.0)):
            r = post(running, f"scaler/versions/{version}:predict", {"inputs": {"x": [[1.0, 1.0, 1.0]]}})
            assert r.json()["outputs"] == {"y": [[factor] * 3], "loads": [1]}


def test_python_models_are_refused_unless_allowed(repo: Path) -> None:
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(repo))) as running:
        status = requests.get(f"{running.rest_url}/v1/models/scaler", timeout=30).json()["model_version_status"]
        assert status[0]["state"] == "END"
        assert status[0]["status"]["error_code"] == "FAILED_PRECONDITION"
        assert "--allow_python_models" in status[0]["status"]["error_message"]
        r = post(running, "scaler:predict", {"inputs": {"x": [[1.0, 1.0, 1.0]]}})
        assert r.status_code == 404


def test_workbench_serve_with_the_flag_serves_them(repo: Path) -> None:
    """A real ``workbench serve`` process, started by the notebook handle with ``allow_python_models=True``."""
    handle = workbench.ServerHandle(repo, server_name="python-models", allow_python_models=True)
    assert "--allow_python_models" in handle.command() and "--allow_pickle" not in handle.command()
    handle.start()
    try:
        handle.wait_for_version("shouter", 1)
        assert handle.client.predict("shouter", {"text": np.array([b"ok"], object)})["loud"].tolist() == [b"OK!"]
    finally:
        handle.stop()


# ------------------------------------------------------------------------------------------------ export
class Affine(python.PythonModel):
    """y = a*x + b with a and b from module constants: export writes them beside the class."""

    inputs = {"x": ("float32", [-1])}
    outputs = {"y": ("float32", [-1])}

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": SLOPE * inputs["x"] + np.float32(OFFSET)}


SLOPE, OFFSET = 3.0, 0.5


def exported_answer(cls: type, folder: Path, x: np.ndarray) -> np.ndarray:
    assert python.exports(cls)
    python.write(cls, folder)
    servable = in_process(folder)
    try:
        return servable.run(servable.signatures["serving_default"], {"x": x}, ["y"])["y"]
    finally:
        servable.close()


def test_export_writes_a_model_py_that_loads_and_answers_the_same(tmp_path: Path) -> None:
    x = np.array([1.0, 2.0], np.float32)
    assert exported_answer(Affine, tmp_path, x).tolist() == [3.5, 6.5]
    text = (tmp_path / "model.py").read_text()
    assert "import numpy as np" in text and "SLOPE = 3.0" in text
    assert "import workbench.platforms.python as python" in text  # what the class's base is read through
    assert not python.exports(python.PythonModel) and not python.exports(Affine())


def test_export_of_a_class_defined_in_a_notebook_cell(ipython_shell: Any, tmp_path: Path) -> None:
    ipython_shell.run_cell(
        textwrap.dedent(
            """
            import numpy as np
            import workbench

            class Halver(workbench.PythonModel):
                inputs = {"x": ("float32", [-1])}
                outputs = {"y": ("float32", [-1])}

                def predict(self, inputs):
                    return {"y": inputs["x"] / 2}
            """
        )
    ).raise_error()
    assert exported_answer(ipython_shell.user_ns["Halver"], tmp_path, np.array([3.0], np.float32)).tolist() == [1.5]


def test_export_names_what_cannot_be_written(ipython_shell: Any, tmp_path: Path) -> None:
    ipython_shell.run_cell(
        textwrap.dedent(
            """
            import numpy as np
            import workbench
            weights = np.ones(3)

            class Weighted(workbench.PythonModel):
                inputs = {"x": ("float32", [-1, 3])}
                outputs = {"y": ("float32", [-1])}

                def predict(self, inputs):
                    return {"y": inputs["x"] @ weights}
            """
        )
    ).raise_error()
    with pytest.raises(ServingError, match='uses "weights" \\(ndarray\\)'):
        python.write(ipython_shell.user_ns["Weighted"], tmp_path)


def test_declaration_mistakes_are_named(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        """
        import workbench
        class Bad(workbench.PythonModel):
            inputs = {"x": ("float33", [-1])}
            outputs = {"y": ("float32", [-1])}
        """,
    )
    with pytest.raises(ServingError, match='Bad in .*inputs.x: "float33" is not a type'):
        in_process(tmp_path)
