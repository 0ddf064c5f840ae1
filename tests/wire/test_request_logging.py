"""Request logging (TF Serving's ``logging_config``): sampled PredictionLogs in TFRecord files, from a config file
or a ``logging_config.txt`` beside a model; every method over REST and gRPC; config reloads; the files read by
the warmup reader and replayed as a new version's warmup; ``%serve logs`` through IPython."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from IPython.core.error import UsageError
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from test_warmup import save_counter_model
from waiting import model_config_text, place_atomically, version_states, wait_until, write_atomically

from workbench.config.options import ModelConfig
from workbench.config.request_logging import RequestLogConfig
from workbench.core.errors import Code, ServingError
from workbench.models.configs import parse_model_config_file
from workbench.models.warmup_replay import read_warmup_records
from workbench.observability.prediction_logs import PredictEntry
from workbench.observability.request_logger import RequestLogger
from workbench.protocol.request_log_files import log_files
from workbench.request_log import RequestLog, read_request_log, write_warmup_file

X = {"instances": [[1.0], [3.0]]}  # half_plus_two: [[2.5], [3.5]]
FILE_NAME = re.compile(r"requests-\d{8}T\d{6}Z-[A-Za-z0-9_.]+-\d+-00000\.tfrecord")


def logging_config(prefix: str | Path, rate: float, collector_type: str = "tfrecord") -> str:
    return (
        f'log_collector_config {{ type: "{collector_type}" filename_prefix: "{prefix}" }} '
        f"sampling_config {{ sampling_rate: {rate} }}"
    )


def in_config(prefix: str | Path, rate: float) -> str:
    """The ``logging_config { … }`` field of a model's entry in a ModelServerConfig."""
    return f"logging_config {{ {logging_config(prefix, rate)} }}"


def request_log(server: Any) -> dict[str, dict[str, Any]]:
    """What the server says it logs, through its health endpoint: model → prefix, rate and counts."""
    return requests.get(f"{server.rest_url}/workbench/v1/health", timeout=10).json()["request_log"]


def wait_logged(server: Any, model: str, count: int) -> dict[str, Any]:
    """Wait until ``count`` records of ``model`` are written and flushed (never more: that is a failure)."""
    info = wait_until(
        lambda: (request_log(server).get(model, {}).get("logged", 0) >= count) and request_log(server)[model],
        what=f"{count} logged requests of {model}",
    )
    assert info["logged"] == count and info["dropped"] == 0, info
    return info


def predict(server: Any, model: str, body: Any = X, version: int | None = None) -> requests.Response:
    path = f"/v1/models/{model}" + (f"/versions/{version}" if version else "") + ":predict"
    r = requests.post(server.rest_url + path, data=json.dumps(body), timeout=30)
    assert r.status_code == 200, r.text
    return r


def stub(server: Any) -> Any:
    return prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc_target))


def examples_input(*xs: float) -> Any:
    request_input = input_pb2.Input()
    for x in xs:
        request_input.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    return request_input


def records(path: Path) -> list[Any]:
    """A log file's records, read by the server's own warmup reader."""
    return list(read_warmup_records(str(path)))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return tmp_path / "models.config"


# ------------------------------------------------------------------------------------------ the file format
def test_every_request_is_logged_at_rate_1_in_files_the_warmup_reader_reads(serve, make_repo, config_file, tmp_path):
    base = make_repo("hp", {1: "hp2_tf2"})
    # A relative prefix is taken from the config file's folder, as base_path is.
    config_file.write_text(model_config_text(("hp", base, in_config("logs/requests", 1.0))))
    server = serve(model_config_file=str(config_file))
    prefix = tmp_path / "logs" / "requests"
    assert request_log(server)["hp"]["filename_prefix"] == str(prefix)

    answers = [predict(server, "hp").json() for _ in range(3)]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "hp"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[5.0]], np.float32)))
    grpc_answer = stub(server).Predict(request, 10.0)
    wait_logged(server, "hp", 4)

    (path,) = log_files(prefix)
    assert FILE_NAME.fullmatch(path.name), path.name
    logged = records(path)
    assert [log.WhichOneof("log_type") for log in logged] == ["predict_log"] * 4
    for log, answer in zip(logged[:3], answers, strict=True):  # REST requests, logged as the PredictRequest they are
        np.testing.assert_array_equal(tf.make_ndarray(log.predict_log.request.inputs["x"]), [[1.0], [3.0]])
        np.testing.assert_array_equal(tf.make_ndarray(log.predict_log.response.outputs["y"]), answer["predictions"])
        assert log.predict_log.request.model_spec.signature_name == "serving_default"
    last = logged[3].predict_log
    np.testing.assert_array_equal(tf.make_ndarray(last.request.inputs["x"]), [[5.0]])
    np.testing.assert_array_equal(
        tf.make_ndarray(last.response.outputs["y"]), tf.make_ndarray(grpc_answer.outputs["y"])
    )
    assert last.response.model_spec.version.value == 1
    metadata = logged[0].log_metadata
    assert (metadata.model_spec.name, metadata.model_spec.version.value) == ("hp", 1)
    assert metadata.model_spec.signature_name == "serving_default"
    assert metadata.sampling_config.sampling_rate == 1.0
    assert list(metadata.saved_model_tags) == ["serve"]
    assert metadata.timestamp_secs > 0


