"""Stateful models and Triton's sequence batcher, with Triton's own clients.

A running-total model keeps its total per sequence (implicit state): each request of a sequence sees the state the
one before it left, requests of one sequence run in order and on the version the sequence started on (a promotion
meanwhile does not move it), sequences that idle out are released, and Triton's words refuse a sequence that was
never started or has ended. The batcher's Oldest strategy batches across sequences; Direct holds a slot per sequence.
"""

from __future__ import annotations

import asyncio
import queue
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import workbench
from workbench import PythonModel
from workbench.batching.sequence_batcher import SequenceBatcher
from workbench.client import Client
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls, SequenceRequest, SequenceSettings, Strategy, sequence_request
from workbench.core.signatures import Signature
from workbench.server import ServerThread

RUNNING_TOTAL = """
import workbench

class RunningTotal(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 1])}
    outputs = {"total": ("float32", [-1, 1]), "version": ("int32", [-1]), "start": ("int32", [-1])}
    stateful = True
    sequence_batching = {"max_idle_seconds": %s}
    control_inputs = {"START": "start_flag"}

    def predict(self, inputs, state):
        total = inputs["x"] + (0.0 if state is None else state)
        rows = len(total)
        return {"total": total, "version": [%d] * rows, "start": list(inputs["start_flag"]) * rows}, total
"""


# ------------------------------------------------------------------------------------------- the batcher alone
class Recorder:
    """A stateful servable that sums its inputs per sequence, taking ``delay`` seconds a step."""

    name, version = "m", 1

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[list[Any]] = []  # the sequence ids of each batch (filled by the test that looks)

    def run_step(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        state: Any,
        controls: Controls,
    ) -> tuple[dict[str, np.ndarray], Any]:
        time.sleep(self.delay)
        total = float(inputs["x"]) + (state or 0.0)
        return {"total": np.array(total), "start": np.array(controls.start)}, total


def run_batcher(settings: SequenceSettings, servable: Recorder, main: Callable[[SequenceBatcher], Any]) -> Any:
    async def body() -> Any:
        with ThreadPoolExecutor(4) as executor:
            batcher = SequenceBatcher(servable, settings, executor)  # type: ignore[arg-type]
            try:
                return await main(batcher)
            finally:
                batcher.close()

    return asyncio.run(body())


SIGNATURE = Signature("serving_default", "tensorflow/serving/predict", {}, {})


def step(batcher: SequenceBatcher, sequence_id: Any, x: float, start: bool = False, end: bool = False) -> Any:
    request = SequenceRequest(sequence_id, start, end)
    return batcher.run(SIGNATURE, {"x": np.array(x)}, ["total"], request)


def test_each_step_sees_the_state_its_sequence_left_and_steps_run_in_order() -> None:
    async def main(batcher: SequenceBatcher) -> list[float]:
        await step(batcher, 1, 1.0, start=True)
        await step(batcher, "b", 10.0, start=True)
        # Sent at once: a sequence's requests still run one after the other, each on the state before it.
        answers = await asyncio.gather(*(step(batcher, 1, 1.0) for _ in range(5)), step(batcher, "b", 5.0, end=True))
        return [float(a["total"]) for a in answers]

    assert run_batcher(SequenceSettings(max_batch_size=4), Recorder(delay=0.01), main) == [2, 3, 4, 5, 6, 15]


def test_triton_refuses_a_sequence_that_never_started_or_has_ended() -> None:
    async def main(batcher: SequenceBatcher) -> list[str]:
        messages = []
        for attempt in (lambda: step(batcher, 7, 1.0), lambda: step(batcher, 8, 1.0, start=True, end=True)):
            try:
                await attempt()
            except ServingError as exc:
                messages.append(exc.message)
        with pytest.raises(ServingError) as ended:
            await step(batcher, 8, 1.0)  # its last request ran: the sequence is gone
        assert ended.value.code is Code.INVALID_ARGUMENT
        messages.append(ended.value.message)
        return messages

    never, ended = run_batcher(SequenceSettings(), Recorder(), main)
    assert never.startswith(
        "inference request for sequence 7 to model 'm' must specify the START flag on the first request of the sequence"
    )
    assert ended.startswith("inference request for sequence 8 to model 'm' must specify the START flag")


