"""Triton Python backend models that stream (``model_transaction_policy { decoupled: true }``: responses sent through
``request.get_response_sender()``) and that serve sequences (``sequence_batching``: control tensors and
``request.correlation_id()``), from an unchanged Triton model repository, to the unchanged tritonclient over gRPC
and REST on a real server; and how their configs are read and refused."""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from stream_callbacks import Collected, is_final
from tritonclient.utils import InferenceServerException
from waiting import wait_until

from workbench.batching.sequence_batcher import SequenceBatcher
from workbench.config import triton_model_config as triton_config
from workbench.config.options import ServerOptions
from workbench.core.errors import ServingError
from workbench.core.sequence_contract import Controls, SequenceRequest, SequenceSettings, Strategy
from workbench.core.signatures import Signature
from workbench.platforms import triton, triton_backends
from workbench.platforms import triton_python as triton_python_platform
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

# ===================================================================================== a decoupled model
# Triton's decoupled idiom: execute starts a thread per request and returns None; the thread sends N responses
# counting down (the final flag with the last one when N is odd, alone after it when N is even). N = 0 sends the
# final flag alone, from execute; N = -1 one response then one carrying an error; N = -2 makes execute raise;
# N >= 1000 sends until the request is over, and 500 <= N < 1000 sends one response then waits, sending nothing, until
# is_cancelled(); both write what they saw into files beside model.py.
COUNTDOWN_PY = """
import json
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        assert pb_utils.using_decoupled_model_transaction_policy(config)
        self.folder = Path(args["model_repository"]) / args["model_version"]
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            if n == 0:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif n == -1:
                sender.send(self.response(-1))
                failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("N must not be negative"))
                sender.send(failed, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif n == -2:
                raise RuntimeError("execute refused N=-2")
            else:
                target = self.endless if n >= 1000 else self.waits if n >= 500 else self.count
                thread = threading.Thread(target=target, args=(sender, n))
                thread.start()
                self.threads.append(thread)
        return None

    def response(self, left):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("LEFT", np.array([left], np.int32)),
                pb_utils.Tensor("WORD", np.array([f"left {left}".encode()], object)),
            ]
        )

    def count(self, sender, n):
        for left in range(n - 1, -1, -1):
            final = left == 0 and n % 2 == 1
            sender.send(self.response(left), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        if n % 2 == 0:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def endless(self, sender, n):
        sent = 0
        try:
            while True:
                sender.send(self.response(sent))
                sent += 1
                (self.folder / "sent.txt").write_text(str(sent))
        except pb_utils.TritonModelException as exc:
            seen = {"sent": sent, "error": str(exc), "cancelled": sender.is_cancelled()}
            (self.folder / "ended.json").write_text(json.dumps(seen))

    def waits(self, sender, n):
        sender.send(self.response(n))
        began = time.monotonic()
        while not sender.is_cancelled() and time.monotonic() - began < 20:
            time.sleep(0.01)
        (self.folder / "waited.json").write_text(json.dumps({"cancelled": sender.is_cancelled()}))

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=10)
"""

COUNTDOWN_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "WORD" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# ===================================================================================== a sequence model
# Triton's classic accumulator: a total per sequence, kept by the model keyed by correlation_id, reset by START and
# dropped at END; SEEN tells what the control tensors and correlation_id() were.
ACCUMULATE_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def first(tensor):
    value = tensor.as_numpy().flatten()[0]
    return value.decode() if isinstance(value, bytes) else value.item()


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}
        self.batched = json.loads(args["model_config"])["max_batch_size"] > 0

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            key = request.correlation_id()
            seen = {"correlation_id": key, "inputs": sorted(t.name() for t in request.inputs())}
            for name in ("START", "END", "READY", "CORRID"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    seen[name] = [str(tensor.as_numpy().dtype), tensor.shape(), first(tensor)]
            if first(pb_utils.get_input_tensor_by_name(request, "START")):
                self.totals[key] = 0
            total = self.totals.get(key, 0) + int(value.sum())
            self.totals[key] = total
            end = pb_utils.get_input_tensor_by_name(request, "END")
            if end is not None and first(end):
                del self.totals[key]
            text = np.array([json.dumps(seen).encode()], object)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", np.full_like(value, total)),
                        pb_utils.Tensor("SEEN", text.reshape(1, 1) if self.batched else text),
                    ]
                )
            )
        return responses
