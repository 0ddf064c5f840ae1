"""``workbench.Client``: the same answers over REST and gRPC (numpy in and out, the signature's dtypes), version
and label routing, latencies, the server's errors as ServingError, and workbench's management methods."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import requests
from waiting import model_config_text, port_is_free

from workbench.client import Client, Prediction
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.server import ServerThread

PROTOCOLS = ["rest", "grpc"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store) -> Iterator[ServerThread]:
    """``hp`` (v1: TF1 half_plus_two, y = 0.5x + 2; v2: TF2 half_plus_three; label "old" → 1) and ``multi``."""
    root = tmp_path_factory.mktemp("client")
    shutil.copytree(model_store / "hp2_tf1", root / "hp" / "1")
    shutil.copytree(model_store / "hp3_tf2", root / "hp" / "2")
    shutil.copytree(model_store / "multi_io", root / "multi" / "1")
    config = root / "models.config"
    config.write_text(
        model_config_text(
            ("hp", root / "hp", 'model_version_policy { all {} } version_labels { key: "old" value: 1 }'),
            ("multi", root / "multi", ""),
        )
    )
    options = ServerOptions(model_config_file=str(config), rest_api_port=-1, port=0, file_system_poll_wait_seconds=0)
    with ServerThread(options) as started:
        yield started


@pytest.fixture(scope="module")
def clients(server) -> Iterator[dict[str, Client]]:
    made = {p: Client(server.rest_url, server.grpc_target, protocol=p) for p in PROTOCOLS}
    yield made
    for client in made.values():
        client.close()


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Both answers have the same outputs, dtypes, shapes and values."""
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert a[key].tolist() == b[key].tolist(), key


# ----------------------------------------------------------------------------------------------- predict
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_predict_returns_numpy_with_the_signature_dtype(clients, protocol):
    client = clients[protocol]
    answer = client.predict("hp", {"x": [[1.0], [3.0]]})
    assert isinstance(answer, Prediction)
    assert list(answer) == ["y"]
    assert answer["y"].dtype == np.float32
    assert answer["y"].tolist() == [[3.5], [4.5]]  # the default is the latest version: 0.5x + 3
    assert (answer.model, answer.protocol) == ("hp", protocol)
    assert answer.latency_ms > 0
    assert client.last_latency_ms == answer.latency_ms
    assert repr(answer).startswith("Prediction(hp")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_single_array_feeds_a_one_input_signature(clients, protocol):
    client = clients[protocol]
    single = client.predict("hp", np.array([[1.0], [2.0]]))
    named = client.predict("hp", {"x": [[1.0], [2.0]]})
    same(single, named)
    assert client.predict("hp", [[2]])["y"].tolist() == [[4.0]]  # ints cast to the signature's float32


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_version_and_label_routing(clients, protocol):
    client = clients[protocol]
    v1 = client.predict("hp", [[1.0]], version=1)
    assert v1["y"].tolist() == [[2.5]]
    assert v1.version == 1
    assert client.predict("hp", [[1.0]], version=2)["y"].tolist() == [[3.5]]
    old = client.predict("hp", [[1.0]], label="old")
    assert old["y"].tolist() == [[2.5]]
    if protocol == "grpc":  # the gRPC answer names the version that ran
        assert old.version == 1
        assert client.predict("hp", [[1.0]]).version == 2
    with pytest.raises(ValueError):
        client.predict("hp", [[1.0]], version=1, label="old")


def test_rest_and_grpc_give_the_same_multi_io_answers(clients):
    inputs = {"a": [[1, 2], [0.5, 0.25]], "b": [3, -4], "text": ["hi", "h\u00e9"]}
    rest, grpc = clients["rest"].predict("multi", inputs), clients["grpc"].predict("multi", inputs)
    same(rest, grpc)
    assert rest["total"].dtype == np.float32 and rest["total"].tolist() == [6.0, -3.25]
    assert rest["doubled"].dtype == np.int64 and rest["doubled"].tolist() == [6, -8]
    assert rest["echo_bytes"].dtype == object and rest["echo_bytes"].tolist() == [b"hi", "h\u00e9".encode()]
    assert rest["upper"].tolist()[0] == b"HI"
    for protocol in PROTOCOLS:
        only = clients[protocol].predict("multi", inputs, output_filter=["doubled"])
        assert list(only) == ["doubled"], protocol
        assert only["doubled"].tolist() == [6, -8]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "text",
    [[b"\xff\x00bin", b"ab"], [b"ab\x00", b"\x00"], ["text", b"\xffbytes"]],
    ids=["binary", "trailing-nul", "str-and-bytes"],
)
def test_string_inputs_reach_the_model_byte_for_byte(clients, protocol, text):
    inputs = {"a": [[0, 0], [0, 0]], "b": [0, 0], "text": text}
    echoed = clients[protocol].predict("multi", inputs, output_filter=["echo_bytes"])["echo_bytes"]
    assert echoed.tolist() == [t.encode() if isinstance(t, str) else t for t in text]


