"""Triton's system shared-memory extension, and the CUDA one's answers on a server without CUDA, driven by
tritonclient's own clients (http, http.aio, grpc, grpc.aio) and ``tritonclient.utils.shared_memory``, unchanged.

Regions registered over one protocol are used over the other; inputs are read from regions and outputs written into
them (FP32 and BYTES, with offsets, beside ordinary tensors); every refusal is checked (names, keys, bounds, sizes, the
server's limit, clients on other hosts, the flags), and after each the server goes on serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from workbench.config.options import ServerOptions
from workbench.config.serve_options import FlagError, serve_options
from workbench.core.errors import Code, ServingError
from workbench.frontends.auth import is_local_peer
from workbench.frontends.v2_shared_memory import SharedMemoryAccess
from workbench.planes.shared_memory import SharedMemoryRegistry
from workbench.protocol import v2_json
from workbench.protocol.shared_memory_parameters import SharedTensor
from workbench.server import ServerThread

PREFIX = f"/workbench_test_{os.getpid()}"  # POSIX shared memory is machine-wide: keys of this test run only
X = np.array([[1.0], [2.0], [3.0]], np.float32)  # hp answers y = x / 2 + 2
Y = X / 2 + 2
TEXT = np.array([b"caf\xc3\xa9", b"tea"], dtype=object)


def key(name: str) -> str:
    return f"{PREFIX}_{name}"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    root = tmp_path_factory.mktemp("v2-shm")
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    shutil.copytree(model_store / "multi_io", root / "multi_io" / "1")
    return root


@pytest.fixture(scope="module")
def socket_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sock") / "grpc.sock"


@pytest.fixture(scope="module")
def server(repository: Path, socket_path: Path) -> Iterator[ServerThread]:
    options = ServerOptions(
        rest_api_port=-1, port=0, model_repository=str(repository), grpc_socket_path=str(socket_path)
    )
    with ServerThread(options) as running:
        yield running


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.rest_url.removeprefix("http://")) as client:
        client.unregister_system_shared_memory()  # as Triton's examples start: from no regions
        yield client
        client.unregister_system_shared_memory()


@pytest.fixture
def grpc_client(server: ServerThread) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_target) as client:
        yield client


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], Any]]:
    """``create(name, byte_size)``: a new shared-memory object of key ``key(name)`` (tritonclient's handle); every one
    is destroyed after the test."""
    made: list[Any] = []

    def create(name: str, byte_size: int) -> Any:
        handle = shm.create_shared_memory_region(name, key(name), byte_size, create_only=True)
        made.append(handle)
        return handle

    yield create
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def http_error(call: Callable[[], Any]) -> tuple[str, str]:
    """The HTTP status and message a tritonclient.http call fails with."""
    with pytest.raises(InferenceServerException) as failed:
        call()
    return str(failed.value.status()), failed.value.message()


def grpc_error(call: Callable[[], Any]) -> tuple[str, str]:
    """The status code name and message a tritonclient.grpc call fails with."""
    with pytest.raises(InferenceServerException) as failed:
        call()
    return str(failed.value.status()).removeprefix("StatusCode."), failed.value.message()


def still_serves(http: httpclient.InferenceServerClient) -> None:
    x = httpclient.InferInput("x", [1, 1], "FP32").set_data_from_numpy(np.array([[4.0]], np.float32))
    assert http.infer("hp", [x]).as_numpy("y").tolist() == [[4.0]]


def http_input(name: str, shape: list[int], datatype: str, region: str, byte_size: int, offset: int = 0) -> Any:
    tensor = httpclient.InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def http_output(name: str, region: str, byte_size: int, offset: int = 0) -> Any:
    output = httpclient.InferRequestedOutput(name)
    output.set_shared_memory(region, byte_size, offset)
    return output


def grpc_input(name: str, shape: list[int], datatype: str, region: str, byte_size: int, offset: int = 0) -> Any:
    tensor = grpcclient.InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def grpc_output(name: str, region: str, byte_size: int, offset: int = 0) -> Any:
    output = grpcclient.InferRequestedOutput(name)
    output.set_shared_memory(region, byte_size, offset)
    return output


# ============================================================================================= inference
def test_fp32_inputs_and_outputs_travel_through_regions_registered_over_either_protocol(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient, regions: Any
):
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]
    inputs, outputs = regions("in", 64), regions("out", 64)
    shm.set_shared_memory_region(inputs, [X])
    shm.set_shared_memory_region(inputs, [X * 2], offset=16)
    http.register_system_shared_memory("in", key("in"), 64)
    grpc_client.register_system_shared_memory("out", key("out"), 64)  # one registry: usable over REST too

    result = http.infer("hp", [http_input("x", [3, 1], "FP32", "in", 12)], outputs=[http_output("y", "out", 64)])
    # As Triton answers an output written to shared memory: its datatype and shape, no data.
    described = result.get_output("y")
    assert described == {
        "name": "y",
        "datatype": "FP32",
        "shape": [3, 1],
        "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64},
    }
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [3, 1]), Y)

    # Over gRPC, from an offset into the input region, to an offset in the output region.
    answer = grpc_client.infer(
        "hp", [grpc_input("x", [3, 1], "FP32", "in", 12, offset=16)], outputs=[grpc_output("y", "out", 48, 16)]
    )
    output = answer.get_output("y")
    assert (output.datatype, list(output.shape), output.parameters["shared_memory_offset"].int64_param) == (
        "FP32",
        [3, 1],
        16,
    )
    assert answer.get_response().raw_output_contents == [b""]  # one (empty) buffer per output, as Triton answers
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [3, 1], offset=16), X + 2)

    # A region is read on every request (the client rewrites it), and outputs may come back in the answer.
    shm.set_shared_memory_region(inputs, [X * 4])
    for binary in (True, False):
        answer_http = http.infer(
            "hp", [http_input("x", [3, 1], "FP32", "in", 12)], outputs=[httpclient.InferRequestedOutput("y", binary)]
        )
        np.testing.assert_array_equal(answer_http.as_numpy("y"), X * 2 + 2)

    status = sorted(http.get_system_shared_memory_status(), key=lambda region: region["name"])
    assert status == [
        {"name": "in", "key": key("in"), "offset": 0, "byte_size": 64},
        {"name": "out", "key": key("out"), "offset": 0, "byte_size": 64},
    ]
    grpc_status = grpc_client.get_system_shared_memory_status()
    assert sorted(grpc_status.regions) == ["in", "out"]
    assert (grpc_status.regions["out"].key, grpc_status.regions["out"].byte_size) == (key("out"), 64)
    assert http.get_system_shared_memory_status("in") == [status[0]]


def test_a_stream_reads_and_writes_regions_as_model_infer_does(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient, regions: Any
):
    inputs, outputs = regions("stream_in", 64), regions("stream_out", 64)
    shm.set_shared_memory_region(inputs, [X])
    http.register_system_shared_memory("stream_in", key("stream_in"), 64)
    http.register_system_shared_memory("stream_out", key("stream_out"), 64)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            "hp",
            [grpc_input("x", [3, 1], "FP32", "stream_in", 12)],
            outputs=[grpc_output("y", "stream_out", 12)],
            request_id="in-shm",
        )
        result, error = answers.get(timeout=30)
        assert error is None
        assert result.get_response().id == "in-shm"
        assert result.get_output("y").parameters["shared_memory_region"].string_param == "stream_out"
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [3, 1]), Y)
        # A region too small for the output is refused in the stream, naming it; the stream goes on.
        grpc_client.async_stream_infer(
            "hp",
            [grpc_input("x", [3, 1], "FP32", "stream_in", 12)],
            outputs=[grpc_output("y", "stream_out", 8)],
            request_id="small",
        )
        result, error = answers.get(timeout=30)
        assert result is None
        assert (
            error.message()
            == 'Output "y" takes 12 bytes, more than its shared memory holds (shared_memory_byte_size 8)'
        )
        grpc_client.async_stream_infer("hp", [grpc_input("x", [3, 1], "FP32", "no_such_region", 12)])
        _, error = answers.get(timeout=30)
        assert "no_such_region" in error.message()
    finally:
        grpc_client.stop_stream()
    still_serves(http)


def test_bytes_tensors_in_regions_beside_ordinary_tensors(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient, regions: Any
):
    serialized = serialize_byte_tensor(TEXT).item()  # each element a 4-byte little-endian length and its bytes
    text, upper = regions("text", len(serialized)), regions("upper", 64)
    shm.set_shared_memory_region(text, [serialize_byte_tensor(TEXT)])
    http.register_system_shared_memory("text", key("text"), len(serialized))
    http.register_system_shared_memory("upper", key("upper"), 64)
    a, b = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([10, 20], np.int64)

    result = http.infer(
        "multi_io",
        [
            httpclient.InferInput("a", [2, 2], "FP32").set_data_from_numpy(a),
            httpclient.InferInput("b", [2], "INT64").set_data_from_numpy(b, binary_data=False),
            http_input("text", [2], "BYTES", "text", len(serialized)),
        ],
        outputs=[http_output("upper", "upper", 64), httpclient.InferRequestedOutput("total")],
    )
    assert shm.get_contents_as_numpy(upper, np.object_, [2]).tolist() == [b"CAF\xc3\xa9", b"TEA"]
    assert result.get_output("upper")["datatype"] == "BYTES" and "data" not in result.get_output("upper")
    np.testing.assert_array_equal(result.as_numpy("total"), [13.0, 27.0])

    # gRPC: raw_input_contents then holds buffers only for the inputs not in shared memory, as tritonclient sends.
    shm.set_shared_memory_region(upper, [np.zeros(64, np.uint8)])
    answer = grpc_client.infer(
        "multi_io",
        [
            grpcclient.InferInput("a", [2, 2], "FP32").set_data_from_numpy(a),
            grpc_input("text", [2], "BYTES", "text", len(serialized)),
            grpcclient.InferInput("b", [2], "INT64").set_data_from_numpy(b),
        ],
        outputs=[grpcclient.InferRequestedOutput("total"), grpc_output("upper", "upper", 64)],
    )
    assert shm.get_contents_as_numpy(upper, np.object_, [2]).tolist() == [b"CAF\xc3\xa9", b"TEA"]
    np.testing.assert_array_equal(answer.as_numpy("total"), [13.0, 27.0])


def test_the_asyncio_clients_register_infer_and_unregister(server: ServerThread, regions: Any):
    inputs, outputs = regions("aio_in", 12), regions("aio_out", 12)
    shm.set_shared_memory_region(inputs, [X])

    async def over_http() -> None:
        client = http_aio.InferenceServerClient(server.rest_url.removeprefix("http://"))
        try:
            await client.unregister_system_shared_memory()
            await client.register_system_shared_memory("aio_in", key("aio_in"), 12)
            await client.register_system_shared_memory("aio_out", key("aio_out"), 12)
            x = http_aio.InferInput("x", [3, 1], "FP32")
            x.set_shared_memory("aio_in", 12)
            y = http_aio.InferRequestedOutput("y")
            y.set_shared_memory("aio_out", 12)
            result = await client.infer("hp", [x], outputs=[y])
            assert result.get_output("y")["parameters"]["shared_memory_region"] == "aio_out"
            assert len(await client.get_system_shared_memory_status()) == 2
            await client.unregister_system_shared_memory()
            assert await client.get_system_shared_memory_status() == []
            assert await client.get_cuda_shared_memory_status() == []
            await client.unregister_cuda_shared_memory()
        finally:
            await client.close()

    async def over_grpc() -> None:
        client = grpc_aio.InferenceServerClient(server.grpc_target)
        try:
            await client.register_system_shared_memory("aio_in", key("aio_in"), 12)
            await client.register_system_shared_memory("aio_out", key("aio_out"), 12)
            x = grpc_aio.InferInput("x", [3, 1], "FP32")
            x.set_shared_memory("aio_in", 12)
            y = grpc_aio.InferRequestedOutput("y")
            y.set_shared_memory("aio_out", 12)
            await client.infer("hp", [x], outputs=[y])
            status = await client.get_system_shared_memory_status(as_json=True)
            assert sorted(status["regions"]) == ["aio_in", "aio_out"]
            await client.unregister_system_shared_memory("aio_in")
            await client.unregister_system_shared_memory()
            assert (await client.get_system_shared_memory_status()).regions == {}
            await client.unregister_cuda_shared_memory()
        finally:
            await client.close()

    asyncio.run(over_http())
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [3, 1]), Y)
    shm.set_shared_memory_region(outputs, [np.zeros(3, np.float32)])
    asyncio.run(over_grpc())
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [3, 1]), Y)


def test_a_unix_socket_client_is_local(socket_path: Path, http: httpclient.InferenceServerClient, regions: Any):
    shm.set_shared_memory_region(regions("unix_in", 12), [X])
    with grpcclient.InferenceServerClient(f"unix://{socket_path}") as client:
        client.register_system_shared_memory("unix_in", key("unix_in"), 12)
        answer = client.infer("hp", [grpc_input("x", [3, 1], "FP32", "unix_in", 12)])
    np.testing.assert_array_equal(answer.as_numpy("y"), Y)


# ============================================================================================ inference errors
def test_requests_naming_regions_wrongly_are_refused_naming_the_tensor(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient, regions: Any
):
    shm.set_shared_memory_region(regions("small", 12), [X])
    regions("tiny", 4)
    http.register_system_shared_memory("small", key("small"), 12)
    http.register_system_shared_memory("tiny", key("tiny"), 4)
    y_out = grpcclient.InferRequestedOutput("y")
    cases: list[tuple[list[Any], list[Any], str, str]] = [
        # (inputs, outputs as (http, grpc) pairs, the code, words the message holds)
        ([("x", [3, 1], "FP32", "nowhere", 12)], [], "INVALID_ARGUMENT", "Input \"x\": shared memory region 'nowhere'"),
        ([("x", [3, 1], "FP32", "small", 8)], [], "INVALID_ARGUMENT", 'Input "x": shape [3, 1] of FP32 takes 12 bytes'),
        ([("x", [3, 1], "FP32", "small", 12, 8)], [], "INVALID_ARGUMENT", "do not fit in shared memory region 'small'"),
        ([("x", [1, 1], "FP32", "small", 4, 64)], [], "INVALID_ARGUMENT", "shared_memory_offset 64 and"),
        ([("x", [3, 1], "FP32", "small", 12)], [("y", "nowhere", 12)], "INVALID_ARGUMENT", 'Output "y": shared'),
        ([("x", [3, 1], "FP32", "small", 12)], [("y", "tiny", 8)], "INVALID_ARGUMENT", "do not fit in shared memory"),
        # only known once the model ran: its 12 bytes do not fit in the 4 the request gave
        ([("x", [3, 1], "FP32", "small", 12)], [("y", "tiny", 4)], "INVALID_ARGUMENT", 'Output "y" takes 12 bytes'),
    ]
    for inputs, outputs, code, words in cases:
        message = http_error(
            lambda inputs=inputs, outputs=outputs: http.infer(
                "hp", [http_input(*i) for i in inputs], outputs=[http_output(*o) for o in outputs] or None
            )
        )
        assert message[0] == "400" and words in message[1], (inputs, outputs, message)
        failed = grpc_error(
            lambda inputs=inputs, outputs=outputs: grpc_client.infer(
                "hp", [grpc_input(*i) for i in inputs], outputs=[grpc_output(*o) for o in outputs] or [y_out]
            )
        )
        assert failed[0] == code and words in failed[1], (inputs, outputs, failed)
        still_serves(http)


def test_malformed_shared_memory_parameters_are_invalid_argument(server: ServerThread, http: Any, regions: Any):
    shm.set_shared_memory_region(regions("p", 12), [X])
    http.register_system_shared_memory("p", key("p"), 12)
    url = f"{server.rest_url}/v2/models/hp/infer"

    def infer(x: dict[str, Any], outputs: list[dict[str, Any]] | None = None) -> requests.Response:
        body: dict[str, Any] = {"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", **x}]}
        if outputs is not None:
            body["outputs"] = outputs
        return requests.post(url, json=body, timeout=30)

    region = {"shared_memory_region": "p", "shared_memory_byte_size": 12}
    cases = [
        (infer({"parameters": {"shared_memory_region": "p"}}), "without shared_memory_byte_size"),
        (infer({"parameters": {"shared_memory_byte_size": 12}}), "has shared_memory_byte_size but no"),
        (infer({"parameters": {**region, "shared_memory_offset": -4}}), "shared_memory_offset must be a number"),
        (infer({"parameters": {**region, "shared_memory_byte_size": "12"}}), "must be a number of bytes"),
        (infer({"parameters": {**region, "shared_memory_region": 7}}), "must name a registered region"),
        (infer({"parameters": region, "data": [1, 2, 3]}), 'Input "x" has shared_memory_region and data'),
        (infer({"parameters": region}, [{"name": "y", "parameters": {**region, "binary_data": True}}]), "both"),
    ]
    for answer, words in cases:
        assert answer.status_code == 400 and words in answer.json()["error"], (words, answer.text)
    assert infer({"parameters": region}).json()["outputs"][0]["data"] == Y.ravel().tolist()


# ========================================================================================= registration
def test_registration_refuses_what_it_cannot_map_safely(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient, regions: Any
):
    regions("reg", 64)
    refused_keys = [
        ("../etc/passwd", "is not a shared memory key"),
        ("/dev/shm/x", "is not a shared memory key"),
        ("a/b", "is not a shared memory key"),
        ("/", "is not a shared memory key"),
        ("..", "is not a shared memory key"),
        ("x" * 300, "is not a shared memory key"),
        ("/nul\x00byte", "is not a shared memory key"),
        (key("never_created"), f"shared memory '{key('never_created')}' does not exist"),
    ]
    for bad_key, words in refused_keys:
        status, message = http_error(lambda bad_key=bad_key: http.register_system_shared_memory("r", bad_key, 8))
        assert status == "400" and words in message, (bad_key, message)
        code, message = grpc_error(lambda bad_key=bad_key: grpc_client.register_system_shared_memory("r", bad_key, 8))
        assert code == "INVALID_ARGUMENT" and words in message, (bad_key, message)
    for bad_name in ["../etc/passwd", "a\nb", "x" * 300, ".."]:
        code, message = grpc_error(
            lambda bad_name=bad_name: grpc_client.register_system_shared_memory(bad_name, key("reg"), 8)
        )
        assert code == "INVALID_ARGUMENT" and "cannot name a shared memory region" in message, (bad_name, message)
    status, message = http_error(lambda: http.register_system_shared_memory("r", key("reg"), 60, offset=8))
    assert status == "400" and "offset 8 + byte_size 60 runs past the end" in message and "(64 bytes)" in message
    status, message = http_error(lambda: http.register_system_shared_memory("r", key("reg"), 0))
    assert status == "400" and "byte_size at least 1" in message
    assert http.get_system_shared_memory_status() == []

    http.register_system_shared_memory("reg", key("reg"), 64)
    assert http_error(lambda: http.register_system_shared_memory("reg", key("reg"), 8)) == (
        "409",  # ALREADY_EXISTS, in this server's table of HTTP statuses
        "shared memory region 'reg' already in manager",
    )
    assert grpc_error(lambda: grpc_client.register_system_shared_memory("reg", key("reg"), 8))[0] == "ALREADY_EXISTS"
    assert http_error(lambda: http.get_system_shared_memory_status("nope")) == (
        "404",
        "Unable to find system shared memory region: 'nope'",
    )
    assert grpc_error(lambda: grpc_client.get_system_shared_memory_status("nope"))[0] == "NOT_FOUND"
    http.unregister_system_shared_memory("nope")  # an unknown name is no error, as in Triton
    grpc_client.unregister_system_shared_memory("nope")
    grpc_client.register_system_shared_memory("reg2", key("reg"), 32, offset=32)  # another window of the same object
    assert len(http.get_system_shared_memory_status()) == 2
    grpc_client.unregister_system_shared_memory()
    assert http.get_system_shared_memory_status() == []
    assert grpc_client.get_system_shared_memory_status().regions == {}
    still_serves(http)


def test_cuda_shared_memory_is_refused_and_its_status_and_unregister_answer(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient, regions: Any
):
    status, message = http_error(lambda: http.register_cuda_shared_memory("gpu", "aGFuZGxl", 0, 8))
    assert status == "501" and "this server has no CUDA" in message
    code, message = grpc_error(lambda: grpc_client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 8))
    assert code == "UNIMPLEMENTED" and "'gpu'" in message and "no CUDA" in message
    assert http.get_cuda_shared_memory_status() == []
    assert grpc_client.get_cuda_shared_memory_status().regions == {}
    assert http_error(lambda: http.get_cuda_shared_memory_status("gpu")) == (
        "404",
        "Unable to find cuda shared memory region: 'gpu'",
    )
    assert grpc_error(lambda: grpc_client.get_cuda_shared_memory_status("gpu"))[0] == "NOT_FOUND"
    regions("sys", 8)
    http.register_system_shared_memory("sys", key("sys"), 8)
    assert "registered as system shared memory" in http_error(lambda: http.get_cuda_shared_memory_status("sys"))[1]
    for client in (http, grpc_client):
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("gpu")
    assert len(http.get_system_shared_memory_status()) == 1  # CUDA's unregister-all leaves system regions alone
    still_serves(http)


def test_the_limit_the_token_and_the_stop(serve: Callable[..., ServerThread], repository: Path, regions: Any):
    """--shared_memory_max_bytes bounds the regions together; with --allow_remote_shared_memory and a management
    token, registering and unregistering need the token (inference does not); a stopped server unmaps them all."""
    running = serve(
        model_repository=str(repository),
        shared_memory_max_bytes=100,
        allow_remote_shared_memory=True,
        management_token="s3cret",
    )
    token = {"authorization": "Bearer s3cret"}  # gRPC metadata keys are lower-case; HTTP headers may be either
    shm.set_shared_memory_region(regions("first", 64), [X])
    regions("second", 64)
    with httpclient.InferenceServerClient(running.rest_url.removeprefix("http://")) as client:
        status, message = http_error(lambda: client.register_system_shared_memory("first", key("first"), 64))
        assert status == "401" and "management token" in message
        client.register_system_shared_memory("first", key("first"), 64, headers=token)
        status, message = http_error(
            lambda: client.register_system_shared_memory("second", key("second"), 64, headers=token)
        )
        assert status == "429" and "limit of 100 bytes" in message and "--shared_memory_max_bytes" in message
        assert http_error(lambda: client.unregister_system_shared_memory("first"))[0] == "401"
        answer = client.infer("hp", [http_input("x", [3, 1], "FP32", "first", 12)])  # no token needed
        np.testing.assert_array_equal(answer.as_numpy("y"), Y)
        with grpcclient.InferenceServerClient(running.grpc_target) as grpc_client:
            code, _ = grpc_error(lambda: grpc_client.register_system_shared_memory("second", key("second"), 64))
            assert code == "UNAUTHENTICATED"
            grpc_client.unregister_system_shared_memory("first", headers=token)
            grpc_client.register_system_shared_memory("second", key("second"), 64, headers=token)
            assert sorted(grpc_client.get_system_shared_memory_status().regions) == ["second"]
    registry = running.server.shared_memory
    running.stop()
    assert registry.status() == []
    with pytest.raises(ServingError) as refused:
        registry.register("again", key("second"), 0, 8)
    assert refused.value.code == Code.UNAVAILABLE


# ==================================================================================== who may use it
@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("ipv4:127.0.0.1:50000", True),
        ("ipv4:127.8.9.10:50000", True),
        ("ipv6:%5B::1%5D:50000", True),
        ("ipv6:[::1]:50000", True),
        ("ipv6:%5B::ffff:127.0.0.1%5D:50000", True),
        ("unix:/run/workbench/grpc.sock", True),
        ("unix:", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("ipv4:10.0.0.7:50000", False),
        ("ipv4:0.0.0.0:50000", False),
        ("ipv6:%5B2001:db8::1%5D:50000", False),
        ("ipv6:%5B::ffff:10.0.0.7%5D:50000", False),
        ("192.168.1.20", False),
        ("localhost.evil.example", False),
        ("testclient", False),
        ("", False),
    ],
)
def test_only_loopback_addresses_and_unix_sockets_are_local(peer: str, local: bool):
    assert is_local_peer(peer) is local


def test_clients_on_other_hosts_are_refused_unless_the_flag_allows_them(regions: Any):
    shm.set_shared_memory_region(regions("remote", 12), [X])
    remote, place = "ipv4:10.1.2.3:40000", SharedTensor("remote", 12)
    registry = SharedMemoryRegistry()
    try:
        closed = SharedMemoryAccess(registry)
        for call in (
            lambda: closed.register(remote, "", "remote", key("remote"), 0, 12),
            lambda: closed.unregister(remote, "", ""),
            lambda: closed.status(remote, ""),
            lambda: closed.cuda_register(remote, "", "gpu"),
            lambda: closed.for_peer(remote).read(place, 'Input "x"'),
        ):
            with pytest.raises(ServingError) as refused:
                call()
            assert refused.value.code == Code.PERMISSION_DENIED and "10.1.2.3" in refused.value.message
        # The REST codec asks the same object: a remote request naming a region is refused before any read.
        body = b'{"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "parameters": {'
        body += b'"shared_memory_region": "remote", "shared_memory_byte_size": 12}}]}'
        with pytest.raises(ServingError) as refused:
            v2_json.decode_infer_request(body, None, closed.for_peer(remote))
        assert refused.value.code == Code.PERMISSION_DENIED
        assert registry.status() == []

        opened = SharedMemoryAccess(registry, allow_remote=True, management_token="tok")
        with pytest.raises(ServingError) as refused:
            opened.register(remote, "", "remote", key("remote"), 0, 12)
        assert refused.value.code == Code.UNAUTHENTICATED
        opened.register(remote, "Bearer tok", "remote", key("remote"), 0, 12)
        decoded = v2_json.decode_infer_request(body, None, opened.for_peer(remote))
        np.testing.assert_array_equal(decoded.inputs["x"], X)
        assert [region.name for region in opened.status(remote, "")] == ["remote"]
    finally:
        registry.close()


# ============================================================================================= the registry
def test_reads_copy_and_writes_stay_inside_the_window(regions: Any):
    """A window at an offset that is no page boundary, in an object filled with a sentinel: reads are copies, and
    nothing outside the window is ever written, whatever the request says."""
    size = 3 * 4096
    handle = regions("window", size)
    shm.set_shared_memory_region(handle, [np.full(size, 0xAB, np.uint8)])
    registry = SharedMemoryRegistry()
    try:
        registry.register("w", key("window"), 4100, 16)
        copy = registry.read(SharedTensor("w", 16), 'Input "x"')
        shm.set_shared_memory_region(handle, [np.zeros(4, np.uint8)], offset=4100)
        assert copy == b"\xab" * 16  # the bytes read do not change when the client rewrites the region
        registry.write(SharedTensor("w", 16), b"\x01" * 16, 'Output "y"')
        for too_far in (SharedTensor("w", 17), SharedTensor("w", 8, 9), SharedTensor("w", 1, 16)):
            with pytest.raises(ServingError, match="do not fit in shared memory region 'w'"):
                registry.write(too_far, b"\x02", 'Output "y"')
        with pytest.raises(ServingError, match='Output "y" takes 17 bytes, more than its shared memory holds'):
            registry.write(SharedTensor("w", 16), b"\x02" * 17, 'Output "y"')
        contents = shm.get_contents_as_numpy(handle, np.uint8, [size])
        assert (contents[4100:4116] == 1).all()
        assert (contents[:4100] == 0xAB).all() and (contents[4116:] == 0xAB).all()
        registry.unregister("w")
        with pytest.raises(ServingError, match="'w' is not registered"):
            registry.read(SharedTensor("w", 1), 'Input "x"')
    finally:
        registry.close()


def test_an_object_shrunk_after_registering_is_refused_not_read(regions: Any):
    """Reading a mapping past its object's end would kill the server (SIGBUS): the size is checked before each use."""
    import _posixshmem  # shm_open, as the server opens regions

    regions("shrink", 8192)
    registry = SharedMemoryRegistry()
    try:
        registry.register("s", key("shrink"), 4096, 4096)
        fd = _posixshmem.shm_open(key("shrink"), os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, 4100)  # the client shrinks its object to 4 bytes past the window's start
        finally:
            os.close(fd)
        with pytest.raises(ServingError, match="smaller than when it was registered") as refused:
            registry.read(SharedTensor("s", 4096), 'Input "x"')
        assert refused.value.code == Code.INVALID_ARGUMENT
        assert registry.read(SharedTensor("s", 4), 'Input "x"') == bytes(4)  # what is left is still readable
    finally:
        registry.close()


def test_the_regions_count_is_bounded_too(regions: Any, monkeypatch: pytest.MonkeyPatch):
    from workbench.planes import shared_memory

    monkeypatch.setattr(shared_memory, "MAX_REGIONS", 2)  # 256 in a server; the same check, reached sooner
    regions("count", 8)
    registry = SharedMemoryRegistry()
    try:
        registry.register("one", key("count"), 0, 8)
        registry.register("two", key("count"), 0, 8)
        with pytest.raises(ServingError, match="2 regions are registered") as refused:
            registry.register("three", key("count"), 0, 8)
        assert refused.value.code == Code.RESOURCE_EXHAUSTED
    finally:
        registry.close()


# ============================================================================================ the rest
def test_tracing_and_logging_rpcs_answer_unimplemented_without_a_traceback(
    server: ServerThread, caplog: pytest.LogCaptureFixture
):
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with caplog.at_level(logging.ERROR):
            for name, rpc, request in [
                ("TraceSetting", stub.TraceSetting, service_pb2.TraceSettingRequest()),
                ("LogSettings", stub.LogSettings, service_pb2.LogSettingsRequest()),
            ]:
                with pytest.raises(grpc.RpcError) as failed:
                    rpc(request, timeout=10)
                assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert failed.value.details().startswith(f"{name} is not implemented")
    assert [record for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_the_flags(tmp_path: Path):
    options = serve_options([f"--model_repository={tmp_path}"])
    assert (options.shared_memory_max_bytes, options.allow_remote_shared_memory) == (4 << 30, False)
    options = serve_options(
        [f"--model_repository={tmp_path}", "--shared_memory_max_bytes=1024", "--allow_remote_shared_memory"]
    )
    assert (options.shared_memory_max_bytes, options.allow_remote_shared_memory) == (1024, True)
    with pytest.raises(FlagError, match="--shared_memory_max_bytes cannot be negative"):
        serve_options([f"--model_repository={tmp_path}", "--shared_memory_max_bytes=-1"])
