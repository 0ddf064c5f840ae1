"""Dynamic batching as TF Serving's ``--enable_batching`` does it: the pure merge/split helpers, the parameters
text proto, the scheduler driven in-process on real SavedModels, and batching behind the real REST and gRPC
frontends (queue full, deadlines, per-model parameter files, hot swaps, metrics)."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from waiting import (
    JumpingClockLoop,
    RequestLoop,
    model_config_text,
    place_atomically,
    run_with_jumping_clock,
    states_are,
    version_states,
    wait_until,
)

from workbench.batching.interest import Interest
from workbench.batching.merge import batch_key, merge, padded_size, split
from workbench.batching.run_cost import RunCost
from workbench.batching.scheduler import BatchRecord, BatchScheduler
from workbench.config.batching_parameters import BatchingParameters, parse_batching_parameters
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.platforms import INLINE_PLATFORMS
from workbench.platforms.tensorflow import load_saved_model
from workbench.server import ServerThread

QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"
METRICS_PATH = "/monitoring/prometheus/metrics"


def column(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32).reshape(-1, 1)


def half_plus_two(*values: float) -> np.ndarray:
    return column(*(0.5 * v + 2 for v in values))


# ===================================================================================== pure functions
def test_merge_concatenates_along_dimension_zero():
    feeds = [
        {"x": column(1, 2), "s": np.array([b"a", b"b"], dtype=object)},
        {"x": column(3), "s": np.array([b"c"], dtype=object)},
    ]
    merged = merge(feeds, pad_variable_length=False, padded_rows=3)
    assert set(merged) == {"x", "s"}
    np.testing.assert_array_equal(merged["x"], column(1, 2, 3))
    assert merged["s"].tolist() == [b"a", b"b", b"c"]


def test_merge_pads_rows_for_allowed_batch_sizes_by_repeating_the_last_row():
    merged = merge([{"x": column(1, 2)}, {"x": column(3)}], pad_variable_length=False, padded_rows=5)
    np.testing.assert_array_equal(merged["x"], column(1, 2, 3, 3, 3))
    # A single feed is padded too, and never changed in place.
    alone = {"x": column(7)}
    np.testing.assert_array_equal(merge([alone], False, 4)["x"], column(7, 7, 7, 7))
    np.testing.assert_array_equal(alone["x"], column(7))


def test_merge_pads_variable_length_inputs_with_zeros_and_empty_strings():
    numbers = merge(
        [{"x": np.array([[1, 2]], dtype=np.int32)}, {"x": np.array([[3, 4, 5], [6, 7, 8]], dtype=np.int32)}],
        pad_variable_length=True,
        padded_rows=3,
    )["x"]
    assert numbers.dtype == np.int32
    assert numbers.tolist() == [[1, 2, 0], [3, 4, 5], [6, 7, 8]]

    strings = merge(
        [{"s": np.array([[b"a"]], dtype=object)}, {"s": np.array([[b"b", b"c"]], dtype=object)}],
        pad_variable_length=True,
        padded_rows=2,
    )["s"]
    assert strings.tolist() == [[b"a", b""], [b"b", b"c"]]

    # Every trailing dimension is padded to the largest of the batch.
    cubes = merge(
        [{"x": np.ones((1, 1, 3), np.float32)}, {"x": np.ones((1, 2, 1), np.float32)}],
        pad_variable_length=True,
        padded_rows=2,
    )["x"]
    assert cubes.shape == (2, 2, 3)
    assert cubes[0].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert cubes[1].tolist() == [[1, 0, 0], [1, 0, 0]]


def test_split_gives_each_task_its_own_rows_and_drops_padding():
    outputs = {"y": column(10, 11, 12, 13, 14, 15, 16, 16), "z": np.arange(8)}
    parts = split(outputs, [1, 2, 3], padded_rows=8)
    assert len(parts) == 3
    np.testing.assert_array_equal(parts[0]["y"], column(10))
    np.testing.assert_array_equal(parts[1]["y"], column(11, 12))
    np.testing.assert_array_equal(parts[2]["y"], column(13, 14, 15))
    assert [p["z"].tolist() for p in parts] == [[0], [1, 2], [3, 4, 5]]


@pytest.mark.parametrize("bad", [np.zeros((3, 1), np.float32), np.float32(1.0), np.zeros((5,), np.int64)])
def test_split_refuses_an_output_whose_dimension_zero_is_not_the_batch(bad):
    with pytest.raises(ServingError) as info:
        split({"y": column(1, 2, 3, 4), "bad": np.asarray(bad)}, [2, 2], padded_rows=4)
    assert info.value.code == Code.INVALID_ARGUMENT
    assert "bad" in info.value.message and "0th dimension" in info.value.message


def test_padded_size_is_the_next_allowed_size():
    allowed = (4, 8, 16)
    assert [padded_size(n, allowed) for n in (1, 3, 4, 5, 8, 9, 16)] == [4, 4, 4, 8, 8, 16, 16]
    assert padded_size(3, ()) == 3
    assert padded_size(20, allowed) == 20  # larger than any allowed size: left alone


def test_batch_key():
    two_rows = {"x": column(1, 2), "s": np.array([b"a", b"b"], dtype=object)}
    key = batch_key(two_rows, pad=False)
    assert key is not None
    # Same aliases, dtypes and trailing shapes → same key whatever the row count.
    assert batch_key({"x": column(5), "s": np.array([b"c"], dtype=object)}, pad=False) == key
    # A different trailing shape or dtype → a different key.
    assert batch_key({"x": np.zeros((2, 2), np.float32), "s": two_rows["s"]}, pad=False) != key
    assert batch_key({"x": column(1, 2).astype(np.float64), "s": two_rows["s"]}, pad=False) != key
    # With padding only the rank must match.
    wide = {"x": np.zeros((1, 3), np.float32)}
    narrow = {"x": np.zeros((4, 2), np.float32)}
    assert batch_key(wide, pad=False) != batch_key(narrow, pad=False)
    assert batch_key(wide, pad=True) == batch_key(narrow, pad=True)
    assert batch_key({"x": np.zeros((1, 3, 1), np.float32)}, pad=True) != batch_key(wide, pad=True)
    # Cannot batch at all: a scalar input, or inputs that disagree on dimension 0.
    assert batch_key({"x": np.float32(1.0)}, pad=False) is None
    assert batch_key({"x": column(1, 2), "k": np.float32(3)}, pad=False) is None
    assert batch_key({"x": column(1, 2), "s": np.array([b"a"], dtype=object)}, pad=False) is None
    assert batch_key({"x": column(1, 2), "s": np.array([b"a"], dtype=object)}, pad=True) is None


# ======================================================================================= parameters
def test_batching_parameters_defaults_are_tf_servings():
    params = parse_batching_parameters("")
    assert params.max_batch_size == 1000
    assert params.batch_timeout_micros == 0
    assert params.max_enqueued_batches == 10
    assert params.num_batch_threads == (os.cpu_count() or 1)
    assert params.allowed_batch_sizes == ()
    assert params.pad_variable_length_inputs is False
    assert params.enable_large_batch_splitting is False
    assert params == BatchingParameters()


def test_batching_parameters_wrapper_syntax():
    params = parse_batching_parameters(
        """
        max_batch_size { value: 128 }
        batch_timeout_micros { value: 2500 }
        max_enqueued_batches { value: 3 }
        num_batch_threads { value: 5 }
        allowed_batch_sizes: 32
        allowed_batch_sizes: 64
        allowed_batch_sizes: 128
        pad_variable_length_inputs { value: true }
        """
    )
    assert (params.max_batch_size, params.batch_timeout_micros, params.max_enqueued_batches) == (128, 2500, 3)
    assert params.num_batch_threads == 5
    assert params.allowed_batch_sizes == (32, 64, 128)
    assert params.pad_variable_length_inputs is True
    assert params.execution_batch_size == 128

    split_params = parse_batching_parameters(
        "max_batch_size { value: 64 } enable_large_batch_splitting { value: true } "
        "max_execution_batch_size { value: 16 } allowed_batch_sizes: [8, 16]"
    )
    assert split_params.execution_batch_size == 16
    assert split_params.allowed_batch_sizes == (8, 16)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("max_batch_size { value: 8 } bogus_field { value: 1 }", "Error parsing text-format tensorflow.serving"),
        ("max_batch_size: 8", "Error parsing text-format tensorflow.serving.BatchingParameters"),
        ("max_batch_size { value: 8 } allowed_batch_sizes: [4, 2, 8]", "allowed_batch_sizes"),
        ("max_batch_size { value: 8 } allowed_batch_sizes: [4, 4, 8]", "allowed_batch_sizes"),
        ("max_batch_size { value: 8 } allowed_batch_sizes: [2, 4]", "max_batch_size"),
        ("max_batch_size { value: 8 } max_execution_batch_size { value: 4 }", "enable_large_batch_splitting"),
        ("max_batch_size { value: 0 }", "max_batch_size"),
        ("num_batch_threads { value: 0 }", "num_batch_threads"),
        ("batch_timeout_micros { value: -1 }", "batch_timeout_micros"),
    ],
)
def test_batching_parameters_errors(text, fragment):
    with pytest.raises(ServingError) as info:
        parse_batching_parameters(text, "my.config")
    assert info.value.code == Code.INVALID_ARGUMENT
    assert fragment in info.value.message
    assert "my.config" in info.value.message


def test_unknown_field_error_names_the_message_type():
    with pytest.raises(ServingError) as info:
        parse_batching_parameters("max_batch_sise { value: 8 }", "b.config")
    assert info.value.message.startswith("Error parsing text-format tensorflow.serving.BatchingParameters: b.config")
    assert "max_batch_sise" in info.value.message


# ============================================================================ the scheduler in-process
def _save_row_sums(path: Path) -> Path:
    class RowSums(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"sums": tf.reduce_sum(x, axis=1)}

    module = RowSums()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


@pytest.fixture(scope="module")
def servables(tmp_path_factory, model_store) -> Iterator[dict[str, Servable]]:
    import shutil

    root = tmp_path_factory.mktemp("scheduler")
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    loaded = {
        "hp": load_saved_model("hp", 1, str(root / "hp" / "1")),
        "sums": load_saved_model("sums", 1, str(_save_row_sums(root / "sums" / "1"))),
    }
    yield loaded
    for servable in loaded.values():
        servable.close()


class Harness:
    """A BatchScheduler on its own inference threads, recording every batch it runs."""

    def __init__(self, servable: Servable, params: BatchingParameters, output: str) -> None:
        self.servable, self.output = servable, output
        self.records: list[BatchRecord] = []
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-batching")
        self.scheduler = BatchScheduler(self.executor, lambda _: params, listener=self.records.append)

    async def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        signature = self.servable.signatures["serving_default"]
        result = await self.scheduler.run(self.servable, signature, feed, [self.output])
        assert set(result) == {self.output}
        return result[self.output]

    def shapes(self) -> list[tuple[int, int, int]]:
        """(size, padded_size, tasks) of every batch so far."""
        return [(r.size, r.padded_size, r.tasks) for r in self.records]


@pytest.fixture
def harness(servables) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(params: BatchingParameters, model: str = "hp") -> Harness:
        h = Harness(servables[model], params, "y" if model == "hp" else "sums")
        made.append(h)
        return h

    yield make
    for h in made:
        h.executor.shutdown(wait=True)


async def until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """Poll ``predicate`` on the running loop (never blocking it) until truthy, or fail at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate!r}")
        await asyncio.sleep(0.002)