def test_an_idle_sequence_is_released_with_its_state() -> None:
    async def main(batcher: SequenceBatcher) -> int:
        await step(batcher, 1, 1.0, start=True)
        assert batcher.active == 1
        await asyncio.sleep(0.3)  # the reaper releases it without any request
        active = batcher.active
        with pytest.raises(ServingError, match="idle longer than"):
            await step(batcher, 1, 1.0)
        return active

    assert run_batcher(SequenceSettings(max_idle_seconds=0.1), Recorder(), main) == 0


def test_a_start_restarts_a_sequence_afresh() -> None:
    async def main(batcher: SequenceBatcher) -> float:
        await step(batcher, 1, 5.0, start=True)
        await step(batcher, 1, 1.0, start=True)
        return float((await step(batcher, 1, 1.0))["total"])

    assert run_batcher(SequenceSettings(), Recorder(), main) == 2.0


def test_oldest_batches_across_sequences_never_two_of_one_sequence() -> None:
    servable = Recorder(delay=0.02)

    async def main(batcher: SequenceBatcher) -> None:
        for sequence_id in range(6):
            await step(batcher, sequence_id, 0.0, start=True)
        original = batcher._run_batch  # what a batch holds: the sequences of its steps

        def recorded(steps: Any) -> Any:
            servable.batches.append([sequence.id for sequence, _ in steps])
            return original(steps)

        batcher._run_batch = recorded  # type: ignore[method-assign]
        await asyncio.gather(*(step(batcher, s, 1.0) for s in range(6) for _ in range(2)))

    run_batcher(SequenceSettings(max_batch_size=4, max_queue_delay_seconds=0.05), servable, main)
    assert sum(len(b) for b in servable.batches) == 12
    assert max(len(b) for b in servable.batches) == 4  # batched across sequences, up to max_batch_size
    assert all(len(set(b)) == len(b) for b in servable.batches)  # one request per sequence in a batch


def test_direct_holds_a_slot_per_sequence_and_a_new_one_waits_for_a_free_slot() -> None:
    async def main(batcher: SequenceBatcher) -> tuple[bool, float]:
        await step(batcher, "a", 1.0, start=True)
        await step(batcher, "b", 1.0, start=True)
        third = asyncio.ensure_future(step(batcher, "c", 1.0, start=True))
        await asyncio.sleep(0.1)
        waited = not third.done()  # both slots are held
        await step(batcher, "a", 1.0, end=True)  # a slot comes free
        return waited, float((await third)["total"])

    waited, total = run_batcher(SequenceSettings(Strategy.DIRECT, max_batch_size=2), Recorder(), main)
    assert waited and total == 1.0


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, None),
        ({"sequence_id": 5, "sequence_start": True}, SequenceRequest(5, True, False)),
        ({"sequence_id": "user-1", "sequence_end": True}, SequenceRequest("user-1", False, True)),
    ],
)
def test_sequence_parameters(parameters: dict[str, Any], expected: SequenceRequest | None) -> None:
    assert sequence_request(parameters) == expected


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"sequence_id": 1.5}, "unsigned integer or a string"),
        ({"sequence_id": True}, "unsigned integer or a string"),
        ({"sequence_id": -1}, "unsigned integer or a string"),
        ({"sequence_id": 1, "sequence_start": "yes"}, "must be true or false"),
        ({"sequence_start": True}, "needs parameters.sequence_id"),
    ],
)
def test_bad_sequence_parameters_are_clear(parameters: dict[str, Any], words: str) -> None:
    with pytest.raises(ServingError, match=words):
        sequence_request(parameters)


# ------------------------------------------------------------------------------------------ over the wire
def write_total(folder: Path, version: int, idle_seconds: float = 60.0) -> None:
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(RUNNING_TOTAL % (idle_seconds, version)))


@pytest.fixture
def server(serve: Callable[..., ServerThread], tmp_path: Path) -> ServerThread:
    root = tmp_path / "repo"
    write_total(root / "total" / "1", 1)
    write_total(root / "total" / "2", 2)
    write_total(root / "quick" / "1", 1, idle_seconds=0.2)
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list {\n"
        f'  config {{ name: "total" base_path: "{root / "total"}" model_version_policy {{ all {{}} }} }}\n'
        f'  config {{ name: "quick" base_path: "{root / "quick"}" }}\n'
        "}\n"
    )
    return serve(model_config_file=str(config), allow_python_models=True)


@pytest.fixture
def clients(server: ServerThread) -> Iterator[tuple[Any, Any]]:
    http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(server.grpc_target)
    yield http, grpc
    http.close()
    grpc.close()