def test_failed_requests_are_not_logged(serve, make_repo, config_file, tmp_path):
    config_file.write_text(model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), in_config("requests", 1.0))))
    server = serve(model_config_file=str(config_file))
    bad = requests.post(f"{server.rest_url}/v1/models/hp:predict", data='{"instances": [["a"]]}', timeout=30)
    assert bad.status_code == 400
    missing = requests.post(f"{server.rest_url}/v1/models/hp/versions/7:predict", data=json.dumps(X), timeout=30)
    assert missing.status_code == 404
    predict(server, "hp")
    # Sampling happens before the answer is sent: the counts are final once the good answer is in.
    assert request_log(server)["hp"]["sampled"] == 1
    wait_logged(server, "hp", 1)
    assert len(records(log_files(tmp_path / "requests")[0])) == 1


# ---------------------------------------------------------------------------------------- every method
def test_classify_regress_and_multi_inference_are_logged_over_rest_and_grpc(serve, make_repo, config_file, tmp_path):
    config_file.write_text(model_config_text(("tf1", make_repo("tf1", {1: "hp2_tf1"}), in_config("requests", 1.0))))
    server = serve(model_config_file=str(config_file))
    url = f"{server.rest_url}/v1/models/tf1"
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}, {"x": 4.0}]}
    assert requests.post(f"{url}:classify", json=body, timeout=30).json() == {"results": [[["", 3.0]], [["", 4.0]]]}
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}
    assert requests.post(f"{url}:regress", json=body, timeout=30).json() == {"results": [3.0]}

    service = stub(server)
    classify = classification_pb2.ClassificationRequest(input=examples_input(6.0))
    classify.model_spec.name, classify.model_spec.signature_name = "tf1", "classify_x_to_y"
    service.Classify(classify, 10.0)
    regress = regression_pb2.RegressionRequest(input=examples_input(8.0))
    regress.model_spec.name, regress.model_spec.signature_name = "tf1", "regress_x_to_y"
    service.Regress(regress, 10.0)
    multi = inference_pb2.MultiInferenceRequest(input=examples_input(10.0))
    for signature, method in (
        ("classify_x_to_y", "tensorflow/serving/classify"),
        ("regress_x_to_y2", "tensorflow/serving/regress"),
    ):
        task = multi.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = "tf1", signature
    service.MultiInference(multi, 10.0)
    predict_request = predict_pb2.PredictRequest()
    predict_request.model_spec.name = "tf1"
    predict_request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[2.0]], np.float32)))
    service.Predict(predict_request, 10.0)
    predict(server, "tf1")
    wait_logged(server, "tf1", 7)

    log = read_request_log(tmp_path / "requests")
    assert [r.method for r in log] == [
        "classify", "regress", "classify", "regress", "multi_inference", "predict", "predict",
    ]  # fmt: skip
    assert {(r.model, r.version) for r in log} == {("tf1", 1)}
    rest_classify, rest_regress, grpc_classify, grpc_regress, multi_log, grpc_predict, rest_predict = log
    assert rest_classify.signature_name == "classify_x_to_y"
    assert [e["x"].tolist() for e in rest_classify.request] == [[2.0], [4.0]]
    assert rest_classify.response == [[("", 3.0)], [("", 4.0)]]
    assert rest_regress.response.tolist() == [3.0]
    assert grpc_classify.request[0]["x"].tolist() == [6.0] and grpc_classify.response == [[("", 5.0)]]
    assert grpc_regress.request[0]["x"].tolist() == [8.0] and grpc_regress.response.tolist() == [6.0]
    assert multi_log.signature_name == "" and multi_log.request[0]["x"].tolist() == [10.0]
    assert multi_log.response["classify_x_to_y"] == [[("", 7.0)]]
    assert list(multi_log.response) == ["classify_x_to_y", "regress_x_to_y2"]
    tasks = multi_log.log.multi_inference_log.request.tasks
    assert [t.method_name for t in tasks] == ["tensorflow/serving/classify", "tensorflow/serving/regress"]
    assert grpc_predict.request["x"].tolist() == [[2.0]] and grpc_predict.response["y"].tolist() == [[3.0]]
    assert rest_predict.response["y"].tolist() == [[2.5], [3.5]]
    # The whole log is also what the warmup reader reads.
    assert len(records(log_files(tmp_path / "requests")[0])) == 7