LONG = 30_000_000  # a batch_timeout_micros no test waits for: batches in these tests start because they are full


def test_concurrent_tasks_of_mixed_sizes_share_one_batch_and_get_their_own_rows(harness):
    h = harness(BatchingParameters(max_batch_size=6, batch_timeout_micros=LONG, num_batch_threads=2))

    async def main():
        return await asyncio.wait_for(
            asyncio.gather(h.run({"x": column(1)}), h.run({"x": column(2, 3)}), h.run({"x": column(4, 5, 6)})), 60
        )

    one, two, three = asyncio.run(main())
    np.testing.assert_array_equal(one, half_plus_two(1))
    np.testing.assert_array_equal(two, half_plus_two(2, 3))
    np.testing.assert_array_equal(three, half_plus_two(4, 5, 6))
    assert h.shapes() == [(6, 6, 3)]
    record = h.records[0]
    assert (record.model, record.version, record.signature) == ("hp", 1, "serving_default")
    assert len(record.queue_seconds) == 3
    assert all(s >= 0 for s in record.queue_seconds) and record.run_seconds >= 0


def test_allowed_batch_sizes_pad_the_batch_and_cut_the_padding(harness):
    h = harness(
        BatchingParameters(max_batch_size=8, allowed_batch_sizes=(4, 8), batch_timeout_micros=0, num_batch_threads=1)
    )

    async def main():
        three = await h.run({"x": column(1, 2, 3)})
        five = await h.run({"x": column(4, 5, 6, 7, 8)})
        return three, five

    three, five = asyncio.run(main())
    np.testing.assert_array_equal(three, half_plus_two(1, 2, 3))
    np.testing.assert_array_equal(five, half_plus_two(4, 5, 6, 7, 8))
    assert h.shapes() == [(3, 4, 1), (5, 8, 1)]


