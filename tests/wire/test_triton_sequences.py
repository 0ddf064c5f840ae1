"""Triton's sequence batcher for every backend: control tensors and implicit state given by the server, with
Triton's own example models (``simple_sequence``, ``simple_dyna_sequence``: ONNX graphs of the same shape as those
in Triton's ``docs/examples/model_repository``, built here) and ONNX and Python accumulators that keep their total
in implicit state, to the unchanged tritonclient over gRPC (unary and streams) and REST, on a real server."""

from __future__ import annotations

import queue
import struct
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from workbench.config import triton_model_config as triton_config
from workbench.config.options import ServerOptions
from workbench.core.errors import ServingError
from workbench.platforms import triton_backends
from workbench.server import ServerThread

INT32, UINT64 = TensorProto.INT32, TensorProto.UINT64


def onnx_model(name: str, nodes: list[Any], inputs: dict[str, int], outputs: dict[str, int]) -> onnx.ModelProto:
    """A graph whose tensors are all [batch, 1]."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, ["batch", 1]) for n, t in inputs.items()],
        [helper.make_tensor_value_info(n, t, ["batch", 1]) for n, t in outputs.items()],
        initializer=[helper.make_tensor("zero_axis", TensorProto.INT64, [1], [0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# Triton's example "simple_sequence": OUTPUT = READY * (INPUT + START), stateless: the control tensors say it all.
SIMPLE_SEQUENCE = onnx_model(
    "simple_sequence",
    [helper.make_node("Add", ["INPUT", "START"], ["sum"]), helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"])],
    {"INPUT": INT32, "START": INT32, "READY": INT32},
    {"OUTPUT": INT32},
)
SIMPLE_SEQUENCE_CONFIG = """
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

# Triton's example "simple_dyna_sequence": as above, plus END * CORRID (the sequence's id, UINT64).
SIMPLE_DYNA_SEQUENCE = onnx_model(
    "simple_dyna_sequence",
    [
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=INT32),
        helper.make_node("Add", ["INPUT", "START"], ["started"]),
        helper.make_node("Mul", ["END", "corrid"], ["ended"]),
        helper.make_node("Add", ["started", "ended"], ["sum"]),
        helper.make_node("Mul", ["READY", "sum"], ["OUTPUT"]),
    ],
    {"INPUT": INT32, "START": INT32, "END": INT32, "READY": INT32, "CORRID": UINT64},
    {"OUTPUT": INT32},
)
SIMPLE_DYNA_SEQUENCE_CONFIG = """
name: "simple_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# An accumulator keeping its total in implicit state: TOTAL = ACC_IN * (1 - START) + INPUT; ACC_OUT = TOTAL; ROWS is
# the size of the batch the request ran in (every row of it).
ACCUMULATOR = onnx_model(
    "accumulator",
    [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["ACC_IN", "keep"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["TOTAL"]),
        helper.make_node("Identity", ["TOTAL"], ["ACC_OUT"]),
        helper.make_node("Mul", ["INPUT", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["ones"]),
        helper.make_node("ReduceSum", ["ones", "zero_axis"], ["count"], keepdims=1),
        helper.make_node("Add", ["zeros", "count"], ["ROWS"]),
    ],
    {"INPUT": INT32, "START": INT32, "ACC_IN": INT32},
    {"TOTAL": INT32, "ACC_OUT": INT32, "ROWS": INT32},
)
ACCUMULATOR.graph.initializer.extend(
    [helper.make_tensor("one", INT32, [], [1]), helper.make_tensor("zero", INT32, [], [0])]
)


def accumulator_config(sequence_batching: str, max_batch_size: int = 4) -> str:
    return f"""
    platform: "onnxruntime_onnx"
    max_batch_size: {max_batch_size}
    sequence_batching {{
      {sequence_batching}
      control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
    }}
    input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [
      {{ name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] }},
      {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }}
    ]
    """


ZERO_STATE = 'state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
FILE_STATE = """state [ {
  input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
  initial_state { data_type: TYPE_INT32 dims: [ 1 ] name: "hundred" data_file: "hundred" }
} ]"""

# The same accumulator as a Triton Python model: the state comes in as a tensor and goes back as one.
ACCUMULATOR_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            total = (state * (1 - start) + value).astype(np.int32)
            rows = np.ones_like(total)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOTAL", total), pb_utils.Tensor("ACC_OUT", total), pb_utils.Tensor("ROWS", rows)
            ]))
        return responses
"""