# ----------------------------------------------------------------------------------------------- sampling
def test_sampling_rate_0_logs_none_and_0_5_about_half(serve, make_repo, config_file, tmp_path):
    config_file.write_text(
        model_config_text(
            ("never", make_repo("never", {1: "hp2_tf2"}), in_config("logs/never", 0.0)),
            ("half", make_repo("half", {1: "hp2_tf2"}), in_config("logs/half", 0.5)),
        )
    )
    server = serve(model_config_file=str(config_file))
    n = 400
    with requests.Session() as session:
        for model in ("never", "half"):
            for _ in range(n):
                assert session.post(f"{server.rest_url}/v1/models/{model}:predict", json=X, timeout=30).ok
    counts = request_log(server)
    assert counts["never"]["sampled"] == 0
    # Binomial(400, 0.5): mean 200, standard deviation 10; six of them either side fails once in ~500 million.
    sampled = counts["half"]["sampled"]
    assert 140 <= sampled <= 260, sampled
    wait_logged(server, "half", sampled)
    assert sum(len(records(path)) for path in log_files(tmp_path / "logs" / "half")) == sampled
    assert log_files(tmp_path / "logs" / "never") == []


def test_a_full_queue_drops_and_counts_instead_of_waiting(tmp_path):
    logger = RequestLogger(max_pending_bytes=10)  # no entry fits: every sampled request is dropped, none waited for
    config = RequestLogConfig(filename_prefix=str(tmp_path / "requests"), sampling_rate=1.0)
    logger.configure([ModelConfig(name="m", base_path=str(tmp_path), logging=config)])
    x = np.zeros((4, 1), np.float32)
    for _ in range(5):
        logger.log("m", lambda: PredictEntry("m", 1, "serving_default", {"x": x}, (), {"y": x}))
    logger.close()
    assert logger.describe()["m"] == {
        "sink": "tfrecord",
        "filename_prefix": str(tmp_path / "requests"),
        "sampling_rate": 1.0,
        "sampled": 5,
        "logged": 0,
        "dropped": 5,
        "send_failures": 0,
    }


def test_files_roll_over_when_full_and_read_back_in_order(tmp_path):
    logger = RequestLogger(max_file_bytes=1)  # every record fills a file
    config = RequestLogConfig(filename_prefix=str(tmp_path / "logs" / "m"), sampling_rate=1.0)
    logger.configure([ModelConfig(name="m", base_path=str(tmp_path), logging=config)])
    for i in range(3):
        x = np.full((1, 1), i, np.float32)
        logger.log("m", lambda x=x: PredictEntry("m", 1, "serving_default", {"x": x}, (), {"y": x + 1}))
    logger.close()
    assert logger.describe()["m"]["logged"] == 3
    files = log_files(tmp_path / "logs" / "m")
    assert [path.name[-len("00000.tfrecord") :] for path in files] == [f"{n:05d}.tfrecord" for n in range(3)]
    assert [r.request["x"].item() for r in read_request_log(tmp_path / "logs" / "m")] == [0.0, 1.0, 2.0]
    assert log_files(tmp_path / "logs" / "m-other") == []  # a prefix matches its own files only