def test_large_batch_splitting_runs_a_big_request_in_pieces_and_reassembles_it(harness):
    h = harness(
        BatchingParameters(
            max_batch_size=16,
            enable_large_batch_splitting=True,
            max_execution_batch_size=4,
            batch_timeout_micros=0,
            num_batch_threads=1,
        )
    )
    values = [float(v) for v in range(10)]
    result = asyncio.run(h.run({"x": column(*values)}))
    np.testing.assert_array_equal(result, half_plus_two(*values))
    assert [r.size for r in h.records] == [4, 4, 2]
    assert all(r.tasks == 1 for r in h.records)


def test_a_task_larger_than_max_batch_size_is_refused(harness):
    h = harness(BatchingParameters(max_batch_size=16, enable_large_batch_splitting=True, max_execution_batch_size=4))
    with pytest.raises(ServingError) as info:
        asyncio.run(h.run({"x": column(*range(20))}))
    assert info.value.code == Code.INVALID_ARGUMENT
    assert info.value.message == "Task size 20 is larger than maximum input batch size 16"
    assert h.records == []


def test_a_full_queue_answers_unavailable_at_once(harness):
    h = harness(
        BatchingParameters(max_batch_size=4, max_enqueued_batches=1, batch_timeout_micros=LONG, num_batch_threads=1)
    )

    async def main():
        waiting = asyncio.ensure_future(h.run({"x": column(1, 2, 3)}))
        await until(lambda: h.scheduler.queue_depths() == [("hp", 1, 3)], what="3 rows waiting")
        with pytest.raises(ServingError) as info:
            # Refused at once: far sooner than the batch timeout, or this wait_for would fail instead.
            await asyncio.wait_for(h.run({"x": column(4, 5)}), 20)
        assert not waiting.done()
        filler = await asyncio.wait_for(h.run({"x": column(9)}), 20)  # 3 + 1 rows: the batch is full and runs
        return info.value, await waiting, filler

    error, waited, filler = asyncio.run(main())
    assert error.code == Code.UNAVAILABLE
    assert error.message == QUEUE_FULL
    np.testing.assert_array_equal(waited, half_plus_two(1, 2, 3))
    np.testing.assert_array_equal(filler, half_plus_two(9))
    assert h.shapes() == [(4, 4, 2)]
    assert h.scheduler.queue_depths() == []


def test_incompatible_tasks_do_not_merge_but_all_are_answered(harness):
    h = harness(BatchingParameters(max_batch_size=3, batch_timeout_micros=LONG, num_batch_threads=2), model="sums")
    narrow = np.array([[1, 2], [3, 4]], np.float32)
    wide_one = np.array([[1, 2, 3]], np.float32)
    wide_two = np.array([[4, 5, 6], [7, 8, 9]], np.float32)

    async def main():
        return await asyncio.wait_for(
            asyncio.gather(h.run({"x": narrow}), h.run({"x": wide_one}), h.run({"x": wide_two})), 60
        )

    a, b, c = asyncio.run(main())
    assert a.tolist() == [3, 7]
    assert b.tolist() == [6]
    assert c.tolist() == [15, 24]
    # The narrow task went alone; the two wide ones filled the next batch together.
    assert sorted(h.shapes()) == [(2, 2, 1), (3, 3, 2)]


