"""Triton's streaming: gRPC ModelStreamInfer (tritonclient.grpc's start_stream and tritonclient.grpc.aio's
stream_infer, unchanged), decoupled Python models, and the REST generate extension (/generate, /generate_stream as
server-sent events), on a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from stream_callbacks import Collected, is_final
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
from waiting import wait_until

from workbench.client import Client
from workbench.config.options import ServerOptions
from workbench.core.errors import ServingError
from workbench.frontends import v2_stream
from workbench.platforms import python
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

# An ordinary model: batched, one answer per request.
DOUBLER = """
import workbench

class Doubler(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 2])}
    outputs = {"y": ("float32", [-1, 2])}

    def predict(self, inputs):
        return {"y": inputs["x"] * 2}
"""

# A decoupled model: n responses counting down, then the end; n < 0 is a bad request met after one response.
COUNTDOWN = """
import workbench

class Countdown(workbench.PythonModel):
    inputs = {"n": ("int32", [1])}
    outputs = {"left": ("int32", [1]), "word": ("string", [1])}
    decoupled = True

    def predict(self, inputs):
        n = int(inputs["n"][0])
        if n < 0:
            yield {"left": [n], "word": ["negative"]}
            raise ValueError("n must not be negative")
        for left in range(n - 1, -1, -1):
            yield {"left": [left], "word": [f"left {left}"]}
"""

# A decoupled model that never ends by itself and records, in files of its folder, how many responses it produced,
# how many of its requests started, and whether its generator was closed: what a slow reader must bound.
ENDLESS = """
import threading

import numpy as np
import workbench

class Endless(workbench.PythonModel):
    inputs = {"size": ("int32", [1])}
    outputs = {"data": ("uint8", [-1])}
    decoupled = True

    def load(self, path):
        self.folder = path
        self.lock = threading.Lock()
        self.produced = self.started = self.closed = 0

    def _note(self, what):
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            (self.folder / f"{what}.txt").write_text(str(getattr(self, what)))

    def predict(self, inputs):
        size = int(inputs["size"][0])
        self._note("started")
        try:
            while True:
                self._note("produced")
                yield {"data": np.zeros(size, np.uint8)}
        finally:
            self._note("closed")
"""


ALLOWED = LoadPolicy(allow_python=True)


def write_model(folder: Path, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streaming")
    write_model(root / "doubler" / "1", DOUBLER)
    write_model(root / "countdown" / "1", COUNTDOWN)
    write_model(root / "endless" / "1", ENDLESS)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerThread]:
    options = ServerOptions(
        rest_api_port=-1, port=0, model_repository=str(repo), allow_python_models=True, enable_batching=True
    )
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.grpc_target) as opened:
        yield opened


@pytest.fixture(scope="module")
def aio_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for this module's grpc.aio clients: gRPC's completion queue may still deliver an event of a
    finished call to its loop, which must not be closed by then (as asyncio.run's would be)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def tensor(name: str, value: np.ndarray, datatype: str) -> triton.InferInput:
    return triton.InferInput(name, list(value.shape), datatype).set_data_from_numpy(value)


def countdown_input(n: int) -> list[triton.InferInput]:
    return [tensor("n", np.array([n], np.int32), "INT32")]


# ========================================================================= the Python model contract
def test_a_decoupled_python_model_yields_conformed_responses_and_refuses_run(tmp_path: Path) -> None:
    model = python.load("countdown", 1, str(write_model(tmp_path / "countdown", COUNTDOWN)), ALLOWED)
    signature = model.signatures["serving_default"]
    assert model.decoupled and not signature.batchable  # its requests share no batch
    answers = list(model.run_decoupled(signature, {"n": np.array([2], np.int32)}, ["left", "word"]))
    assert [(a["left"].dtype, a["left"].tolist(), a["word"].tolist()) for a in answers] == [
        (np.dtype(np.int32), [1], [b"left 1"]),
        (np.dtype(np.int32), [0], [b"left 0"]),
    ]
    with pytest.raises(ServingError) as failed:
        list(model.run_decoupled(signature, {"n": np.array([-1], np.int32)}, ["left"]))
    assert failed.value.code.name == "INVALID_ARGUMENT" and "n must not be negative" in failed.value.message
    with pytest.raises(ServingError) as refused:
        model.run(signature, {"n": np.array([2], np.int32)}, ["left"])
    assert refused.value.code.name == "UNIMPLEMENTED" and "ModelStreamInfer" in refused.value.message
    model.close()


def test_decoupled_model_mistakes_are_named(tmp_path: Path) -> None:
    both = COUNTDOWN.replace("decoupled = True", "decoupled = True\n    stateful = True")
    with pytest.raises(ServingError, match="stateful or decoupled, not both"):
        python.load("both", 1, str(write_model(tmp_path / "both", both)), ALLOWED)
    returns = """
