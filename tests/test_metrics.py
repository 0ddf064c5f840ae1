"""Prometheus metrics: always at ``/metrics``, and at TF Serving's path when a monitoring config enables it;
TF Serving's series, exact request counts, and our per-version series (including the availability gauge through
hot swaps and config reloads)."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families
from waiting import model_config_text, place_atomically, states_are, version_states, wait_until, write_atomically

DEFAULT_PATH = "/monitoring/prometheus/metrics"
ALWAYS_ON_PATH = "/metrics"
ONE = {"instances": [[1.0]]}


def monitoring_config(tmp_path, text: str) -> str:
    path = tmp_path / "monitoring.config"
    path.write_text(text)
    return str(path)


def enabled(tmp_path, path: str = DEFAULT_PATH) -> str:
    return monitoring_config(tmp_path, f'prometheus_config {{ enable: true path: "{path}" }}\n')


def scrape(server, path: str = DEFAULT_PATH) -> str:
    r = requests.get(server.rest_url + path, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


def samples(text: str, name: str, **labels: str) -> list[float]:
    """Values of every sample called ``name`` whose labels include ``labels``."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample matching exactly; None when there is none."""
    found = samples(text, name, **labels)
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def post(server, path: str, body: object = ONE) -> requests.Response:
    return requests.post(server.rest_url + path, json=body, timeout=30)


def test_requests_are_counted_by_model_and_status(serve, make_repo, tmp_path):
    server = serve(
        model_name="m",
        model_base_path=str(make_repo("m", {1: "hp2_tf1"})),
        file_system_poll_wait_seconds=0,
        monitoring_config_file=enabled(tmp_path),
    )
    for _ in range(7):
        assert post(server, "/v1/models/m:predict").status_code == 200
    for _ in range(2):
        r = post(server, "/v1/models/m:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]})
        assert r.status_code == 200
    for _ in range(3):  # a string where the signature wants float: INVALID_ARGUMENT
        assert post(server, "/v1/models/m:predict", {"instances": [["text"]]}).status_code == 400
    assert post(server, "/v1/models/m/versions/9:predict").status_code == 404
    for _ in range(2):  # a model that does not exist is still counted under the name asked for
        assert post(server, "/v1/models/nope:predict").status_code == 404

    text = scrape(server)
    assert "# TYPE :tensorflow:serving:request_count " in text
    assert "# TYPE :tensorflow:serving:request_latency histogram" in text
    assert ':tensorflow:serving:request_count{model_name="m",status="OK"} ' in text
    count = ":tensorflow:serving:request_count"
    assert value(text, count, model_name="m", status="OK") == 9
    assert value(text, count, model_name="m", status="INVALID_ARGUMENT") == 3
    assert value(text, count, model_name="m", status="NOT_FOUND") == 1
    assert value(text, count, model_name="nope", status="NOT_FOUND") == 2
    assert value(text, count, model_name="nope", status="OK") is None
    assert sum(samples(text, count)) == 15

    latency = ":tensorflow:serving:request_latency"
    assert samples(text, f"{latency}_bucket", model_name="m", API="predict", entrypoint="REST")
    regress_count = value(text, f"{latency}_count", model_name="m", API="regress", entrypoint="REST")
    assert regress_count == 2
    assert value(text, f"{latency}_bucket", model_name="m", API="regress", entrypoint="REST", le="+Inf") == 2
    predict_count = value(text, f"{latency}_count", model_name="m", API="predict", entrypoint="REST")
    assert predict_count is not None and predict_count >= 7
    assert (
        value(text, f"{latency}_bucket", model_name="m", API="predict", entrypoint="REST", le="+Inf") == predict_count
    )

    # Our own per-version series.
    requests_total = "workbench_requests_total"
    rest = {"model": "m", "protocol": "rest"}
    assert value(text, requests_total, **rest, version="1", api="predict", code="OK") == 7
    assert value(text, requests_total, **rest, version="1", api="regress", code="OK") == 2
    assert value(text, requests_total, **rest, version="1", api="predict", code="INVALID_ARGUMENT") == 3
    assert sum(samples(text, requests_total, model="m", code="NOT_FOUND")) == 1
    assert sum(samples(text, requests_total, model="nope", code="NOT_FOUND")) == 2
    assert value(text, "workbench_model_version_available", model="m", version="1") == 1

    # Scraping again counts nothing new: the metrics endpoint is not a model request.
    again = scrape(server)
    assert value(again, count, model_name="m", status="OK") == 9


def test_custom_metrics_path(serve, make_repo, tmp_path):
    server = serve(
        model_name="m",
        model_base_path=str(make_repo("m", {1: "hp2_tf2"})),
        file_system_poll_wait_seconds=0,
        monitoring_config_file=enabled(tmp_path, "/custom/metrics"),
    )
    assert post(server, "/v1/models/m:predict").status_code == 200
    text = scrape(server, "/custom/metrics")
    assert "# TYPE " in text
    assert value(text, ":tensorflow:serving:request_count", model_name="m", status="OK") == 1

    r = requests.get(server.rest_url + DEFAULT_PATH, timeout=30)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert set(r.json()) == {"error"}
    assert value(scrape(server, ALWAYS_ON_PATH), ":tensorflow:serving:request_count", model_name="m", status="OK") == 1


def assert_metrics_only_at_the_always_on_path(server) -> None:
    """TF Serving's path answers 404 as TF Serving's would; ``/metrics`` has TF Serving's series all the same."""
    assert post(server, "/v1/models/m:predict").status_code == 200
    r = requests.get(server.rest_url + DEFAULT_PATH, timeout=30)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert set(r.json()) == {"error"}
    text = scrape(server, ALWAYS_ON_PATH)
    assert "# TYPE :tensorflow:serving:request_count " in text
    assert "# TYPE :tensorflow:serving:request_latency histogram" in text
    assert value(text, ":tensorflow:serving:request_count", model_name="m", status="OK") == 1
    assert value(text, "workbench_model_version_available", model="m", version="1") == 1


def test_metrics_without_a_monitoring_config(serve, make_repo):
    base = make_repo("m", {1: "hp2_tf2"})
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0)
    assert_metrics_only_at_the_always_on_path(server)


