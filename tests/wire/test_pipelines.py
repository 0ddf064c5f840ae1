"""Pipelines (``pipeline.yaml``): scaler → classifier → label across Python and TF models, through each model's
batcher; a failing step, a missing member, the file's checks, export, and a canary between two pipeline versions."""

from __future__ import annotations

import shutil
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import models  # (tests/models.py)
import numpy as np
import pytest
import requests
import tensorflow as tf
import yaml
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from waiting import RequestLoop, place_atomically, version_states, wait_until

from workbench.client import Client
from workbench.config.options import ModelConfig, ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.models.manager import DiskVersion, Manager, VersionState
from workbench.platforms import Loader, pipeline
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

SCALER = """
import workbench

class Halve(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 4])}
    outputs = {"y": ("float32", [-1, 4])}

    def predict(self, inputs):
        return {"y": inputs["x"] / 2}
"""

NAMER = """
import numpy as np
import workbench

class Namer(workbench.PythonModel):
    inputs = {"logits": ("float32", [-1, 2])}
    outputs = {"label": ("string", [-1])}

    def predict(self, inputs):
        return {"label": np.array(["big" if row[0] > 5 else "small" for row in inputs["logits"]])}
"""

SHOUTER = """
import numpy as np
import workbench

class Shout(workbench.PythonModel):
    inputs = {"text": ("string", [-1])}
    outputs = {"loud": ("string", [-1])}

    def predict(self, inputs):
        return {"loud": np.array([t.decode().upper() for t in inputs["text"]])}
"""

# scaler (Python) → dense (TensorFlow: logits = [sum, 2·sum]) → namer (Python)
FLOW = """
inputs:
  x: {dtype: float32, shape: [-1, 4]}
outputs:
  label: {dtype: string, shape: [-1]}
steps:
  - name: scale
    model: scaler
    inputs: {x: x}
    outputs: {y: scaled}
  - name: classify
    model: dense
    version: 1
    inputs: {features: scaled}
    outputs: {logits: logits}
  - name: name
    model: namer
    inputs: {logits: logits}
    outputs: {label: label}
"""

# Version 2: the same, then shouted.
FLOW_LOUD = FLOW.replace("outputs: {label: label}", "outputs: {label: quiet}") + (
    "  - name: shout\n    model: shouter\n    inputs: {text: quiet}\n    outputs: {loud: label}\n"
)


def python_model(folder: Path, source: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))


def pipeline_version(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.yaml").write_text(text)
    return folder


def expected_label(row: list[float]) -> str:
    return "big" if sum(row) / 2 > 5 else "small"


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The member models, once; each test's repository copies them."""
    root = tmp_path_factory.mktemp("members")
    python_model(root / "scaler" / "1", SCALER)
    models.save_dense(root / "dense" / "1")
    python_model(root / "namer" / "1", NAMER)
    python_model(root / "shouter" / "1", SHOUTER)
    return root


@pytest.fixture
def start(members: Path, tmp_path: Path) -> Iterator[Callable[..., tuple[ServerThread, Path]]]:
    """Start a server on a repository of the members plus ``pipelines`` (model name → pipeline.yaml text)."""
    servers: list[ServerThread] = []

    def start(**pipelines: str) -> tuple[ServerThread, Path]:
        repo = tmp_path / "repo"
        shutil.copytree(members, repo)
        for name, text in pipelines.items():
            pipeline_version(repo / name / "1", text)
        options = ServerOptions(
            rest_api_port=-1,
            port=0,
            model_repository=str(repo),
            allow_python_models=True,
            enable_batching=True,
            file_system_poll_wait_seconds=0.2,
        )
        server = ServerThread(options).start()
        servers.append(server)
        return server, repo

    yield start
    for server in servers:
        server.stop()


def predict(server: ServerThread, model: str, body: Any) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=60)


ROWS = [[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 1.0], [5.0, 5.0, 5.0, 5.0]]


def in_process_chain(members: Path, rows: list[list[float]]) -> list[bytes]:
    """The three models loaded here and called one after the other: what the pipeline must answer."""
    loader = Loader(LoadPolicy(allow_python=True))
    value: np.ndarray = np.array(rows, np.float32)
    for model, given, taken in (("scaler", "x", "y"), ("dense", "features", "logits"), ("namer", "logits", "label")):
        servable = loader(model, 1, str(members / model / "1"))
        try:
            value = servable.run(servable.signatures["serving_default"], {given: value}, [taken])[taken]
        finally:
            servable.close()
    return list(value)


