"""One model name, versions of different frameworks: promoted, canaried and swapped under load, clients unchanged.

Version 1 is a scikit-learn logistic regression (``model.skops``); version 2 is the same regression as a
TensorFlow module (a SavedModel holding scikit-learn's coefficients), so every answer must be the same labels
whichever version gives it, and only the ``X-Model-Version`` header tells the versions apart.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from waiting import version_states, wait_until

import workbench
from workbench.client import Client

CLIENTS = 4


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_digits()
    return data.data, data.target


@pytest.fixture(scope="module")
def regression(digits: tuple[np.ndarray, np.ndarray]) -> LogisticRegression:
    x, y = digits
    return LogisticRegression(max_iter=2000).fit(x, y)


def tensorflow_twin(estimator: LogisticRegression) -> object:
    """The estimator's decision function as a tf.Module: argmax(x @ coef.T + intercept), the same labels."""
    import tensorflow as tf

    class Twin(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.coef = tf.Variable(estimator.coef_.T.astype(np.float64))
            self.intercept = tf.Variable(estimator.intercept_.astype(np.float64))

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float64, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"predictions": tf.argmax(tf.matmul(x, self.coef) + self.intercept, axis=1)}

    return Twin()


def test_a_canary_and_a_swap_between_frameworks_under_load_fail_no_request(
    tmp_path: Path, serve, digits: tuple[np.ndarray, np.ndarray], regression: LogisticRegression
) -> None:
    x, _ = digits
    rows, expected = x[:8], regression.predict(x[:8]).tolist()
    repository = tmp_path / "models"
    first = workbench.export(regression, "digits", repository, examples=rows)
    assert first.version == 1 and (first.path / "model.skops").is_file()
    server = serve(model_repository=str(repository), file_system_poll_wait_seconds=0.1)
    client = Client(server.rest_url)
    wait_until(lambda: version_states(server.rest_url, "digits") == {"1": "AVAILABLE"}, what="v1 (scikit-learn)")
    client.promote("digits", 1)

    served_by: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                r = session.post(
                    f"{server.rest_url}/v1/models/digits:predict", json={"instances": rows.tolist()}, timeout=30
                )
                if r.status_code != 200 or r.json() != {"predictions": expected}:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                else:
                    served_by[r.headers["X-Model-Version"]] += 1

    threads = [threading.Thread(target=load, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        second = workbench.export(tensorflow_twin(regression), "digits", repository, examples=rows)
        assert second.version == 2 and (second.path / "saved_model.pb").is_file()
        wait_until(lambda: version_states(server.rest_url, "digits").get("2") == "AVAILABLE", what="v2 (TF)")
        client.canary("digits", 2, 0.5)
        wait_until(lambda: served_by["2"] >= 20 and served_by["1"] >= 20, timeout=60, what="both frameworks")
        client.promote("digits", 2)
        # v1 stays loaded as the previous stable version (an instant rollback), but takes no more traffic.
        after = served_by["2"]
        wait_until(lambda: served_by["2"] >= after + 20, what="v2 to answer after the promotion")
        v1_done = served_by["1"]
        wait_until(lambda: served_by["2"] >= after + 60, what="v2 alone to answer")
        assert served_by["1"] == v1_done
        assert client.model("digits")["previous_stable"] == 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert failures == []
    assert served_by["1"] > 0 and served_by["2"] > 0
    metadata = client.signatures("digits")
    assert metadata["serving_default"].inputs["x"].dtype == np.float64  # the SavedModel's, now v2 serves