import workbench

class ReturnsOne(workbench.PythonModel):
    inputs = {"n": ("int32", [1])}
    outputs = {"left": ("int32", [1])}
    decoupled = True

    def predict(self, inputs):  # forgot to yield
        return {"left": inputs["n"]}
"""
    model = python.load("returns", 1, str(write_model(tmp_path / "returns", returns)), ALLOWED)
    with pytest.raises(ServingError, match="must yield dicts of outputs"):
        next(model.run_decoupled(model.signatures["serving_default"], {"n": np.array([1], np.int32)}, ["left"]))
    model.close()


# ================================================================================ ModelStreamInfer
def test_an_ordinary_model_over_a_stream_answers_each_request_matched_by_id(client: Any) -> None:
    got = Collected()
    client.start_stream(callback=got)
    try:
        for i in range(5):
            x = np.full((1, 2), i, np.float32)
            client.async_stream_infer("doubler", [tensor("x", x, "FP32")], request_id=f"r{i}")
        answers = got.take(5)
    finally:
        client.stop_stream()
    assert all(error is None for _, error in answers)
    by_id = {result.get_response().id: result for result, _ in answers}
    assert sorted(by_id) == [f"r{i}" for i in range(5)]
    for i in range(5):
        np.testing.assert_array_equal(by_id[f"r{i}"].as_numpy("y"), np.full((1, 2), 2 * i, np.float32))
        assert by_id[f"r{i}"].get_response().model_version == "1"
        assert is_final(by_id[f"r{i}"])  # one answer: the request's last


def test_a_decoupled_model_streams_its_responses_then_the_empty_final_one(client: Any) -> None:
    got = Collected()
    client.start_stream(callback=got)
    try:
        client.async_stream_infer("countdown", countdown_input(3), request_id="three", enable_empty_final_response=True)
        answers = got.take(4)
        client.async_stream_infer("countdown", countdown_input(0), request_id="none", enable_empty_final_response=True)
        (nothing,) = got.take(1)
    finally:
        client.stop_stream()
    assert all(error is None for _, error in answers)
    results = [result for result, _ in answers]
    assert [r.as_numpy("left").tolist() for r in results[:3]] == [[2], [1], [0]]
    assert [r.as_numpy("word").tolist() for r in results[:3]] == [[b"left 2"], [b"left 1"], [b"left 0"]]
    assert [is_final(r) for r in results] == [False, False, False, True]
    assert results[3].get_response().outputs == [] and results[3].get_response().id == "three"
    # A request that yields nothing still ends, with its empty final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL).
    result, error = nothing
    assert error is None and is_final(result) and result.get_response().id == "none"
    assert result.get_response().outputs == []


def test_errors_come_in_the_stream_and_the_stream_goes_on(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    got = Collected()
    client.start_stream(callback=got)
    try:
        client.async_stream_infer("no_such_model", countdown_input(1), request_id="unknown")
        ((_, unknown),) = got.take(1)
        client.async_stream_infer("countdown", [tensor("n", np.array([1.5], np.float32), "FP32")], request_id="bad")
        ((_, bad),) = got.take(1)
        client.async_stream_infer(
            "countdown", countdown_input(-1), request_id="fails", enable_empty_final_response=True
        )
        (first, none), (_, failed) = got.take(2)
        client.async_stream_infer("countdown", countdown_input(1), request_id="ok", enable_empty_final_response=True)
        (last, error), (end, _) = got.take(2)
    finally:
        client.stop_stream()
    assert isinstance(unknown, InferenceServerException) and "unknown model: 'no_such_model'" in unknown.message()
    assert isinstance(bad, InferenceServerException) and 'Input "n" expects int32' in bad.message()
    assert none is None and first.as_numpy("left").tolist() == [-1]  # what it yielded before failing came first
    assert isinstance(failed, InferenceServerException) and "n must not be negative" in failed.message()
    assert error is None and last.as_numpy("left").tolist() == [0] and is_final(end)
    assert "Traceback" not in caplog.text


def stats(server: ServerThread, model: str) -> tuple[int, int]:
    """The model's (succeeded, failed) request counts, from Triton's statistics extension (read off the metrics)."""
    answer = requests.get(f"{server.rest_url}/v2/models/{model}/stats", timeout=20).json()
    inference = answer["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def test_streamed_requests_are_counted_as_any_request(server: ServerThread, client: Any) -> None:
    ok, failed = stats(server, "countdown")
    got = Collected()
    client.start_stream(callback=got)
    try:
        client.async_stream_infer("countdown", countdown_input(2), enable_empty_final_response=True)
        client.async_stream_infer("countdown", countdown_input(-1))
        got.take(5)  # 2 responses and the final one; 1 response and the error
    finally:
        client.stop_stream()
    # One request each, however many responses: counted once, when the request ends.
    wait_until(lambda: stats(server, "countdown") == (ok + 1, failed + 1), timeout=10, what="the requests counted")


def test_garbage_requests_get_in_stream_errors_naming_the_request(server: ServerThread) -> None:
    requests_ = [service_pb2.ModelInferRequest(model_name="", id="nameless")]
    broken = service_pb2.ModelInferRequest(model_name="doubler", id="short")
    broken.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    broken.raw_input_contents.append(b"\x00\x00")  # 2 bytes for 8
    requests_.append(broken)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter(requests_), timeout=20))
    assert [a.infer_response.id for a in answers] == ["nameless", "short"]
    assert "model name is required" in answers[0].error_message
    assert "raw_input_contents holds 2" in answers[1].error_message


def test_a_message_that_does_not_parse_ends_the_stream_with_invalid_argument(server: ServerThread) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=None,  # bytes as they are
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        answers = stream(iter([b"\xff\xff not a message"]), timeout=20)
        with pytest.raises(grpc.RpcError) as failed:
            next(answers)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Reading the request stream failed: DecodeError" in failed.value.details()


def test_model_infer_and_rest_infer_refuse_a_decoupled_model_in_tritons_words(
    client: Any, server: ServerThread
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        client.infer("countdown", countdown_input(2))
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert refused.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    body = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [2]}]}
    answer = requests.post(f"{server.rest_url}/v2/models/countdown/infer", json=body, timeout=20)
    assert answer.status_code == 501
    assert answer.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    # TF Serving's API has no stream: refused too, naming the ways to stream it.
    tf_answer = requests.post(f"{server.rest_url}/v1/models/countdown:predict", json={"instances": [[2]]}, timeout=20)
    assert tf_answer.status_code == 501 and "ModelStreamInfer" in tf_answer.json()["error"]
    # The config says so, in Triton's words, as tools read it to know they must stream; an ordinary model's does not.
    assert client.get_model_config("countdown").config.model_transaction_policy.decoupled
    assert not client.get_model_config("doubler").config.model_transaction_policy.decoupled


def test_the_aio_client_streams_from_an_async_iterator(
    server: ServerThread, aio_loop: asyncio.AbstractEventLoop
) -> None:
    """tritonclient.grpc.aio's stream_infer cannot ask for the empty final response (it refuses triton_ parameters),
    so, as from Triton, it gets the data responses only."""

    async def run() -> list[tuple[str, list[int], bool]]:
        async with triton_aio.InferenceServerClient(server.grpc_target) as aio:

            async def requests_() -> AsyncIterator[dict[str, Any]]:
                for n in (2, 1):
                    yield {"model_name": "countdown", "inputs": countdown_input(n), "request_id": f"n{n}"}

            seen = []
            async for result, error in aio.stream_infer(requests_()):
                assert error is None
                seen.append((result.get_response().id, result.as_numpy("left").tolist(), is_final(result)))
                if len(seen) == 3:
                    break
            return seen

    seen = aio_loop.run_until_complete(asyncio.wait_for(run(), 30))
    assert [s for s in seen if s[0] == "n2"] == [("n2", [1], False), ("n2", [0], False)]
    assert [s for s in seen if s[0] == "n1"] == [("n1", [0], False)]


def count(folder: Path, what: str) -> int:
    file = folder / f"{what}.txt"
    return int(file.read_text() or 0) if file.exists() else 0


def test_a_slow_reader_holds_the_model_back_and_leaving_closes_its_generator(
    server: ServerThread, repo: Path, aio_loop: asyncio.AbstractEventLoop
) -> None:
    """One endless request of 1 MiB responses that nobody reads: the model stops producing (gRPC's flow control
    and the stream's bounded queue), and cancelling the stream closes its generator between two yields."""
    folder = repo / "endless" / "1"

    async def run() -> tuple[int, int]:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="endless", id="big")
            request.inputs.add(name="size", datatype="INT32", shape=[1]).contents.int_contents.append(1 << 20)
            call = stub.ModelStreamInfer(iter([request]))
            await call.read()  # it started
            settled = await until_steady(folder)  # nobody reads: production stops (a count unchanged for 0.5 s)
            for _ in range(3):
                await call.read()
            call.cancel()
            return settled, count(folder, "produced")

    settled, after = aio_loop.run_until_complete(asyncio.wait_for(run(), 30))
    # The stream's queue (16) plus what gRPC's windows and send buffers hold: usually about 10 responses of 1 MiB,
    # once 21 on a busy 2-core machine (gRPC's core buffers a write before the window is checked), never thousands.
    assert settled <= v2_stream.MAX_QUEUED + 32, settled
    assert after <= settled + 3 + 2
    all_closed(folder)


