"""Shadow traffic and promotions that must be earned, on a real server: model ``m`` has version 1 (a logistic
regression of the digits) and version 2, a deliberately different one (a shallow decision tree), so the agreement
the server reports can be checked against the two models' own predictions on the rows sent.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tabular_models as tm  # (tests/tabular_models.py)
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier
from waiting import wait_until

import workbench
from workbench.client import Client

MODELS = "/workbench/v1/models"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    x, y = tm.digits()
    root = tmp_path_factory.mktemp("shadow-models")
    first = LogisticRegression(max_iter=2000).fit(x, y)
    second = DecisionTreeClassifier(max_depth=4, random_state=0).fit(x, y)
    workbench.export(first, "m", root)
    workbench.export(second, "m", root)
    return root, first, second


def post(server: Any, target: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{server.rest_url}{MODELS}/{target}", json=body, timeout=120)


def record(server: Any) -> dict[str, Any] | None:
    shadow = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json().get("shadow") or {}
    return shadow.get("m")


def test_the_shadow_sees_a_copy_clients_never_see_and_its_agreement_is_the_models(models) -> None:
    root, first, second = models
    x = tm.digits()[0][:300]
    with tm.serving(root) as server:
        tm.available(server, "m")
        assert post(server, "m:promote", {"version": 1}).status_code == 200
        answer = post(server, "m:shadow", {"version": 2, "fraction": 1.0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["shadow"] == {"version": 2, "fraction": 1.0}
        url = f"{server.rest_url}/v1/models/m:predict"
        with requests.Session() as session:
            got = [session.post(url, json={"instances": x[i : i + 3].tolist()}, timeout=30) for i in range(0, 300, 3)]
        # Clients get version 1's answers, every one.
        assert [r.status_code for r in got] == [200] * 100
        assert np.concatenate([r.json()["predictions"] for r in got]).tolist() == first.predict(x).tolist()
        expected = float(np.mean(first.predict(x) == second.predict(x)))
        assert expected < 0.95  # the two really differ

        def all_compared() -> dict[str, Any] | None:
            found = record(server)
            return found if found is not None and found["compared"] == 100 else None

        shadow = wait_until(all_compared, timeout=60, interval=0.1, what="100 copies compared")
        assert (shadow["version"], shadow["primary_version"], shadow["mirrored"]) == (2, 1, 100)
        assert (shadow["failed"], shadow["dropped"]) == (0, 0)
        assert shadow["agreement"] == pytest.approx(expected, abs=1e-6)
        assert shadow["outputs"]["predictions"]["agreement"] == pytest.approx(expected, abs=1e-6)
        assert shadow["p99_ms"] > 0 and shadow["primary_p99_ms"] > 0

        metrics = requests.get(f"{server.rest_url}/metrics", timeout=30).text
        assert 'workbench_shadow_requests_total{model="m",outcome="compared",version="2"} 100.0' in metrics
        agreeing = round(expected * 300)
        assert (
            f'workbench_shadow_rows_total{{agreeing="true",model="m",output="predictions",version="2"}} {agreeing}.0'
            in metrics
        )

        # The dashboard's "v1 vs v2" panel shows the server's record.
        from workbench.notebook.shadow_panel import ShadowPanel

        panel = ShadowPanel(server.rest_url, interval=0.1)
        try:
            # Drawn once its records, details and chart are all there (the panel's thread sets them one after another).
            wait_until(
                lambda: "m" in panel.records and "v2 (shadow) vs v1" in panel.details.value and panel.figure.data,
                timeout=30,
                what="the panel's first reading, drawn",
            )
            assert panel.records["m"]["agreement"] == pytest.approx(expected, abs=1e-6)
            assert f"{expected:.2%}" in panel.details.value and "v2 (shadow) vs v1" in panel.details.value
            assert [trace.type for trace in panel.figure.data] == ["scatter", "histogram"]
            # Readings that arrive while the kernel runs a long cell (its draws wait, and only the newest is made)
            # all join the agreement's series: three readings, one draw, three more points.
            panel.close()  # its polling stops: the readings below are the test's
            drawn = len(panel.figure.data[0].x)
            for _ in range(3):
                panel._received(panel.records)
            panel._draw(panel.records)
            assert len(panel.figure.data[0].x) == drawn + 3
        finally:
            panel.close()

        # A promotion that must be earned: refused with the figures, then made when the bar is the record's.
        refused = post(server, "m:promote", {"version": 2, "if": "agreement >= 0.99 and p99_ms <= 1000"})
        assert refused.status_code == 400, refused.text  # FAILED_PRECONDITION, as TF Serving maps it
        assert "agreement" in refused.json()["error"] and "Not promoted" in refused.json()["error"]
        assert requests.get(f"{server.rest_url}{MODELS}/m", timeout=30).json()["stable"] == 1
        bad = post(server, "m:promote", {"version": 2, "if": "__import__('os').system('true')"})
        assert bad.status_code == 400, bad.text
        unknown = post(server, "m:promote", {"version": 2, "if": "accuracy > 0.5"})
        assert unknown.status_code == 400 and "no figure 'accuracy'" in unknown.json()["error"]
        with Client(server.rest_url) as client:
            diff = client.diff("m", 1, 2, [{"x": x[i : i + 30]} for i in range(0, 300, 30)])
            assert diff["outputs"]["predictions"]["agreement"] == pytest.approx(expected, abs=1e-6)
            earned = client.promote("m", 2, condition=f"agreement >= {expected - 0.01:.4f}")
        assert earned["stable"] == 2


def test_a_share_is_copied_exactly_and_ending_the_shadow_stops_the_copies(models) -> None:
    root, _, _ = models
    x = tm.digits()[0][:40]
    with tm.serving(root) as server:
        tm.available(server, "m")
        assert post(server, "m:promote", {"version": 1}).status_code == 200
        assert post(server, "m:shadow", {"version": 2, "fraction": 0.25}).status_code == 200
        url = f"{server.rest_url}/v1/models/m:predict"
        with requests.Session() as session:
            for row in x:
                session.post(url, json={"instances": [row.tolist()]}, timeout=30)
            # Requests naming a version are not default traffic: never copied.
            for row in x[:8]:
                session.post(f"{server.rest_url}/v1/models/m/versions/1:predict", json={"instances": [row.tolist()]})
        wait_until(lambda: (record(server) or {}).get("compared") == 10, timeout=60, what="10 of 40 compared")
        assert record(server)["mirrored"] == 10
        # gRPC's default traffic is mirrored alike (the data plane copies it, whatever the API).
        with Client(server.rest_url, server.grpc_target) as client:
            for row in x[:8]:
                client.predict("m", row[None], protocol="grpc")
        wait_until(lambda: (record(server) or {}).get("compared") == 12, timeout=60, what="2 more of 8 compared")
        ended = post(server, "m:shadow", {"version": 2, "fraction": 0})
        assert ended.status_code == 200 and ended.json()["shadow"] is None
        assert record(server) is None
        assert post(server, "m:shadow", {"version": 9, "fraction": 0.5}).status_code == 404
        assert post(server, "m:shadow", {"version": 2, "fraction": 1.5}).status_code == 400


SLOW = textwrap.dedent(
    """
    import time

    import numpy as np
    import workbench


    class Slow(workbench.PythonModel):
        inputs = {"x": ("float64", [-1, 64])}
        outputs = {"predictions": ("int64", [-1])}

        def predict(self, inputs):
            time.sleep(0.3)
            return {"predictions": np.zeros(len(inputs["x"]), dtype=np.int64)}
    """
)


def test_a_shadow_that_falls_behind_is_dropped_never_waited_for(models, tmp_path: Path) -> None:
    root, first, _ = models
    repository = tmp_path / "repo"
    (repository / "m" / "1").mkdir(parents=True)
    for item in (root / "m" / "1").iterdir():
        (repository / "m" / "1" / item.name).write_bytes(item.read_bytes())
    (repository / "m" / "2").mkdir()
    (repository / "m" / "2" / "model.py").write_text(SLOW)
    x = tm.digits()[0][:1]
    # Every call on the 4 inference threads (none inline on the loop), as on a machine slow enough that the logistic
    # regression costs more than an inline call may: there, copies that held every thread held the clients too.
    with tm.serving(repository, allow_python_models=True, inline_cheap_calls=False, num_inference_threads=4) as server:
        tm.available(server, "m")
        assert post(server, "m:promote", {"version": 1}).status_code == 200
        assert post(server, "m:shadow", {"version": 2, "fraction": 1.0}).status_code == 200
        url = f"{server.rest_url}/v1/models/m:predict"

        def send(count: int) -> list[float]:
            took = []
            with requests.Session() as session:
                for _ in range(count):
                    started = time.perf_counter()
                    assert session.post(url, json={"instances": x.tolist()}, timeout=30).status_code == 200
                    took.append(time.perf_counter() - started)
            return took

        with ThreadPoolExecutor(4) as pool:
            latencies = [t for part in pool.map(send, [100] * 4) for t in part]
        # The clients never waited for the 300 ms shadow: most answers came sooner than one shadow call takes
        # (at the logistic regression's pace: milliseconds, more on a busy machine; a client held for its copy would
        # wait 300 ms or more every time).
        assert float(np.median(latencies)) < 0.3
        shadow = record(server)
        assert shadow is not None and shadow["mirrored"] == 400
        assert shadow["dropped"] > 0 and shadow["failed"] == 0
        wait_until(
            lambda: (r := record(server)) is not None and r["compared"] + r["dropped"] == 400,
            timeout=120,
            what="every copy compared or dropped",
        )


def test_diff_replays_the_requests_a_server_logged(models, tmp_path: Path) -> None:
    """Two versions compared offline on real traffic: the predict requests v1's server logged, replayed."""
    from workbench.request_log import read_request_log

    root, first, second = models
    repository = tmp_path / "repo"
    shutil.copytree(root, repository)
    prefix = tmp_path / "logs" / "m"
    (repository / "m" / "logging_config.txt").write_text(
        f'log_collector_config {{ filename_prefix: "{prefix}" }} sampling_config {{ sampling_rate: 1.0 }}'
    )
    x = tm.digits()[0][:50]
    with tm.serving(repository) as server:
        tm.available(server, "m")
        with Client(server.rest_url) as client:
            client.promote("m", 1)  # both versions serve: v1 the stable one, v2 the latest
            for i in range(0, 50, 5):
                client.predict("m", x[i : i + 5], version=1)
            wait_until(lambda: len(read_request_log(prefix, model="m")) == 10, timeout=30, what="10 records")
            logged = read_request_log(prefix, model="m")
            diff = client.diff("m", 1, 2, logged)
    assert diff["requests"] == 10
    expected = float(np.mean(first.predict(x) == second.predict(x)))
    assert diff["outputs"]["predictions"]["agreement"] == pytest.approx(expected, abs=1e-6)


