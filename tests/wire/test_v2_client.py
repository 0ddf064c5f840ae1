"""The Open Inference Protocol (v2) around the server: ``workbench.Client`` over v2 REST and gRPC answers as it does
over TF Serving's API (numpy in and out, versions and labels, status, errors as ServingError), ``workbench bench``
and ``run_load`` drive v2, and the dashboard's query and load panels send v2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from waiting import model_config_text, wait_until

from workbench import cli
from workbench.client import Client, Prediction
from workbench.client.bench import run_load
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.notebook.widgets import LoadPanel, QueryPanel
from workbench.protocol import v2_client as v2
from workbench.server import ServerThread

V2 = ["v2-rest", "v2-grpc"]
TF_SERVING = ["rest", "grpc"]


def save_half_precision(export_dir: Path) -> Path:
    """``y = 2x`` on float16: FP16 has no typed contents in v2's gRPC and travels raw."""
    import tensorflow as tf

    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float16, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x * tf.constant(2, tf.float16)}

    module = Double()
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.serve})
    return export_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerThread]:
    """``hp`` (v1: y = 0.5x + 2; v2: y = 0.5x + 3; label "old" → 1), ``multi`` (several typed inputs and outputs,
    strings among them) and ``half`` (float16)."""
    root = tmp_path_factory.mktemp("v2-client")
    shutil.copytree(model_store / "hp2_tf1", root / "hp" / "1")
    shutil.copytree(model_store / "hp3_tf2", root / "hp" / "2")
    shutil.copytree(model_store / "multi_io", root / "multi" / "1")
    save_half_precision(root / "half" / "1")
    config = root / "models.config"
    config.write_text(
        model_config_text(
            ("hp", root / "hp", 'model_version_policy { all {} } version_labels { key: "old" value: 1 }'),
            ("multi", root / "multi", ""),
            ("half", root / "half", ""),
        )
    )
    options = ServerOptions(model_config_file=str(config), rest_api_port=-1, port=0, file_system_poll_wait_seconds=0)
    with ServerThread(options) as started:
        yield started


@pytest.fixture(scope="module")
def clients(server: ServerThread) -> Iterator[dict[str, Client]]:
    made = {p: Client(server.rest_url, server.grpc_target, protocol=p) for p in [*TF_SERVING, *V2]}
    yield made
    for client in made.values():
        client.close()


MULTI = {"a": [[1.0, 2.0], [3.0, 4.5]], "b": [10, 20], "text": ["héllo", "x"]}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Both answers have the same outputs, dtypes, shapes and values."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert a[key].tolist() == b[key].tolist(), key


# ----------------------------------------------------------------------------------------------- predict
@pytest.mark.parametrize("protocol", V2)
def test_v2_answers_equal_tf_servings(clients, protocol):
    for model, inputs in (("hp", {"x": [[1.0], [3.0]]}), ("multi", MULTI)):
        answer = clients[protocol].predict(model, inputs)
        assert isinstance(answer, Prediction)
        assert (answer.model, answer.protocol, answer.version) == (model, protocol, 2 if model == "hp" else 1)
        assert answer.latency_ms > 0
        for reference in TF_SERVING:
            same(answer, clients[reference].predict(model, inputs))
    upper = clients[protocol].predict("multi", MULTI)["upper"]
    assert upper.tolist() == ["HéLLO".encode(), b"X"]  # UTF-8 bytes, upper-cased as TensorFlow does (ASCII only)


def test_v2_is_short_for_v2_rest(server):
    with Client(server.rest_url, protocol="v2") as client:
        assert client.protocol == "v2-rest"
        assert client.predict("hp", [[2.0]]).protocol == "v2-rest"
    with pytest.raises(ValueError, match="v2-grpc"):
        Client(server.rest_url, protocol="v3")


@pytest.mark.parametrize("protocol", V2)
def test_bytes_that_are_not_text_and_float16_travel_exactly(clients, protocol):
    raw = b"\x00\xff\xfe bytes\x00"
    answer = clients[protocol].predict("multi", {**MULTI, "text": [raw, b""]})
    assert answer["echo_bytes"].tolist() == [raw, b""]
    half = clients[protocol].predict("half", np.array([[0.5, 1.5], [-2.0, 65504 / 2]], np.float16))
    assert half["y"].dtype == np.float16
    assert half["y"].tolist() == [[1.0, 3.0], [-4.0, 65504.0]]


@pytest.mark.parametrize("binary_data", [None, True, False])
def test_rest_json_and_binary_tensors_answer_alike(server, clients, binary_data):
    large = np.linspace(-1, 1, 600, dtype=np.float32).reshape(-1, 1)  # 2,400 bytes: raw under binary_data=None
    with Client(server.rest_url, protocol="v2", binary_data=binary_data) as client:
        for inputs in ({"x": large}, {"x": large[:3]}):
            same(client.predict("hp", inputs), clients["grpc"].predict("hp", inputs))
        same(client.predict("multi", MULTI), clients["grpc"].predict("multi", MULTI))
        if binary_data is False:
            with pytest.raises(ValueError, match="not UTF-8"):
                client.predict("multi", {**MULTI, "text": [b"\xff", b""]})


