"""Request logs to real sinks: Parquet files (local, and S3 on moto's server) read back with pandas and pyarrow, and
CloudEvents POSTed as KServe's logger sends them to a real receiving HTTP server; over REST and gRPC, with the bounded
queue's drops counted and bad collector configs refused by name."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pytest
import requests
import tensorflow as tf
from moto_aws import moto_aws
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from waiting import model_config_text, wait_until

from workbench.config.options import ModelConfig
from workbench.config.request_logging import RequestLogConfig
from workbench.core.errors import Code, ServingError
from workbench.models.configs import parse_model_config_file
from workbench.observability.prediction_logs import PredictEntry
from workbench.observability.request_logger import RequestLogger


def logging_field(collector: str, prefix: str | Path) -> str:
    return (
        f'logging_config {{ log_collector_config {{ type: "{collector}" filename_prefix: "{prefix}" }} '
        "sampling_config { sampling_rate: 1.0 } }"
    )


def request_log(server: Any) -> dict[str, dict[str, Any]]:
    return requests.get(f"{server.rest_url}/workbench/v1/health", timeout=10).json()["request_log"]


def logged(server: Any, model: str, count: int) -> dict[str, Any]:
    return wait_until(
        lambda: (
            (info := request_log(server).get(model, {})).get("logged", 0) + info.get("dropped", 0) >= count and info
        ),
        what=f"{count} logged requests of {model}",
    )


def rest_predict(server: Any, model: str, xs: list[float]) -> None:
    body = {"instances": [[x] for x in xs]}
    r = requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=30)
    assert r.status_code == 200, r.text


def grpc_predict(server: Any, model: str, xs: list[float]) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[x] for x in xs], np.float32)))
    with grpc.insecure_channel(server.grpc_target) as channel:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)


# ------------------------------------------------------------------------------------------------- Parquet
def test_parquet_files_partitioned_by_model_version_and_hour_read_back_with_pandas_and_pyarrow(
    serve, make_repo, tmp_path
):
    folder = tmp_path / "request-logs"
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), logging_field("parquet", folder))))
    server = serve(model_config_file=str(config), request_log_flush_seconds=0.1)
    rest_predict(server, "hp", [1.0, 3.0])
    grpc_predict(server, "hp", [5.0])
    v2 = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [7.0]}]}
    assert requests.post(f"{server.rest_url}/v2/models/hp/infer", json=v2, timeout=30).status_code == 200
    info = logged(server, "hp", 3)
    assert info["sink"] == "parquet" and info["logged"] == 3 and info["dropped"] == 0, info

    files = sorted(folder.rglob("*.parquet"))
    assert files and all(f.parent.parent.parent.name == "model=hp" for f in files), files
    assert all(f.parent.parent.name == "version=1" and f.parent.name.startswith("hour=") for f in files)
    assert not list(folder.rglob(".*.tmp"))  # written whole, renamed into place

    frame = pd.read_parquet(folder).sort_values("time")
    assert list(frame["model"].astype(str)) == ["hp"] * 3 and list(frame["version"].astype(int)) == [1] * 3
    assert frame["hour"].astype(str).str.match(r"\d{4}-\d{2}-\d{2}T\d{2}$").all()
    assert list(frame["protocol"]) == ["rest", "grpc", "v2-rest"] and set(frame["method"]) == {"predict"}
    assert set(frame["status"]) == {"OK"} and (frame["latency_seconds"] > 0).all()
    assert frame["request_id"].str.fullmatch(r"[0-9a-f]{32}").all() and frame["request_id"].nunique() == 3
    assert [list(v) for v in frame["input.x"]] == [[1.0, 3.0], [5.0], [7.0]]
    assert [list(v) for v in frame["output.y"]] == [[2.5, 3.5], [4.5], [5.5]]  # half_plus_two
    assert json.loads(frame["shapes"].iloc[0]) == {"input.x": [2, 1], "output.y": [2, 1]}

    table = pads.dataset(folder, partitioning="hive").to_table()
    assert {"model", "version", "hour", "request_id", "time", "input.x", "output.y"} <= set(table.column_names)
    assert str(table.schema.field("time").type) == "timestamp[us, tz=UTC]"
    assert str(table.schema.field("input.x").type) == "list<element: float>"


def test_parquet_files_in_s3_on_motos_server(monkeypatch, tmp_path):
    with moto_aws(monkeypatch):
        import boto3
        import s3fs

        boto3.client("s3").create_bucket(Bucket="logs")
        logger = RequestLogger(parquet_flush_seconds=60)  # written at close, not before
        config = RequestLogConfig("s3://logs/requests", 1.0, sink="parquet")
        logger.configure([ModelConfig(name="m", base_path=str(tmp_path), logging=config)])
        x = np.arange(6, dtype=np.int64).reshape(3, 2)
        for row in x:
            batch = row[None]
            logger.log("m", lambda b=batch: PredictEntry("m", 7, "serving_default", {"x": b}, (), {"y": b}), "v2-rest")
        logger.close()
        assert logger.describe()["m"]["logged"] == 3
        fs = s3fs.S3FileSystem()
        names = fs.find("logs/requests")
        assert len(names) == 1 and "/model=m/version=7/hour=" in names[0] and names[0].endswith(".parquet"), names
        table = pads.dataset("logs/requests", filesystem=fs, partitioning="hive").to_table()
        assert table.num_rows == 3 and set(table.column("model").to_pylist()) == {"m"}
        assert table.column("input.x").to_pylist() == [[0, 1], [2, 3], [4, 5]]
        assert str(table.schema.field("input.x").type) == "list<element: int64>"


# --------------------------------------------------------------------------------------------- CloudEvents
class Receiver:
    """A real HTTP server taking CloudEvents: what it got, in order; ``hold`` keeps it from answering."""

    def __init__(self) -> None:
        self.events: list[tuple[dict[str, str], Any]] = []
        self.hold = threading.Event()
        self.hold.set()
        received = self.events
        hold = self.hold

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hold.wait(30)
                received.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_cloudevents_as_kserves_logger_sends_them_over_rest_and_grpc(serve, make_repo, tmp_path, receiver):
    config = tmp_path / "models.config"
    config.write_text(
        model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), logging_field("cloudevents", receiver.url)))
    )
    server = serve(model_config_file=str(config))
    rest_predict(server, "hp", [1.0, 3.0])
    grpc_predict(server, "hp", [5.0])
    info = logged(server, "hp", 2)
    assert info["sink"] == "cloudevents" and info["logged"] == 2 and info["send_failures"] == 0, info
    assert len(receiver.events) == 4

    by_id: dict[str, dict[str, tuple[dict[str, str], Any]]] = {}
    for headers, body in receiver.events:
        assert headers["ce-specversion"] == "1.0" and headers["content-type"] == "application/json"
        assert headers["ce-inferenceservicename"] == "hp" and headers["ce-modelversion"] == "1"
        assert headers["ce-component"] == "predictor" and headers["ce-endpoint"] == "default"
        assert headers["ce-source"].startswith("workbench://") and headers["ce-time"].endswith("Z")
        by_id.setdefault(headers["ce-id"], {})[headers["ce-type"]] = (headers, body)
    assert len(by_id) == 2
    sent = {}
    for request_id, pair in by_id.items():
        assert set(pair) == {"org.kubeflow.serving.inference.request", "org.kubeflow.serving.inference.response"}
        request = pair["org.kubeflow.serving.inference.request"][1]
        response = pair["org.kubeflow.serving.inference.response"][1]
        assert request["id"] == response["id"] == request_id
        assert response["model_name"] == "hp" and response["model_version"] == "1"
        [x] = request["inputs"]
        [y] = response["outputs"]
        assert x["name"] == "x" and x["datatype"] == "FP32" and y["name"] == "y"
        sent[pair["org.kubeflow.serving.inference.request"][0]["ce-protocol"]] = (x["shape"], x["data"], y["data"])
    assert sent == {"rest": ([2, 1], [1.0, 3.0], [2.5, 3.5]), "grpc": ([1, 1], [5.0], [4.5])}


def entry(i: int) -> PredictEntry:
    x = np.full((1, 1), i, np.float32)
    return PredictEntry("m", 1, "serving_default", {"x": x}, (), {"y": x})


def test_a_slow_receiver_fills_the_bounded_queue_and_drops_are_counted(tmp_path, receiver):
    receiver.hold.clear()  # the first POST waits: the sender is stuck on it
    logger = RequestLogger(cloudevents_max_queued=2)
    logger.configure([ModelConfig("m", str(tmp_path), logging=RequestLogConfig(receiver.url, 1.0, sink="cloudevents"))])
    for i in range(10):
        logger.log("m", lambda i=i: entry(i))
    wait_until(lambda: logger.describe()["m"]["dropped"] >= 7, what="drops")  # 1 in flight, 2 queued at most
    receiver.hold.set()
    counts = wait_until(lambda: (c := logger.describe()["m"])["logged"] + c["dropped"] == 10 and c, what="all counted")
    assert counts["sampled"] == 10 and 1 <= counts["logged"] <= 3, counts
    assert len(receiver.events) == 2 * counts["logged"]
    logger.close()


def test_an_absent_receiver_costs_bounded_retries_and_counted_failures(tmp_path):
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as closed:
        port = closed.server_address[1]  # bound, then closed: nothing listens there
    logger = RequestLogger()
    url = f"http://127.0.0.1:{port}/"
    logger.configure([ModelConfig("m", str(tmp_path), logging=RequestLogConfig(url, 1.0, sink="cloudevents"))])
    logger.log("m", lambda: entry(1))
    counts = wait_until(lambda: (c := logger.describe()["m"])["dropped"] == 1 and c, what="the record given up on")
    assert counts["logged"] == 0 and counts["send_failures"] == 3, counts  # three attempts, then given up
    logger.close()


def test_request_log_counts_are_prometheus_counters(serve, make_repo, tmp_path, receiver):
    config = tmp_path / "models.config"
    config.write_text(
        model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), logging_field("cloudevents", receiver.url)))
    )
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }')
    server = serve(model_config_file=str(config), monitoring_config_file=str(monitoring))
    rest_predict(server, "hp", [1.0])
    logged(server, "hp", 1)
    text = requests.get(f"{server.rest_url}/metrics", timeout=10).text
    assert 'workbench_request_log_records_total{model="hp",outcome="logged",sink="cloudevents"} 1.0' in text
    assert 'workbench_request_log_records_total{model="hp",outcome="dropped",sink="cloudevents"} 0.0' in text
    assert 'workbench_request_log_send_failures_total{model="hp",sink="cloudevents"} 0.0' in text


# -------------------------------------------------------------------------------------------- bad configs
@pytest.mark.parametrize(
    ("collector", "prefix", "code", "message"),
    [
        ("cloudevents", "/var/log/x", Code.INVALID_ARGUMENT, "filename_prefix is the URL events are POSTed to"),
        ("parquet", "nosuchfs://bucket/logs", Code.INVALID_ARGUMENT, "no file system is known for nosuchfs://"),
        ("kafka", "logs", Code.UNIMPLEMENTED, '"parquet" for Parquet files, "cloudevents" for CloudEvents over HTTP'),
    ],
)
def test_a_bad_collector_is_refused_by_name(make_repo, tmp_path, collector, prefix, code, message):
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), logging_field(collector, prefix))))
    with pytest.raises(ServingError) as info:
        parse_model_config_file(config)
    assert info.value.code == code
    assert info.value.message.startswith("Invalid logging_config of model hp: ") and message in info.value.message
