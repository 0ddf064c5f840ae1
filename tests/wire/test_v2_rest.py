"""The Open Inference Protocol (v2) on the REST port, driven by Triton's own clients (tritonclient.http and its aio
form, unchanged) and by plain requests for the JSON forms: health, metadata, config, statistics, inference in JSON
and binary, versions and labels, the repository extension, batching, and every error path."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException
from waiting import model_config_text, wait_until  # (tests/waiting.py)

from workbench.config.options import ServerOptions
from workbench.server import ServerThread

ALL_VERSIONS = "model_version_policy { all {} }"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclasses.dataclass(frozen=True)
class Framed:
    """A body in the binary tensor extension's form: a JSON header, then raw tensors."""

    header: bytes
    raw: bytes
    declared: int | None = None  # the header length to claim, when not the true one

    def post(self, target: str) -> requests.Response:
        length = len(self.header) if self.declared is None else self.declared
        return requests.post(target, data=self.header + self.raw, headers={HEADER_LENGTH: str(length)}, timeout=30)


def half_model() -> onnx.ModelProto:
    """doubled = x + x on FP16 [batch, 2]: an ONNX model whose tensors are half precision."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["doubled"])],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 2])],
        [helper.make_tensor_value_info("doubled", TensorProto.FLOAT16, ["batch", 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    """hp: versions 1 (y = x/2 + 2) and 2 (y = x/2 + 3), both served; multi: several typed inputs and outputs;
    half: an ONNX FP16 model."""
    root = tmp_path_factory.mktemp("v2-models")
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    shutil.copytree(model_store / "hp3_tf2", root / "hp" / "2")
    shutil.copytree(model_store / "multi_io", root / "multi" / "1")
    (root / "half" / "1").mkdir(parents=True)
    onnx.save(half_model(), str(root / "half" / "1" / "model.onnx"))
    (root / "models.config").write_text(
        "model_config_list {\n"
        f'  config {{ name: "hp" base_path: "{root / "hp"}" model_platform: "tensorflow" {ALL_VERSIONS} }}\n'
        f'  config {{ name: "multi" base_path: "{root / "multi"}" model_platform: "tensorflow" }}\n'
        f'  config {{ name: "half" base_path: "{root / "half"}" model_platform: "onnx" }}\n'
        "}\n"
    )
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_config_file=str(repository / "models.config"))
    with ServerThread(options) as running:
        yield running


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.rest_url.removeprefix("http://")) as made:
        yield made


def url(server: ServerThread, path: str) -> str:
    return server.rest_url + path


def hp_input(values: list[float], binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", [len(values), 1], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32).reshape(-1, 1), binary_data=binary)
    return tensor


def multi_inputs(binary: bool) -> list[httpclient.InferInput]:
    a = httpclient.InferInput("a", [2, 2], "FP32")
    a.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32), binary_data=binary)
    b = httpclient.InferInput("b", [2], "INT64")
    b.set_data_from_numpy(np.array([10, 20], dtype=np.int64), binary_data=binary)
    text = httpclient.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"caf\xc3\xa9", b"tea"], dtype=object), binary_data=binary)
    return [a, b, text]


def metric(server: ServerThread, name: str, **labels: str) -> float | None:
    text = requests.get(url(server, "/metrics"), timeout=30).text
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


# =================================================================================== health and metadata
def test_health_and_server_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"  # as Triton's clients check
    assert {"binary_tensor_data", "model_repository", "statistics", "model_configuration"} <= set(
        metadata["extensions"]
    )


def test_model_metadata_uses_v2_datatypes_platform_names_and_variable_dims(
    client: httpclient.InferenceServerClient,
) -> None:
    hp = client.get_model_metadata("hp")
    assert hp == {
        "name": "hp",
        "versions": ["1", "2"],
        "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
    }
    multi = client.get_model_metadata("multi", "1")
    assert {(t["name"], t["datatype"], tuple(t["shape"])) for t in multi["inputs"]} == {
        ("a", "FP32", (-1, 2)),
        ("b", "INT64", (-1,)),
        ("text", "BYTES", (-1,)),
    }
    assert {t["name"]: t["datatype"] for t in multi["outputs"]} == {
        "total": "FP32",
        "doubled": "INT64",
        "upper": "BYTES",
        "echo_bytes": "BYTES",
    }
    half = client.get_model_metadata("half")
    assert half["platform"] == "onnxruntime_onnx"
    assert half["inputs"] == [{"name": "x", "datatype": "FP16", "shape": [-1, 2]}]


def test_model_config_without_batching_keeps_every_dimension(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("multi")
    assert config["name"] == "multi"
    assert config["platform"] == "tensorflow_savedmodel"
    assert config["max_batch_size"] == 0
    inputs = {t["name"]: (t["data_type"], t["dims"]) for t in config["input"]}
    assert inputs == {"a": ("TYPE_FP32", [-1, 2]), "b": ("TYPE_INT64", [-1]), "text": ("TYPE_STRING", [-1])}


# ======================================================================================= inference
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_answers_with_the_default_version(client: httpclient.InferenceServerClient, binary: bool) -> None:
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    result = client.infer("hp", [hp_input([1.0, 2.0, 5.0], binary)], outputs=outputs, request_id="r-7")
    np.testing.assert_allclose(result.as_numpy("y"), [[3.5], [4.0], [5.5]])  # version 2: x/2 + 3
    response = result.get_response()
    assert response["model_name"] == "hp"
    assert response["model_version"] == "2"
    assert response["id"] == "r-7"
    assert ("parameters" in response["outputs"][0]) is binary  # binary_data_size only when sent raw


def test_infer_by_version_number(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("hp", [hp_input([1.0, 2.0])], model_version="1")
    np.testing.assert_allclose(result.as_numpy("y"), [[2.5], [3.0]])
    assert result.get_response()["model_version"] == "1"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_several_inputs_and_outputs_with_bytes(client: httpclient.InferenceServerClient, binary: bool) -> None:
    result = client.infer("multi", multi_inputs(binary))  # no outputs named: all of them, raw
    np.testing.assert_allclose(result.as_numpy("total"), [13.0, 27.0])
    np.testing.assert_array_equal(result.as_numpy("doubled"), [20, 40])
    assert result.as_numpy("doubled").dtype == np.int64
    assert list(result.as_numpy("upper")) == [b"CAF\xc3\xa9", b"TEA"]  # upper() leaves non-ASCII bytes alone
    assert list(result.as_numpy("echo_bytes")) == [b"caf\xc3\xa9", b"tea"]


def test_requested_outputs_only_each_in_the_form_asked(client: httpclient.InferenceServerClient) -> None:
    outputs = [
        httpclient.InferRequestedOutput("doubled", binary_data=True),
        httpclient.InferRequestedOutput("upper", binary_data=False),
    ]
    result = client.infer("multi", multi_inputs(binary=True), outputs=outputs)
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["doubled", "upper"]
    assert response["outputs"][1]["data"] == ["CAFé", "TEA"]
    np.testing.assert_array_equal(result.as_numpy("doubled"), [20, 40])
    assert result.as_numpy("total") is None


def test_fp16_tensors_in_binary_and_json(client: httpclient.InferenceServerClient) -> None:
    values = np.array([[0.5, 1.5], [-2.0, 65504 / 4]], dtype=np.float16)
    for binary in (True, False):
        x = httpclient.InferInput("x", [2, 2], "FP16")
        x.set_data_from_numpy(values, binary_data=binary)
        result = client.infer("half", [x], outputs=[httpclient.InferRequestedOutput("doubled", binary_data=binary)])
        doubled = result.as_numpy("doubled")
        assert doubled.dtype == np.float16
        np.testing.assert_array_equal(doubled, values * 2)


def test_the_aio_client_speaks_the_same(server: ServerThread) -> None:
    async def session() -> tuple[bool, dict[str, Any], np.ndarray, dict[str, Any]]:
        async with aiohttpclient.InferenceServerClient(server.rest_url.removeprefix("http://")) as client:
            x = aiohttpclient.InferInput("x", [2, 1], "FP32")
            x.set_data_from_numpy(np.array([[4.0], [6.0]], dtype=np.float32))
            result = await client.infer("hp", [x], model_version="1")
            return (
                await client.is_model_ready("hp", "1"),
                await client.get_model_metadata("hp"),
                result.as_numpy("y"),
                await client.get_inference_statistics("hp", "1"),
            )

    ready, metadata, y, stats = asyncio.run(session())
    assert ready
    assert metadata["versions"] == ["1", "2"]
    np.testing.assert_allclose(y, [[4.0], [5.0]])
    assert stats["model_stats"][0]["version"] == "1"
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 1


def test_plain_json_nested_or_flat_data_and_b64_bytes(server: ServerThread) -> None:
    nested = {
        "id": "abc",
        "inputs": [
            {"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
            {"name": "b", "shape": [2], "datatype": "INT64", "data": [10, 20]},
            {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["x", {"b64": "eXo="}]},
        ],
        "outputs": [{"name": "total"}, {"name": "upper"}],
    }
    r = requests.post(url(server, "/v2/models/multi/infer"), json=nested, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "model_name": "multi",
        "model_version": "1",
        "id": "abc",
        "outputs": [
            {"name": "total", "datatype": "FP32", "shape": [2], "data": [13.0, 27.0]},
            {"name": "upper", "datatype": "BYTES", "shape": [2], "data": ["X", "YZ"]},
        ],
    }
    flat = {"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [2, 4, 6]}]}
    r = requests.post(url(server, "/v2/models/hp/versions/1/infer"), json=flat, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 1], "data": [3.0, 4.0, 5.0]}]


def test_binary_outputs_for_a_plain_http_client(server: ServerThread) -> None:
    body = {
        "inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [2, 4]}],
        "parameters": {"binary_data_output": True},
    }
    r = requests.post(url(server, "/v2/models/hp/versions/1/infer"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    length = int(r.headers[HEADER_LENGTH])
    header = json.loads(r.content[:length])
    assert header["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [2, 1], "parameters": {"binary_data_size": 8}}
    ]
    np.testing.assert_array_equal(np.frombuffer(r.content[length:], "<f4"), [3.0, 4.0])


def test_raw_bytes_tensors_are_length_prefixed(server: ServerThread) -> None:
    header = (
        b'{"inputs":[{"name":"a","shape":[1,2],"datatype":"FP32","data":[1,2]},'
        b'{"name":"b","shape":[1],"datatype":"INT64","data":[3]},'
        b'{"name":"text","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":9}}],'
        b'"outputs":[{"name":"echo_bytes","parameters":{"binary_data":true}}]}'
    )
    raw = struct.pack("<I", 5) + b"\x00\xffab\n"
    r = requests.post(
        url(server, "/v2/models/multi/infer"), data=header + raw, headers={HEADER_LENGTH: str(len(header))}, timeout=30
    )
    assert r.status_code == 200, r.text
    length = int(r.headers[HEADER_LENGTH])
    assert r.content[length:] == raw  # non-UTF-8 bytes travel untouched


# ======================================================================================= statistics
def test_statistics_count_v2_requests_from_the_server_metrics(
    server: ServerThread, client: httpclient.InferenceServerClient
) -> None:
    before = client.get_inference_statistics("multi", "1")["model_stats"][0]
    for _ in range(3):
        client.infer("multi", multi_inputs(binary=True))
    with pytest.raises(InferenceServerException):
        client.infer("multi", multi_inputs(binary=True)[:2])  # "text" missing: a failed request
    (after,) = client.get_inference_statistics("multi", "1")["model_stats"]
    assert after["name"] == "multi"
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 3
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 6  # rows
    assert after["execution_count"] == before["execution_count"] + 3
    assert after["inference_stats"]["compute_infer"]["count"] == after["execution_count"]
    # perf_analyzer stops unless the three compute stages count alike (input and output are timed inside infer).
    stages = [after["inference_stats"][stage] for stage in ("compute_input", "compute_infer", "compute_output")]
    assert [s["count"] for s in stages] == [after["execution_count"]] * 3
    assert stages[0]["ns"] == stages[2]["ns"] == 0
    assert metric(server, "workbench_requests_total", model="multi", protocol="v2-rest", code="OK") >= 3

    everything = client.get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in everything} == {("half", "1"), ("hp", "1"), ("hp", "2"), ("multi", "1")}
    assert [s["version"] for s in client.get_inference_statistics("hp")["model_stats"]] == ["1", "2"]


def test_repository_index_lists_every_version_and_its_state(client: httpclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    assert {(m["name"], m["version"], m["state"]) for m in index} == {
        ("half", "1", "READY"),
        ("hp", "1", "READY"),
        ("hp", "2", "READY"),
        ("multi", "1", "READY"),
    }


def test_model_readiness_by_version(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("hp")
    assert client.is_model_ready("hp", "1")
    assert not client.is_model_ready("hp", "7")
    assert not client.is_model_ready("nope")


# ============================================================================================ errors
ONE_FP32 = struct.pack("<f", 1.0)


def binary_x(size: int) -> bytes:
    """The JSON header of an hp request whose x [2,1] comes raw, claiming ``size`` bytes."""
    parameters = {"binary_data_size": size}
    return json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "parameters": parameters}]}
    ).encode()


BAD_REQUESTS = [
    # (path, body or raw bytes, headers, status, words in the error)
    ("/v2/models/nope/infer", {"inputs": []}, {}, 404, "nope"),
    ("/v2/models/hp/versions/9/infer", {"inputs": []}, {}, 404, "Specific(hp, 9)"),
    ("/v2/models/hp/versions/blue/infer", {"inputs": []}, {}, 400, "version string 'blue': it is neither"),
    ("/v2/models/hp/versions/²/infer", {"inputs": []}, {}, 400, "version string '²'"),  # a digit to isdigit()
    ("/v2/models/hp/infer", b"{not json", {}, 400, "JSON Parse error"),
    ("/v2/models/hp/infer", {"inputs": []}, {}, 400, '"inputs"'),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "INT32", "data": [1]}]},
        {},
        400,
        'Input "x" is FP32 but the request sends INT32',
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP99", "data": [1]}]},
        {},
        400,
        "Unknown datatype 'FP99'",
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1, 2, 3]}]},
        {},
        400,
        'Input "x" says shape [2, 1] (2 elements) but "data" holds 3 elements',
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1], [2]]}]},
        {},
        400,
        'its nested "data" has shape [2, 1]',
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [[1], [2, 3]]}]},
        {},
        400,
        "not a regular array",
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": ["1"]}]},
        {},
        400,
        "must be numbers",
    ),
    (
        "/v2/models/multi/infer",
        {"inputs": [{"name": "b", "shape": [1], "datatype": "INT64", "data": [1.5]}]},
        {},
        400,
        "must be integers",
    ),
    (
        "/v2/models/multi/infer",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [1]}]},
        {},
        400,
        "must be strings",
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "z", "shape": [1, 1], "datatype": "FP32", "data": [1]}]},
        {},
        400,
        "input tensor alias not found in signature: z",
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}], "outputs": [{"name": "w"}]},
        {},
        400,
        "output tensor alias not found in signature: w",
    ),
    ("/v2/models/hp/infer", Framed(binary_x(8), ONE_FP32), {}, 400, "only 4 bytes of binary data are left"),
    ("/v2/models/hp/infer", Framed(binary_x(4), ONE_FP32), {}, 400, "its 4 bytes of binary data hold 1 FP32 elements"),
    ("/v2/models/hp/infer", Framed(binary_x(4), ONE_FP32, 999), {}, 400, "Inference-Header-Content-Length must be"),
    ("/v2/models/hp/infer", Framed(binary_x(4), ONE_FP32, -1), {}, 400, "Inference-Header-Content-Length must be"),
    (
        "/v2/models/hp/infer",
        Framed(b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1]}]}', ONE_FP32),
        {},
        400,
        "4 bytes of binary data that no input",
    ),
    (
        "/v2/models/multi/infer",
        Framed(
            b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}}]}',
            b"\x09\x00\x00\x00ab",
        ),
        {},
        400,
        "runs past its binary data",
    ),
    (
        "/v2/models/multi/infer",
        Framed(
            b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":3}}]}',
            b"\x09\x00\x00",
        ),
        {},
        400,
        "ends inside an element's 4-byte length",
    ),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}], "parameters": {"timeout": "1s"}},
        {},
        400,
        "parameters.timeout must be a positive number of microseconds",
    ),
    ("/v2/repository/index", {"ready": "yes"}, {}, 400, '"ready" must be true or false'),
    ("/v2/repository/models/nope/load", b"", {}, 404, "Unknown model: nope"),
    ("/v2/repository/models/hp/unload", b"", {}, 400, "Name the version of hp to unload"),
    ("/v2/repository/models/hp/load", {"parameters": {"config": "{}"}}, {}, 400, "need --model_control_mode=explicit"),
    ("/v2/repository/models/hp/load", {"parameters": {"priority": 1}}, {}, 400, "takes no parameter priority"),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "words"), BAD_REQUESTS)
def test_bad_requests_are_clear_client_errors(
    server: ServerThread, path: str, body: Any, headers: dict[str, str], status: int, words: str
) -> None:
    if isinstance(body, Framed):
        r = body.post(url(server, path))
    elif isinstance(body, bytes):
        r = requests.post(url(server, path), data=body, headers=headers, timeout=30)
    else:
        r = requests.post(url(server, path), json=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v2/models/nope", 404),
        ("/v2/models/hp/versions/9", 404),
        ("/v2/models/hp/versions/blue/config", 400),  # not a version, nor a label: Triton's 400
        ("/v2/models/nope/stats", 404),
        ("/v2/models/hp/versions/9/stats", 404),
        ("/v2/models/hp/versions/9/ready", 404),
        ("/v2/nothing/here", 404),
    ],
)
def test_unknown_models_versions_and_paths_are_refused(server: ServerThread, path: str, status: int) -> None:
    r = requests.get(url(server, path), timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]


def test_tritonclient_sees_the_errors(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        client.infer("hp", [hp_input([1.0])], model_version="5")
    assert raised.value.status() == "404"
    x = httpclient.InferInput("x", [1, 1], "FP64")
    x.set_data_from_numpy(np.array([[1.0]]))
    with pytest.raises(InferenceServerException, match='Input "x" is FP32 but the request sends FP64') as raised:
        client.infer("hp", [x])
    assert raised.value.status() == "400"
    with pytest.raises(InferenceServerException, match="Unknown model: nope"):
        client.load_model("nope")


# ========================================================== labels, routing and the repository extension
@pytest.fixture
def managed(serve: Callable[..., ServerThread], make_repo: Callable[..., Path], tmp_path: Path) -> ServerThread:
    """A server of its own (its routing changes): hp with versions 1 and 2, both served."""
    base = make_repo("hp", {1: "hp2_tf2", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("hp", base, ALL_VERSIONS)))
    return serve(model_config_file=str(config))


def manage(server: ServerThread, action: str, body: dict[str, Any]) -> None:
    r = requests.post(url(server, f"/workbench/v1/models/hp:{action}"), json=body, timeout=60)
    assert r.status_code == 200, r.text


def answer(server: ServerThread, path: str) -> tuple[str, list[float]]:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}
    r = requests.post(url(server, path), json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["model_version"], r.json()["outputs"][0]["data"]


def test_labels_in_the_version_position_and_promotion(managed: ServerThread) -> None:
    assert answer(managed, "/v2/models/hp/infer") == ("2", [4.0])  # the latest, by default
    manage(managed, "canary", {"version": 1, "weight": 0.01})
    assert answer(managed, "/v2/models/hp/versions/canary/infer") == ("1", [3.0])
    with httpclient.InferenceServerClient(managed.rest_url.removeprefix("http://")) as client:
        result = client.infer("hp", [hp_input([2.0])], model_version="canary")
        assert result.get_response()["model_version"] == "1"
        assert client.is_model_ready("hp", "canary")
        assert client.get_inference_statistics("hp", "canary")["model_stats"][0]["version"] == "1"
    manage(managed, "canary", {"version": 1, "weight": 0})
    manage(managed, "promote", {"version": 1})
    assert answer(managed, "/v2/models/hp/infer") == ("1", [3.0])  # promotion moves the default traffic
    assert answer(managed, "/v2/models/hp/versions/stable/infer") == ("1", [3.0])
    assert answer(managed, "/v2/models/hp/versions/2/infer") == ("2", [4.0])


def test_repository_unload_and_load_a_version(managed: ServerThread) -> None:
    unload = url(managed, "/v2/repository/models/hp/unload")
    r = requests.post(unload, json={"parameters": {"version": 1}}, timeout=60)
    assert r.status_code == 200, r.text
    with httpclient.InferenceServerClient(managed.rest_url.removeprefix("http://")) as client:
        wait_until(lambda: not client.is_model_ready("hp", "1"), what="version 1 unloaded")
        index = {(m["name"], m["version"]): m["state"] for m in client.get_model_repository_index()}
        assert index[("hp", "2")] == "READY"
        assert index[("hp", "1")] in ("UNLOADING", "UNAVAILABLE")
        r = requests.post(url(managed, "/v2/repository/index"), json={"ready": True}, timeout=30)
        assert [(m["name"], m["version"], m["state"]) for m in r.json()] == [("hp", "2", "READY")]
        with pytest.raises(InferenceServerException) as raised:
            client.infer("hp", [hp_input([1.0])], model_version="1")
        assert raised.value.status() == "404"

        r = requests.post(
            url(managed, "/v2/repository/models/hp/load"), json={"parameters": {"version": "1"}}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert client.is_model_ready("hp", "1")  # load answers once the version serves
        client.load_model("hp")  # the model as its folder says: both versions serve
        assert client.is_model_ready("hp", "2")
        with pytest.raises(InferenceServerException, match="Name the version of hp to unload"):
            client.unload_model("hp")
        r = requests.post(unload, json={"parameters": {"version": 1, "unload_dependents": False}}, timeout=60)
        assert r.status_code == 200, r.text
        # Triton's unload removes what it names: the last version that serves too (workbench's own :unload keeps
        # it). The model then serves nothing, and the server stays ready.
        r = requests.post(unload, json={"parameters": {"version": 2}}, timeout=60)
        assert r.status_code == 200, r.text
        assert not client.is_model_ready("hp", "2") and not client.is_model_ready("hp")
        with pytest.raises(InferenceServerException) as raised:
            client.infer("hp", [hp_input([1.0])])
        assert raised.value.status() == "404"
        assert client.is_server_ready()
        r = requests.post(
            url(managed, "/v2/repository/models/hp/load"), json={"parameters": {"version": 2}}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert client.infer("hp", [hp_input([2.0])]).get_response()["model_version"] == "2"


def test_repository_changes_need_the_management_token(
    serve: Callable[..., ServerThread], make_repo: Callable[..., Path]
) -> None:
    server = serve(model_name="hp", model_base_path=str(make_repo("hp", {1: "hp2_tf2"})), management_token="s3cret")
    load = url(server, "/v2/repository/models/hp/load")
    assert requests.post(load, timeout=30).status_code == 401
    assert requests.post(load, headers={"Authorization": "Bearer nope"}, timeout=30).status_code == 401
    assert requests.post(load, headers={"Authorization": "Bearer s3cret"}, timeout=60).status_code == 200


# ============================================================================================= batching
def test_v2_requests_are_batched_like_tf_servings(
    serve: Callable[..., ServerThread], make_repo: Callable[..., Path], tmp_path: Path
) -> None:
    base = make_repo("batched", {1: "hp2_tf2"})
    # Eight rows fill a batch; fewer wait 30 s for more, so eight concurrent requests can only run as one call.
    (base / "batching_parameters.txt").write_text(
        "max_batch_size { value: 8 } batch_timeout_micros { value: 30000000 } num_batch_threads { value: 1 }\n"
    )
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("batched", base, "")))
    server = serve(model_config_file=str(config))
    address = server.rest_url.removeprefix("http://")

    def ask(i: int) -> np.ndarray:
        with httpclient.InferenceServerClient(address) as client:
            return client.infer("batched", [hp_input([float(i)], binary=i % 2 == 0)]).as_numpy("y")

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, range(8)))
    for i, y in enumerate(answers):
        np.testing.assert_allclose(y, [[0.5 * i + 2]])
    assert metric(server, "workbench_batch_size_count", model="batched", version="1") == 1
    assert metric(server, "workbench_batch_size_sum", model="batched", version="1") == 8
    assert metric(server, "workbench_requests_total", model="batched", protocol="v2-rest", code="OK") == 8
    with httpclient.InferenceServerClient(address) as client:
        (stats,) = client.get_inference_statistics("batched")["model_stats"]
        config_answer = client.get_model_config("batched")
    assert stats["execution_count"] == 1
    assert stats["inference_count"] == 8
    assert stats["inference_stats"]["queue"]["count"] == 8
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(8, 1)]
    # Batched: Triton's config leaves the batch dimension out.
    assert config_answer["max_batch_size"] == 8
    assert config_answer["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}]