def send(
    client: Any, module: Any, x: float, sequence_id: Any, model: str = "total", **flags: bool
) -> tuple[float, int]:
    tensor = module.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[x]], np.float32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, **flags)
    return float(result.as_numpy("total")[0, 0]), int(result.as_numpy("version")[0])


def test_a_sequence_over_rest_and_grpc_keeps_its_total(clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    assert send(http, triton_http, 1.0, 42, sequence_start=True) == (1.0, 2)
    assert send(grpc, triton_grpc, 2.0, 42) == (3.0, 2)  # the same sequence, another transport
    assert send(http, triton_http, 10.0, "other", sequence_start=True)[0] == 10.0  # a string id, its own state
    assert send(grpc, triton_grpc, 4.0, 42, sequence_end=True) == (7.0, 2)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        send(http, triton_http, 1.0, 42)  # ended


def test_the_start_control_input_reaches_the_model(clients: tuple[Any, Any]) -> None:
    http, _ = clients
    tensor = triton_http.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
    first = http.infer("total", [tensor], sequence_id=9, sequence_start=True).as_numpy("start")
    second = http.infer("total", [tensor], sequence_id=9, sequence_end=True).as_numpy("start")
    assert (first.tolist(), second.tolist()) == ([1], [0])


def test_a_sequence_stays_on_its_version_through_a_promotion(server: ServerThread, clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    assert send(http, triton_http, 1.0, 5, sequence_start=True) == (1.0, 2)
    promoted = requests.post(f"{server.rest_url}/workbench/v1/models/total:promote", json={"version": 1}, timeout=60)
    assert promoted.status_code == 200, promoted.text
    assert send(grpc, triton_grpc, 1.0, 5) == (2.0, 2)  # started on 2: stays there
    assert send(http, triton_http, 1.0, 6, sequence_start=True) == (1.0, 1)  # a new sequence goes to the promoted 1
    assert send(http, triton_http, 1.0, 5, sequence_end=True) == (3.0, 2)


def test_requests_without_a_sequence_and_idle_sequences_are_refused_clearly(clients: tuple[Any, Any]) -> None:
    http, grpc = clients
    tensor = triton_http.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
    with pytest.raises(InferenceServerException) as missing:
        http.infer("total", [tensor])
    assert missing.value.message() == (
        "inference request to model 'total' must specify a non-zero or non-empty correlation ID"
    )
    assert missing.value.status() == "400"
    send(grpc, triton_grpc, 1.0, 3, model="quick", sequence_start=True)
    time.sleep(0.5)  # longer than the model's max_idle_seconds
    with pytest.raises(InferenceServerException, match="idle longer than"):
        send(grpc, triton_grpc, 1.0, 3, model="quick")
    assert send(http, triton_http, 1.0, 3, model="quick", sequence_start=True)[0] == 1.0  # and it serves on


def stream_steps(target: str, steps: list[tuple[Any, float, dict[str, bool]]]) -> dict[str, Any]:
    """Send ``(sequence_id, x, flags)`` steps down one ModelStreamInfer, all at once, and collect each answer (a
    total, or an error's message) by its request id, ``"<sequence id>:<step>"``."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(target)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for number, (sequence_id, x, flags) in enumerate(steps):
            tensor = triton_grpc.InferInput("x", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[x]], np.float32))
            client.async_stream_infer(
                "total", [tensor], request_id=f"{sequence_id}:{number}", sequence_id=sequence_id, **flags
            )
        got: dict[str, Any] = {}
        for _ in steps:
            result, error = answers.get(timeout=60)
            if error is not None:
                got[f"error {len(got)}"] = error.message()
            else:
                got[result.get_response().id] = float(result.as_numpy("total")[0, 0])
        return got
    finally:
        client.stop_stream()
        client.close()


def test_a_sequence_down_a_stream_runs_in_the_order_sent(server: ServerThread) -> None:
    """Twenty steps of two sequences sent at once on one stream: each sequence's totals come out in the order sent,
    however the stream's requests overlap; a step after a sequence's end is refused in the stream, which goes on."""
    steps: list[tuple[Any, float, dict[str, bool]]] = []
    for number in range(10):
        for sequence_id in (31, "s-31"):
            flags = {"sequence_start": number == 0, "sequence_end": number == 9}
            steps.append((sequence_id, float(number + 1), flags))
    steps.append((31, 1.0, {}))  # after its end
    got = stream_steps(server.grpc_target, steps)
    for sequence_id in (31, "s-31"):
        totals = [got[f"{sequence_id}:{n}"] for n, step in enumerate(steps[:-1]) if step[0] == sequence_id]
        assert totals == [float(sum(range(1, k + 2))) for k in range(10)]
    (refusal,) = [message for request_id, message in got.items() if request_id.startswith("error")]
    assert "must specify the START flag" in refusal


@pytest.mark.parametrize("protocol", ["v2", "v2-grpc"])
def test_the_notebook_client_sends_a_sequence(server: ServerThread, protocol: str) -> None:
    client = Client(server.rest_url, server.grpc_target, protocol=protocol)
    totals = []
    for x, flags in ((1.0, {"sequence_start": True}), (2.0, {}), (3.0, {"sequence_end": True})):
        answer = client.predict("total", np.array([[x]], np.float32), parameters={"sequence_id": "nb", **flags})
        totals.append(float(answer["total"][0, 0]))
    assert totals == [1.0, 3.0, 6.0]
    with pytest.raises(ValueError, match="travel over the v2 protocol"):
        client.predict("total", np.array([[1.0]], np.float32), protocol="rest", parameters={"sequence_id": 1})


# ------------------------------------------------------------------------------------ --num_workers 2
def test_with_two_workers_every_request_of_a_sequence_reaches_the_worker_that_holds_it(tmp_path: Path) -> None:
    """Each request on a new connection (the kernel picks the worker); the totals still add up."""
    from replica import Replica

    from workbench.frontends.sequence_routing import owner_of

    write_total(tmp_path / "repo" / "total" / "1", 1)
    replica = Replica(
        tmp_path / "server", f"--model_repository={tmp_path / 'repo'}", "--allow_python_models", "--num_workers=2"
    ).wait_ready()
    try:
        ids = [7, "sensor-b"]
        assert {owner_of(i, 2) for i in ids} == {0, 1}  # one sequence held by each worker
        totals: dict[Any, list[float]] = {i: [] for i in ids}
        for step_number in range(8):
            for sequence_id in ids:
                flags = {"sequence_start": step_number == 0, "sequence_end": step_number == 7}
                parameters = {"sequence_id": sequence_id, **flags}
                if step_number % 2:  # a fresh gRPC channel: a new connection, to whichever worker
                    client = triton_grpc.InferenceServerClient(replica.grpc_target)
                    tensor = triton_grpc.InferInput("x", [1, 1], "FP32")
                else:  # REST, without a session: a new connection each time
                    client = triton_http.InferenceServerClient(replica.rest_url.removeprefix("http://"))
                    tensor = triton_http.InferInput("x", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
                answer = client.infer("total", [tensor], sequence_id=parameters["sequence_id"], **flags)
                totals[sequence_id].append(float(answer.as_numpy("total")[0, 0]))
                client.close()
        assert totals == {i: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0] for i in ids}
        # Down one stream (one connection, so one worker): the sequence the other worker holds is handed to it.
        steps = [(i, 1.0, {"sequence_start": n == 0, "sequence_end": n == 3}) for n in range(4) for i in ids]
        got = stream_steps(replica.grpc_target, steps)
        for sequence_id in ids:
            assert [got[f"{sequence_id}:{n}"] for n, step in enumerate(steps) if step[0] == sequence_id] == [1, 2, 3, 4]
        workers = requests.get(f"{replica.rest_url}/workbench/v1/health", timeout=30).json()["workers"]
        assert len(workers) == 2
    finally:
        replica.stop()


class Accumulate(PythonModel):
    inputs = {"x": ("float32", [-1, 1])}
    outputs = {"total": ("float32", [-1, 1])}
    stateful = True

    def predict(self, inputs, state):  # type: ignore[no-untyped-def, override]
        total = inputs["x"] + (0.0 if state is None else state)
        return {"total": total}, total


class Forgetful(Accumulate):
    def predict(self, inputs, state):  # type: ignore[no-untyped-def]
        return {"total": inputs["x"]}  # no new state: not what a stateful model returns


def test_export_checks_a_stateful_model_as_a_sequence(tmp_path: Path) -> None:
    exported = workbench.export(Accumulate, "acc", tmp_path, examples={"x": np.ones((2, 1), np.float32)})
    assert (exported.path / "model.py").exists()
    assert not (exported.path / "assets.extra").exists()  # no warmup: it would replay requests outside a sequence
    with pytest.raises(workbench.ExportError, match=r"must return \(outputs, new_state\)"):
        workbench.export(Forgetful, "forgetful", tmp_path)