def test_large_tensors_go_raw_and_small_ones_as_json():
    small = v2.rest_infer_request({"x": np.zeros((3, 1), np.float32)})
    assert small.headers == {"Content-Type": "application/json"}
    assert json.loads(small.body)["inputs"][0]["data"] == [0.0, 0.0, 0.0]
    large = v2.rest_infer_request({"x": np.zeros((300, 1), np.float32), "t": np.array([b"a"], object)})
    header_length = int(large.headers[v2.HEADER_LENGTH])
    header = json.loads(large.body[:header_length])
    assert [t.get("parameters", {}).get("binary_data_size") for t in header["inputs"]] == [1200, None]
    assert header["inputs"][1]["data"] == ["a"]
    assert header["parameters"] == {"binary_data_output": True}
    assert len(large.body) == header_length + 1200


@pytest.mark.parametrize(
    "array",
    [
        np.array([[True, False]]),
        np.array([1, 2**64 - 1], np.uint64),
        np.array([[-128, 127]], np.int8),
        np.array([1.5, -0.25], np.float16),
        np.arange(6, dtype=np.float64).reshape(2, 3),
        np.array([[b"", b"\x00a"], [b"long" * 10, "ü".encode()]], object),
        np.zeros((0, 3), np.float32),
    ],
    ids=lambda a: str(a.dtype),
)
def test_raw_tensors_round_trip(array):
    datatype = v2.to_datatype(array.dtype)
    back = v2.from_raw(v2.to_raw(array), datatype, array.shape)
    assert back.dtype == array.dtype and back.shape == array.shape and back.tolist() == array.tolist()


def test_a_damaged_raw_tensor_is_data_loss():
    with pytest.raises(ServingError) as caught:
        v2.from_raw(b"\x00" * 7, "FP32", [2])
    assert caught.value.code == Code.DATA_LOSS
    with pytest.raises(ServingError) as caught:
        v2.from_raw(b"\x09\x00\x00\x00ab", "BYTES", [1])
    assert caught.value.code == Code.DATA_LOSS


@pytest.mark.parametrize("protocol", V2)
def test_requested_outputs_are_the_output_filter(clients, protocol):
    answer = clients[protocol].predict("multi", MULTI, output_filter=["doubled", "upper"])
    assert sorted(answer) == ["doubled", "upper"]
    assert answer["doubled"].tolist() == [20, 40]


# ------------------------------------------------------------------------------------ versions and labels
@pytest.mark.parametrize("protocol", V2)
def test_version_and_label_select_what_answers(clients, protocol):
    client = clients[protocol]
    by_version = client.predict("hp", [[2.0]], version=1)
    by_label = client.predict("hp", [[2.0]], label="old")
    default = client.predict("hp", [[2.0]])
    assert (by_version.version, by_version["y"].tolist()) == (1, [[3.0]])
    assert (by_label.version, by_label["y"].tolist()) == (1, [[3.0]])
    assert (default.version, default["y"].tolist()) == (2, [[4.0]])
    with pytest.raises(ValueError, match="version number"):
        client.predict("hp", [[2.0]], label="2")


@pytest.mark.parametrize("protocol", V2)
def test_signatures_and_metadata(clients, protocol):
    signatures = clients[protocol].signatures("multi")
    assert list(signatures) == ["serving_default"]
    tf_side = clients["rest"].signatures("multi")["serving_default"]
    for ours, theirs in ((signatures["serving_default"].inputs, tf_side.inputs),
                         (signatures["serving_default"].outputs, tf_side.outputs)):  # fmt: skip
        assert {k: (s.dtype, s.shape) for k, s in ours.items()} == {k: (s.dtype, s.shape) for k, s in theirs.items()}
    metadata = clients[protocol].metadata("hp", label="old")
    assert metadata == clients["v2-rest"].metadata("hp", label="old")  # the same dict over REST and gRPC
    assert metadata["platform"] == "tensorflow_savedmodel"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]


@pytest.mark.parametrize("protocol", V2)
def test_status_reads_as_tf_servings(clients, protocol):
    for where in ({}, {"version": 1}, {"label": "old"}):
        assert clients[protocol].status("hp", **where) == clients["rest"].status("hp", **where), where