"""

SEQUENCE_TENSORS = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# Direct (Triton's default: no strategy given), batched, with START as int32, READY as fp32, END as bool values.
ACC_DIRECT_CONFIG = (
    """
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""
    + SEQUENCE_TENSORS
)

# Oldest, unbatched, with a string CORRID (ids may be strings) and START values of its own.
ACC_OLDEST_CONFIG = (
    """
backend: "python"
max_batch_size: 0
sequence_batching {
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 1000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 7 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
"""
    + SEQUENCE_TENSORS
)

# Direct with one slot and a short idle time: a second sequence waits for the first to idle out.
ACC_ONE_CONFIG = (
    """
backend: "python"
max_batch_size: 1
sequence_batching {
  direct { }
  max_sequence_idle_microseconds: 400000
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
"""
    + SEQUENCE_TENSORS
)

ONNX_DECOUPLED_CONFIG = 'backend: "onnxruntime"\nmodel_transaction_policy { decoupled: true }\n'


def write(folder: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton-streaming")
    write(root / "countdown", {"config.pbtxt": COUNTDOWN_CONFIG, "1/model.py": COUNTDOWN_PY})
    for name, config in [
        ("acc_direct", ACC_DIRECT_CONFIG),
        ("acc_oldest", ACC_OLDEST_CONFIG),
        ("acc_one", ACC_ONE_CONFIG),
    ]:
        write(root / name, {"config.pbtxt": config, "1/model.py": ACCUMULATE_PY})
    write(root / "onnx_decoupled", {"config.pbtxt": ONNX_DECOUPLED_CONFIG, "1/model.onnx": "never read"})
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def grpc_client(server: ServerThread) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        yield client


@pytest.fixture(scope="module")
def http_client(server: ServerThread) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    yield client
    client.close()


# ======================================================================================= reading configs
def read(tmp_path: Path, text: str) -> triton_config.TritonConfig:
    write(tmp_path / "m", {"config.pbtxt": text})
    return triton_backends.read_config(tmp_path / "m")


def test_sequence_batching_is_read_into_settings_and_controls(tmp_path: Path) -> None:
    direct = read(tmp_path, ACC_DIRECT_CONFIG).sequence_batching
    assert direct is not None
    assert direct.settings == SequenceSettings(
        Strategy.DIRECT, max_idle_seconds=5.0, max_batch_size=4, run_batch_size=4
    )
    assert [(c.name, c.kind, c.data_type, c.false_true) for c in direct.controls] == [
        ("START", "START", "TYPE_INT32", (0, 1)),
        ("READY", "READY", "TYPE_FP32", (0.0, 1.0)),
        ("END", "END", "TYPE_BOOL", (False, True)),
        ("CORRID", "CORRID", "TYPE_UINT64", (0, 1)),
    ]
    controls = Controls(start=True, end=False, ready=True, correlation_id=42)
    values = {c.name: c.value(controls) for c in direct.controls}
    assert [(v.dtype.name, v.tolist()) for v in values.values()] == [
        ("int32", [1]),
        ("float32", [1.0]),
        ("bool", [False]),
        ("uint64", [42]),
    ]
    oldest = read(tmp_path, ACC_OLDEST_CONFIG).sequence_batching
    assert oldest is not None
    assert oldest.settings == SequenceSettings(
        Strategy.OLDEST, max_idle_seconds=1.0, max_batch_size=1, max_queue_delay_seconds=0.001, max_sequences=4
    )  # Triton's default idle time: one second
    start, corrid = oldest.controls
    assert start.value(controls).tolist() == [7] and corrid.value(controls).tolist() == [b"42"]
    assert corrid.value(Controls(True, False, True, "abc")).tolist() == [b"abc"]


def test_slots_and_candidates_are_per_instance_as_in_triton(tmp_path: Path) -> None:
    two = "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
    direct = read(tmp_path, 'backend: "python"\nmax_batch_size: 3\nsequence_batching { direct { } }\n' + two)
    assert direct.sequence_batching is not None
    assert (direct.sequence_batching.settings.strategy, direct.sequence_batching.settings.max_batch_size) == (
        Strategy.DIRECT,
        6,
    )
    oldest = read(tmp_path, 'backend: "python"\nsequence_batching { oldest { } }\n' + two).sequence_batching
    assert oldest is not None  # max_batch_size 0: one candidate per instance, batches of one
    assert (oldest.settings.max_batch_size, oldest.settings.max_sequences) == (1, 2)


def test_a_string_sequence_id_for_a_numeric_corrid_is_refused_clearly(tmp_path: Path) -> None:
    sequence = read(tmp_path, ACC_DIRECT_CONFIG).sequence_batching
    assert sequence is not None
    corrid = sequence.controls[-1]
    with pytest.raises(ServingError, match='sequence id "abc" is a string') as refused:
        corrid.value(Controls(True, False, True, "abc"))
    assert refused.value.code.name == "INVALID_ARGUMENT"


def control(body: str) -> str:
    return f'backend: "python"\nsequence_batching {{ control_input [ {body} ] }}\n'


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        (ONNX_DECOUPLED_CONFIG, "UNIMPLEMENTED", "Triton runs decoupled models only in its Python backend"),
        (
            'platform: "tensorflow_savedmodel"\nmodel_transaction_policy { decoupled: true }\n',
            "UNIMPLEMENTED",
            'not in "tensorflow"',
        ),
        (
            'backend: "python"\nmodel_transaction_policy { decoupled: true }\nsequence_batching { }\n',
            "UNIMPLEMENTED",
            "sequence_batching with a decoupled model",
        ),
        ('backend: "python"\nsequence_batching { iterative_sequence: true }\n', "UNIMPLEMENTED", "iterative_sequence"),
        ('platform: "ensemble"\nensemble_scheduling { }\n', "UNIMPLEMENTED", "ensemble_scheduling"),
        (
            control('{ name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] }'),
            "INVALID_ARGUMENT",
            "must give exactly one of int32_false_true, fp32_false_true and bool_false_true",
        ),
        (
            control('{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] }'),
            "INVALID_ARGUMENT",
            "int32_false_true must have exactly 2 entries",
        ),
        (
            control('{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID int32_false_true: [ 0, 1 ] } ] }'),
            "INVALID_ARGUMENT",
            "takes data_type, not int32_false_true",
        ),
        (
            control('{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] }'),
            "INVALID_ARGUMENT",
            "data_type must be one of TYPE_UINT64",
        ),
        (
            control(
                '{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] },'
                " { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }"
            ),
            "INVALID_ARGUMENT",
            'control_input "S" must give exactly one control',
        ),
        (
            control(
                '{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },'
                '{ name: "T" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }'
            ),
            "INVALID_ARGUMENT",
            "several CONTROL_SEQUENCE_START tensors",
        ),
        (
            control('{ name: "INPUT" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }')
            + 'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
            "INVALID_ARGUMENT",
            '"INPUT" is both an input and a sequence_batching control_input',
        ),
    ],
)
def test_configs_workbench_cannot_serve_say_why(tmp_path: Path, text: str, code: str, words: str) -> None:
    with pytest.raises(ServingError) as refused:
        read(tmp_path, text)
    assert refused.value.code.name == code
    assert words in refused.value.message and "config.pbtxt" in refused.value.message