def write(folder: Path, files: dict[str, str | bytes | onnx.ModelProto]) -> None:
    for relative, content in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(textwrap.dedent(content))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            onnx.save_model(content, str(path))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton-sequences")
    write(root / "simple_sequence", {"config.pbtxt": SIMPLE_SEQUENCE_CONFIG, "1/model.onnx": SIMPLE_SEQUENCE})
    write(
        root / "simple_dyna_sequence",
        {"config.pbtxt": SIMPLE_DYNA_SEQUENCE_CONFIG, "1/model.onnx": SIMPLE_DYNA_SEQUENCE},
    )
    write(root / "accumulator", {"config.pbtxt": accumulator_config(ZERO_STATE), "1/model.onnx": ACCUMULATOR})
    write(
        root / "from_hundred",
        {
            "config.pbtxt": accumulator_config(FILE_STATE),
            "1/model.onnx": ACCUMULATOR,
            "initial_state/hundred": struct.pack("<i", 100),
        },
    )
    # Oldest, waiting up to a minute for four sequences' requests: four sequences sent together run together.
    together = (
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 60000000 }"
    )
    write(
        root / "together",
        {"config.pbtxt": accumulator_config(f"{together}\n{ZERO_STATE}"), "1/model.onnx": ACCUMULATOR},
    )
    idle = f"max_sequence_idle_microseconds: 300000\n{ZERO_STATE}"
    write(root / "forgetful", {"config.pbtxt": accumulator_config(idle), "1/model.onnx": ACCUMULATOR})
    python_config = accumulator_config(ZERO_STATE).replace('platform: "onnxruntime_onnx"', 'backend: "python"')
    write(root / "python_accumulator", {"config.pbtxt": python_config, "1/model.py": ACCUMULATOR_PY})
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
    client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"), concurrency=4)
    yield client
    client.close()


def step(client: Any, module: Any, model: str, value: int, sequence_id: int | str, **flags: bool) -> dict[str, int]:
    """One request of a sequence, as Triton's examples send it: a [1, 1] INT32 INPUT; each output's one value."""
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)
    answer = result.get_response()
    names = [o["name"] for o in answer["outputs"]] if isinstance(answer, dict) else [o.name for o in answer.outputs]
    return {name: int(result.as_numpy(name)[0][0]) for name in names}


def run_sequence(client: Any, module: Any, model: str, values: list[int], sequence_id: int | str) -> list[int]:
    outputs = []
    for index, value in enumerate(values):
        flags = {"sequence_start": index == 0, "sequence_end": index == len(values) - 1}
        outputs.append(
            step(client, module, model, value, sequence_id, **flags)["OUTPUT" if "simple" in model else "TOTAL"]
        )
    return outputs


VALUES = [11, 7, 5, 3, 2, 0, 1]


# ======================================================================================= Triton's example models
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_simple_sequence_gets_its_control_tensors_as_in_tritons_example(
    protocol: str, grpc_client: Any, http_client: Any
) -> None:
    """What Triton's simple_{grpc,http}_sequence_sync_infer_client checks: START on the first request only, READY
    on every one, for numeric and string sequence ids, sequences interleaved."""
    client, module = (grpc_client, triton_grpc) if protocol == "grpc" else (http_client, triton_http)
    first = run_sequence(client, module, "simple_sequence", [0, *VALUES], 1000)
    second = run_sequence(client, module, "simple_sequence", [100, *(-v for v in VALUES)], 1001)
    by_name = run_sequence(client, module, "simple_sequence", [20, *(-v for v in VALUES)], str(uuid.uuid4()))
    assert first == [1, *VALUES]
    assert second == [101, *(-v for v in VALUES)]
    assert by_name == [21, *(-v for v in VALUES)]


def test_simple_dyna_sequence_gets_end_and_its_uint64_correlation_id(grpc_client: Any) -> None:
    outputs = run_sequence(grpc_client, triton_grpc, "simple_dyna_sequence", [0, *VALUES], 1000)
    assert outputs == [1, *VALUES[:-1], VALUES[-1] + 1000]  # END adds the sequence's id (the model's CORRID)


def test_a_string_id_for_a_uint64_corrid_is_refused_clearly(grpc_client: Any) -> None:
    with pytest.raises(InferenceServerException) as refused:
        step(grpc_client, triton_grpc, "simple_dyna_sequence", 1, "abc", sequence_start=True)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert 'CONTROL_SEQUENCE_CORRID input "CORRID" is TYPE_UINT64' in refused.value.message()