# --------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("protocol", V2)
@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c: c.predict("nope", [[1.0]]), Code.NOT_FOUND),
        (lambda c: c.predict("hp", [[1.0]], version=9), Code.NOT_FOUND),
        # Triton's 400 for a version string that names nothing (TF Serving's REST API says the same of a label)
        (lambda c: c.predict("hp", [[1.0]], label="missing"), Code.INVALID_ARGUMENT),
        (lambda c: c.predict("multi", {**MULTI, "b": [1, 2, 3]}), Code.INVALID_ARGUMENT),  # 2 rows of a, 3 of b
        (lambda c: c.status("nope"), Code.NOT_FOUND),
        (lambda c: c.status("hp", version=9), Code.NOT_FOUND),
        (lambda c: c.metadata("hp", label="missing"), Code.INVALID_ARGUMENT),
    ],
    ids=["model", "version", "label", "shape", "status-model", "status-version", "metadata-label"],
)
def test_errors_are_serving_errors_with_the_servers_code(clients, protocol, call, code):
    with pytest.raises(ServingError) as caught:
        call(clients[protocol])
    assert caught.value.code == code, caught.value.message
    assert caught.value.message


@pytest.mark.parametrize("protocol", V2)
def test_what_v2_has_not_is_a_usage_error(clients, protocol):
    with pytest.raises(ValueError, match="serving_default"):
        clients[protocol].predict("hp", [[1.0]], signature_name="classify_x_to_y")
    with pytest.raises(ValueError, match="no classify API"):
        clients[protocol].classify("hp", [{"x": 1.0}])


def test_an_unreachable_v2_server_is_unavailable():
    with Client("http://127.0.0.1:9", "127.0.0.1:9", protocol="v2", timeout=5) as client:
        for protocol in V2:
            with pytest.raises(ServingError) as caught:
                client.predict("hp", [[1.0]], protocol=protocol)
            assert caught.value.code == Code.UNAVAILABLE


# ---------------------------------------------------------------------------------------------------- bench
@pytest.mark.parametrize(("protocol", "binary_data"), [("v2-rest", None), ("v2-rest", False), ("v2-grpc", None)])
def test_bench_loads_v2_without_errors(server, protocol, binary_data):
    target = server.grpc_target if protocol == "v2-grpc" else server.rest_url
    inputs = {"x": np.ones((300, 1), np.float32)}
    result = run_load(target, protocol, "hp", inputs, concurrency=4, requests=40, binary_data=binary_data)
    assert (result.protocol, result.requests, result.errors) == (protocol, 40, 0)
    # The same generator counts what the server refuses: an unknown model is 40 errors, not 40 answers.
    refused = run_load(target, protocol, "nope", inputs, concurrency=2, requests=40, warmup_requests=0)
    assert (refused.requests, refused.errors) == (40, 40)


@pytest.mark.parametrize("protocol", V2)
def test_bench_command_line_speaks_v2(server, protocol, capsys):
    target = server.grpc_target if protocol == "v2-grpc" else server.rest_url.removeprefix("http://")
    words = ["bench", f"--target={target}", f"--protocol={protocol}", "--model=multi", "--requests=20", "--json"]
    inputs = json.dumps({"a": [[1, 2]], "b": [3], "text": ["t"]})  # typed from the model's v2 metadata
    assert cli.main([*words, f"--inputs={inputs}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["protocol"], summary["requests"], summary["errors"]) == (protocol, 20, 0)


# ------------------------------------------------------------------------------------------------ dashboard
def test_query_panel_sends_over_v2(clients):
    panel = QueryPanel(clients["rest"])
    try:
        panel.model.value = "multi"
        assert sorted(panel.signature.options) == ["serving_default"]
        for protocol, shown in (("v2-rest", "v2 REST"), ("v2-grpc", "v2 gRPC")):
            panel.protocol.value = protocol
            assert list(panel.signature.options) == ["serving_default"]  # all v2 has
            panel.last = None
            panel.inputs.value = json.dumps(MULTI)
            panel.send.click()
            wait_until(lambda: panel.last is not None)
            assert panel.last.protocol == protocol and panel.last.version == 1
            assert panel.last["doubled"].tolist() == [20, 40]
            assert f"{shown} · version 1" in panel.response.value
        panel.model.value = "hp"
        panel.target.value = ("label", "old")
        panel.inputs.value = '{"x": [[2.0]]}'
        panel.last = None
        panel.send.click()
        wait_until(lambda: panel.last is not None)
        assert (panel.last.version, panel.last["y"].tolist()) == (1, [[3.0]])
    finally:
        panel.close()


def test_load_panel_sends_v2_load(clients):
    panel = LoadPanel(clients["rest"])
    try:
        panel.model.value, panel.protocol.value, panel.clients.value, panel.seconds.value = "hp", "v2-grpc", 2, 1
        panel.start.click()
        wait_until(lambda: panel.last is not None, timeout=60)
        assert panel.last.protocol == "v2-grpc"
        assert panel.last.requests > 0 and panel.last.errors == 0
        assert "v2-grpc" in panel.result.value
    finally:
        panel.close()
