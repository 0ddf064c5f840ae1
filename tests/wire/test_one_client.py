"""With one client, a model call too slow for the event loop under load runs there all the same; with a second
connection, or over gRPC, it goes to an inference thread (workbench.planes.one_client)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tabular_models as tm  # (tests/tabular_models.py)
from sklearn.linear_model import LogisticRegression
from waiting import wait_until

from workbench.batching.run_cost import RunCost
from workbench.platforms import sklearn as platform
from workbench.server.running import ServerThread

DIGITS = "digits"
LOOP_THREAD = "workbench-server"  # ServerThread's event loop


@pytest.fixture(scope="module")
def classifier() -> LogisticRegression:
    x, y = tm.digits()
    return LogisticRegression(max_iter=2000).fit(x, y)


@pytest.fixture(scope="module")
def expected(classifier: LogisticRegression) -> list[int]:
    """The labels of the first 30 digits, predicted in-process (before any test records predict's threads)."""
    return [int(label) for label in classifier.predict(tm.digits()[0][:30])]


@pytest.fixture
def predicted_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of every LogisticRegression.predict call from now on (the server runs in this process)."""
    threads: list[str] = []
    predict = LogisticRegression.predict

    def recorded(self: LogisticRegression, x: Any) -> Any:
        threads.append(threading.current_thread().name)
        return predict(self, x)

    monkeypatch.setattr(LogisticRegression, "predict", recorded)
    return threads


@pytest.fixture(params=[False, True], ids=["batching off", "batching on"])
def server(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    classifier: LogisticRegression,
    predicted_on: list[str],
) -> Iterator[ServerThread]:
    # No call proves cheap enough for the loop under load, and every call is cheap enough for one client, however
    # busy the machine: which thread runs a call is then the one-client rule's alone.
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 1e-9)
    monkeypatch.setattr(RunCost, "ONE_CLIENT_BUDGET_SECONDS", 60.0)
    folder = tmp_path / DIGITS / "1"
    folder.mkdir(parents=True)
    platform.write(classifier, folder)
    with tm.serving(tmp_path, enable_batching=request.param) as running:
        tm.available(running, DIGITS)
        yield running


def predict(session: requests.Session, server: ServerThread, rows: np.ndarray) -> list[int]:
    r = session.post(f"{server.rest_url}/v1/models/{DIGITS}:predict", json={"instances": rows.tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["predictions"])


def open_connections(server: ServerThread) -> int:
    return server.server.dataplane.one_client.open_connections()


def test_one_connections_calls_run_on_the_loop_and_a_second_connection_sends_them_to_the_threads(
    server: ServerThread, expected: list[int], predicted_on: list[str]
) -> None:
    x, _ = tm.digits()
    predicted_on.clear()
    settle = RunCost.SETTLE_RUNS
    with requests.Session() as one:
        answers = [predict(one, server, x[i : i + 1])[0] for i in range(settle + 10)]
        assert answers == expected[: settle + 10]
        later = predicted_on[-10:]
        assert later == [LOOP_THREAD] * 10, predicted_on

        with requests.Session() as other:  # a second client: its connection stays open between its requests
            assert predict(other, server, x[:2]) == expected[:2]
            predicted_on.clear()
            assert [predict(one, server, x[i : i + 1])[0] for i in range(5)] == expected[:5]
            assert predict(other, server, x[5:7]) == expected[5:7]
            assert len(predicted_on) == 6 and LOOP_THREAD not in predicted_on, predicted_on

    # Both closed: the next client is alone again once the server has seen them go.
    wait_until(lambda: open_connections(server) == 0, 30, 0.05, "the server saw both connections close")
    predicted_on.clear()
    with requests.Session() as again:
        assert [predict(again, server, x[i : i + 1])[0] for i in range(3)] == expected[:3]
    assert predicted_on == [LOOP_THREAD] * 3, predicted_on


def test_grpc_calls_never_run_on_the_loop_for_one_client(
    server: ServerThread, expected: list[int], predicted_on: list[str]
) -> None:
    x, _ = tm.digits()
    with requests.Session() as one:  # the model's cost is known, and one client's calls are on the loop
        for i in range(RunCost.SETTLE_RUNS + 2):
            predict(one, server, x[i : i + 1])
        assert predicted_on[-1] == LOOP_THREAD
    wait_until(lambda: open_connections(server) == 0, 30, 0.05, "the server saw the connection close")
    predicted_on.clear()
    with tm.stub_for(server) as stub:
        for i in range(5):
            answer = tm.grpc_predict(stub, DIGITS, {"x": x[i : i + 1]})
            assert answer["predictions"].ravel().tolist() == expected[i : i + 1]
    assert len(predicted_on) == 5 and LOOP_THREAD not in predicted_on, predicted_on
    assert server.server.dataplane.one_client.grpc_calls == 0, "every answered gRPC call left the count"
    wait_until(lambda: open_connections(server) == 0, 30, 0.05, "no HTTP connection left")
    predicted_on.clear()
    with requests.Session() as again:  # the gRPC client gone, an HTTP client is alone again
        predict(again, server, x[:1])
    assert predicted_on == [LOOP_THREAD], predicted_on