def test_an_unwritable_prefix_counts_drops_and_requests_are_still_answered(serve, make_repo, config_file, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    prefix = tmp_path / "a-file" / "logs" / "requests"
    config_file.write_text(model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), in_config(prefix, 1.0))))
    server = serve(model_config_file=str(config_file))
    for _ in range(3):
        assert predict(server, "hp").json() == {"predictions": [[2.5], [3.5]]}
    info = wait_until(lambda: request_log(server)["hp"]["dropped"] == 3 and request_log(server)["hp"], what="drops")
    assert info["logged"] == 0 and info["sampled"] == 3


# ------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("field", "code", "message"),
    [
        (logging_config("p", 1.5), Code.INVALID_ARGUMENT, "sampling_rate must be from 0 to 1, got 1.5"),
        (logging_config("p", 1.0, "pubsub"), Code.UNIMPLEMENTED, 'log collector type "pubsub" is not supported'),
        ("sampling_config { sampling_rate: 1.0 }", Code.INVALID_ARGUMENT, "filename_prefix } is required"),
    ],
)
def test_a_bad_logging_config_is_refused_by_name(make_repo, config_file, field, code, message):
    config_file.write_text(model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), f"logging_config {{ {field} }}")))
    with pytest.raises(ServingError) as info:
        parse_model_config_file(config_file)
    assert info.value.code == code
    assert info.value.message.startswith("Invalid logging_config of model hp: ") and message in info.value.message


def test_config_reload_turns_logging_on_and_off(serve, make_repo, config_file, tmp_path):
    base = make_repo("hp", {1: "hp2_tf2"})
    config_file.write_text(model_config_text(("hp", base, "")))
    server = serve(model_config_file=str(config_file), model_config_file_poll_wait_seconds=0.2)
    predict(server, "hp")
    assert request_log(server) == {}

    write_atomically(config_file, model_config_text(("hp", base, in_config("requests", 1.0))))
    wait_until(lambda: "hp" in request_log(server), what="logging on")
    predict(server, "hp")
    predict(server, "hp")
    wait_logged(server, "hp", 2)

    write_atomically(config_file, model_config_text(("hp", base, "")))
    wait_until(lambda: request_log(server) == {}, what="logging off")
    predict(server, "hp")
    assert [len(records(path)) for path in log_files(tmp_path / "requests")] == [2]