def test_config_answers_keep_the_sequence_block_and_triton_fills_the_idle_time(tmp_path: Path) -> None:
    answer = triton_config.config_json(read(tmp_path, ACC_OLDEST_CONFIG), "m")
    batching = answer["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == 1_000_000  # Triton's default, as its answer gives it
    assert batching["oldest"]["max_candidate_sequences"] == 4
    assert [c["name"] for c in batching["control_input"]] == ["START", "CORRID"]
    assert triton_config.batching_parameters(str(tmp_path / "m"), None) is None


# ======================================================================================= the batcher alone
class Summer:
    name, version = "m", 1

    def run_step(
        self, signature: Signature, inputs: Mapping[str, Any], outputs: Sequence[str], state: Any, controls: Controls
    ) -> tuple[dict[str, Any], Any]:
        total = float(inputs["x"]) + (state or 0.0)
        return {"total": np.array(total)}, total


def test_oldest_holds_at_most_max_sequences_and_the_next_waits_for_one_to_end() -> None:
    settings = SequenceSettings(Strategy.OLDEST, max_idle_seconds=30.0, max_batch_size=4, max_sequences=2)
    signature = Signature("serving_default", "tensorflow/serving/predict", {}, {})

    def step(batcher: SequenceBatcher, sequence_id: int, start: bool = False, end: bool = False) -> Any:
        return batcher.run(signature, {"x": np.array(1.0)}, ["total"], SequenceRequest(sequence_id, start, end))

    async def body() -> None:
        with ThreadPoolExecutor(2) as executor:
            batcher = SequenceBatcher(Summer(), settings, executor)  # type: ignore[arg-type]
            await step(batcher, 1, start=True)
            await step(batcher, 2, start=True)
            third = asyncio.ensure_future(step(batcher, 3, start=True))
            await asyncio.sleep(0.1)
            assert not third.done() and batcher.active == 2  # a backlog, as Triton keeps it
            await step(batcher, 1, end=True)
            assert float((await asyncio.wait_for(third, 5))["total"]) == 1.0
            batcher.close()

    asyncio.run(body())


# ===================================================================================== decoupled: in process
def load_countdown(tmp_path: Path) -> Any:
    folder = write(tmp_path / "countdown", {"config.pbtxt": COUNTDOWN_CONFIG, "1/model.py": COUNTDOWN_PY})
    return triton.load("countdown", 1, str(folder / "1"), LoadPolicy(allow_python=True))


def test_a_decoupled_servable_streams_what_the_model_sends_and_refuses_run(tmp_path: Path) -> None:
    model = load_countdown(tmp_path)
    try:
        signature = model.signatures["serving_default"]
        assert model.decoupled and not signature.batchable
        answers = list(model.run_decoupled(signature, {"N": np.array([3], np.int32)}, ["LEFT", "WORD"]))
        assert [(a["LEFT"].tolist(), a["WORD"].tolist()) for a in answers] == [
            ([2], [b"left 2"]),
            ([1], [b"left 1"]),
            ([0], [b"left 0"]),
        ]
        assert list(model.run_decoupled(signature, {"N": np.array([0], np.int32)}, ["LEFT"])) == []
        with pytest.raises(ServingError) as refused:
            model.run(signature, {"N": np.array([1], np.int32)}, ["LEFT"])
        assert refused.value.code.name == "UNIMPLEMENTED"
        assert model.model_config["model_transaction_policy"] == {"decoupled": True}
    finally:
        model.close()


def test_send_blocks_while_the_client_lags_and_raises_once_it_left(tmp_path: Path) -> None:
    model = load_countdown(tmp_path)
    folder = tmp_path / "countdown" / "1"
    try:
        responses = model.run_decoupled(
            model.signatures["serving_default"], {"N": np.array([1000], np.int32)}, ["LEFT"]
        )
        assert next(responses)["LEFT"].tolist() == [0]
        time.sleep(0.3)  # the model sends as fast as it can: only the queue's worth gets ahead
        sent = int((folder / "sent.txt").read_text())
        assert sent <= 1 + triton_python_platform.MAX_PENDING_RESPONSES, sent
        time.sleep(0.2)
        assert int((folder / "sent.txt").read_text()) == sent  # held back, not piling up
        responses.close()  # type: ignore[attr-defined]
        ended = wait_until(lambda: (folder / "ended.json").exists() and json.loads((folder / "ended.json").read_text()))
        assert ended["cancelled"] is True and "cancelled" in ended["error"]
    finally:
        model.close()


def decoupled_model(tmp_path: Path, execute: str) -> Any:
    source = f"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
{textwrap.indent(textwrap.dedent(execute), " " * 8)}
"""
    folder = write(tmp_path / "m", {"config.pbtxt": COUNTDOWN_CONFIG, "1/model.py": source})
    return triton.load("m", 1, str(folder / "1"), LoadPolicy(allow_python=True))


@pytest.mark.parametrize(
    ("execute", "words"),
    [
        ("return [pb_utils.InferenceResponse()]", "returned list: a decoupled model's execute returns None"),
        ("return None  # and never sends the final flag", "let go of the request's response sender"),
    ],
)
def test_decoupled_mistakes_end_the_request_with_a_clear_error(tmp_path: Path, execute: str, words: str) -> None:
    model = decoupled_model(tmp_path, execute)
    try:
        with pytest.raises(ServingError) as failed:
            list(model.run_decoupled(model.signatures["serving_default"], {"N": np.array([1], np.int32)}, ["LEFT"]))
        assert failed.value.code.name == "INTERNAL" and words in failed.value.message
    finally:
        model.close()


def test_a_model_that_is_not_decoupled_has_no_response_sender(tmp_path: Path) -> None:
    from workbench.platforms import triton_pb_utils as pb_utils

    request = pb_utils.InferenceRequest([], [])
    with pytest.raises(pb_utils.TritonModelException, match="for decoupled models"):
        request.get_response_sender()
    assert not request.is_cancelled() and request.correlation_id() == 0


# ===================================================================================== decoupled: served


def n_input(n: int) -> list[triton_grpc.InferInput]:
    return [triton_grpc.InferInput("N", [1], "INT32").set_data_from_numpy(np.array([n], np.int32))]


def test_a_decoupled_triton_model_streams_over_grpc_with_its_final_flag(grpc_client: Any) -> None:
    got = Collected()
    grpc_client.start_stream(callback=got)
    try:
        grpc_client.async_stream_infer("countdown", n_input(3), request_id="three", enable_empty_final_response=True)
        three = got.take(3)
        grpc_client.async_stream_infer("countdown", n_input(2), request_id="two", enable_empty_final_response=True)
        two = got.take(3)
        grpc_client.async_stream_infer("countdown", n_input(0), request_id="none", enable_empty_final_response=True)
        (none,) = got.take(1)
    finally:
        grpc_client.stop_stream()
    assert all(error is None for _, error in [*three, *two, none])
    results = [result for result, _ in three]
    assert [r.as_numpy("LEFT").tolist() for r in results[:3]] == [[2], [1], [0]]  # sent from the model's thread
    assert [r.as_numpy("WORD").tolist() for r in results[:3]] == [[b"left 2"], [b"left 1"], [b"left 0"]]
    # The last response came with the final flag: it is marked final, and no empty response follows (as in Triton).
    assert [is_final(r) for r in results] == [False, False, True] and results[2].get_response().id == "three"
    # Two responses, then the final flag alone: an empty final response, as the request asked.
    assert [r.as_numpy("LEFT").tolist() for r, _ in two[:2]] == [[1], [0]] and not is_final(two[1][0])
    assert is_final(two[2][0]) and two[2][0].get_response().outputs == []
    assert is_final(none[0]) and none[0].get_response().outputs == []  # the final flag alone: no response


def test_an_error_response_and_a_failing_execute_come_in_the_stream(grpc_client: Any) -> None:
    got = Collected()
    grpc_client.start_stream(callback=got)
    try:
        grpc_client.async_stream_infer("countdown", n_input(-1), request_id="error")
        (first, none), (_, failed) = got.take(2)
        grpc_client.async_stream_infer("countdown", n_input(-2), request_id="raises")
        ((_, raised),) = got.take(1)
        grpc_client.async_stream_infer("countdown", n_input(1), request_id="ok", enable_empty_final_response=True)
        ((last, error),) = got.take(1)
    finally:
        grpc_client.stop_stream()
    assert none is None and first.as_numpy("LEFT").tolist() == [-1]  # what it sent before the error came first
    assert isinstance(failed, InferenceServerException) and "N must not be negative" in failed.message()
    assert isinstance(raised, InferenceServerException) and "execute refused N=-2" in raised.message()
    assert error is None and last.as_numpy("LEFT").tolist() == [0] and is_final(last)  # sent with the final flag


def test_model_infer_and_rest_infer_refuse_a_decoupled_triton_model(grpc_client: Any, server: ServerThread) -> None:
    with pytest.raises(InferenceServerException) as refused:
        grpc_client.infer("countdown", n_input(2))
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert refused.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    body = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [2]}]}
    answer = requests.post(f"{server.rest_url}/v2/models/countdown/infer", json=body, timeout=20)
    assert answer.status_code == 501
    assert grpc_client.get_model_config("countdown").config.model_transaction_policy.decoupled


def sse_events(response: requests.Response) -> list[dict[str, Any]]:
    return [json.loads(line[len(b"data: ") :]) for line in response.iter_lines() if line]


def test_generate_stream_answers_a_decoupled_triton_model(server: ServerThread) -> None:
    url = f"{server.rest_url}/v2/models/countdown/generate_stream"
    with requests.post(url, json={"N": 3}, stream=True, timeout=20) as answer:
        assert answer.status_code == 200
        events = sse_events(answer)
    assert [(e["LEFT"], e["WORD"]) for e in events] == [(2, "left 2"), (1, "left 1"), (0, "left 0")]
    with requests.post(url, json={"N": -1}, stream=True, timeout=20) as failing:
        events = sse_events(failing)
    assert events[0]["LEFT"] == -1 and "N must not be negative" in events[1]["error"]


def test_a_client_that_leaves_cancels_the_request_the_model_is_sending(server: ServerThread, repository: Path) -> None:
    folder = repository / "countdown" / "1"
    (folder / "ended.json").unlink(missing_ok=True)
    url = f"{server.rest_url}/v2/models/countdown/generate_stream"
    with requests.post(url, json={"N": 1000}, stream=True, timeout=20) as answer:
        next(answer.iter_lines())
    ended = wait_until(lambda: (folder / "ended.json").exists() and json.loads((folder / "ended.json").read_text()))
    assert ended["cancelled"] is True and "cancelled" in ended["error"]


def test_a_model_waiting_without_sending_hears_at_once_that_its_client_left(
    server: ServerThread, repository: Path
) -> None:
    """The request's next response is awaited while the client leaves: the model is told then, not at a send."""
    folder = repository / "countdown" / "1"
    (folder / "waited.json").unlink(missing_ok=True)
    url = f"{server.rest_url}/v2/models/countdown/generate_stream"
    with requests.post(url, json={"N": 500}, stream=True, timeout=20) as answer:
        assert json.loads(next(answer.iter_lines())[len(b"data: ") :])["LEFT"] == 500
    began = time.monotonic()
    waited = wait_until(lambda: (folder / "waited.json").exists() and json.loads((folder / "waited.json").read_text()))
    assert waited == {"cancelled": True} and time.monotonic() - began < 10


# ======================================================================================= sequences: served
def accumulate(client: Any, module: Any, model: str, value: int, sequence_id: Any, **flags: bool) -> tuple[int, dict]:
    batched = model != "acc_oldest"
    array = np.array([[value]] if batched else [value], np.int32)
    tensor = module.InferInput("INPUT", list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)
    seen = result.as_numpy("SEEN").flatten()[0]
    return int(result.as_numpy("OUTPUT").flatten()[0]), json.loads(seen)


def test_a_direct_sequence_over_http_and_grpc_sees_its_controls(http_client: Any, grpc_client: Any) -> None:
    total, first = accumulate(http_client, triton_http, "acc_direct", 1, 7, sequence_start=True)
    assert total == 1
    assert first == {
        "correlation_id": 7,
        "inputs": ["CORRID", "END", "INPUT", "READY", "START"],
        "START": ["int32", [1, 1], 1],
        "READY": ["float32", [1, 1], 1.0],
        "END": ["bool", [1, 1], False],
        "CORRID": ["uint64", [1, 1], 7],
    }
    assert accumulate(http_client, triton_http, "acc_direct", 10, 8, sequence_start=True)[0] == 10  # its own total
    total, middle = accumulate(grpc_client, triton_grpc, "acc_direct", 2, 7)
    assert total == 3 and middle["START"][2] == 0 and middle["END"][2] is False
    total, last = accumulate(grpc_client, triton_grpc, "acc_direct", 3, 7, sequence_end=True)
    assert total == 6 and last["END"][2] is True
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        accumulate(http_client, triton_http, "acc_direct", 1, 7)  # ended
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        tensor = triton_http.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.array([[1]], np.int32))
        http_client.infer("acc_direct", [tensor])
    assert accumulate(grpc_client, triton_grpc, "acc_direct", 4, 8, sequence_end=True)[0] == 14