def test_sequences_over_a_grpc_stream_as_in_tritons_stream_example(grpc_client: Any) -> None:
    """simple_grpc_sequence_stream_infer_client: two sequences' requests interleaved on one stream."""
    answers: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index, value in enumerate([0, *VALUES]):
            for sequence_id, sign in [(2000, 1), (2001, -1)]:
                tensor = triton_grpc.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.full((1, 1), sign * value, np.int32))
                grpc_client.async_stream_infer(
                    "simple_sequence",
                    [tensor],
                    request_id=f"{sequence_id}-{index}",
                    sequence_id=sequence_id,
                    sequence_start=index == 0,
                    sequence_end=index == len(VALUES),
                )
        results = {}
        for _ in range(2 * (len(VALUES) + 1)):
            result, error = answers.get(timeout=60)
            assert error is None, error
            results[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
    finally:
        grpc_client.stop_stream()
    assert [results[f"2000-{i}"] for i in range(len(VALUES) + 1)] == [1, *VALUES]
    assert [results[f"2001-{i}"] for i in range(len(VALUES) + 1)] == [1, *(-v for v in VALUES)]


def test_control_tensors_are_not_the_clients_to_send(http_client: Any) -> None:
    metadata = http_client.get_model_metadata("simple_dyna_sequence")
    assert [t["name"] for t in metadata["inputs"]] == ["INPUT"]
    config = http_client.get_model_config("simple_dyna_sequence")
    assert config["sequence_batching"]["oldest"]["max_candidate_sequences"] == 1024
    assert config["platform"] == "onnxruntime_onnx"


def test_a_request_of_more_than_one_row_is_refused_in_tritons_words(grpc_client: Any) -> None:
    tensor = triton_grpc.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.ones((2, 1), np.int32))
    with pytest.raises(InferenceServerException) as refused:
        grpc_client.infer("simple_sequence", [tensor], sequence_id=7, sequence_start=True)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert refused.value.message() == (
        "inference request to model 'simple_sequence' must specify batch-size 1 due to requirements of sequence batcher"
    )


# ============================================================================================= implicit state
@pytest.mark.parametrize("model", ["accumulator", "python_accumulator"])
def test_implicit_state_carries_each_sequences_total(model: str, grpc_client: Any, http_client: Any) -> None:
    """The server keeps each sequence's state (zeros at its start) and feeds the last output state back; two
    sequences interleaved over both protocols keep their own totals."""
    assert step(grpc_client, triton_grpc, model, 5, 31, sequence_start=True)["TOTAL"] == 5
    assert step(http_client, triton_http, model, 100, 32, sequence_start=True)["TOTAL"] == 100
    assert step(http_client, triton_http, model, 2, 31)["TOTAL"] == 7
    assert step(grpc_client, triton_grpc, model, 3, 32)["TOTAL"] == 103
    assert step(grpc_client, triton_grpc, model, 1, 31, sequence_end=True)["TOTAL"] == 8
    # A new sequence under the same id starts from zeros again, and START restarts a sequence still held.
    assert step(grpc_client, triton_grpc, model, 4, 31, sequence_start=True)["TOTAL"] == 4
    assert step(grpc_client, triton_grpc, model, 9, 32, sequence_start=True)["TOTAL"] == 9


def test_the_state_of_an_ended_sequence_is_gone(grpc_client: Any) -> None:
    step(grpc_client, triton_grpc, "accumulator", 5, 41, sequence_start=True, sequence_end=True)
    with pytest.raises(InferenceServerException) as refused:
        step(grpc_client, triton_grpc, "accumulator", 1, 41)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify the START flag on the first request of the sequence" in refused.value.message()


def test_initial_state_comes_from_its_data_file(grpc_client: Any) -> None:
    assert step(grpc_client, triton_grpc, "from_hundred", 0, 51, sequence_start=True)["TOTAL"] == 0  # START: reset
    assert step(grpc_client, triton_grpc, "from_hundred", 5, 51)["TOTAL"] == 5


def test_a_sequence_idle_longer_than_its_limit_loses_its_state(grpc_client: Any) -> None:
    step(grpc_client, triton_grpc, "forgetful", 5, 61, sequence_start=True)
    time.sleep(1.5)  # five times the model's max_sequence_idle_microseconds
    with pytest.raises(InferenceServerException) as refused:
        step(grpc_client, triton_grpc, "forgetful", 1, 61)
    assert "must specify the START flag" in refused.value.message()