def test_both_paths_serve_the_same_metrics(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    server = serve(
        model_name="m",
        model_base_path=str(base),
        file_system_poll_wait_seconds=0,
        monitoring_config_file=enabled(tmp_path),
    )
    assert post(server, "/v1/models/m:predict").status_code == 200
    count = ":tensorflow:serving:request_count"
    assert value(scrape(server), count, model_name="m", status="OK") == 1
    assert value(scrape(server, ALWAYS_ON_PATH), count, model_name="m", status="OK") == 1


def test_metrics_when_prometheus_is_disabled(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    server = serve(
        model_name="m",
        model_base_path=str(base),
        file_system_poll_wait_seconds=0,
        monitoring_config_file=monitoring_config(tmp_path, "prometheus_config { enable: false }\n"),
    )
    assert_metrics_only_at_the_always_on_path(server)


def test_availability_gauge_follows_version_swaps_and_model_removal(serve, make_repo, model_store, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    gone = make_repo("gone", {1: "hp2_tf1"})
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("m", base, ""), ("gone", gone, "")))
    server = serve(
        model_config_file=str(config),
        model_config_file_poll_wait_seconds=0.3,
        file_system_poll_wait_seconds=0.2,
        monitoring_config_file=enabled(tmp_path),
    )
    gauge = "workbench_model_version_available"
    text = scrape(server)
    assert value(text, gauge, model="m", version="1") == 1
    assert value(text, gauge, model="gone", version="1") == 1

    place_atomically(model_store / "hp3_tf2", base / "2")
    wait_until(states_are(server.rest_url, "m", {"2": "AVAILABLE", "1": "END"}), what="v2 AVAILABLE")
    text = scrape(server)
    assert value(text, gauge, model="m", version="2") == 1
    assert value(text, gauge, model="m", version="1") == 0

    write_atomically(config, model_config_text(("m", base, "")))
    wait_until(lambda: version_states(server.rest_url, "gone") == {}, what="model gone unloaded")
    text = scrape(server)
    # A version that is no longer loaded is not AVAILABLE: 0, or no series at all.
    assert value(text, gauge, model="gone", version="1") in (0, None)
    assert value(text, gauge, model="m", version="2") == 1
