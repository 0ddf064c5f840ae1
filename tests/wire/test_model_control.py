"""Triton's model control (``--model_control_mode``, ``--load_model``) with Triton's own clients.

In explicit mode only the ``--load_model`` models serve at start-up; clients load and unload whole models out of the
repository, the index lists every model of the repository with its state, and ``unload_dependents`` takes the
pipelines built on a model along. In none and poll modes load and unload are refused in Triton's words; without the
flag, workbench's own behaviour (versions) is unchanged (tests/wire/test_v2_rest.py).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from workbench.config.serve_options import FlagError, serve_options
from workbench.server import ServerThread

DOUBLER = """
import workbench

class Doubler(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 1])}
    outputs = {"y": ("float32", [-1, 1])}

    def predict(self, inputs):
        return {"y": inputs["x"] * %s}
"""
BROKEN = """
import workbench

class Broken(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 1])}
    outputs = {"y": ("float32", [-1, 1])}

    def load(self, path):
        raise ValueError("the weights are missing")

    def predict(self, inputs):
        return inputs
"""
CHAIN = """
inputs:
  x: {dtype: float32, shape: [-1, 1]}
outputs:
  y: {dtype: float32, shape: [-1, 1]}
steps:
  - name: first
    model: two
    inputs: {x: x}
    outputs: {y: doubled}
  - name: second
    model: three
    inputs: {x: doubled}
    outputs: {y: y}
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name, source in (("two", DOUBLER % 2), ("three", DOUBLER % 3), ("broken", BROKEN)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (root / "chain" / "1").mkdir(parents=True)
    (root / "chain" / "1" / "pipeline.yaml").write_text(CHAIN)
    return root


@pytest.fixture
def explicit(serve: Callable[..., ServerThread], repository: Path) -> ServerThread:
    return serve(
        model_repository=str(repository),
        allow_python_models=True,
        model_control_mode="explicit",
        load_model=("two",),
    )


@pytest.fixture
def clients(explicit: ServerThread) -> Iterator[tuple[Any, Any]]:
    http = triton_http.InferenceServerClient(explicit.rest_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(explicit.grpc_target)
    yield http, grpc
    http.close()
    grpc.close()


def infer(client: Any, module: Any, model: str, value: float = 1.5) -> float:
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    return float(client.infer(model, [x]).as_numpy("y")[0, 0])


def index(client: Any) -> dict[str, tuple[str, str, str]]:
    """name → (version, state, reason) of tritonclient.http's get_model_repository_index()."""
    return {
        row["name"]: (row.get("version", ""), row.get("state", ""), row.get("reason", ""))
        for row in client.get_model_repository_index()
    }


def test_only_the_named_models_load_and_the_index_lists_the_rest(clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    assert infer(http, triton_http, "two") == 3.0
    assert index(http) == {
        "broken": ("", "", ""),
        "chain": ("", "", ""),
        "three": ("", "", ""),
        "two": ("1", "READY", ""),
    }
    grpc_index = {m.name: m.state for m in grpc.get_model_repository_index().models}
    assert grpc_index == {"broken": "", "chain": "", "three": "", "two": "READY"}
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'three' is not found"):
        infer(http, triton_http, "three")
    assert not http.is_model_ready("three")


def test_load_and_unload_whole_models_over_both_transports(clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    grpc.load_model("three")
    assert infer(grpc, triton_grpc, "three") == 4.5
    http.unload_model("two")
    assert not http.is_model_ready("two")
    assert index(http)["two"] == ("", "UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'two' is not found"):
        infer(grpc, triton_grpc, "two")
    http.load_model("two")  # back, from the repository
    assert infer(http, triton_http, "two") == 3.0
    assert index(http)["two"] == ("1", "READY", "")


def test_unload_dependents_takes_the_pipelines_along(clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    for name in ("three", "chain"):
        http.load_model(name)
    assert infer(http, triton_http, "chain") == 9.0  # 1.5 * 2 * 3
    grpc.unload_model("three", unload_dependents=True)
    assert {name for name, (_, state, _) in index(http).items() if state == "READY"} == {"two"}
    http.load_model("three")
    http.load_model("chain")
    http.unload_model("three")  # without dependents the pipeline stays loaded, and says why it cannot run
    assert index(http)["chain"][1] == "READY"
    with pytest.raises(InferenceServerException, match=r"Latest\(three\)"):
        infer(http, triton_http, "chain")


def test_load_errors_in_tritons_words(clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    with pytest.raises(InferenceServerException) as unknown:
        http.load_model("nope")
    assert unknown.value.message().startswith("failed to load 'nope', failed to poll from model repository")
    assert unknown.value.status() == "404"
    with pytest.raises(InferenceServerException) as broken:
        grpc.load_model("broken")
    assert broken.value.message().startswith("failed to load 'broken', versions that are not available: 1")
    assert "the weights are missing" in broken.value.message()
    assert index(http)["broken"][1:] == ("UNAVAILABLE", broken.value.message().split("version 1: ")[1].rstrip(")"))
    with pytest.raises(InferenceServerException, match="failed to unload 'three': it is not loaded"):
        http.unload_model("three")
    assert infer(http, triton_http, "two") == 3.0  # and the server kept serving


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_none_and_poll_refuse_load_and_unload(serve: Callable[..., ServerThread], repository: Path, mode: str) -> None:
    server = serve(model_repository=str(repository), allow_python_models=True, model_control_mode=mode)
    http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        assert infer(http, triton_http, "three") == 4.5  # every model loaded at start-up
        for call in (lambda: http.load_model("two"), lambda: grpc.unload_model("two")):
            with pytest.raises(InferenceServerException) as refused:
                call()
            assert refused.value.message() == "explicit model load / unload is not allowed if polling is enabled"
        assert infer(grpc, triton_grpc, "two") == 3.0
    finally:
        http.close()
        grpc.close()


def test_star_loads_every_model_at_start_up(serve: Callable[..., ServerThread], repository: Path) -> None:
    server = serve(
        model_repository=str(repository), allow_python_models=True, model_control_mode="explicit", load_model=("*",)
    )
    http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        assert infer(http, triton_http, "chain") == 9.0
        assert index(http)["broken"][1] == "UNAVAILABLE"
    finally:
        http.close()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--model_control_mode=sometimes"], "--model_control_mode takes none, poll or explicit, not 'sometimes'"),
        (["--load_model=two"], "--load_model needs --model_control_mode=explicit"),
        (["--model_control_mode=explicit", "--load_model=*", "--load_model=two"], "give it alone"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(repository: Path, flags: list[str], words: str) -> None:
    with pytest.raises(FlagError, match=words):
        serve_options([f"--model_repository={repository}", *flags])


def test_explicit_needs_a_repository(tmp_path: Path) -> None:
    with pytest.raises(FlagError, match="give --model_repository"):
        serve_options([f"--model_base_path={tmp_path}", "--model_control_mode=explicit"])


# ------------------------------------------------------------------------------- Triton's load overrides
SCALER_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.factor = float(config["parameters"]["factor"]["string_value"])

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * %s)]
            )
            for r in requests
        ]
"""


def scaler_config(factor: float) -> dict[str, Any]:
    return {
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        "parameters": {"factor": {"string_value": str(factor)}},
    }


@pytest.fixture
def triton_server(serve: Callable[..., ServerThread], repository: Path) -> ServerThread:
    folder = repository / "scaler"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(SCALER_PY % "self.factor")
    text = json.dumps(scaler_config(2.0))
    config = json_format.Parse(text, model_config_pb2.ModelConfig())
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
    return serve(
        model_repository=str(repository),
        allow_python_models=True,
        model_control_mode="explicit",
        load_model=("scaler",),
    )


def scale(client: Any, module: Any, value: float) -> float:
    x = module.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    return float(client.infer("scaler", [x]).as_numpy("Y")[0, 0])


def test_a_config_override_reloads_the_model_with_it(triton_server: ServerThread, repository: Path) -> None:
    http = triton_http.InferenceServerClient(triton_server.rest_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(triton_server.grpc_target)
    try:
        assert scale(http, triton_http, 1.5) == 3.0
        grpc.load_model("scaler", config=json.dumps(scaler_config(10.0)))
        assert scale(http, triton_http, 1.5) == 15.0
        assert http.get_model_config("scaler")["parameters"]["factor"]["string_value"] == "10.0"
        assert (repository / "scaler" / "config.pbtxt").read_text().count('"2.0"') == 1  # the repository untouched
        http.load_model("scaler")  # without overrides: back to the repository's folder
        assert scale(grpc, triton_grpc, 1.5) == 3.0
    finally:
        http.close()
        grpc.close()


def test_file_overrides_replace_the_models_files(triton_server: ServerThread) -> None:
    http = triton_http.InferenceServerClient(triton_server.rest_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(triton_server.grpc_target)
    try:
        source = (SCALER_PY % "-1.0").encode()
        config = json.dumps(scaler_config(1.0))
        http.load_model("scaler", config=config, files={"file:1/model.py": source})
        assert scale(http, triton_http, 1.5) == -1.5
        grpc.load_model("scaler", config=config, files={"file:1/model.py": (SCALER_PY % "3.0").encode()})
        assert scale(grpc, triton_grpc, 1.5) == 4.5
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"config": "{not json"}, "failed to load 'scaler': the config parameter is not a model config"),
        ({"config": '{"name": "other"}'}, "the config parameter names model 'other'"),
        ({"file:1/model.py": "AAAA"}, "File overrides need the config parameter too"),
        ({"config": "{}", "file:../escape.py": "AAAA"}, "must be <version>/<file> inside the model's folder"),
        ({"config": "{}", "file:1/model.py": "not base64!"}, "must be base64"),
    ],
)
def test_bad_overrides_are_refused_and_the_model_keeps_serving(
    triton_server: ServerThread, parameters: dict[str, str], words: str
) -> None:
    answer = requests.post(
        f"{triton_server.rest_url}/v2/repository/models/scaler/load", json={"parameters": parameters}, timeout=60
    )
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]
    http = triton_http.InferenceServerClient(triton_server.rest_url.removeprefix("http://"))
    try:
        assert scale(http, triton_http, 1.5) == 3.0
    finally:
        http.close()


# ============================================================================ configs completed as Triton does
def adder_model() -> Any:
    """Triton's example "simple" in shape: INPUT0 + INPUT1 and INPUT0 - INPUT1, INT32 [batch, 16]."""
    import onnx
    from onnx import TensorProto, helper

    tensors = [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16]) for name in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16]) for name in ("OUTPUT0", "OUTPUT1")]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        tensors,
        outputs,
    )
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