def test_oldest_batches_the_requests_of_different_sequences_into_one_run(server: ServerThread) -> None:
    """Four sequences sent at once run in batches of their requests (one model run, rows concatenated), each with
    its own state; the model says how many rows each of its runs had."""
    totals: dict[int, list[int]] = {}
    rows: list[int] = []
    lock = threading.Lock()

    def sequence(sequence_id: int) -> None:
        with triton_grpc.InferenceServerClient(server.grpc_target) as client:
            for index in range(3):
                flags = {"sequence_start": index == 0, "sequence_end": index == 2}
                answer = step(client, triton_grpc, "together", sequence_id, 70 + sequence_id, **flags)
                with lock:
                    totals.setdefault(sequence_id, []).append(answer["TOTAL"])
                    rows.append(answer["ROWS"])

    threads = [threading.Thread(target=sequence, args=(n,)) for n in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert totals == {n: [n, 2 * n, 3 * n] for n in range(1, 5)}
    assert max(rows) > 1, rows  # at least one run held several sequences' requests


# ============================================================================================ reading configs
def read(tmp_path: Path, text: str, files: dict[str, bytes] | None = None) -> triton_config.TritonConfig:
    write(tmp_path / "m", {"config.pbtxt": text, **(files or {})})
    return triton_backends.read_config(tmp_path / "m")


def test_implicit_state_is_read_with_its_initial_data(tmp_path: Path) -> None:
    config = read(tmp_path, accumulator_config(FILE_STATE), {"initial_state/hundred": struct.pack("<i", 100)})
    assert config.sequence_batching is not None
    (state,) = config.sequence_batching.states
    assert (state.input_name, state.output_name, state.data_type, state.dims) == (
        "ACC_IN",
        "ACC_OUT",
        "TYPE_INT32",
        (1,),
    )
    assert state.start_value().tolist() == [100]
    assert config.sequence_batching.given_inputs == {"START", "ACC_IN"}
    zero = read(tmp_path, accumulator_config(ZERO_STATE).replace("dims: [ 1 ] } ]", "dims: [ -1, 3 ] } ]", 1))
    assert zero.sequence_batching is not None
    assert zero.sequence_batching.states[0].start_value().tolist() == [[0, 0, 0]]  # variable dims start as 1


@pytest.mark.parametrize(
    ("state", "fragment"),
    [
        (
            FILE_STATE.replace("initial_state { data_type: TYPE_INT32", "initial_state { data_type: TYPE_FP32"),
            "The data type used for 'initial_state' field of state 'ACC_IN' does not match the state data type.",
        ),
        (
            FILE_STATE.replace(' name: "hundred"', ""),
            "Field 'name' must be set when using initial_state for state input 'ACC_IN'.",
        ),
        (
            FILE_STATE.replace(
                "initial_state { data_type: TYPE_INT32 dims: [ 1 ]", "initial_state { data_type: TYPE_INT32 dims: [ 2 ]"
            ),
            "'initial_state' dim for input name 'ACC_IN' doesn't match 'state' dim description. 2 != 1",
        ),
        (FILE_STATE.replace('data_file: "hundred"', 'data_file: "missing"'), "initial_state of state input 'ACC_IN'"),
        (
            ZERO_STATE.replace('input_name: "ACC_IN"', 'input_name: "START"'),
            "State input name 'START' specified more than once.",
        ),
    ],
)
def test_bad_states_are_refused_in_tritons_words(tmp_path: Path, state: str, fragment: str) -> None:
    with pytest.raises(ServingError) as refused:
        read(tmp_path, accumulator_config(state), {"initial_state/hundred": struct.pack("<i", 100)})
    assert fragment in str(refused.value)


def test_a_control_the_model_lacks_fails_its_load_naming_it(tmp_path: Path) -> None:
    from workbench.platforms import triton
    from workbench.platforms.base import LoadPolicy

    config = SIMPLE_SEQUENCE_CONFIG.replace('name: "READY"', 'name: "NOT_READY"').replace(
        'name: "simple_sequence"\n', ""
    )
    write(tmp_path / "m", {"config.pbtxt": config, "1/model.onnx": SIMPLE_SEQUENCE})
    with pytest.raises(ServingError) as refused:
        triton.load("m", 1, str(tmp_path / "m" / "1"), LoadPolicy())
    assert 'control_input "NOT_READY" is not one of the model\'s inputs' in str(refused.value)