async def until_steady(folder: Path, quiet: float = 0.5, timeout: float = 20.0) -> int:
    """The endless model's count of responses produced, once it has not grown for ``quiet`` seconds (a busy machine
    takes longer to fill the windows and queues, never forever: failing after ``timeout``)."""
    deadline = time.monotonic() + timeout
    produced = count(folder, "produced")
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        now = count(folder, "produced")
        if now == produced:
            return produced
        produced = now
    raise AssertionError(f"the model kept producing for {timeout:g}s with nobody reading ({produced} responses)")


def all_closed(folder: Path) -> None:
    """Every request of the endless model started so far has had its generator closed."""
    wait_until(lambda: count(folder, "closed") == count(folder, "started"), timeout=10, what="generators closed")


def test_a_stream_runs_at_most_max_in_flight_requests_at_once(
    server: ServerThread, repo: Path, aio_loop: asyncio.AbstractEventLoop
) -> None:
    """Many endless requests on one stream nobody reads: only MAX_IN_FLIGHT start; the stream reads no more."""
    folder = repo / "endless" / "1"
    before = count(folder, "started")

    async def run() -> int:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def many() -> AsyncIterator[Any]:
                for i in range(v2_stream.MAX_IN_FLIGHT * 2):
                    request = service_pb2.ModelInferRequest(model_name="endless", id=str(i))
                    request.inputs.add(name="size", datatype="INT32", shape=[1]).contents.int_contents.append(1)
                    yield request

            call = stub.ModelStreamInfer(many())
            await call.read()
            for _ in range(250):  # until the bound is reached (it is within milliseconds; up to 5 s on a busy host)
                if count(folder, "started") - before >= v2_stream.MAX_IN_FLIGHT:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # time enough for any request beyond the bound to start, were it read
            started = count(folder, "started") - before
            call.cancel()
            return started

    started = aio_loop.run_until_complete(asyncio.wait_for(run(), 30))
    assert started == v2_stream.MAX_IN_FLIGHT
    all_closed(folder)