SIMPLE_CONFIG = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""


@pytest.fixture
def onnx_repository(repository: Path) -> Path:
    import onnx

    for name, config in (("simple", SIMPLE_CONFIG), ("bare", "max_batch_size: 8\n")):
        (repository / name / "1").mkdir(parents=True)
        onnx.save_model(adder_model(), str(repository / name / "1" / "model.onnx"))
        (repository / name / "config.pbtxt").write_text(textwrap.dedent(config))
    return repository


def add(client: Any, module: Any, rows: int) -> np.ndarray:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((rows, 16), np.int32))
        tensors.append(tensor)
    return client.infer("simple", tensors).as_numpy("OUTPUT0")


def test_a_partial_override_config_is_completed_from_the_models_files(
    serve: Callable[..., ServerThread], onnx_repository: Path
) -> None:
    """Triton's simple_*_model_control examples: a config of only max_batch_size is completed (the platform from
    model.onnx, the tensors from the model) and get_model_config shows the completed config."""
    server = serve(model_repository=str(onnx_repository), model_control_mode="explicit", load_model=("simple",))
    http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    try:
        with pytest.raises(InferenceServerException) as refused:
            http.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
        assert "failed to load" in refused.value.message()
        grpc.load_model("simple", config='{"max_batch_size":"16"}')
        config = grpc.get_model_config("simple").config
        assert (config.max_batch_size, config.platform, config.backend) == (16, "onnxruntime_onnx", "onnxruntime")
        assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
        assert http.get_model_config("simple")["max_batch_size"] == 16
        assert add(http, triton_http, 12).tolist() == np.full((12, 16), 2).tolist()  # beyond the file's 8
        http.load_model("simple")
        assert http.get_model_config("simple")["max_batch_size"] == 8
    finally:
        http.close()
        grpc.close()


