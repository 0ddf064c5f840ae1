"""Asynchronous inference over REST: accepted at once, answered by the server's consumers, fetched by id.

Real servers on 127.0.0.1 (in-process, and ``workbench serve`` processes killed with SIGKILL mid-request), the
real ``requests`` client, SQLite queues in the test's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tabular_models as tm  # (tests/tabular_models.py)
from moto_aws import moto_aws  # (tests/moto_aws.py)
from sklearn.linear_model import LogisticRegression
from waiting import free_port, wait_until

import workbench


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory) -> tuple[Path, Any]:
    x, y = tm.digits()
    root = tmp_path_factory.mktemp("async-models")
    model = LogisticRegression(max_iter=2000).fit(x, y)
    workbench.export(model, "digits", root)
    return root, model


@pytest.fixture(scope="module")
def server(digits_model, tmp_path_factory):
    root, _ = digits_model
    queue = tmp_path_factory.mktemp("queue") / "async.sqlite"
    with tm.serving(root, async_queue=f"sqlite://{queue}") as running:
        tm.available(running, "digits")
        yield running


def answered(url: str, request_id: str, timeout: float = 60) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def done() -> bool:
        found.update(requests.get(f"{url}/workbench/v1/async/{request_id}", timeout=30).json())
        return found.get("state") in ("done", "failed")

    wait_until(done, timeout=timeout, interval=0.05, what=f"asynchronous request {request_id} answered")
    return found


def test_a_request_is_accepted_at_once_and_its_answer_is_predicts(server, digits_model):
    _, model = digits_model
    x = tm.digits()[0][:3]
    body = {"instances": x.tolist()}
    accepted = requests.post(f"{server.rest_url}/v1/models/digits:predictAsync", json=body, timeout=30)
    assert accepted.status_code == 202, accepted.text
    ticket = accepted.json()
    assert ticket["state"] == "queued" and ticket["url"] == f"/workbench/v1/async/{ticket['id']}"
    assert accepted.headers["Location"] == ticket["url"]
    record = answered(server.rest_url, ticket["id"])
    synchronous = requests.post(f"{server.rest_url}/v1/models/digits:predict", json=body, timeout=30).json()
    assert (record["state"], record["status"], record["attempts"], record["model"]) == ("done", 200, 1, "digits")
    assert record["answer"] == synchronous == {"predictions": model.predict(x).tolist()}


def test_the_client_predicts_asynchronously_as_a_future(server, digits_model):
    from workbench.client import Client
    from workbench.core.errors import Code, ServingError

    _, model = digits_model
    x = tm.digits()[0][:5]
    with Client(server.rest_url) as client:
        pending = client.predict_async("digits", x, signature_name="predict_proba")
        answer = pending.result(timeout=60)
        assert pending.done() and pending.state() == "done"
        np.testing.assert_allclose(answer["probabilities"], model.predict_proba(x))
        with pytest.raises(ServingError) as refused:
            client.predict_async("nosuch", x)
        assert refused.value.code == Code.NOT_FOUND


def test_a_version_or_label_is_kept_and_many_requests_each_get_their_own_answer(server, digits_model):
    _, model = digits_model
    x = tm.digits()[0][:40]
    ids = [
        requests.post(
            f"{server.rest_url}/v1/models/digits/versions/1:predictAsync", json={"instances": [row]}, timeout=30
        ).json()["id"]
        for row in x.tolist()
    ]
    assert len(set(ids)) == 40
    answers = [answered(server.rest_url, i)["answer"]["predictions"][0] for i in ids]
    assert answers == model.predict(x).tolist()


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/models/nosuch:predictAsync", {"instances": [[0.0] * 64]}, 404, "nosuch"),
        ("/v1/models/digits/versions/9:predictAsync", {"instances": [[0.0] * 64]}, 404, "9"),
        ("/v1/models/digits:predictAsync", {"instance": [[0.0] * 64]}, 400, "instances"),
        ("/v1/models/digits:predictAsync", {"instances": [["a"] * 64]}, 400, ""),
    ],
)
def test_what_predict_would_refuse_is_refused_at_once(server, path, body, status, says):
    response = requests.post(f"{server.rest_url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]


def v2_body(rows: np.ndarray, **parameters: Any) -> dict[str, Any]:
    tensor = {"name": "x", "shape": list(rows.shape), "datatype": "FP64", "data": rows.ravel().tolist()}
    return {"inputs": [tensor], **({"parameters": parameters} if parameters else {})}


def test_a_v2_request_with_parameters_async_is_queued_and_answered_as_infer_answers(server, digits_model):
    _, model = digits_model
    x = tm.digits()[0][:4]
    for path in ("/v2/models/digits/infer", "/v2/models/digits/versions/1/infer"):
        accepted = requests.post(f"{server.rest_url}{path}", json=v2_body(x, **{"async": True}), timeout=30)
        assert accepted.status_code == 202, accepted.text
        ticket = accepted.json()
        assert ticket["state"] == "queued" and accepted.headers["Location"] == ticket["url"]
        record = answered(server.rest_url, ticket["id"])
        synchronous = requests.post(f"{server.rest_url}{path}", json=v2_body(x), timeout=30).json()
        assert (record["state"], record["status"], record["model"]) == ("done", 200, "digits")
        assert record["answer"] == synchronous
        (output,) = [o for o in record["answer"]["outputs"] if o["name"] == "predictions"]
        assert output["data"] == model.predict(x).tolist()
    # false, or any other value, is an ordinary request
    plain = requests.post(f"{server.rest_url}/v2/models/digits/infer", json=v2_body(x, **{"async": False}), timeout=30)
    assert plain.status_code == 200 and "outputs" in plain.json(), plain.text


def test_a_queued_request_keeps_its_stickiness_key(tmp_path):
    """Under a canary, a request queued with a key runs on the version its key picks, as it would have at once:
    the key travels with it (the X-Workbench-Key header, or v2's parameters.workbench_key in the body)."""
    from sklearn.dummy import DummyClassifier

    from workbench.models.routing.policy import Routing, sticky_pick

    x, y = tm.digits()
    workbench.export(LogisticRegression(max_iter=2000).fit(x, y), "m", tmp_path / "models")
    workbench.export(DummyClassifier(strategy="constant", constant=7).fit(x, y), "m", tmp_path / "models")
    row = x[y != 7][:1]  # the logistic regression does not answer 7 for it; version 2 always does
    with tm.serving(tmp_path / "models", async_queue=f"sqlite://{tmp_path / 'queue.sqlite'}") as server:
        tm.available(server, "m")
        manage = f"{server.rest_url}/workbench/v1/models/m"
        assert requests.post(f"{manage}:promote", json={"version": 1}, timeout=60).status_code == 200
        assert requests.post(f"{manage}:canary", json={"version": 2, "weight": 0.5}, timeout=60).status_code == 200
        split = Routing(stable=1, canary=2, canary_weight=0.5)
        keys = [f"user-{n}" for n in range(16)]
        expected = [sticky_pick(split, [1, 2], key) for key in keys]
        assert set(expected) == {1, 2}  # both sides are tried
        tickets = []
        for key in keys:
            header = {"X-Workbench-Key": key}
            tickets.append(
                (
                    requests.post(
                        f"{server.rest_url}/v1/models/m:predictAsync",
                        json={"instances": row.tolist()},
                        headers=header,
                        timeout=30,
                    ),
                    requests.post(
                        f"{server.rest_url}/v2/models/m/infer",
                        json=v2_body(row, **{"async": True}),
                        headers=header,
                        timeout=30,
                    ),
                    requests.post(
                        f"{server.rest_url}/v2/models/m/infer",
                        json=v2_body(row, **{"async": True, "workbench_key": key}),
                        timeout=30,
                    ),
                )
            )
        from workbench.client import Client

        with Client(server.rest_url) as client:
            by_client = [client.predict_async("m", row, key=key).result(timeout=60) for key in keys]
        for version, answer in zip(expected, by_client, strict=True):
            assert (int(np.asarray(answer["predictions"])[0]) == 7) == (version == 2)
        for version, (rest, v2_header, v2_parameter) in zip(expected, tickets, strict=True):
            predicted = answered(server.rest_url, rest.json()["id"])["answer"]["predictions"][0]
            assert (predicted == 7) == (version == 2), (version, predicted)
            for v2 in (v2_header, v2_parameter):
                assert answered(server.rest_url, v2.json()["id"])["answer"]["model_version"] == str(version)


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v2/models/nosuch/infer", v2_body(np.zeros((1, 64)), **{"async": True}), 404, "nosuch"),
        ("/v2/models/digits/versions/9/infer", v2_body(np.zeros((1, 64)), **{"async": True}), 404, "9"),
        ("/v2/models/digits/infer", {"parameters": {"async": True}, "inputs": [{"name": "x"}]}, 400, "shape"),
        (
            "/v2/models/digits/infer",
            v2_body(np.zeros((1, 64)), **{"async": True, "binary_data_output": True}),
            400,
            "binary_data",
        ),
    ],
)
def test_what_v2_infer_would_refuse_is_refused_at_once(server, path, body, status, says):
    response = requests.post(f"{server.rest_url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]


def test_the_queue_shows_in_prometheus(server):
    requests.post(f"{server.rest_url}/v1/models/digits:predictAsync", json={"instances": [[0.0] * 64]}, timeout=30)
    text = requests.get(f"{server.rest_url}/metrics", timeout=30).text
    samples = dict(line.split() for line in text.splitlines() if line.startswith("workbench_async_"))
    assert {"workbench_async_requests_waiting", "workbench_async_oldest_waiting_seconds"} <= set(samples)
    assert float(samples["workbench_async_requests_waiting"]) >= 0


def test_the_keda_example_scales_the_deployment_on_a_metric_the_server_exports(server):
    import yaml

    repo = Path(__file__).resolve().parents[2]
    scaled = yaml.safe_load((repo / "deploy" / "keda" / "scaledobject.yaml").read_text())
    deployment = yaml.safe_load((repo / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (prometheus,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    metric = prometheus["metadata"]["query"].split("(", 1)[1].split("{", 1)[0]
    exported = requests.get(f"{server.rest_url}/metrics", timeout=30).text
    assert f"# TYPE {metric} gauge" in exported


def test_an_unknown_or_expired_id_is_not_found(server):
    response = requests.get(f"{server.rest_url}/workbench/v1/async/0123456789abcdef", timeout=30)
    assert response.status_code == 404 and "No asynchronous request 0123456789abcdef" in response.json()["error"]


SLOW_MODEL = textwrap.dedent(
    """
    import os, time
    import workbench


    class Slow(workbench.PythonModel):
        inputs = {"x": ("float32", [-1, 1])}
        outputs = {"y": ("float32", [-1, 1])}

        def predict(self, inputs):
            if float(inputs["x"].ravel()[0]) < 0:
                raise RuntimeError("this model fails on negative numbers")
            time.sleep(float(os.environ.get("SLOW_SECONDS", "0")))
            return {"y": inputs["x"] * 2.0}
    """
)


class Serve:
    """``workbench serve`` of the slow model, as a process of its own."""

    def __init__(self, repository: Path, queue: str, slow_seconds: float, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, SLOW_SECONDS=str(slow_seconds), TF_CPP_MIN_LOG_LEVEL="2")
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")))
        )
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "workbench", "serve", f"--model_repository={repository}", "--port=0",
                f"--rest_api_port={self.port}", "--allow_python_models", f"--async_queue={queue}", *flags,
            ],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self._ready, timeout=120, interval=0.1, what="workbench serve answers")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, "workbench serve exited"
        try:
            return requests.get(f"{self.url}/v1/models/slow", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(60)


class RedisServer:
    """A real redis-server on 127.0.0.1 (a free port, nothing saved), for the test alone."""

    def __init__(self, folder: Path) -> None:
        import shutil

        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (.ci/run installs Debian's)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        client = redis.Redis(port=self.port)
        wait_until(lambda: _pings(client), timeout=30, interval=0.05, what="redis-server answers")
        client.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _pings(client: Any) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture(params=["sqlite", "redis", "sqs"])
def queue(request, tmp_path, monkeypatch) -> Iterator[str]:
    """Where the requests wait: the embedded SQLite file, a stream of a real Redis server, or SQS on moto's server
    (its answers in moto's S3), reached with boto3 and s3fs as in AWS."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'queue.sqlite'}"
        return
    if request.param == "sqs":
        import boto3

        with moto_aws(monkeypatch):  # inherited by the servers the test starts
            boto3.client("sqs").create_queue(QueueName="requests")
            boto3.client("s3").create_bucket(Bucket="answers")
            yield "sqs://requests?results=s3://answers/async"
        return
    server = RedisServer(tmp_path)
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture()
def slow_repository(tmp_path) -> Iterator[Path]:
    version = tmp_path / "models" / "slow" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(SLOW_MODEL)
    yield tmp_path / "models"


def test_requests_accepted_by_a_server_killed_mid_request_are_answered_once_after_it_restarts(queue, slow_repository):
    # A call of a minute: whenever the test sees the first request taken, the server is killed under that call (with
    # half a second, a busy machine once let it finish the call before the kill).
    first = Serve(slow_repository, queue, 60.0, "--async_visibility_seconds=1", "--async_concurrency=1")
    try:
        ids = [
            requests.post(f"{first.url}/v1/models/slow:predictAsync", json={"instances": [[i]]}, timeout=30).json()[
                "id"
            ]
            for i in range(1, 7)
        ]
        wait_until(
            lambda: requests.get(f"{first.url}/workbench/v1/async/{ids[0]}", timeout=30).json()["state"] != "queued",
            timeout=30,
            what="the first request taken",
        )
    finally:
        first.stop(kill=True)  # mid-request: its claim expires, nothing answered it
    second = Serve(slow_repository, queue, 0.0, "--async_visibility_seconds=1")
    try:
        records = [answered(second.url, i) for i in ids]
    finally:
        second.stop()
    assert [r["answer"] for r in records] == [{"predictions": [[2.0 * i]]} for i in range(1, 7)]
    assert all(r["state"] == "done" and r["status"] == 200 for r in records)
    assert records[0]["attempts"] >= 2  # taken by the killed server, then again


def test_a_request_that_keeps_failing_on_the_server_fails_after_its_attempts(queue, slow_repository):
    # A Redis stream has no delayed redelivery: a retried request is taken again once its claim's time is over.
    server = Serve(slow_repository, queue, 0.0, "--async_max_attempts=2", "--async_visibility_seconds=1")
    try:
        ticket = requests.post(f"{server.url}/v1/models/slow:predictAsync", json={"instances": [[-1.0]]}, timeout=30)
        record = answered(server.url, ticket.json()["id"])
    finally:
        server.stop()
    assert (record["state"], record["status"], record["attempts"]) == ("failed", 500, 2)
    assert "this model fails on negative numbers" in record["answer"]["error"]


def test_queue_flags_are_checked():
    from workbench.cli import main

    assert main(["serve", "--model_base_path=/x", "--async_queue=amqp://queue"]) == 2
    assert main(["serve", "--model_base_path=/x", "--async_queue=sqs://queue"]) == 2  # no ?results=
    assert main(["serve", "--model_base_path=/x", "--async_concurrency=0"]) == 2


def test_a_headless_consumer_answers_the_queue_and_writes_each_answer(tmp_path, slow_repository):
    from workbench.asynchronous.sqlite_queue import SqliteStore

    queue = tmp_path / "queue.sqlite"
    store = SqliteStore(queue)  # requests queued by a server elsewhere (any process writing this queue)
    ids = [store.put("slow", "/v1/models/slow:predict", f'{{"instances": [[{i}]]}}'.encode()) for i in range(1, 5)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH"))))
    consumer = subprocess.Popen(
        [sys.executable, "-m", "workbench", "consume", f"--model_repository={slow_repository}",
         "--allow_python_models", f"--async_queue=sqlite://{queue}", f"--output={tmp_path / 'answers'}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(
            lambda: all(getattr(store.get(i), "state", None) == "done" for i in ids), timeout=120, what="answered"
        )
    finally:
        consumer.terminate()
        _, stderr = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, stderr.decode()[-2000:]
    for n, request_id in enumerate(ids, start=1):
        written = json.loads((tmp_path / "answers" / f"{request_id}.json").read_text())
        assert written == {"id": request_id, "model": "slow", "status": 200, "answer": {"predictions": [[2.0 * n]]}}
    store.close()


def test_each_answered_request_is_posted_to_the_webhook(digits_model, tmp_path):
    import http.server
    import threading

    told: list[dict[str, Any]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            told.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    webhook = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    root, _ = digits_model
    url = f"http://127.0.0.1:{webhook.server_address[1]}/done"
    try:
        with tm.serving(root, async_queue=f"sqlite://{tmp_path / 'q.sqlite'}", async_notify_url=url) as running:
            tm.available(running, "digits")
            ticket = requests.post(
                f"{running.rest_url}/v1/models/digits:predictAsync", json={"instances": [[0.0] * 64]}, timeout=30
            ).json()
            wait_until(lambda: bool(told), timeout=60, what="the webhook told")
    finally:
        webhook.shutdown()
    assert told == [{"id": ticket["id"], "model": "digits", "state": "done", "status": 200, "url": ticket["url"]}]


def test_a_large_input_and_its_answer_by_reference(server, digits_model, tmp_path):
    _, model = digits_model
    x = tm.digits()[0][:50]
    (tmp_path / "request.json").write_text(json.dumps({"instances": x.tolist()}))
    headers = {
        "X-Workbench-Input-Location": str(tmp_path / "request.json"),
        "X-Workbench-Output-Location": str(tmp_path / "out" / "answer.json"),
    }
    ticket = requests.post(f"{server.rest_url}/v1/models/digits:predictAsync", headers=headers, timeout=30).json()
    record = answered(server.rest_url, ticket["id"])
    assert (record["state"], record["status"]) == ("done", 200)
    assert record["answer"] == {"output_location": str(tmp_path / "out" / "answer.json")}
    assert json.loads((tmp_path / "out" / "answer.json").read_text()) == {"predictions": model.predict(x).tolist()}

    missing = requests.post(
        f"{server.rest_url}/v1/models/digits:predictAsync",
        headers={"X-Workbench-Input-Location": str(tmp_path / "nope.json")},
        timeout=30,
    )
    assert missing.status_code == 400 and "nope.json does not exist" in missing.json()["error"]


@pytest.mark.parametrize("kind", ["redis", "sqs"])
def test_a_result_queue_gets_a_notice_of_each_answer(digits_model, tmp_path, monkeypatch, kind):
    import boto3
    import redis

    root, _ = digits_model
    notices: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if kind == "redis":
            server = RedisServer(tmp_path)
            stack.callback(server.stop)
            notify = f"redis://127.0.0.1:{server.port}/0?key=answered"
            client = redis.Redis(port=server.port)
            stack.callback(client.close)

            def arrived() -> bool:
                notices[:] = [json.loads(fields[b"notice"]) for _, fields in client.xrange("answered")]
                return bool(notices)
        else:
            stack.enter_context(moto_aws(monkeypatch))
            results = boto3.client("sqs").create_queue(QueueName="answered")["QueueUrl"]
            notify = "sqs://answered"

            def arrived() -> bool:
                messages = boto3.client("sqs").receive_message(QueueUrl=results).get("Messages", [])
                notices.extend(json.loads(m["Body"]) for m in messages)
                return bool(notices)

        queue = f"sqlite://{tmp_path / 'queue.sqlite'}"
        with tm.serving(root, async_queue=queue, async_notify_url=notify) as running:
            tm.available(running, "digits")
            ticket = requests.post(
                f"{running.rest_url}/v1/models/digits:predictAsync", json={"instances": [[0.0] * 64]}, timeout=30
            ).json()
            answered(running.rest_url, ticket["id"])
            wait_until(arrived, timeout=30, what=f"the notice on {kind}")
    assert notices == [{"id": ticket["id"], "model": "digits", "state": "done", "status": 200, "url": ticket["url"]}]