def test_a_three_step_pipeline_answers_as_its_models_chained(start: Any, members: Path) -> None:
    server, _ = start(flow=FLOW)
    wait_until(lambda: version_states(server.rest_url, "flow") == {"1": "AVAILABLE"}, what="flow AVAILABLE")
    expected = in_process_chain(members, ROWS)
    assert expected == [expected_label(r).encode() for r in ROWS]
    rows = predict(server, "flow", {"instances": ROWS})
    assert rows.status_code == 200, rows.text
    assert rows.json() == {"predictions": [e.decode() for e in expected]}
    columns = predict(server, "flow", {"inputs": {"x": ROWS}})
    assert columns.json() == {"outputs": [e.decode() for e in expected]}

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "flow"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array(ROWS, np.float32)))
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert list(response.outputs["label"].string_val) == expected
    assert response.model_spec.version.value == 1

    meta = requests.get(f"{server.rest_url}/v1/models/flow/metadata", timeout=30).json()
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["x"]["dtype"] == "DT_FLOAT" and signature["outputs"]["label"]["dtype"] == "DT_STRING"


def test_a_failing_step_is_named_with_its_model_and_keeps_its_code(start: Any) -> None:
    server, _ = start(flow=FLOW)
    wait_until(lambda: version_states(server.rest_url, "flow") == {"1": "AVAILABLE"}, what="flow AVAILABLE")
    # Rows of 5: the Python scaler takes them, the TF model of step "classify" does not.
    r = predict(server, "flow", {"instances": [[1.0] * 5]})
    assert r.status_code == 400
    error = r.json()["error"]
    # The pipeline's own input check leads (x is not the shape it declares), then the step, its model and its error.
    assert error.startswith('Input "x" expects float [-1,4] but received float [1,5]: '), error
    assert 'Pipeline flow: step "classify" (model dense version 1) failed: Input "features"' in error
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "flow"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((1, 5), np.float32)))
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'step "classify" (model dense version 1)' in info.value.details()


def test_a_missing_member_keeps_the_version_unavailable_until_it_serves(start: Any) -> None:
    server, repo = start(lonely=FLOW.replace("model: namer", "model: later"))

    def lonely() -> dict[str, Any]:
        return requests.get(f"{server.rest_url}/v1/models/lonely", timeout=30).json()["model_version_status"][0]

    status = wait_until(lambda: (s := lonely())["state"] == "END" and s, what="lonely failed")
    assert status["status"]["error_code"] == "FAILED_PRECONDITION"
    assert "runs on models that are not serving: later" in status["status"]["error_message"]
    assert predict(server, "lonely", {"instances": ROWS}).status_code == 404
    # The member appears (a new model folder): the pipeline version is retried and serves.
    place_atomically(repo / "namer", repo / "later")
    wait_until(lambda: lonely()["state"] == "AVAILABLE", timeout=60, what="lonely AVAILABLE")
    assert predict(server, "lonely", {"instances": ROWS}).json() == {"predictions": [expected_label(r) for r in ROWS]}


def test_a_pipeline_loaded_before_its_members_waits_for_them_instead_of_failing(members: Path, tmp_path: Path) -> None:
    """The manager parks a pipeline version whose members are still loading: LOADING, then AVAILABLE, never END."""
    gate, flow_loaded = threading.Event(), threading.Event()
    real = Loader(LoadPolicy(allow_python=True))

    def loader(name: str, version: int, path: str, platform: str = "") -> Any:
        if name == "scaler":
            gate.wait(60)  # the scaler loads slowly: the pipeline finishes loading first
        servable = real(name, version, path, platform)
        if name == "flow":
            flow_loaded.set()
        return servable

    paths = {name: members / name for name in ("scaler", "dense", "namer")}
    paths["flow"] = pipeline_version(tmp_path / "flow" / "1", FLOW).parent
    transitions: list[tuple[str, VersionState]] = []
    manager = Manager(loader, load_threads=4)
    manager.add_listener(lambda model, version, state: transitions.append((model, state)))
    try:
        manager.set_models([ModelConfig(name, str(path)) for name, path in paths.items()])
        for name in ("flow", "scaler", "dense", "namer"):
            manager.set_aspired_versions(name, {1: DiskVersion(str(paths[name] / "1"))})
        assert flow_loaded.wait(60)
        wait_until(lambda: manager.served.version_state("namer", 1) == VersionState.AVAILABLE, what="namer")
        assert manager.served.version_state("flow", 1) == VersionState.LOADING  # waiting for the scaler, loaded
        gate.set()
        assert manager.served.wait_until_settled(60)
        assert [state for model, state in transitions if model == "flow"] == [
            VersionState.LOADING,
            VersionState.AVAILABLE,
        ]
    finally:
        gate.set()
        manager.stop()