def test_a_config_naming_no_backend_serves_by_its_model_file_unless_auto_complete_is_off(
    serve: Callable[..., ServerThread], onnx_repository: Path
) -> None:
    completing = serve(model_repository=str(onnx_repository), allow_python_models=True)
    http = triton_http.InferenceServerClient(completing.rest_url.removeprefix("http://"))
    try:
        assert http.get_model_config("bare")["platform"] == "onnxruntime_onnx"
        assert [t["name"] for t in http.get_model_metadata("bare")["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    finally:
        http.close()
    strict = serve(model_repository=str(onnx_repository), allow_python_models=True, disable_auto_complete_config=True)
    http = triton_http.InferenceServerClient(strict.rest_url.removeprefix("http://"))
    try:
        _, state, reason = index(http)["bare"]
        assert state == "UNAVAILABLE" and "auto-complete is off: --disable_auto_complete_config" in reason
        assert http.is_model_ready("simple")  # a config that says everything serves either way
    finally:
        http.close()


def test_an_override_file_name_longer_than_a_file_system_takes_fails_as_tritons_poll(
    serve: Callable[..., ServerThread], onnx_repository: Path
) -> None:
    """Triton's simple_grpc_model_control example checks INTERNAL and "failed to poll from model repository"."""
    server = serve(model_repository=str(onnx_repository), model_control_mode="explicit", load_model=("simple",))
    with triton_grpc.InferenceServerClient(server.grpc_target) as grpc:
        with pytest.raises(InferenceServerException) as refused:
            grpc.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        assert refused.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in refused.value.message()
        assert grpc.is_server_live() and grpc.is_model_ready("simple")


def test_auto_complete_finds_each_platforms_model_file(tmp_path: Path) -> None:
    from workbench.platforms.triton_backends import detect_platform

    cases = {"model.onnx": "onnx", "model.py": "python", "model.pt": "pytorch", "model.savedmodel/": "tensorflow"}
    for file, platform in cases.items():
        folder = tmp_path / platform
        (folder / "3").mkdir(parents=True)
        target = folder / "3" / file.rstrip("/")
        target.mkdir() if file.endswith("/") else target.write_bytes(b"")
        assert detect_platform(folder) == platform
    (tmp_path / "named" / "1").mkdir(parents=True)
    (tmp_path / "named" / "1" / "net.onnx").write_bytes(b"")
    assert detect_platform(tmp_path / "named", "net.onnx") == "onnx"
    assert detect_platform(tmp_path / "named") is None