# ========================================================================================= generate
def test_generate_answers_one_json_response(server: ServerThread) -> None:
    doubled = requests.post(
        f"{server.rest_url}/v2/models/doubler/generate", json={"x": [1.0, 2.5], "id": "g1"}, timeout=20
    )
    assert doubled.status_code == 200, doubled.text
    assert doubled.json() == {"model_name": "doubler", "model_version": "1", "id": "g1", "y": [[2.0, 5.0]]}
    one = requests.post(f"{server.rest_url}/v2/models/countdown/versions/1/generate", json={"n": 1}, timeout=20)
    assert one.json() == {"model_name": "countdown", "model_version": "1", "left": 0, "word": "left 0"}
    several = requests.post(f"{server.rest_url}/v2/models/countdown/generate", json={"n": 3}, timeout=20)
    assert several.status_code == 400 and "/generate_stream" in several.json()["error"]
    unknown = requests.post(f"{server.rest_url}/v2/models/nope/generate", json={"n": 3}, timeout=20)
    assert unknown.status_code == 404


def sse_events(response: requests.Response) -> list[dict[str, Any]]:
    events = []
    for line in response.iter_lines():
        if line:
            assert line.startswith(b"data: "), line
            events.append(json.loads(line[len(b"data: ") :]))
    return events


