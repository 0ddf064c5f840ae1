"""Requests for one model that arrive together, answered as one group (:mod:`workbench.planes.coalescing`), in-process
on the fake engine of ``test_dataplane_resolution``: what each request gets is what it gets alone, byte for byte and
word for word (answers, errors, counts), while the model runs the group's rows in fewer calls.

A group forms from the requests of one event-loop turn while another request for the model is in flight, so each
test sends its requests with ``asyncio.gather`` (one turn) and reads the fake servable's calls (``batches``: the rows
of each) to see whether they ran together. Bodies go through :class:`~workbench.protocol.json_tensor.PredictBody`, as
TF Serving's REST ``:predict`` sends them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import FakeServable
from test_dataplane_resolution import PROTOCOL, WAIT, Engine

from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError
from workbench.core.servable import PerRequestServable
from workbench.planes.dataplane import ModelSpec
from workbench.protocol import json_tensor
from workbench.protocol.json_tensor import PredictBody

BATCHING = BatchingParameters(max_batch_size=64, num_batch_threads=1)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path, batching=BATCHING)
    yield engine
    engine.stop()


def body(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


DEFAULT = ModelSpec("m")


async def answer(engine: Engine, sent: Any, spec: ModelSpec = DEFAULT) -> tuple[Any, ...]:
    """One ``:predict`` through the data plane: ("ok", version, JSON bytes) or ("error", code, message)."""
    try:
        version, encoded = await engine.dataplane.infer(spec, PROTOCOL, PredictBody(body(sent)), WAIT)
    except ServingError as exc:
        return "error", exc.code, exc.message
    return "ok", version, encoded


async def together(engine: Engine, bodies: Sequence[Any]) -> list[tuple[Any, ...]]:
    """``bodies`` sent in one turn of the loop."""
    return list(await asyncio.gather(*(answer(engine, sent) for sent in bodies)))


async def one_by_one(engine: Engine, bodies: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [await answer(engine, sent) for sent in bodies]


def rows(*values: float) -> dict[str, Any]:
    return {"instances": [[v] for v in values]}


def test_requests_that_arrive_together_run_as_one_call_and_each_gets_its_own_rows(engine: Engine) -> None:
    engine.serve("m", 1)
    bodies = [rows(float(i), float(i) + 0.5) for i in range(9)]
    answers = asyncio.run(together(engine, bodies))
    # The first finds nothing in flight and runs at once; the eight sent with it run as one call of 16 rows.
    assert engine.servable("m", 1).batches == [2, 16]
    alone = asyncio.run(one_by_one(engine, bodies))
    assert answers == alone
    assert answers[3] == ("ok", 1, b'{"predictions":[[4.0],[4.5]]}')  # y = x + version
    assert engine.count("OK", 1) == 18  # every request counted, each once
    assert engine.rolling(1)["total_requests"] == 18
    # The batch's record counts the requests it ran, not the one task they were queued as.
    grouped = engine.batch_records[1]
    assert (grouped.size, grouped.tasks, len(grouped.queue_seconds)) == (16, 8, 8)


MIXED = [
    rows(1.0),
    rows(2.0, 3.0),
    b"{not json",  # does not decode: its own error, the others run
    {"instances": [[4.0]], "signature_name": "nope"},  # an unknown signature: its own error
    {"inputs": {"x": [[5.0]]}},  # columnar: stacks with the rows, answered in its own format
    {"instances": [[6, 7]]},  # another row shape: a stack of its own
    {"instances": [[True]]},  # a boolean: TF Serving's error for it
    {"instances": [[8.0]], "signature_name": "serving_default"},
    rows(9.0),
]


def test_a_group_of_mixed_requests_answers_each_as_it_would_be_answered_alone(engine: Engine) -> None:
    engine.serve("m", 1)
    answers = asyncio.run(together(engine, MIXED))
    grouped = sorted(engine.servable("m", 1).batches)
    alone = asyncio.run(one_by_one(engine, MIXED))
    assert answers == alone
    assert [a[0] for a in answers] == ["ok", "ok", "error", "error", "ok", "ok", "error", "ok", "ok"]
    assert answers[4] == ("ok", 1, b'{"outputs":[[6.0]]}')
    # The first alone, the rows that stack (2 + 1 + 1 + 1: "" and serving_default are one signature), and the
    # 2-wide row, which stacks with none, alone.
    assert grouped == [1, 1, 5]


def test_a_failing_run_fails_every_member_with_its_error_each_counted(engine: Engine) -> None:
    engine.serve("m", 1)
    engine.servable("m", 1).fail_with = ServingError(Code.INTERNAL, "the fake failed")
    answers = asyncio.run(together(engine, [rows(float(i)) for i in range(5)]))
    assert answers == [("error", Code.INTERNAL, "the fake failed")] * 5
    assert engine.servable("m", 1).batches == [1, 4]
    assert engine.count("INTERNAL", 1) == 5


def test_a_group_over_the_largest_batch_runs_in_parts_that_fit(tmp_path: Path) -> None:
    engine = Engine(tmp_path, batching=BatchingParameters(max_batch_size=4, num_batch_threads=1))
    try:
        engine.serve("m", 1)
        bodies = [rows(float(i)) for i in range(8)] + [rows(*range(5))]  # the last is over the limit alone
        answers = asyncio.run(together(engine, bodies))
        assert answers == asyncio.run(one_by_one(engine, bodies))
        assert answers[-1] == ("error", Code.INVALID_ARGUMENT, "Task size 5 is larger than maximum input batch size 4")
        assert engine.servable("m", 1).batches[:3] == [1, 4, 3]
    finally:
        engine.stop()


def test_a_model_that_does_not_batch_is_never_batched_by_a_group(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    try:
        engine.serve("m", 1)
        answers = asyncio.run(together(engine, [rows(float(i)) for i in range(6)]))
        assert [a[0] for a in answers] == ["ok"] * 6
        assert engine.servable("m", 1).batches == [1] * 6
    finally:
        engine.stop()


def test_a_canary_still_gets_its_exact_share_of_requests_that_arrive_together(engine: Engine) -> None:
    engine.serve("m", 1, 2)
    engine.routing_changes.set_canary("m", 1, 0.5, timeout=WAIT)
    answers = asyncio.run(together(engine, [rows(0.0) for _ in range(8)]))
    assert sorted(a[1] for a in answers) == [1] * 4 + [2] * 4  # the split counts every request


def test_cached_answers_are_still_cached_and_found_request_by_request(tmp_path: Path) -> None:
    engine = Engine(tmp_path, batching=BATCHING, cache_models=["m"])
    try:
        engine.serve("m", 1)
        bodies = [rows(float(i)) for i in range(6)]
        first = asyncio.run(together(engine, bodies))
        calls = list(engine.servable("m", 1).batches)
        assert asyncio.run(together(engine, bodies)) == first
        assert engine.servable("m", 1).batches == calls  # every second answer came from the cache
        assert engine.rolling(1)["cache_hits"] == 6
    finally:
        engine.stop()


def test_a_cancelled_member_leaves_the_others_answered_and_is_counted_cancelled(engine: Engine) -> None:
    engine.serve("m", 1)

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(answer(engine, rows(float(i)))) for i in range(5)]
        await asyncio.sleep(0)  # each has started: the second leads the group of the four after the first
        tasks[1].cancel()  # the leader
        tasks[3].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[1], asyncio.CancelledError) and isinstance(answers[3], asyncio.CancelledError)
    assert [answers[i] for i in (0, 2, 4)] == [
        ("ok", 1, f'{{"predictions":[[{i + 1}.0]]}}'.encode()) for i in (0, 2, 4)
    ]
    assert engine.count("CANCELLED", None) + engine.count("CANCELLED", 1) == 2
    assert engine.count("OK", 1) == 3


# ------------------------------------------------------------------------------------------- decoding
@pytest.mark.parametrize(
    "bodies",
    [
        [rows(1.0, 2.0), rows(3.0)],
        [{"instances": [[1, 2.5]]}, {"instances": [[3, 4]]}],  # integers among floats, as each alone reads them
        [{"instances": [1.0, 2.0]}, {"instances": [3.0]}],  # scalars as rows
        [{"instances": [[[1.0], [2.0]]]}, {"instances": [[[3.0], [4.0]]]}],  # rows of a deeper shape
        [{"instances": [[1.0]], "signature_name": "serving_default"}, {"instances": [[2.0]], "signature_name": ""}],
    ],
)
def test_decoding_bodies_together_gives_each_what_it_decodes_to_alone(bodies: list[Any]) -> None:
    signatures = FakeServable().signatures
    decoded = json_tensor.decode_rows([body(b) for b in bodies], signatures)
    if bodies[-1].get("signature_name") == "":
        assert decoded is None  # two names for one signature: each alone
        return
    assert decoded is not None
    signature_name, name, arrays = decoded
    for sent, array in zip(bodies, arrays, strict=True):
        alone_name, alone = PredictBody(body(sent)).decode(signatures)
        assert (signature_name, name) == (alone_name, "x")
        assert array.dtype == alone["x"].dtype and np.array_equal(array, alone["x"])


@pytest.mark.parametrize(
    "odd",
    [
        {"instances": [[True]]},
        {"instances": [[float("nan")]]},
        {"instances": [[16777217]]},  # past float32's exact integers
        {"instances": [["a"]]},
        {"instances": [{"x": [1.0]}]},
        {"instances": []},
        {"inputs": {"x": [[1.0]]}},
        {"instances": [[1.0]], "extra": 1},
        {"instances": [[1.0, 2.0], [3.0]]},  # ragged
    ],
)
def test_a_group_with_any_other_body_decodes_one_by_one(odd: Any) -> None:
    signatures = FakeServable().signatures
    text = json.dumps(odd, allow_nan=True).encode()
    assert json_tensor.decode_rows([body(rows(1.0)), text], signatures) is None


class _EachOnItsOwn(PerRequestServable):
    """A model that answers each request on its own, as Triton's Python backend and Hugging Face's tasks do."""

    def __init__(self) -> None:
        self.name, self.version, self.path = "m", 1, ""
        self.signatures = FakeServable().signatures

    def run_requests(self, signature: Any, feeds: Sequence[Any], outputs: Sequence[str]) -> list[Any]:
        return [{"y": feed["x"]} for feed in feeds]


def test_a_model_that_answers_each_request_on_its_own_takes_no_group(engine: Engine) -> None:
    """Its batches hand it the requests one by one; a group would be one request of several clients' rows (and a
    token classifier's answer padded to another client's longest text)."""
    assert engine.dataplane.merges(FakeServable()) == BATCHING.max_batch_size
    assert engine.dataplane.merges(_EachOnItsOwn()) == 0