def test_an_oldest_sequence_with_a_string_id_gets_it_as_corrid(http_client: Any, grpc_client: Any) -> None:
    total, seen = accumulate(grpc_client, triton_grpc, "acc_oldest", 5, "user-1", sequence_start=True)
    assert total == 5
    assert seen["correlation_id"] == "user-1" and seen["CORRID"] == ["object", [1], "user-1"]
    assert seen["START"] == ["int32", [1], 7]  # the config's true value
    assert accumulate(http_client, triton_http, "acc_oldest", 5, "user-1", sequence_end=True)[0] == 10
    total, seen = accumulate(http_client, triton_http, "acc_oldest", 2, 99, sequence_start=True, sequence_end=True)
    assert total == 2 and seen["CORRID"][2] == "99" and seen["correlation_id"] == 99


def test_a_direct_slot_frees_when_its_sequence_idles_out(http_client: Any, grpc_client: Any) -> None:
    """acc_one has one slot and a 0.4 s idle time: a second sequence waits for the first to idle out, after which
    the first is refused in Triton's words."""
    accumulate(grpc_client, triton_grpc, "acc_one", 1, 1, sequence_start=True)
    began = time.monotonic()
    assert accumulate(http_client, triton_http, "acc_one", 2, 2, sequence_start=True)[0] == 2
    assert time.monotonic() - began >= 0.3  # it waited for the slot
    with pytest.raises(InferenceServerException, match="idle longer than"):
        accumulate(grpc_client, triton_grpc, "acc_one", 1, 1)
    accumulate(grpc_client, triton_grpc, "acc_one", 1, 2, sequence_end=True)


