"""A SavedModel's graph runs on the calling thread while its calls are cheap, on TensorFlow's pool once one is slow.

Both ways must answer the same; which way a call goes only decides how many threads it wakes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workbench.demo import save_half_plus_two
from workbench.platforms.tensorflow import GraphCall, SavedModelServable


@pytest.fixture
def servable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SavedModelServable]:
    # No call of this tiny model is slow unless a test says so (a busy CI machine must not decide for it).
    monkeypatch.setattr(GraphCall, "POOL_ABOVE_SECONDS", 10.0)
    save_half_plus_two(tmp_path / "1")
    loaded = SavedModelServable("hp2", 1, str(tmp_path / "1"))
    yield loaded
    loaded.close()


def predict(servable: SavedModelServable, x: float) -> np.ndarray:
    signature = servable.signatures["serving_default"]
    return servable.run(signature, {"x": np.array([[x]], np.float32)}, ["y"])["y"]


def graph_call(servable: SavedModelServable) -> GraphCall:
    (call,) = servable._callables.values()  # the one prepared call the predictions above made
    return call


def test_a_cheap_graph_answers_from_the_calling_thread(servable: SavedModelServable) -> None:
    for x in range(50):
        assert predict(servable, float(x)).tolist() == [[x / 2 + 2]]
    assert graph_call(servable).on_caller_thread
    assert len(servable._callables) == 1  # prepared once, not per call


def test_a_slow_call_moves_the_graph_to_the_pool_and_a_cheap_one_brings_it_back(
    servable: SavedModelServable, monkeypatch: pytest.MonkeyPatch
) -> None:
    predict(servable, 0.0)
    call = graph_call(servable)
    assert call.on_caller_thread
    # Every call counts as slow: the next one moves the graph to TensorFlow's inter-op pool.
    monkeypatch.setattr(GraphCall, "POOL_ABOVE_SECONDS", -1.0)
    assert predict(servable, 4.0).tolist() == [[4.0]]
    assert not call.on_caller_thread
    # On the pool, the same answers; a call is not cheap by this bound, so it stays there.
    monkeypatch.setattr(GraphCall, "CALLER_BELOW_SECONDS", -1.0)
    assert predict(servable, 6.0).tolist() == [[5.0]]
    assert not call.on_caller_thread
    # Any call is cheap by this bound: back on the calling thread.
    monkeypatch.setattr(GraphCall, "CALLER_BELOW_SECONDS", 10.0)
    monkeypatch.setattr(GraphCall, "POOL_ABOVE_SECONDS", 10.0)
    assert predict(servable, 8.0).tolist() == [[6.0]]
    assert call.on_caller_thread