def test_a_pipeline_canary_between_two_versions_loses_no_request(start: Any) -> None:
    server, repo = start(flow=FLOW)
    wait_until(lambda: version_states(server.rest_url, "flow") == {"1": "AVAILABLE"}, what="flow v1")
    client = Client(server.rest_url)
    client.promote("flow", 1)  # v1 stays the default, and loaded, when v2 arrives
    body = {"instances": [[9.0, 9.0, 9.0, 9.0]]}
    v1, v2 = '{"predictions":["big"]}', '{"predictions":["BIG"]}'
    url = f"{server.rest_url}/v1/models/flow:predict"
    loops = [RequestLoop(url, body) for _ in range(4)]
    for loop in loops:
        loop.start()
    try:
        wait_until(lambda: all(loop.count(v1) for loop in loops), what="v1 answers")
        staged = pipeline_version(repo.parent / "staged" / "2", FLOW_LOUD)
        place_atomically(staged, repo / "flow" / "2")
        wait_until(lambda: version_states(server.rest_url, "flow").get("2") == "AVAILABLE", what="flow v2")
        client.canary("flow", 2, 0.5)
        wait_until(lambda: sum(loop.count(v2) for loop in loops) >= 10, timeout=60, what="canary answers")
        client.promote("flow", 2)
        seen = sum(loop.count() for loop in loops)
        wait_until(lambda: sum(loop.count() for loop in loops) > seen + 20, what="answers after the promotion")
    finally:
        results = [loop.stop() for loop in loops]
    answers = [body for result in results for _, body in result]
    assert [r for result in results for r in result if r[0] != 200] == []  # 0 failed requests
    assert answers.count(v1) and answers.count(v2) and set(answers) == {v1, v2}
    assert all(result[-1][1] == v2 for result in results)  # after the promotion, v2 answers everyone


# ------------------------------------------------------------------------------------------ the file's checks
def flow(**change: Any) -> dict[str, Any]:
    document = yaml.safe_load(FLOW)
    for key, value in change.items():
        if key.startswith("step1_"):
            document["steps"][1][key[len("step1_") :]] = value
        else:
            document[key] = value
    return document


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({**flow(), "step": []}, "a pipeline has exactly inputs, outputs, steps; unknown: ['step']"),
        (flow(step1_inputs={"features": "scaled_x"}), 'steps[1] (classify).inputs.features: reads "scaled_x"'),
        (flow(step1_label="stable"), "steps[1] (classify): names a version and a label"),
        (flow(step1_version="one"), "steps[1] (classify): version must be a version number"),
        (flow(step1_outputs={"logits": "logits", "extra": "unused"}), 'maps out "unused", which no later step'),
        (flow(step1_name="scale"), 'another step is named "scale"'),
        (flow(step1_outputs={"logits": "scaled"}), '"scaled" is already produced by step "scale"'),
        (flow(step1_colour="blue"), "steps[1] (classify): unknown keys ['colour']"),
        (flow(outputs={"labels": {"dtype": "string"}}), "outputs.labels: no step produces it"),
        (flow(inputs={"x": {"dtype": "float33", "shape": [-1, 4]}}), 'inputs.x: "float33" is not a type'),
        (flow(steps=[]), "steps must be a list of at least one step"),
    ],
)
def test_mistakes_in_the_file_are_named_with_their_place(document: Any, message: str) -> None:
    with pytest.raises(ServingError) as info:
        pipeline.parse(document)
    assert info.value.code == Code.INVALID_ARGUMENT
    assert message in info.value.message, info.value.message


def test_a_pipeline_cannot_name_itself_nor_run_outside_a_server(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match=r"steps\[2\] \(name\) names the pipeline itself \(namer\)"):
        pipeline.load("namer", 1, str(pipeline_version(tmp_path / "1", FLOW)), LoadPolicy())
    servable = pipeline.load("flow", 1, str(tmp_path / "1"), LoadPolicy())
    assert servable.members() == ["dense", "namer", "scaler"]
    with pytest.raises(ServingError) as info:
        servable.run(servable.signatures["serving_default"], {"x": np.ones((1, 4), np.float32)}, ["label"])
    assert info.value.code == Code.FAILED_PRECONDITION and "runs in a server" in info.value.message


def test_export_writes_a_pipeline_yaml_that_loads_the_same(tmp_path: Path) -> None:
    description = pipeline.Pipeline(
        inputs={"x": ("float32", [-1, 4])},
        outputs={"label": ("string", [-1])},
        steps=[
            pipeline.Step("scale", "scaler", inputs={"x": "x"}, outputs={"y": "scaled"}),
            pipeline.Step("classify", "dense", inputs={"features": "scaled"}, outputs={"logits": "logits"}, version=1),
            pipeline.Step("name", "namer", inputs={"logits": "logits"}, outputs={"label": "label"}),
        ],
    )
    assert pipeline.exports(description) and pipeline.exports(yaml.safe_load(FLOW)) and not pipeline.exports({})
    pipeline.write(description, tmp_path)
    assert yaml.safe_load((tmp_path / "pipeline.yaml").read_text()) == yaml.safe_load(FLOW)
    (tmp_path / "dict").mkdir()
    pipeline.write(yaml.safe_load(FLOW), tmp_path / "dict")
    assert pipeline.parse(yaml.safe_load((tmp_path / "dict" / "pipeline.yaml").read_text())) == pipeline.parse(
        yaml.safe_load(FLOW)
    )
    with pytest.raises(ServingError, match="no step produces it"):
        pipeline.write({**yaml.safe_load(FLOW), "outputs": {"nope": ("string", [-1])}}, tmp_path / "dict")