def test_the_command_line_shadows_records_and_promotes_only_when_earned(models) -> None:
    import subprocess
    import sys

    root, first, second = models
    x = tm.digits()[0][:60]

    def routing(*words: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "workbench", "routing", f"--target={server.rest_url}", *words]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    with tm.serving(root) as server:
        tm.available(server, "m")
        assert routing("promote", "m", "1").returncode == 0
        shadowed = routing("shadow", "m", "2", "--fraction=1")
        assert shadowed.returncode == 0 and json.loads(shadowed.stdout)["shadow"] == {"version": 2, "fraction": 1.0}
        with Client(server.rest_url) as client:
            for row in x:
                client.predict("m", row[None])
        wait_until(lambda: (record(server) or {}).get("compared") == 60, timeout=60, what="60 compared")
        shown = routing("record", "m")
        expected = float(np.mean(first.predict(x) == second.predict(x)))
        assert json.loads(shown.stdout)["agreement"] == pytest.approx(expected, abs=1e-6)
        refused = routing("promote", "m", "2", "--if=agreement >= 0.999")
        assert refused.returncode == 1 and "Not promoted" in refused.stderr and "agreement" in refused.stderr
        earned = routing("promote", "m", "2", f"--if=agreement >= {expected - 0.01:.4f}")
        assert earned.returncode == 0 and json.loads(earned.stdout)["stable"] == 2
        assert routing("rollback", "m").returncode == 0
        assert routing("record", "nosuch").returncode == 1