def test_sequence_metadata_and_config_answers(http_client: Any, grpc_client: Any) -> None:
    metadata = http_client.get_model_metadata("acc_direct")
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]  # control tensors are not the client's to send
    config = http_client.get_model_config("acc_direct")["sequence_batching"]
    assert config["max_sequence_idle_microseconds"] == 5_000_000
    assert [c["name"] for c in config["control_input"]] == ["START", "READY", "END", "CORRID"]
    over_grpc = grpc_client.get_model_config("acc_oldest").config.sequence_batching
    assert over_grpc.oldest.max_candidate_sequences == 4 and over_grpc.max_sequence_idle_microseconds == 1_000_000


def test_configs_workbench_cannot_serve_are_unavailable_with_their_reason(http_client: Any) -> None:
    index = {m["name"]: m for m in http_client.get_model_repository_index()}
    assert "Triton runs decoupled models only in its Python backend" in index["onnx_decoupled"]["reason"]
    for model in ("countdown", "acc_direct", "acc_oldest", "acc_one"):
        assert index[model]["state"] == "READY", index[model]


def test_many_sequences_at_once_keep_their_own_totals(server: ServerThread) -> None:
    """Eight threads, each a sequence of five steps on acc_direct (four slots): every total is its own."""

    def run(sequence_id: int) -> list[int]:
        client = triton_grpc.InferenceServerClient(server.grpc_target)
        try:
            return [
                accumulate(
                    client,
                    triton_grpc,
                    "acc_direct",
                    step,
                    sequence_id,
                    sequence_start=step == 1,
                    sequence_end=step == 5,
                )[0]
                for step in range(1, 6)
            ]
        finally:
            client.close()

    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(i))) for i in range(100, 108)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {i: [1, 3, 6, 10, 15] for i in range(100, 108)}