def test_several_inputs_need_a_dict_and_known_names(clients):
    client = clients["rest"]
    with pytest.raises(ValueError, match="several inputs"):
        client.predict("multi", [[1.0, 2.0]])
    with pytest.raises(ValueError, match="no input 'z'"):
        client.predict("hp", {"z": [[1.0]]})


# ------------------------------------------------------------------------------------- classify / regress
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classify_and_regress(clients, protocol):
    client = clients[protocol]
    scores = client.classify("hp", [{"x": 2.0}, {"x": [4.0]}], signature_name="classify_x_to_y", version=1)
    assert scores == [[("", 3.0)], [("", 4.0)]]
    assert client.last_latency_ms is not None and client.last_latency_ms > 0

    classes = client.classify("hp", [{"x": 2.0}], signature_name="classify_with_classes", label="old")
    (((low, p_low), (high, p_high)),) = classes
    assert (low, high) == ("low", "high")
    assert p_high == pytest.approx(1 / (1 + np.exp(-3.0)), rel=1e-6)
    assert p_low + p_high == pytest.approx(1.0)

    assert client.regress("hp", [{"x": 2.0}, {"x": 4.0}], signature_name="regress_x_to_y", version=1) == [3.0, 4.0]
    assert client.regress("hp", [{"x": 2.0}], signature_name="regress_x_to_y2", version=1) == [4.0]


def test_classify_and_regress_agree_across_protocols(clients):
    examples = [{"x": 1.0}, {"x": -2.0}]
    for kind in ("classify", "regress"):
        rest, grpc = (
            getattr(clients[p], kind)("hp", examples, signature_name=f"{kind}_x_to_y", version=1) for p in PROTOCOLS
        )
        assert rest == grpc, kind


# ------------------------------------------------------------------------------------ status / metadata
def test_status_and_metadata_agree_across_protocols(clients):
    rest, grpc = clients["rest"], clients["grpc"]
    expected = [
        {"version": 2, "state": "AVAILABLE", "error_code": "OK", "error_message": ""},
        {"version": 1, "state": "AVAILABLE", "error_code": "OK", "error_message": ""},
    ]
    assert rest.status("hp") == grpc.status("hp") == expected
    assert rest.status("hp", version=1) == grpc.status("hp", version=1) == expected[1:]
    assert rest.status("hp", protocol="grpc") == expected  # a per-call protocol

    for version in (1, 2):
        meta_rest, meta_grpc = rest.metadata("hp", version=version), grpc.metadata("hp", version=version)
        assert meta_rest == meta_grpc
        x = meta_rest.signature_def["serving_default"].inputs["x"]
        assert x.dtype == 1  # DT_FLOAT
        assert [d.size for d in x.tensor_shape.dim] == [-1, 1]
    assert "classify_with_classes" in rest.metadata("hp", label="old").signature_def
    assert "classify_with_classes" not in rest.metadata("hp", version=2).signature_def


