"""Triton's test backends (``identity``, ``repeat``, ``dyna_sequence``), which its QA and its example clients serve
models with, answered by workbench's stand-ins under the models' own configs, to the unchanged tritonclient."""

from __future__ import annotations

import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from workbench.config.options import ServerOptions
from workbench.server import ServerThread

IDENTITY_CONFIG = """
name: "custom_identity_int32"
backend: "identity"
max_batch_size: 1024
instance_group [ { kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
REPEAT_CONFIG = """
name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""
# As Triton's qa/L0_grpc makes it from simple_dyna_sequence: the dyna_sequence backend, a STRING correlation id.
DYNA_CONFIG = """
name: "simple_string_dyna_sequence"
backend: "dyna_sequence"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("stand-ins")
    for name, config in [
        ("custom_identity_int32", IDENTITY_CONFIG),
        ("repeat_int32", REPEAT_CONFIG),
        ("simple_string_dyna_sequence", DYNA_CONFIG),
    ]:
        (root / name / "1").mkdir(parents=True)  # Triton's QA puts the backend's library there; none is read
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / "simple_string_dyna_sequence" / "1" / "libtriton_dyna_sequence.so").write_bytes(b"\x7fELF not loaded")
    with ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=str(root))) as running:
        yield running


@pytest.fixture(scope="module")
def grpc_client(server: ServerThread) -> Iterator[triton_grpc.InferenceServerClient]:
    with triton_grpc.InferenceServerClient(server.grpc_target) as client:
        yield client


def test_identity_answers_each_input_as_its_output(server: ServerThread, grpc_client: Any) -> None:
    """What Triton's memory_growth_test.py checks, over both protocols: the same dtype, shape and values."""
    data = np.arange(16, dtype=np.int32)[np.newaxis]
    http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        for client, module in [(http, triton_http), (grpc_client, triton_grpc)]:
            tensor = module.InferInput("INPUT0", [1, 16], "INT32")
            tensor.set_data_from_numpy(data)
            answer = client.infer("custom_identity_int32", [tensor], outputs=[module.InferRequestedOutput("OUTPUT0")])
            out = answer.as_numpy("OUTPUT0")
            assert out.dtype == data.dtype and out.tolist() == data.tolist()
        assert http.get_model_config("custom_identity_int32")["backend"] == "identity"
    finally:
        http.close()


def repeat(client: Any, values: list[int], delay_ms: int = 5, wait_ms: int = 5) -> list[tuple[int, int]]:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    inputs = []
    for name, value, datatype in [
        ("IN", np.array(values, np.int32), "INT32"),
        ("DELAY", np.full(len(values), delay_ms, np.uint32), "UINT32"),
        ("WAIT", np.array([wait_ms], np.uint32), "UINT32"),
    ]:
        tensor = triton_grpc.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    try:
        client.async_stream_infer("repeat_int32", inputs, enable_empty_final_response=True)
        received = []
        while True:
            item = answers.get(timeout=60)
            if isinstance(item, InferenceServerException):
                raise item
            response = item.get_response()
            if response.outputs:
                received.append((int(item.as_numpy("OUT")[0]), int(item.as_numpy("IDX")[0])))
            if response.parameters["triton_final_response"].bool_param:
                return received
    finally:
        client.stop_stream()


def test_repeat_sends_one_response_per_element_in_order(grpc_client: Any) -> None:
    """Triton's simple_grpc_custom_repeat: IN's elements, each its own response with its index."""
    assert repeat(grpc_client, [100, 101, 102, 103]) == [(100, 0), (101, 1), (102, 2), (103, 3)]
    assert repeat(grpc_client, []) == []  # nothing to repeat: the final flag alone


def test_dyna_sequence_accumulates_and_adds_the_correlation_id_at_the_end(grpc_client: Any) -> None:
    """What simple_grpc_sequence_sync_infer_client -d expects of simple_string_dyna_sequence: the first request
    sets the accumulator, each later one adds to it, the last adds the sequence's (numeric string) id."""
    values = [20, -11, -7, -5, -3, -2, 0, -1]
    outputs = []
    for index, value in enumerate(values):
        tensor = triton_grpc.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = grpc_client.infer(
            "simple_string_dyna_sequence",
            [tensor],
            sequence_id="1002",
            sequence_start=index == 0,
            sequence_end=index == len(values) - 1,
        )
        outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
    running = list(np.cumsum(values))
    assert outputs == [*running[:-1], running[-1] + 1002]


def test_a_stand_in_whose_config_lacks_what_its_backend_needs_fails_its_load(tmp_path: Path) -> None:
    from workbench.core.errors import ServingError
    from workbench.platforms import triton
    from workbench.platforms.base import LoadPolicy

    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(
        REPEAT_CONFIG.replace('name: "repeat_int32"\n', "").replace("WAIT", "W")
    )
    with pytest.raises(ServingError) as refused:
        triton.load("m", 1, str(tmp_path / "m" / "1"), LoadPolicy())
    assert "the repeat backend needs the inputs IN, DELAY and WAIT" in str(refused.value)
