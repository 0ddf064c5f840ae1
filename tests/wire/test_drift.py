"""Drift over the wire: a model exported with its training inputs as reference, served traffic from that distribution
over REST and gRPC, then traffic with one feature shifted; the drift endpoint and the Prometheus gauges flag that
feature only. Unknown models are 404, and a model without a reference has nothing monitored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from sklearn.linear_model import Ridge
from tabular_models import grpc_predict, stub_for
from waiting import wait_until

import workbench
from workbench.publishing.export_errors import ExportError


def drift(server: Any, model: str) -> requests.Response:
    return requests.get(f"{server.rest_url}/workbench/v1/models/{model}/drift", timeout=10)


def report_after(server: Any, model: str, rows: int) -> dict[str, Any]:
    """The drift report of ``model``'s version 1 once ``rows`` served rows are tested."""
    return wait_until(
        lambda: (r := drift(server, model).json()["versions"]) and r[0]["rows_tested"] == rows and r[0],
        what=f"{rows} rows of {model} tested",
    )


def send(server: Any, model: str, x: np.ndarray) -> None:
    """Half of the rows over REST, half over gRPC, in batches of 50."""
    with stub_for(server) as stub:
        for start in range(0, len(x), 50):
            batch = x[start : start + 50]
            if start % 100:
                grpc_predict(stub, model, {"x": batch})
            else:
                r = requests.post(
                    f"{server.rest_url}/v1/models/{model}:predict", json={"instances": batch.tolist()}, timeout=60
                )
                assert r.status_code == 200, r.text


def test_shifted_traffic_flags_only_the_shifted_feature_in_the_endpoint_and_the_gauges(serve, tmp_path: Path):
    rng = np.random.default_rng(3)
    x_train = rng.normal(0, 1, (2000, 3))
    model = Ridge().fit(x_train, x_train @ np.array([1.0, 2.0, 3.0]))
    repository = tmp_path / "models"
    workbench.export(model, "ridge", repository, reference=x_train)
    workbench.export(model, "plain", repository)  # no reference: not monitored
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }')
    server = serve(model_repository=str(repository), drift_window=300, monitoring_config_file=str(monitoring))

    send(server, "ridge", rng.normal(0, 1, (300, 3)))
    steady = report_after(server, "ridge", 300)
    assert steady["reference"] == {"source": "export", "rows": 2000} and steady["alert"] is False, steady
    assert [(f["name"], f["kind"], f["test"]) for f in steady["features"]] == [
        ("x[0]", "numeric", "ks"),
        ("x[1]", "numeric", "ks"),
        ("x[2]", "numeric", "ks"),
    ]

    moved = rng.normal(0, 1, (300, 3))
    moved[:, 1] += 1.5
    send(server, "ridge", moved)
    drifted = report_after(server, "ridge", 600)
    assert drifted["alert"] is True and drifted["drifted_features"] == ["x[1]"], drifted
    shifted = {f["name"]: f for f in drifted["features"]}["x[1]"]
    assert shifted["psi"] > 0.2 and shifted["p_value"] < 0.001

    metrics = requests.get(f"{server.rest_url}/metrics", timeout=10).text
    assert 'workbench_drift_alert{feature="x[1]",model="ridge",version="1"} 1.0' in metrics
    assert 'workbench_drift_alert{feature="x[0]",model="ridge",version="1"} 0.0' in metrics
    assert 'workbench_drift_p_value{feature="x[2]",model="ridge",test="ks",version="1"}' in metrics

    # The dashboard's "Drift" tab shows the same record, from the stats stream's snapshot.
    from workbench.notebook.drift_panel import DriftPanel

    panel = DriftPanel(server.rest_url, interval=0.1)
    try:
        wait_until(lambda: "ridge" in panel.records, what="the panel's first reading")
        record = panel.records["ridge"]["1"]
        assert record["alert"] is True and [f for f, v in record["features"].items() if v["drifted"]] == ["x[1]"]
        assert "ridge v1" in panel.details.value and "drift</b>" in panel.details.value
        [bars] = panel.figure.data
        assert bars.type == "bar" and list(bars.x) == ["ridge v1 x[0]", "ridge v1 x[1]", "ridge v1 x[2]"]
    finally:
        panel.close()

    send(server, "plain", rng.normal(0, 1, (100, 3)))
    plain = drift(server, "plain")
    assert plain.status_code == 200 and plain.json()["versions"] == []
    assert plain.json()["thresholds"] == {"psi": 0.2, "p_value": 0.001}
    unknown = drift(server, "nope")
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]


def test_a_reference_that_is_not_rows_is_refused_at_export_and_nothing_is_published(tmp_path: Path):
    x = np.arange(12.0).reshape(6, 2)
    model = Ridge().fit(x, x.sum(axis=1))
    with pytest.raises(ExportError, match=r"reference's inputs have different numbers of rows: \[2, 6\]"):
        workbench.export(model, "m", tmp_path, reference={"x": x, "w": x[:2]})
    with pytest.raises(ExportError, match=r"reference\['\*'\] must hold rows \(a batch\), got shape \[\]"):
        workbench.export(model, "m", tmp_path, reference=3.0)
    assert not (tmp_path / "m").exists()
    result = workbench.export(model, "m", tmp_path, reference=x)
    with np.load(result.path / "assets.extra" / "drift_reference.npz") as stored:
        assert stored.files == ["*"] and stored["*"].tolist() == x.tolist()