def test_generate_stream_answers_server_sent_events(server: ServerThread) -> None:
    url = f"{server.rest_url}/v2/models/countdown/generate_stream"
    with requests.post(url, json={"n": 3, "parameters": {"note": "ignored"}}, stream=True, timeout=20) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = sse_events(answer)
    assert [(e["left"], e["word"]) for e in events] == [(2, "left 2"), (1, "left 1"), (0, "left 0")]
    with requests.post(url, json={"n": -1}, stream=True, timeout=20) as failing:
        events = sse_events(failing)
    assert events[0]["left"] == -1 and "n must not be negative" in events[1]["error"]
    # An error before inference begins is a plain JSON error with its status, as Triton answers it.
    before = requests.post(url, json={"n": "three"}, timeout=20)
    assert before.status_code == 400 and "int32" in before.json()["error"]
    ordinary = requests.post(f"{server.rest_url}/v2/models/doubler/generate_stream", json={"x": [1.0, 1.0]}, timeout=20)
    assert sse_events(ordinary) == [{"model_name": "doubler", "model_version": "1", "y": [[2.0, 2.0]]}]


def test_generate_stream_follows_the_readers_pace_and_stops_the_model_when_it_leaves(
    server: ServerThread, repo: Path
) -> None:
    folder = repo / "endless" / "1"
    closed = count(folder, "closed")
    url = f"{server.rest_url}/v2/models/endless/generate_stream"
    with requests.post(url, json={"size": 256 * 1024}, stream=True, timeout=20) as answer:
        next(answer.iter_content(1024))
        time.sleep(0.6)
        settled = count(folder, "produced")
        time.sleep(0.4)
        assert count(folder, "produced") == settled  # the socket's buffers are full: the model waits
    wait_until(lambda: count(folder, "closed") == closed + 1, timeout=10, what="the generator closed")
    all_closed(folder)


def test_the_deadline_ends_a_decoupled_request_and_closes_its_generator(serve: Any, tmp_path: Path) -> None:
    """The REST timeout bounds a generate_stream's whole run: past it, an error event, and the model is stopped."""
    folder = write_model(tmp_path / "endless" / "1", ENDLESS)
    server = serve(model_repository=str(tmp_path), allow_python_models=True, rest_api_timeout_in_ms=300)
    url = f"{server.rest_url}/v2/models/endless/generate_stream"
    with requests.post(url, json={"size": 4}, stream=True, timeout=20) as answer:
        events = sse_events(answer)
    assert all("data" in e for e in events[:-1]) and len(events) > 1
    assert "error" in events[-1] and "deadline" in events[-1]["error"].lower(), events[-1]
    all_closed(folder)
    assert count(folder, "closed") == 1


# =========================================================================================== client
def test_the_notebook_client_iterates_a_stream(server: ServerThread) -> None:
    with Client(server.rest_url, server.grpc_target) as notebook:
        answers = list(notebook.stream("countdown", {"n": [3]}))
        assert [a["left"].tolist() for a in answers] == [[2], [1], [0]]
        assert answers[0].version == 1 and answers[0].protocol == "v2-grpc"
        assert [a["y"].tolist() for a in notebook.stream("doubler", [[1.0, 2.0]])] == [[[2.0, 4.0]]]
        assert list(notebook.stream("countdown", {"n": [0]})) == []
        with pytest.raises(ServingError, match="n must not be negative"):
            list(notebook.stream("countdown", {"n": [-1]}))