def test_a_logging_config_file_beside_a_model_in_a_model_repository(serve, model_store, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(model_store / "hp2_tf2", repo / "hp" / "1")
    server = serve(model_repository=str(repo), file_system_poll_wait_seconds=0.1)
    assert request_log(server) == {}

    # A relative prefix starts in the model's folder (a folder that is not a number is no version).
    write_atomically(repo / "hp" / "logging_config.txt", logging_config("logs/requests", 1.0))
    wait_until(lambda: "hp" in request_log(server), what="the file beside the model to be read")
    assert request_log(server)["hp"]["filename_prefix"] == str(repo / "hp" / "logs" / "requests")
    predict(server, "hp")
    wait_logged(server, "hp", 1)

    # A broken edit keeps what worked; removing the file turns logging off.
    write_atomically(repo / "hp" / "logging_config.txt", "sampling_config { sampling_rate: ")
    predict(server, "hp")
    wait_logged(server, "hp", 2)
    (repo / "hp" / "logging_config.txt").unlink()
    wait_until(lambda: request_log(server) == {}, what="logging off")
    assert len(read_request_log(repo / "hp" / "logs" / "requests")) == 2
    assert [
        v["version"] for v in requests.get(f"{server.rest_url}/workbench/v1/models/hp", timeout=10).json()["versions"]
    ] == [1]


# ------------------------------------------------------------------------------------------------- reading
def test_reading_stops_before_a_partial_record_and_refuses_a_corrupted_one(serve, make_repo, config_file, tmp_path):
    config_file.write_text(model_config_text(("hp", make_repo("hp", {1: "hp2_tf2"}), in_config("requests", 1.0))))
    server = serve(model_config_file=str(config_file))
    for _ in range(3):
        predict(server, "hp")
    wait_logged(server, "hp", 3)
    (path,) = log_files(tmp_path / "requests")
    data = path.read_bytes()

    being_written = tmp_path / "partial" / path.name  # as a reader may find a file while the server writes it
    being_written.parent.mkdir()
    being_written.write_bytes(data[:-5])
    assert len(read_request_log(being_written)) == 2

    corrupted = bytearray(data)
    corrupted[len(data) // 2] ^= 0xFF
    being_written.write_bytes(bytes(corrupted))
    with pytest.raises(ValueError, match="corrupted record"):
        read_request_log(being_written)
    with pytest.raises(FileNotFoundError):
        read_request_log(tmp_path / "nothing-here")

    log = read_request_log(tmp_path / "requests", last=2)
    assert len(log) == 2 and repr(log).splitlines()[0] == "2 logged requests"
    assert "x: float32[2,1]" in repr(log) and "<table>" in log._repr_html_()


# ------------------------------------------------------------------------------------------ replay as warmup
def test_logged_traffic_replays_as_the_warmup_of_a_new_version(serve, config_file, tmp_path):
    base = tmp_path / "counter"
    model = save_counter_model(tmp_path / "store" / "counter")
    shutil.copytree(model, base / "1")
    config_file.write_text(model_config_text(("counter", base, in_config("requests", 1.0))))
    server = serve(model_config_file=str(config_file), file_system_poll_wait_seconds=0.1)

    # Traffic of every kind that bumps the counter: two predicts, a classify and a regress (one run each).
    predict(server, "counter", {"signature_name": "incr", "instances": [1.0, 2.0]})
    predict(server, "counter", {"signature_name": "incr", "instances": [3.0]})
    url = f"{server.rest_url}/v1/models/counter"
    for verb, signature in (("classify", "classify_incr"), ("regress", "regress_incr")):
        r = requests.post(f"{url}:{verb}", json={"signature_name": signature, "examples": [{"x": 1.0}]}, timeout=30)
        assert r.status_code == 200, r.text
    wait_logged(server, "counter", 4)

    staging = tmp_path / "staging"
    shutil.copytree(model, staging)
    warmup = write_warmup_file(read_request_log(tmp_path / "requests"), staging)
    assert len(records(warmup)) == 4
    place_atomically(staging, base / "2")
    wait_until(lambda: version_states(server.rest_url, "counter").get("2") == "AVAILABLE", what="version 2 warmed up")
    # Version 2's counter says how many requests its warmup ran: all four logged ones, once each.
    count = predict(server, "counter", {"signature_name": "read", "instances": [0.0]}, version=2).json()
    assert count == {"predictions": [4.0]}


# ------------------------------------------------------------------------------------------------ %serve logs
def test_serve_logs_shows_and_returns_a_models_logged_requests(ipython_shell, model_store, tmp_path):
    ip = ipython_shell
    repo = tmp_path / "repo"
    shutil.copytree(model_store / "hp2_tf2", repo / "hp" / "1")
    shutil.copytree(model_store / "hp2_tf2", repo / "quiet" / "1")
    (repo / "hp" / "logging_config.txt").write_text(logging_config("logs/requests", 1.0))
    handle = ip.run_line_magic("serve", f"start --model_repository {repo} --server_name reqlog")
    try:
        handle.wait_for_version("hp", 1)
        for x in (1.0, 2.0, 3.0):
            handle.client.predict("hp", {"x": [[x]]})
        handle.client.predict("hp", {"x": [[4.0]]}, protocol="grpc")
        wait_until(lambda: handle.client.health()["request_log"]["hp"]["logged"] == 4, what="4 logged requests")

        log = ip.run_line_magic("serve", "logs hp --server_name reqlog")
        assert isinstance(log, RequestLog) and len(log) == 4
        assert [r.request["x"].tolist() for r in log] == [[[1.0]], [[2.0]], [[3.0]], [[4.0]]]
        assert [r.response["y"].tolist() for r in log] == [[[2.5]], [[3.0]], [[3.5]], [[4.0]]]
        assert {(r.model, r.version, r.method) for r in log} == {("hp", 1, "predict")}
        table = repr(log).splitlines()
        assert table[0] == "4 logged requests" and table[1].split()[:3] == ["time", "(UTC)", "model"]
        assert len(ip.run_line_magic("serve", "logs hp --last 1 --server_name reqlog")) == 1
        prefix = repo / "hp" / "logs" / "requests"
        assert len(ip.run_line_magic("serve", f"logs hp --filename_prefix {prefix}")) == 4

        with pytest.raises(UsageError) as info:
            ip.run_line_magic("serve", "logs quiet --server_name reqlog")
        assert "does not log requests" in str(info.value) and "\n" not in str(info.value)
    finally:
        ip.run_line_magic("serve", "stop reqlog")
