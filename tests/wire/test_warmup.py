"""Warmup replay (``assets.extra/tf_serving_warmup_requests``): every record runs once before AVAILABLE, a bad
file fails only the version that carries it, and ``enable_model_warmup=False`` skips the file entirely."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import models
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import inference_pb2, model_pb2, prediction_log_pb2
from waiting import model_config_text, states_are, version_states, wait_until

X1 = {"x": np.array([[1.0]], dtype=np.float32)}
EXAMPLE = [{"x": [1.0]}]


def multi_inference_log(
    model_name: str, examples: list[dict[str, list[float]]], tasks: list[tuple[str, str]]
) -> prediction_log_pb2.PredictionLog:
    """A warmup record holding a MultiInferenceRequest: (signature, method_name) tasks over the examples."""
    request = inference_pb2.MultiInferenceRequest(input=models._input(examples))
    for signature, method in tasks:
        request.tasks.add(model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature), method_name=method)
    return prediction_log_pb2.PredictionLog(multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=request))


def save_counter_model(export_dir: Path) -> Path:
    """A TF1 model whose signatures bump a variable: after loading, ``read`` tells how many ran.

    ``incr`` (predict), ``classify_incr`` (classify) and ``regress_incr`` (regress) each add 1 to ``counter``
    through their own assign op, once per run; ``read`` (also ``serving_default``) returns the counter,
    broadcast to the batch, without changing it.
    """
    v1 = tf.compat.v1
    sig = v1.saved_model.signature_def_utils.build_signature_def
    info = v1.saved_model.utils.build_tensor_info
    with tf.Graph().as_default(), v1.Session() as session:
        counter = v1.Variable(0.0, dtype=tf.float32, name="counter")
        x = v1.placeholder(tf.float32, [None], name="x")
        examples = v1.placeholder(tf.string, [None], name="examples")
        parsed = v1.parse_example(examples, {"x": v1.FixedLenFeature([1], tf.float32)})["x"]
        incr = tf.zeros_like(x) + counter.assign_add(1.0)
        classify_scores = tf.zeros_like(parsed) + counter.assign_add(1.0)
        regress_outputs = tf.zeros_like(parsed) + counter.assign_add(1.0)
        read = tf.zeros_like(x) + counter.read_value()
        session.run(v1.global_variables_initializer())
        read_sig = sig({"x": info(x)}, {"count": info(read)}, "tensorflow/serving/predict")
        builder = v1.saved_model.Builder(str(export_dir))
        builder.add_meta_graph_and_variables(
            session,
            ["serve"],
            signature_def_map={
                "serving_default": read_sig,
                "read": read_sig,
                "incr": sig({"x": info(x)}, {"count": info(incr)}, "tensorflow/serving/predict"),
                "classify_incr": sig(
                    {"inputs": info(examples)}, {"scores": info(classify_scores)}, "tensorflow/serving/classify"
                ),
                "regress_incr": sig(
                    {"inputs": info(examples)}, {"outputs": info(regress_outputs)}, "tensorflow/serving/regress"
                ),
            },
        )
        builder.save()
    return export_dir


@pytest.fixture(scope="module")
def counter_model(tmp_path_factory) -> Path:
    return save_counter_model(tmp_path_factory.mktemp("counter") / "model")


def counter_value(server, name: str = "counter", version: int | None = None) -> float:
    path = f"/v1/models/{name}" + (f"/versions/{version}" if version else "") + ":predict"
    r = requests.post(server.rest_url + path, json={"signature_name": "read", "instances": [0.0]}, timeout=30)
    assert r.status_code == 200, r.text
    (value,) = r.json()["predictions"]
    return value


def four_kinds_of_records(model_name: str, predict_sig: str, classify_sig: str, regress_sig: str, x: np.ndarray):
    """A predict, a classify, a regress and a multi_inference (classify + regress) warmup record."""
    return [
        models.predict_log(model_name, {"x": x}, predict_sig),
        models.classify_log(model_name, EXAMPLE, classify_sig),
        models.regress_log(model_name, EXAMPLE, regress_sig),
        multi_inference_log(
            model_name,
            EXAMPLE,
            [(classify_sig, "tensorflow/serving/classify"), (regress_sig, "tensorflow/serving/regress")],
        ),
    ]


def counter_records():
    return four_kinds_of_records("counter", "incr", "classify_incr", "regress_incr", np.array([1.0], dtype=np.float32))


# --------------------------------------------------------------------------------------- warmup that works
def test_half_plus_two_with_all_four_kinds_of_warmup_records_loads(serve, tmp_path, model_store):
    base = tmp_path / "m"
    shutil.copytree(model_store / "hp2_tf1", base / "1")
    path = models.write_warmup_file(
        base / "1", four_kinds_of_records("m", "serving_default", "classify_x_to_y", "regress_x_to_y", X1["x"])
    )
    assert sum(1 for _ in tf.data.TFRecordDataset(str(path))) == 4
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0)

    assert version_states(server.rest_url, "m") == {"1": "AVAILABLE"}
    r = requests.post(f"{server.rest_url}/v1/models/m:predict", json={"instances": [[1.0]]}, timeout=30)
    assert r.text == '{"predictions":[[2.5]]}'


def test_every_warmup_record_runs_exactly_once_before_the_version_is_available(serve, tmp_path, counter_model):
    base = tmp_path / "counter"
    shutil.copytree(counter_model, base / "1")
    models.write_warmup_file(base / "1", counter_records())
    shutil.copytree(counter_model, base / "2")  # no warmup file
    models.write_warmup_file(base / "2", [])  # an empty warmup file is fine too
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("counter", base, "model_version_policy { all {} }")))
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0)

    assert version_states(server.rest_url, "counter") == {"2": "AVAILABLE", "1": "AVAILABLE"}
    # predict + classify + regress + a multi_inference of two tasks = 5 runs of a bumping signature.
    assert counter_value(server, version=1) == 5.0
    assert counter_value(server, version=2) == 0.0
    # The counter is live: a client's run bumps it once more.
    r = requests.post(
        f"{server.rest_url}/v1/models/counter/versions/1:predict",
        json={"signature_name": "incr", "instances": [0.0]},
        timeout=30,
    )
    assert r.json() == {"predictions": [6.0]}


def test_exactly_1000_records_are_allowed(serve, tmp_path, counter_model):
    base = tmp_path / "counter"
    shutil.copytree(counter_model, base / "1")
    record = models.predict_log("counter", {"x": np.array([1.0], dtype=np.float32)}, "incr")
    models.write_warmup_file(base / "1", [record] * 1000)
    server = serve(model_name="counter", model_base_path=str(base), file_system_poll_wait_seconds=0)

    assert version_states(server.rest_url, "counter") == {"1": "AVAILABLE"}
    assert counter_value(server) == 1000.0


def test_disabled_warmup_skips_the_file_even_a_broken_one(serve, tmp_path, counter_model, model_store):
    counter_base, broken_base = tmp_path / "counter", tmp_path / "broken"
    shutil.copytree(counter_model, counter_base / "1")
    models.write_warmup_file(counter_base / "1", counter_records())
    shutil.copytree(model_store / "hp2_tf1", broken_base / "1")
    models.write_bad_warmup_file(broken_base / "1")
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("counter", counter_base, ""), ("broken", broken_base, "")))
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0, enable_model_warmup=False)

    assert version_states(server.rest_url, "broken") == {"1": "AVAILABLE"}
    r = requests.post(f"{server.rest_url}/v1/models/broken:predict", json={"instances": [[1.0]]}, timeout=30)
    assert r.text == '{"predictions":[[2.5]]}'
    assert counter_value(server) == 0.0  # not one warmup record ran


# ------------------------------------------------------------------------------------ warmup that fails
def _bad_framing(version_dir: Path) -> None:
    models.write_bad_warmup_file(version_dir)


def _truncated_record(version_dir: Path) -> None:
    path = models.write_warmup_file(version_dir, [models.predict_log("m", X1)] * 2)
    path.write_bytes(path.read_bytes()[:-7])  # the last record's data and CRC are cut short


def _too_many_records(version_dir: Path) -> None:
    models.write_warmup_file(version_dir, [models.predict_log("m", X1)] * 1001)


def _unparsable_record(version_dir: Path) -> None:
    path = models._warmup_path(version_dir)
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(models.predict_log("m", X1).SerializeToString())
        writer.write(b"\x0a\xff\xff\xff\xff\x0f not a PredictionLog")  # field 1, absurd length: truncated


def _unknown_signature(version_dir: Path) -> None:
    models.write_warmup_file(
        version_dir, [models.predict_log("m", X1), models.predict_log("m", X1, signature_name="no_such_signature")]
    )


FAILURES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "bad_framing": (_bad_framing, "DATA_LOSS", "warmup"),
    "truncated_record": (_truncated_record, "DATA_LOSS", "warmup"),
    "1001_records": (_too_many_records, "INVALID_ARGUMENT", "1000"),
    "unparsable_record": (_unparsable_record, "INVALID_ARGUMENT", "PredictionLog"),
    "unknown_signature": (
        _unknown_signature,
        "FAILED_PRECONDITION",
        'Serving signature key "no_such_signature" not found.',
    ),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_bad_warmup_fails_the_new_version_and_the_serving_one_stays(serve, tmp_path, model_store, case):
    write, error_code, fragment = FAILURES[case]
    base = tmp_path / "m"
    shutil.copytree(model_store / "hp2_tf1", base / "1")
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0.2)
    url = server.rest_url
    assert version_states(url, "m") == {"1": "AVAILABLE"}

    staging = tmp_path / ".staging-2"
    shutil.copytree(model_store / "hp2_tf1", staging)
    write(staging)
    os.replace(staging, base / "2")
    wait_until(lambda: version_states(url, "m").get("2") == "END", what="v2 END")

    statuses = requests.get(f"{url}/v1/models/m", timeout=30).json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in statuses] == [("2", "END"), ("1", "AVAILABLE")]
    assert statuses[0]["status"]["error_code"] == error_code
    assert fragment in statuses[0]["status"]["error_message"]
    assert statuses[1]["status"] == {"error_code": "OK", "error_message": ""}

    # Version 1 goes on serving, and the failed one is not routable.
    r = requests.post(f"{url}/v1/models/m:predict", json={"instances": [[1.0]]}, timeout=30)
    assert (r.status_code, r.text) == (200, '{"predictions":[[2.5]]}')
    assert requests.get(f"{url}/v1/models/m/metadata", timeout=30).json()["model_spec"]["version"] == "1"
    r = requests.post(f"{url}/v1/models/m/versions/2:predict", json={"instances": [[1.0]]}, timeout=30)
    assert r.status_code == 404
    assert states_are(url, "m", {"2": "END", "1": "AVAILABLE"})()


# ------------------------------------------------------------------------------------------- the reader itself
@pytest.mark.parametrize(
    ("write", "start"),
    [(_truncated_record, "truncated record at "), (_bad_framing, "corrupted record at 0")],
    ids=["truncated_record", "bad_framing"],
)
def test_a_broken_file_is_data_loss_with_tensorflows_reason_and_no_op_wrapping(tmp_path, write, start):
    from workbench.core.errors import Code, ServingError
    from workbench.models.warmup_replay import read_warmup_records, warmup_path

    write(tmp_path)
    path = warmup_path(str(tmp_path))
    with pytest.raises(ServingError) as caught:
        list(read_warmup_records(path))
    assert caught.value.code == Code.DATA_LOSS
    assert caught.value.message.startswith(f"Failed to read warmup file {path}: {start}")
    assert "function_node" not in caught.value.message
    assert "[Op:" not in caught.value.message


def test_the_reader_returns_every_record_in_order(tmp_path):
    from workbench.models.warmup_replay import read_warmup_records, warmup_path

    records = [models.predict_log("m", {"x": np.array([[float(i)]], np.float32)}) for i in range(3)]
    models.write_warmup_file(tmp_path, records)
    assert list(read_warmup_records(warmup_path(str(tmp_path)))) == records