def test_pad_variable_length_inputs_merges_rows_of_different_lengths(harness):
    h = harness(
        BatchingParameters(
            max_batch_size=4, batch_timeout_micros=LONG, num_batch_threads=1, pad_variable_length_inputs=True
        ),
        model="sums",
    )

    async def main():
        return await asyncio.wait_for(
            asyncio.gather(
                h.run({"x": np.array([[1, 2]], np.float32)}),
                h.run({"x": np.array([[1, 2, 3, 4], [10, 20, 30, 40]], np.float32)}),
                h.run({"x": np.array([[5]], np.float32)}),
            ),
            60,
        )

    a, b, c = asyncio.run(main())
    assert a.tolist() == [3]
    assert b.tolist() == [10, 100]
    assert c.tolist() == [5]
    assert h.shapes() == [(4, 4, 3)]


def test_an_idle_model_runs_each_request_at_once_as_a_batch_of_one(harness):
    h = harness(BatchingParameters(max_batch_size=32, batch_timeout_micros=0))

    async def main():
        answers = []
        for v in range(5):
            # Nothing else is queued: the request must not wait for a companion (a hang fails the wait_for).
            answers.append(await asyncio.wait_for(h.run({"x": column(v)}), 20))
        return answers

    answers = asyncio.run(main())
    for v, answer in enumerate(answers):
        np.testing.assert_array_equal(answer, half_plus_two(v))
    assert h.shapes() == [(1, 1, 1)] * 5


class Recorded(Servable):
    """A real servable run through a recorder: which thread each call ran on, optionally slowed down."""

    def __init__(self, inner: Servable) -> None:
        self.inner, self.name, self.version = inner, inner.name, inner.version
        self.path, self.signatures = inner.path, inner.signatures
        self.platform = "tensorflow"  # as the platform loader names it
        self.threads: list[str] = []
        self.delay = 0.0

    def run(self, signature, inputs, outputs):
        self.threads.append(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)  # a model that blocks, e.g. on I/O
        return self.inner.run(signature, inputs, outputs)


def test_run_cost_settles_on_cheap_thread_calls_and_one_slow_call_on_the_loop_sends_it_back():
    cost = RunCost()
    budget, settle = RunCost.INLINE_BUDGET_SECONDS, RunCost.SETTLE_RUNS
    for _ in range(settle - 1):
        cost.record(budget / 10, on_loop=False)
        cost.record(budget * 10, on_loop=False)  # on a thread, maybe a wait for the GIL: proves nothing
    assert not cost.inline, "too few cheap calls seen"
    cost.record(budget / 10, on_loop=False)
    assert cost.inline
    cost.record(budget / 10, on_loop=True)
    assert cost.inline
    cost.record(budget * 2, on_loop=True)
    assert cost.inline, "one call a little over budget among cheap ones is the machine's hiccup"
    cost.record(budget * 2, on_loop=True)
    assert not cost.inline, "two in a row over budget on the loop are enough to leave it"
    for _ in range(settle - 1):
        cost.record(budget / 10, on_loop=False)
    assert not cost.inline, "back only once cheap again"
    cost.record(budget / 10, on_loop=False)
    assert cost.inline


def test_a_python_models_calls_never_run_on_the_loop():
    cost = RunCost(allowed=False)  # user code may wait on I/O: however cheap it looks, it stays on the threads
    for _ in range(RunCost.SETTLE_RUNS * 4):
        cost.record(RunCost.INLINE_BUDGET_SECONDS / 10, on_loop=False)
    assert not cost.inline
    assert "python" not in INLINE_PLATFORMS and "pipeline" not in INLINE_PLATFORMS


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_a_cheap_model_runs_on_the_event_loop_once_settled_and_a_slow_call_moves_it_back(
    servables, monkeypatch, batched
):
    # The budget is the policy under test's knob: a generous one keeps a busy test machine's hiccups out of it.
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 0.5)
    recorded = Recorded(servables["hp"])
    params = BatchingParameters(max_batch_size=32, batch_timeout_micros=0) if batched else None
    records: list[BatchRecord] = []
    signature = recorded.signatures["serving_default"]
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-infer") as executor:
        scheduler = BatchScheduler(executor, lambda _: params, listener=records.append, inline_cheap_calls=True)

        async def ask(v: float) -> np.ndarray:
            return (await asyncio.wait_for(scheduler.run(recorded, signature, {"x": column(v)}, ["y"]), 20))["y"]

        async def main() -> tuple[list[np.ndarray], str]:
            answers = [await ask(v) for v in range(RunCost.SETTLE_RUNS + 2)]
            recorded.delay = 0.6  # out of budget: this call holds the loop once, the next goes to a thread
            answers += [await ask(v) for v in (20, 21)]
            return answers, threading.current_thread().name

        answers, loop_thread = asyncio.run(main())
    for v, answer in zip([*range(RunCost.SETTLE_RUNS + 2), 20, 21], answers, strict=True):
        np.testing.assert_array_equal(answer, half_plus_two(v))
    settle = RunCost.SETTLE_RUNS
    assert all(name.startswith("test-infer") for name in recorded.threads[:settle]), recorded.threads
    assert recorded.threads[settle:] == [loop_thread] * 3 + [recorded.threads[-1]], recorded.threads
    assert recorded.threads[-1].startswith("test-infer")
    # Wherever a call ran, it was recorded alike: one row, one task.
    assert [(r.size, r.padded_size, r.tasks) for r in records] == [(1, 1, 1)] * (settle + 4)


