"""Prometheus metrics: always at ``/metrics``, and at TF Serving's path when a monitoring config enables it;
TF Serving's series, exact request counts, and our per-version series (including the availability gauge through
hot swaps and config reloads)."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families
from waiting import model_config_text, place_atomically, states_are, version_states, wait_until, write_atomically

from workbench.batching.scheduler import BatchRecord
from workbench.observability.metrics import ServingMetrics
from workbench.observability.whole_server import merge_expositions

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


# ------------------------------------------------------------------------------ the request series
# (model, version, api, protocol, code, seconds): OK answers from two versions over two protocols, one error
# answer, and a request refused before it reached a version (dataplane.refused: no version, 0 s).
OBSERVED = [
    ("m", 1, "predict", "grpc", "OK", 0.0001),  # on a bucket bound: counted in le="0.0001" (le means <=)
    ("m", 1, "predict", "grpc", "OK", 0.003),
    ("m", 1, "predict", "grpc", "OK", 2.0),
    ("m", 2, "predict", "rest", "OK", 0.02),
    ("m", 1, "predict", "grpc", "INVALID_ARGUMENT", 0.5),
    ("m", None, "predict", "grpc", "NOT_FOUND", 0.0),
    ("m", 2, "predict", "rest", "OK", 20.0),  # past the last bound: +Inf only
]


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    return {
        family.name: (family.type, [(s.name, s.labels, s.value) for s in family.samples])
        for family in text_string_to_metric_families(text)
    }


def test_request_series_exposition_parses_into_the_expected_families():
    metrics = ServingMetrics()
    for observation in OBSERVED:
        metrics.observe_request(*observation)
    text = metrics.exposition().decode()
    got = families(text)

    # TF Serving's request count: untyped, its exact sample name, per (model, status), no _created.
    assert got[":tensorflow:serving:request_count"] == (
        "unknown",
        [
            (":tensorflow:serving:request_count", {"model_name": "m", "status": "INVALID_ARGUMENT"}, 1.0),
            (":tensorflow:serving:request_count", {"model_name": "m", "status": "NOT_FOUND"}, 1.0),
            (":tensorflow:serving:request_count", {"model_name": "m", "status": "OK"}, 5.0),
        ],
    )
    # TF Serving's latency in µs for every answer, per (model, API, entrypoint): 33 bounds from 10 µs by 1.8x.
    tf_name = ":tensorflow:serving:request_latency"
    tf_type, tf_samples = got[tf_name]
    assert tf_type == "histogram"
    tf_bounds = [10 * 1.8**i for i in range(33)] + [float("inf")]
    for entrypoint, protocol in (("GRPC", "grpc"), ("REST", "rest")):
        labels = {"model_name": "m", "API": "predict", "entrypoint": entrypoint}
        observed = [o[5] * 1e6 for o in OBSERVED if o[3] == protocol]
        buckets = [
            (s[1]["le"], s[2]) for s in tf_samples if s[0] == f"{tf_name}_bucket" and s[1].items() >= labels.items()
        ]
        assert [float(le) for le, _ in buckets] == tf_bounds
        assert [count for _, count in buckets] == [float(sum(v <= b for v in observed)) for b in tf_bounds]
        assert (f"{tf_name}_count", labels, float(len(observed))) in tf_samples
        assert (f"{tf_name}_sum", labels, sum(observed)) in tf_samples
    grpc = {"model_name": "m", "API": "predict", "entrypoint": "GRPC"}
    assert value(text, f"{tf_name}_bucket", **grpc, le="10.0") == 1  # the refused request's 0 µs
    assert value(text, f"{tf_name}_count", **grpc) == 5
    assert got[f"{tf_name}_created"][0] == "gauge" and len(got[f"{tf_name}_created"][1]) == 2

    # Workbench's request counter: every code, per version ("" when the request named none).
    requests_type, requests_samples = got["workbench_requests"]
    assert requests_type == "counter"
    totals = {(s[1]["version"], s[1]["protocol"], s[1]["code"]): s[2] for s in requests_samples}
    assert totals == {
        ("1", "grpc", "OK"): 3.0,
        ("2", "rest", "OK"): 2.0,
        ("1", "grpc", "INVALID_ARGUMENT"): 1.0,
        ("", "grpc", "NOT_FOUND"): 1.0,
    }
    assert all(s[0] == "workbench_requests_total" and s[1]["api"] == "predict" for s in requests_samples)
    created = got["workbench_requests_created"]
    assert created[0] == "gauge" and len(created[1]) == 4 and all(s[2] > 1.6e9 for s in created[1])

    # Workbench's latency in seconds: OK answers only, per version; 16 bounds from 100 µs to 10 s.
    name = "workbench_request_latency_seconds"
    latency_type, latency_samples = got[name]
    assert latency_type == "histogram"
    bounds = [1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
    bounds.append(float("inf"))
    for version, protocol in (("1", "grpc"), ("2", "rest")):
        labels = {"model": "m", "version": version, "api": "predict", "protocol": protocol}
        observed = [o[5] for o in OBSERVED if str(o[1]) == version and o[4] == "OK"]
        buckets = [
            (s[1]["le"], s[2]) for s in latency_samples if s[0] == f"{name}_bucket" and s[1].items() >= labels.items()
        ]
        assert [float(le) for le, _ in buckets] == bounds
        assert [count for _, count in buckets] == [float(sum(v <= b for v in observed)) for b in bounds]
        assert (f"{name}_count", labels, float(len(observed))) in latency_samples
        assert (f"{name}_sum", labels, sum(observed)) in latency_samples
    assert value(text, f"{name}_bucket", model="m", version="1", le="0.0001") == 1
    assert value(text, f"{name}_bucket", model="m", version="2", le="10.0") == 1
    assert value(text, f"{name}_bucket", model="m", version="2", le="+Inf") == 2
    assert len(got[f"{name}_created"][1]) == 2
    assert sum(samples(text, f"{name}_count")) == 5  # the error and the refused request are not timed here

    # What Triton's statistics extension reads: the same families, under the names it looks for.
    statistics = {family.name: family for family in metrics.statistics_families()}
    assert {name for name in statistics if not name.startswith("nv_")} == {
        "workbench_requests",
        "workbench_request_latency_seconds",
        "workbench_queue_seconds",
        "workbench_inference_seconds",
        "workbench_batch_size",
    }
    assert {"nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model"} <= set(statistics)  # cache stats
    for family in ("workbench_requests", name):  # what the exposition shows, _created included
        here = sorted((s.name, sorted(s.labels.items()), s.value) for s in statistics[family].samples)
        there = sorted((n, sorted(labels.items()), v) for n, labels, v in got[family][1] + got[f"{family}_created"][1])
        assert here == there

    # Workers' expositions merge as text (peers): counts and buckets add up, _created keeps the earliest.
    merged = merge_expositions([text, text]).decode()
    assert value(merged, "workbench_requests_total", version="1", code="OK") == 6
    assert value(merged, f"{name}_bucket", version="2", le="+Inf") == 4
    assert value(merged, ":tensorflow:serving:request_count", model_name="m", status="OK") == 10
    assert value(merged, "workbench_requests_created", version="1", code="OK") == value(
        text, "workbench_requests_created", version="1", code="OK"
    )


# ------------------------------------------------------------------------------------------ Triton's names
def test_triton_series_count_requests_inferences_runs_and_their_times():
    metrics = ServingMetrics()
    for observation in OBSERVED:
        metrics.observe_request(*observation)
    metrics.observe_request("m", 1, "predict", "grpc", "RESOURCE_EXHAUSTED", 0.001)
    metrics.observe_request("m", 1, "predict", "grpc", "DEADLINE_EXCEEDED", 0.001)
    metrics.observe_request("m", 1, "predict", "grpc", "INTERNAL", 0.001)
    # Two runs of version 1: a batch of 3 requests (5 rows), then one request alone.
    metrics.observe_batch(BatchRecord("m", 1, "serving_default", 5, 8, 3, (0.001, 0.002, 0.003), 0.010))
    metrics.observe_batch(BatchRecord("m", 1, "serving_default", 1, 1, 1, (0.0,), 0.004))
    text = metrics.exposition().decode()
    got = families(text)
    v1, v2 = {"model": "m", "version": "1"}, {"model": "m", "version": "2"}

    # Untyped, as TF Serving's request count: Triton's exact sample names, without prometheus_client's _total.
    assert got["nv_inference_request_success"][0] == "unknown"
    assert "# TYPE nv_inference_request_success untyped" in text
    assert value(text, "nv_inference_request_success", **v1) == 3
    assert value(text, "nv_inference_request_success", **v2) == 2
    # Each failure under Triton's reason; the request that never reached a version is not Triton's to count.
    reasons = {s[1]["reason"]: s[2] for s in got["nv_inference_request_failure"][1] if s[1]["version"] == "1"}
    assert reasons == {"OTHER": 1, "REJECTED": 1, "CANCELED": 1, "BACKEND": 1}
    assert not [s for s in got["nv_inference_request_failure"][1] if s[1]["version"] == ""]
    # Successful requests' time in whole µs.
    assert value(text, "nv_inference_request_duration_us", **v1) == round((0.0001 + 0.003 + 2.0) * 1e6)
    # Rows and runs; queueing per request; each request of a batch is charged its batch's run.
    assert value(text, "nv_inference_count", **v1) == 6
    assert value(text, "nv_inference_exec_count", **v1) == 2
    assert value(text, "nv_inference_queue_duration_us", **v1) == 6000
    assert value(text, "nv_inference_compute_infer_duration_us", **v1) == 3 * 10_000 + 4_000
    # Version 2 has served, but has not run yet: Triton's series show it at 0 rather than leave it out.
    assert value(text, "nv_inference_exec_count", **v2) == 0
    assert value(text, "nv_inference_compute_input_duration_us", **v1) == 0
    assert value(text, "nv_inference_compute_output_duration_us", **v1) == 0
    # No cache: no cache series.
    assert got["nv_cache_num_hits_per_model"][1] == []


def test_triton_series_of_every_worker_add_up():
    workers = [ServingMetrics(), ServingMetrics()]
    for index, metrics in enumerate(workers):
        metrics.observe_request("m", 1, "predict", "rest", "OK", 0.001 * (index + 1))
        metrics.observe_cache_lookup("m", 1, True, 0.000002)
        metrics.observe_cache_lookup("m", 1, False, 0.000003)
        metrics.observe_cache_insert("m", 1, 0.000004)
    merged = merge_expositions([metrics.exposition().decode() for metrics in workers]).decode()
    v1 = {"model": "m", "version": "1"}
    assert value(merged, "nv_inference_request_success", **v1) == 2
    assert value(merged, "nv_inference_request_duration_us", **v1) == 3000
    assert value(merged, "nv_cache_num_hits_per_model", **v1) == 2
    assert value(merged, "nv_cache_num_misses_per_model", **v1) == 2
    assert value(merged, "nv_cache_hit_duration_per_model", **v1) == 4
    assert value(merged, "nv_cache_miss_duration_per_model", **v1) == 14