# -------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_is_not_found_with_the_servers_message(server, clients, protocol):
    client = clients[protocol]
    with pytest.raises(ServingError) as caught:
        client.predict("nope", [[1.0]])
    assert caught.value.code == Code.NOT_FOUND
    assert "nope" in caught.value.message
    with pytest.raises(ServingError) as status:
        client.status("nope")
    assert status.value.code == Code.NOT_FOUND
    if protocol == "rest":  # word for word what the server said
        said = requests.get(server.rest_url + "/v1/models/nope", timeout=30).json()["error"]
        assert status.value.message == said


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_requests_raise_the_servers_error(clients, protocol):
    client = clients[protocol]
    with pytest.raises(ServingError) as caught:
        client.predict("hp", {})  # x is missing: the server says so
    assert caught.value.code == Code.INVALID_ARGUMENT
    assert "x" in caught.value.message
    with pytest.raises(ServingError) as version:
        client.predict("hp", [[1.0]], version=9)
    assert version.value.code == Code.NOT_FOUND
    with pytest.raises(ServingError) as signature:
        client.predict("hp", [[1.0]], signature_name="no_such_signature")
    assert signature.value.code == Code.INVALID_ARGUMENT
    assert "no_such_signature" in signature.value.message


def test_protocol_choices_and_unreachable_servers():
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1", protocol="soap")
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:1").status("m", protocol="grpc")  # no gRPC target given
    with pytest.raises(ValueError):
        Client(None, "127.0.0.1:1").status("m")  # no REST url given
    port = free_port()
    with Client(f"http://127.0.0.1:{port}", timeout=5) as client, pytest.raises(ServingError) as caught:
        client.status("m")
    assert caught.value.code == Code.UNAVAILABLE
    with Client(None, f"127.0.0.1:{port}", protocol="grpc", timeout=5) as client, pytest.raises(ServingError) as down:
        client.status("m")
    assert down.value.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert port_is_free(port)
    return port


# -------------------------------------------------------------------------------------- management methods
ONE_ROW = [[1.0]]


def test_management_methods(serve, make_repo):
    root = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"}).parent
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    with Client(server.rest_url, server.grpc_target) as client:
        (model,) = client.models()
        assert model["name"] == "m" and [v["version"] for v in model["versions"]] == [2, 1]
        assert client.model("m") == model

        promoted = client.promote("m", 1)
        assert promoted["stable"] == 1
        for protocol in PROTOCOLS:
            assert client.predict("m", ONE_ROW, protocol=protocol)["y"].tolist() == [[2.5]]
            assert client.predict("m", ONE_ROW, label="stable", protocol=protocol)["y"].tolist() == [[2.5]]
        assert client.promote("m", 2)["previous_stable"] == 1
        assert client.rollback("m")["stable"] == 1
        with pytest.raises(ServingError) as no_history:
            client.rollback("m")
        assert no_history.value.http_status == 400
        assert no_history.value.message == "Model m has no previous stable version to roll back to"

        canary = client.canary("m", 2, 0.5)
        assert canary["canary"] == {"version": 2, "weight": 0.5}
        answers = sorted(client.predict("m", ONE_ROW)["y"].item() for _ in range(4))
        assert answers == [2.5, 2.5, 3.5, 3.5]
        assert client.canary("m", 2, 0)["canary"] is None
        with pytest.raises(ServingError) as weight:
            client.canary("m", 2, 1.5)
        assert weight.value.code == Code.INVALID_ARGUMENT

        unloaded = client.unload("m", 2)
        assert {v["version"]: v["dropped"] for v in unloaded["versions"]} == {2: True, 1: False}
        loaded = client.load("m", 2)
        assert {v["version"]: (v["state"], v["dropped"]) for v in loaded["versions"]}[2] == ("AVAILABLE", False)
        with pytest.raises(ServingError) as missing:
            client.promote("m", 9)
        assert missing.value.code == Code.NOT_FOUND

        health = client.health()
        assert health["status"] == "ok"
        assert health["models"] == ["m"]
        assert (health["rest_port"], health["grpc_port"]) == (server.server.rest_port, server.server.grpc_port)
        stats = client.stats()
        assert isinstance(stats, dict) and stats
        assert "m" in str(stats)


def test_management_token_in_the_client(serve, make_repo):
    root = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"}).parent
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0, management_token="t0ken")
    with Client(server.rest_url) as anonymous, pytest.raises(ServingError) as refused:
        anonymous.promote("m", 1)
    assert refused.value.code == Code.UNAUTHENTICATED
    with Client(server.rest_url, token="t0ken") as trusted:
        assert trusted.promote("m", 1)["stable"] == 1
        assert trusted.predict("m", ONE_ROW)["y"].tolist() == [[2.5]]
    with Client(server.rest_url) as anonymous:
        assert anonymous.models()[0]["stable"] == 1  # reading needs no token