class Gated(Servable):
    """A real servable whose calls wait for the test's gate; records the inputs of every call as it starts."""

    def __init__(self, inner: Servable) -> None:
        self.inner, self.name, self.version = inner, inner.name, inner.version
        self.path, self.signatures, self.platform = inner.path, inner.signatures, "tensorflow"
        self.calls: list[list[float]] = []
        self.started, self.opened = threading.Event(), threading.Event()

    def run(self, signature, inputs, outputs):
        self.calls.append(inputs["x"].ravel().tolist())
        self.started.set()
        self.opened.wait(60)
        return self.inner.run(signature, inputs, outputs)


@pytest.fixture
def gated(servables) -> Iterator[tuple[Gated, BatchScheduler, list[BatchRecord]]]:
    """A gated half_plus_two behind a scheduler with one batch thread: while a call waits at the gate, the next
    requests queue."""
    model = Gated(servables["hp"])
    records: list[BatchRecord] = []
    params = BatchingParameters(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-gated") as executor:
        yield model, BatchScheduler(executor, lambda _: params, listener=records.append), records
        model.opened.set()


@pytest.mark.parametrize("how", ["given-up", "cancelled"])
def test_queued_requests_nobody_waits_for_leave_the_queue_unrun_and_the_wanted_ones_run(gated, how):
    model, scheduler, records = gated
    signature = model.signatures["serving_default"]

    async def ask(*values: float) -> np.ndarray:
        return (await scheduler.run(model, signature, {"x": column(*values)}, ["y"]))["y"]

    async def two_members() -> list[np.ndarray]:  # like a composite: its member requests run as tasks of their own
        return list(await asyncio.gather(ask(2), ask(3, 4)))

    async def main() -> tuple[np.ndarray, np.ndarray, BaseException]:
        running = asyncio.ensure_future(ask(1))
        await until(model.started.is_set, what="the first call at the gate")
        interest = Interest()
        unwanted = interest.start(two_members())
        wanted = Interest().start(ask(5))
        await until(lambda: scheduler.queue_depths() == [("hp", 1, 4)], what="4 rows queued behind the gate")

        if how == "given-up":
            interest.give_up(ServingError(Code.CANCELLED, "Cancelled"))
        else:
            unwanted.cancel()
        # Out of the queue and answered without waiting for the thread.
        done, _ = await asyncio.wait([unwanted], timeout=20)
        assert done, "the unwanted requests still wait"
        assert scheduler.queue_depths() == [("hp", 1, 1)]
        error = unwanted.exception() if not unwanted.cancelled() else asyncio.CancelledError()
        assert not model.opened.is_set() and model.calls == [[1.0]]

        model.opened.set()
        return await asyncio.wait_for(running, 20), await asyncio.wait_for(wanted, 20), error

    first, kept, error = asyncio.run(main())
    np.testing.assert_array_equal(first, half_plus_two(1))
    np.testing.assert_array_equal(kept, half_plus_two(5))
    if how == "given-up":
        assert isinstance(error, ServingError) and error.code == Code.CANCELLED
    else:
        assert isinstance(error, asyncio.CancelledError)
    assert model.calls == [[1.0], [5.0]], "a request nobody waited for reached the model"
    assert [(r.size, r.tasks) for r in records] == [(1, 1), (1, 1)]
    assert scheduler.queue_depths() == []


def test_a_queued_request_whose_deadline_passed_is_dropped_when_its_batch_forms(gated):
    model, scheduler, records = gated
    signature = model.signatures["serving_default"]

    async def ask(*values: float) -> np.ndarray:
        return (await scheduler.run(model, signature, {"x": column(*values)}, ["y"]))["y"]

    async def main() -> tuple[np.ndarray, np.ndarray, list[np.ndarray], BaseException | None]:
        loop = asyncio.get_running_loop()
        running = asyncio.ensure_future(ask(1))
        await until(model.started.is_set, what="the first call at the gate")
        expiring = Interest(timeout=0.05)
        expired = expiring.start(ask(2))
        later = Interest(timeout=600)
        wanted = [later.start(ask(3)), asyncio.ensure_future(ask(4))]
        await until(lambda: expiring.deadline is not None and loop.time() >= expiring.deadline, what="the deadline")
        assert not expired.done(), "nothing gave up on it: it goes when its batch forms"
        model.opened.set()
        answers = await asyncio.wait_for(asyncio.gather(*wanted), 20)
        await asyncio.wait([expired], timeout=20)
        return await running, answers[0], answers[1:], expired.exception()

    first, kept, others, error = asyncio.run(main())
    np.testing.assert_array_equal(first, half_plus_two(1))
    np.testing.assert_array_equal(kept, half_plus_two(3))
    np.testing.assert_array_equal(others[0], half_plus_two(4))
    assert isinstance(error, ServingError)
    assert (error.code, error.message) == (Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
    # The two wanted requests ran together, without the expired one.
    assert model.calls == [[1.0], [3.0, 4.0]]
    assert [(r.size, r.tasks) for r in records] == [(1, 1), (2, 2)]


def test_a_finished_batch_timer_does_not_evict_a_newer_queue(harness):
    # A batch that started because it was full had armed a timeout timer while its first row waited. If that
    # timer still fires after the queue was emptied and replaced, the newer queue must stay the one new tasks
    # join. The loop's clock jumps: timers fire in the order they are due however slow the machine is, and a
    # minute-long batch timeout leaves the real time a test run takes nothing to race.
    timeout = 60.0
    h = harness(BatchingParameters(max_batch_size=2, batch_timeout_micros=int(timeout * 1e6), num_batch_threads=1))

    async def main(loop: JumpingClockLoop) -> tuple[np.ndarray, np.ndarray]:
        start = loop.time()
        first = asyncio.ensure_future(h.run({"x": column(1)}))
        await until(lambda: h.scheduler.queue_depths() == [("hp", 1, 1)], what="the first row waiting, timer armed")
        await h.run({"x": column(2)})  # fills the batch: both rows run at once; the first row's timer was due at
        await first  # start + 60 s (plus the real seconds this took)
        loop.jump(timeout / 2)
        late = asyncio.ensure_future(h.run({"x": column(3)}))  # a new queue; its timer is due at start + 90 s
        await until(lambda: h.scheduler.queue_depths() == [("hp", 1, 1)], what="the late row waiting")
        seen: list[object] = []
        joined: list[asyncio.Future[np.ndarray]] = []

        def probe() -> None:  # between the first batch's timer and the late row's own
            seen.append(h.scheduler.queue_depths())
            joined.append(asyncio.ensure_future(h.run({"x": column(4)})))

        probe_at = start + timeout * 1.25
        loop.call_at(probe_at, probe)
        loop.jump(probe_at - loop.time())
        await until(lambda: joined, what="the probe")
        assert seen == [[("hp", 1, 1)]], "the waiting row vanished from the queue depths"
        # Together they fill a batch that runs at once; apart, each would wait for a timer no jump brings closer.
        _, waiting = await asyncio.wait([late, joined[0]], timeout=20)
        assert not waiting, "the late task and the next one were not batched together"
        return late.result(), joined[0].result()

    late, joined = run_with_jumping_clock(main)
    np.testing.assert_array_equal(late, half_plus_two(3))
    np.testing.assert_array_equal(joined, half_plus_two(4))
    assert h.shapes() == [(2, 2, 2), (2, 2, 2)]


# ============================================================================= through the real server
def write_params(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def predict_request(model: str, version: int | None = None, **inputs: np.ndarray) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    return request


def in_threads(fn: Callable[[int], object], count: int, workers: int = 8) -> list[object]:
    """``fn(0..count-1)`` on ``workers`` threads at once; results in order, the first exception raised."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, range(count)))


@pytest.fixture(scope="module")
def model_root(tmp_path_factory, model_store) -> Path:
    import shutil

    root = tmp_path_factory.mktemp("batched")
    for name, stored in [("hp", "hp2_tf2"), ("tf1", "hp2_tf1"), ("multi", "multi_io")]:
        shutil.copytree(model_store / stored, root / name / "1")
    (root / "models.config").write_text(model_config_text(*((n, root / n, "") for n in ("hp", "tf1", "multi"))))
    return root


@pytest.fixture(scope="module")
def batched(model_root) -> Iterator[ServerThread]:
    params = write_params(
        model_root / "batching.config",
        "max_batch_size { value: 64 } batch_timeout_micros { value: 2000 } "
        "max_enqueued_batches { value: 1000 } num_batch_threads { value: 2 }",
    )
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_config_file=str(model_root / "models.config"),
        enable_batching=True,
        batching_parameters_file=params,
    )
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def unbatched(model_root) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_config_file=str(model_root / "models.config"))
    with ServerThread(options) as running:
        yield running


def test_the_server_reports_batching_in_health(batched, unbatched):
    assert requests.get(batched.rest_url + "/workbench/v1/health", timeout=30).json()["batching"] == {
        "hp": True,
        "multi": True,
        "tf1": True,
    }
    assert requests.get(unbatched.rest_url + "/workbench/v1/health", timeout=30).json()["batching"] == {
        "hp": False,
        "multi": False,
        "tf1": False,
    }


def _rest_case(i: int) -> tuple[str, dict, dict]:
    """A predict body in one of the REST formats, with values unique to ``i``, and its exact answer."""
    v = float(i)
    cases: list[tuple[str, dict, dict]] = [
        ("hp", {"instances": [[v]]}, {"predictions": [[0.5 * v + 2]]}),
        ("hp", {"instances": [[v], [v + 0.5]]}, {"predictions": [[0.5 * v + 2], [0.5 * v + 2.25]]}),
        ("hp", {"inputs": [[v], [v + 1], [v + 2]]}, {"outputs": [[0.5 * v + 2], [0.5 * v + 2.5], [0.5 * v + 3]]}),
        ("hp", {"inputs": {"x": [[v]]}}, {"outputs": [[0.5 * v + 2]]}),
        ("hp", {"signature_name": "serving_default", "instances": [{"x": [v]}]}, {"predictions": [[0.5 * v + 2]]}),
        ("tf1", {"instances": [v, v + 2]}, {"predictions": [0.5 * v + 2, 0.5 * v + 3]}),  # rank 1: its own batches
        ("tf1", {"instances": [[v]]}, {"predictions": [[0.5 * v + 2]]}),
    ]
    return cases[i % len(cases)]


def test_concurrent_rest_predicts_in_several_formats_each_get_their_own_answer(batched):
    def call(i: int) -> tuple[int, dict, dict]:
        model, body, expected = _rest_case(i)
        with requests.Session() as session:
            r = session.post(f"{batched.rest_url}/v1/models/{model}:predict", json=body, timeout=60)
        return r.status_code, r.json(), expected

    def answered() -> float:  # REST predicts answered OK so far, all models
        text = requests.get(f"{batched.rest_url}/metrics", timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("workbench_requests_total{") and 'protocol="rest"' in line and 'code="OK"' in line
        )

    before = answered()
    for status, answer, expected in in_threads(call, 140):
        assert status == 200, answer
        assert answer == expected
    # Requests that arrived together may have run as one group (planes/coalescing.py): each is still counted once.
    assert answered() - before == 140


def test_concurrent_grpc_predicts_each_get_their_own_rows(batched):
    with grpc.insecure_channel(batched.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        def call(i: int) -> tuple[int, np.ndarray, np.ndarray]:
            values = [float(i * 10 + k) for k in range(1 + i % 3)]
            response = stub.Predict(predict_request("hp", x=column(*values)), timeout=60)
            return response.model_spec.version.value, tf.make_ndarray(response.outputs["y"]), half_plus_two(*values)

        for version, got, expected in in_threads(call, 120):
            assert version == 1
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("verb", "signature"), [("classify", "classify_x_to_y"), ("regress", "regress_x_to_y")])
def test_batched_classify_and_regress_answer_like_unbatched(batched, unbatched, verb, signature):
    def body(i: int) -> dict:
        return {"signature_name": signature, "examples": [{"x": float(i + k)} for k in range(1 + i % 3)]}

    expected = [
        requests.post(f"{unbatched.rest_url}/v1/models/tf1:{verb}", json=body(i), timeout=30).json() for i in range(40)
    ]
    assert expected[1] == ({"results": [[["", 2.5]], [["", 3.0]]]} if verb == "classify" else {"results": [2.5, 3.0]})

    def call(i: int) -> tuple[int, object]:
        r = requests.post(f"{batched.rest_url}/v1/models/tf1:{verb}", json=body(i), timeout=60)
        return r.status_code, r.json()

    got = in_threads(call, 40)
    assert [status for status, _ in got] == [200] * 40
    assert [answer for _, answer in got] == expected


def test_multi_input_model_batched_with_strings_gives_each_caller_its_rows(batched):
    def call(i: int) -> tuple[int, dict, list[dict]]:
        rows: list[dict[str, Any]] = [
            {"a": [float(i), float(k)], "b": i * 10 + k, "text": f"caller{i}-row{k}"} for k in range(1 + i % 3)
        ]
        expected = [
            {
                "total": row["a"][0] + row["a"][1] + row["b"],
                "doubled": 2 * row["b"],
                "upper": row["text"].upper(),
                "echo_bytes": {"b64": base64.b64encode(row["text"].encode()).decode()},
            }
            for row in rows
        ]
        if i % 2:
            body: dict = {"instances": rows}
        else:
            body = {"inputs": {key: [row[key] for row in rows] for key in ("a", "b", "text")}}
        r = requests.post(f"{batched.rest_url}/v1/models/multi:predict", json=body, timeout=60)
        answer = r.json()
        if i % 2 == 0 and r.status_code == 200:  # columnar answers: back to rows for the comparison
            outputs = answer["outputs"]
            answer = {"predictions": [{k: outputs[k][n] for k in outputs} for n in range(len(rows))]}
        return r.status_code, answer, expected

    for status, answer, expected in in_threads(call, 60):
        assert status == 200, answer
        assert answer["predictions"] == expected


def test_queue_full_is_503_and_unavailable_and_a_rest_deadline_is_504(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    params = write_params(
        tmp_path / "batching.config",
        "max_batch_size { value: 4 } max_enqueued_batches { value: 1 } "
        "batch_timeout_micros { value: 30000000 } num_batch_threads { value: 1 }",
    )
    server = serve(
        model_name="m",
        model_base_path=str(base),
        file_system_poll_wait_seconds=0,
        enable_batching=True,
        batching_parameters_file=params,
        rest_api_timeout_in_ms=200,
    )
    url = f"{server.rest_url}/v1/models/m:predict"

    def depth() -> int:
        entry = requests.get(server.rest_url + "/workbench/v1/stats", timeout=30).json()["models"].get("m", {})
        return entry.get("1", {}).get("queue_depth", 0)

    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        # A full batch runs at once, long before the 30 s batch timeout (over gRPC: REST's 200 ms deadline is for
        # the end of this test, not for a first call on a busy machine).
        full = stub.Predict(predict_request("m", x=column(1, 2, 3, 4)), timeout=10)
        np.testing.assert_array_equal(tf.make_ndarray(full.outputs["y"]), half_plus_two(1, 2, 3, 4))
        waiting = stub.Predict.future(predict_request("m", x=column(1, 2, 3)), timeout=60)
        wait_until(lambda: depth() == 3, what="3 rows waiting in the queue")

        r = requests.post(url, json={"instances": [[5.0], [6.0]]}, timeout=30)
        assert r.status_code == 503
        assert r.json() == {"error": QUEUE_FULL}

        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(predict_request("m", x=column(5, 6)), timeout=30)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == QUEUE_FULL

        assert not waiting.done()
        filler = stub.Predict(predict_request("m", x=column(7)), timeout=30)  # 3 + 1 rows: the batch is full
        np.testing.assert_array_equal(tf.make_ndarray(filler.outputs["y"]), half_plus_two(7))
        np.testing.assert_array_equal(tf.make_ndarray(waiting.result(timeout=30).outputs["y"]), half_plus_two(1, 2, 3))

    # One row alone waits for the 30 s batch timeout; REST gives up at its 200 ms deadline.
    r = requests.post(url, json={"instances": [[1.0]]}, timeout=30)
    assert r.status_code == 504
    assert r.json() == {"error": "Deadline Exceeded"}

    entry = requests.get(server.rest_url + "/workbench/v1/stats", timeout=30).json()["models"]["m"]["1"]
    assert entry["total_requests"] == 6
    assert entry["total_errors"] == 3


def _scrape(server: ServerThread) -> str:
    r = requests.get(server.rest_url + METRICS_PATH, timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def _sample(text: str, name: str, **labels: str) -> float | None:
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def test_per_model_parameter_file_batches_that_model_only_with_metrics_and_stats(serve, make_repo, tmp_path):
    batched_base = make_repo("batched", {1: "hp2_tf2"})
    (batched_base / "batching_parameters.txt").write_text(
        "max_batch_size { value: 8 } batch_timeout_micros { value: 30000000 } num_batch_threads { value: 1 }\n"
    )
    plain_base = make_repo("plain", {1: "hp2_tf2"})
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("batched", batched_base, ""), ("plain", plain_base, "")))
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}\n')
    server = serve(
        model_config_file=str(config), file_system_poll_wait_seconds=0, monitoring_config_file=str(monitoring)
    )

    health = requests.get(server.rest_url + "/workbench/v1/health", timeout=30).json()
    assert health["models"] == ["batched", "plain"]
    assert health["batching"] == {"batched": True, "plain": False}

    def call(model: str, i: int) -> tuple[int, object]:
        r = requests.post(f"{server.rest_url}/v1/models/{model}:predict", json={"instances": [[float(i)]]}, timeout=60)
        return r.status_code, r.json()

    # Seven single-row requests wait (the batch holds 8, the timeout is 30 s) and show as the queue depth;
    # the eighth fills the batch and all eight are answered by one TensorFlow call.
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = [pool.submit(call, "batched", i) for i in range(7)]
        wait_until(
            lambda: _sample(_scrape(server), "workbench_queue_depth", model="batched", version="1") == 7,
            what="7 rows in the queue depth gauge",
        )
        assert not any(f.done() for f in first)
        last = pool.submit(call, "batched", 7)
        answers = [f.result(timeout=60) for f in [*first, last]]
    assert answers == [(200, {"predictions": [[0.5 * i + 2]]}) for i in range(8)]
    for i in range(3):
        assert call("plain", i) == (200, {"predictions": [[0.5 * i + 2]]})

    text = _scrape(server)
    assert _sample(text, "workbench_batch_size_count", model="batched", version="1") == 1
    assert _sample(text, "workbench_batch_size_sum", model="batched", version="1") == 8
    assert _sample(text, "workbench_batch_size_bucket", model="batched", version="1", le="4.0") == 0
    assert _sample(text, "workbench_batch_size_bucket", model="batched", version="1", le="8.0") == 1
    assert _sample(text, "workbench_batch_size_count", model="plain", version="1") == 3
    assert _sample(text, "workbench_batch_size_bucket", model="plain", version="1", le="1.0") == 3
    assert _sample(text, "workbench_queue_seconds_count", model="batched", version="1") == 8
    assert _sample(text, "workbench_inference_seconds_count", model="batched", version="1") == 1
    assert _sample(text, "workbench_inference_seconds_count", model="plain", version="1") == 3
    assert "# TYPE workbench_queue_depth gauge" in text
    assert _sample(text, "workbench_queue_depth", model="batched", version="1") in (None, 0)

    stats = requests.get(server.rest_url + "/workbench/v1/stats", timeout=30).json()["models"]
    assert stats["batched"]["1"]["mean_batch_size"] == 8.0
    assert stats["batched"]["1"]["total_requests"] == 8
    assert stats["plain"]["1"]["mean_batch_size"] == 1.0
    assert stats["plain"]["1"]["total_requests"] == 3


def test_batching_parameters_file_without_enable_batching_fails_start_up(serve, make_repo, tmp_path):
    params = write_params(tmp_path / "batching.config", "max_batch_size { value: 8 }")
    base = make_repo("m", {1: "hp2_tf2"})
    with pytest.raises(ServingError, match="--batching_parameters_file was given without --enable_batching"):
        serve(model_name="m", model_base_path=str(base), batching_parameters_file=params)


@pytest.mark.parametrize("where", ["flag", "model"])
def test_a_malformed_parameters_file_fails_start_up(serve, make_repo, tmp_path, where):
    base = make_repo("m", {1: "hp2_tf2"})
    text = "max_batch_size { value: 8 } not_a_field: 1\n"
    if where == "flag":
        options = {"enable_batching": True, "batching_parameters_file": write_params(tmp_path / "b.config", text)}
    else:
        (base / "batching_parameters.txt").write_text(text)
        options = {}
    with pytest.raises(ServingError, match="Error parsing text-format tensorflow.serving.BatchingParameters"):
        serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0, **options)


def test_hot_add_with_batching_switches_versions_without_a_failed_request(serve, make_repo, model_store, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    params = write_params(
        tmp_path / "batching.config", "max_batch_size { value: 16 } batch_timeout_micros { value: 1000 }"
    )
    server = serve(
        model_name="m",
        model_base_path=str(base),
        file_system_poll_wait_seconds=0.2,
        enable_batching=True,
        batching_parameters_file=params,
    )
    url = server.rest_url
    v1, v2 = '{"predictions":[[2.5]]}', '{"predictions":[[3.5]]}'
    clients = [RequestLoop(f"{url}/v1/models/m:predict", {"instances": [[1.0]]}) for _ in range(8)]
    for client in clients:
        client.start()
    try:
        wait_until(lambda: all(c.count(v1) >= 5 for c in clients), what="v1 traffic on every client")
        place_atomically(model_store / "hp3_tf2", base / "2")
        wait_until(states_are(url, "m", {"2": "AVAILABLE", "1": "END"}), what="v2 AVAILABLE, v1 END")
        wait_until(lambda: all(c.count(v2) >= 5 for c in clients), what="v2 traffic on every client")
    finally:
        for client in clients:
            client.stop()
    for client in clients:
        assert client.failures() == []
        answers = [body for _, body in client.results]
        assert set(answers) == {v1, v2}
        first_v2 = answers.index(v2)
        assert all(a == v2 for a in answers[first_v2:]), "answers went back to version 1"
    assert version_states(url, "m") == {"2": "AVAILABLE", "1": "END"}
