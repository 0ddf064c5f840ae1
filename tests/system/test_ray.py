"""workbench on Ray Serve, on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``), with the real clients.

One cluster for the module: a head node with no CPUs (it runs Serve's controller and the HTTP and gRPC proxies the
clients talk to, which need none) and two worker nodes of one CPU each, so that with ``num_cpus=1`` per replica each
worker holds exactly one replica and removing a worker removes a replica, never the proxies. Every test deploys its
own application and Serve is shut down after it: gRPC calls without ``application`` metadata only route while one
Serve application exists, which is how TF Serving's clients call.

What Ray guarantees when a replica's node goes away (read in ``ray/serve/_private/router.py`` and
``deployment_state.py``, Ray 2.60):

- Draining a node (the GCS ``DrainNode`` call the autoscaler makes before it removes one) makes Serve's controller
  *migrate* each replica on it: the replacement starts on another node first, the old replica becomes
  ``PENDING_MIGRATION`` and is only stopped, gracefully (it finishes its requests, ``graceful_shutdown_timeout_s``),
  once the replacement runs. No request needs to fail, and none does here.
- A node that dies abruptly takes its replicas' in-flight requests with it: the router does not resend a request a
  replica had already accepted (it cannot know whether it ran), so the caller gets an error (Ray's HTTP proxy: 500).
  A request that had not yet been accepted is retried on another replica: the router first asks a replica to
  reserve a slot (``max_ongoing_requests`` is enforced replica-side), and an ``ActorDiedError`` or
  ``ActorUnavailableError`` at that step, or a rejection, sends the request back to be routed again; the first
  ``ActorDiedError`` also takes the dead replica out of the router's set before the controller says so. Failures
  are therefore bounded by the requests executing on the lost replica at that moment: with 4 closed-loop clients,
  at most 4. The controller then replaces the replica on a node with room.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai
import pytest
import ray
import ray._private.state
import requests
from ray import serve
from ray.cluster_utils import Cluster

# Loads TF Serving's protos without importing TensorFlow: must come before tensorflow_serving.apis.
import workbench.runtime.tensorflow_protos  # isort: skip
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tritonclient.utils import InferenceServerException

import workbench.ray
from tests.text_models import HASHER, PARROT, TEMPLATED, TICKER, chat, hashed, openai_client, write_model
from tests.waiting import free_port, patient_ray_nodes, process_gone, start_ray_node, wait_until
from workbench import demo
from workbench.jupyter import server_records as registry
from workbench.notebook.widgets import LiveChart
from workbench.protocol.tensor_proto import from_numpy, to_numpy
from workbench.ray import RayDeployment
from workbench.ray.grpc_methods import SERVICER_FUNCTIONS

MODEL = "half_plus_two"
OBJECT_STORE_BYTES = 80 * 1024**2  # Ray's floor is 75 MiB; the tests move no large objects
REPLICA_HEADER = "x-workbench-replica"
VERSION_HEADER = "x-model-version"
REPLICA_METADATA = "workbench-replica"
# One replica per worker node: the workers have one CPU each and the head none.
ONE_PER_WORKER = {"num_cpus": 1}
SERVE_ACTOR_PREFIXES = ("ServeReplica", "ServeController", "ProxyActor")
# pytest-timeout's limit for the tests below, a net for a hang and no more: their own waits (wait_until, a node's
# start, Serve's proxies) bound each step. With both cores of a 2-core machine burnt (`make test-busy`) those waits
# add up to several minutes, and limits of 4 to 5 minutes cut the autoscaling and node-removal tests short.
PATIENCE = 1500
# How long Ray's machinery may take on a machine busy with other work (CI's, or `make test-busy`): nets, not
# expectations, every wait returns as soon as its condition holds. A new replica's start (a worker process importing
# workbench and loading the model) while clients load the cluster: on a busy CI machine a replica sat STARTING for
# over two minutes, and once for five, while Ray still started its workers at nice 15 (tests/waiting.py's
# patient_ray_nodes now starts them at the tests' own priority).
REPLICA_START = 300
# A RUNNING replica reached through the proxies (which learn of it by long poll), and what it exports reaching Ray's
# metrics agents.
ROUTED = 180
# Serve's actors and Ray's processes gone after a shutdown.
GONE = 180
pytestmark = pytest.mark.timeout(PATIENCE)


# ------------------------------------------------------------------------------------------------------ fixtures
@dataclasses.dataclass
class RayCluster:
    """The module's cluster and the metrics port of each of its nodes."""

    cluster: Cluster
    metrics_ports: dict[str, int]  # node id (hex) → the port its metrics agent exports on

    def add_worker(self) -> Any:
        port = free_port()
        node = start_ray_node(
            lambda: self.cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES, metrics_export_port=port)
        )
        self.metrics_ports[node.node_id] = port
        return node

    def worker(self, node_id: str) -> Any:
        return next(node for node in self.cluster.worker_nodes if node.node_id == node_id)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    with patient_ray_nodes(), monkeypatched_environment(AUTOSCALING_METRICS_EVERY_HALF_SECOND):
        yield from _ray_cluster()  # the module's nodes, the ones tests add included, patient on a busy machine too


# Serve's handles and replicas push their request counts to the controller every 10 s, and the controller drops a
# handle's counts not renewed within 10 s: on a busy machine a push came late, the counts were dropped as often as
# they came, and the autoscaling test waited in vain for the second replica. Ray's own autoscaling tests push faster.
AUTOSCALING_METRICS_EVERY_HALF_SECOND = {
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
}


@contextlib.contextmanager
def monkeypatched_environment(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in ``os.environ`` while inside (the Ray processes started meanwhile inherit them)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        yield


def _ray_cluster() -> Iterator[RayCluster]:
    head_metrics_port = free_port()
    cluster = Cluster()  # its head is its first node
    start_ray_node(
        lambda: cluster.add_node(
            num_cpus=0,
            object_store_memory=OBJECT_STORE_BYTES,
            include_dashboard=False,
            metrics_export_port=head_metrics_port,
            _system_config={
                # Ray metrics reach the agents' /metrics every second instead of every 10 s.
                "metrics_report_interval_ms": 1000,
                # A node killed without a word is declared dead after ~3 s instead of ~15 s (the abrupt-removal
                # test waits for it); still loose enough for a busy 2-core machine.
                "health_check_period_ms": 1000,
                "health_check_failure_threshold": 3,
            },
        )
    )
    nodes = RayCluster(cluster, {cluster.head_node.node_id: head_metrics_port})
    try:
        for _ in range(2):
            nodes.add_worker()
        ray.init(address=cluster.address, log_to_driver=False)
        yield nodes
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """half_plus_two in two versions: 1 answers 0.5x + 2, 2 answers 0.5x + 3."""
    store = tmp_path_factory.mktemp("ray-store")
    demo.save_half_plus_two(store / "1")
    demo.save_half_plus_two(store / "2", offset=3.0)
    return store


@pytest.fixture
def repository(tmp_path: Path, model_store: Path) -> Path:
    """A repository of the test's own (promotions write ``routing.json`` into it), seen by every node."""
    root = tmp_path / "repository"
    shutil.copytree(model_store, root / MODEL)
    return root


@pytest.fixture
def deploy(ray_cluster: RayCluster, repository: Path) -> Iterator[Callable[..., RayDeployment]]:
    """``deploy(**options)``: workbench.ray.deploy on the module's cluster, on fresh ports; Serve stops after."""

    def start(**options: Any) -> RayDeployment:
        options.setdefault("http_port", free_port())
        options.setdefault("grpc_port", free_port())
        options.setdefault("ray_actor_options", ONE_PER_WORKER)
        if "autoscaling_config" not in options:
            options.setdefault("num_replicas", 2)
        deployment = workbench.ray.deploy(repository, **options)
        wait_until(
            lambda: replica_states(deployment) == running(replica_count(options)), REPLICA_START, 0.2, "replicas up"
        )
        return deployment

    try:
        yield start
    finally:
        serve.shutdown()  # idempotent; also when a test failed half-way
        wait_until(lambda: not alive_serve_actors(), GONE, 0.2, "Serve's actors gone before the next test")


def replica_count(options: dict[str, Any]) -> int:
    autoscaling = options.get("autoscaling_config")
    return int(autoscaling["min_replicas"]) if autoscaling else int(options["num_replicas"])


def running(count: int) -> dict[str, int]:
    return {"RUNNING": count}


def replica_states(deployment: RayDeployment) -> dict[str, int]:
    """``{"RUNNING": 2}``: the deployment's replicas by state (states with none left out)."""
    return {state: n for state, n in deployment.status()["replicas"].items() if n}


def alive_serve_actors() -> list[dict[str, Any]]:
    """Serve's live actors (replicas, controller, proxies), from the GCS actor table (no dashboard needed)."""
    return [
        actor
        for actor in ray._private.state.actors().values()
        if actor["State"] == "ALIVE" and actor["ActorClassName"].startswith(SERVE_ACTOR_PREFIXES)
    ]


def replica_nodes() -> dict[str, str]:
    """Live replica actor id → the id of the node it runs on."""
    return {
        actor["ActorID"]: actor["Address"]["NodeID"]
        for actor in alive_serve_actors()
        if actor["ActorClassName"].startswith("ServeReplica")
    }


# ------------------------------------------------------------------------------------------------------ clients
def predict_body(*xs: float) -> dict[str, Any]:
    return {"instances": [[x] for x in xs]}


def rest_predict(session: requests.Session, deployment: RayDeployment, *xs: float) -> requests.Response:
    return session.post(f"{deployment.rest_url}/v1/models/{MODEL}:predict", json=predict_body(*xs), timeout=30)


def fresh_predict(deployment: RayDeployment, *xs: float) -> requests.Response:
    """A predict on a new connection.

    On a one-machine Cluster every node's proxy listens on the same 127.0.0.1 port (Ray sets SO_REUSEPORT), so
    the kernel hands each connection to any node's proxy, and a proxy on a worker node prefers the replica on its
    own node: all of one keep-alive connection's requests (or one gRPC channel's) may go to one replica. A test that
    needs to see every replica opens a connection a request, as many independent clients do.
    """
    return requests.post(
        f"{deployment.rest_url}/v1/models/{MODEL}:predict",
        json=predict_body(*xs),
        headers={"Connection": "close"},
        timeout=30,
    )


def answering_replicas(deployment: RayDeployment, requests_made: int = 20) -> set[str]:
    """The replicas that answered ``requests_made`` predicts, each on a new connection; every one must succeed."""
    replicas = set()
    for _ in range(requests_made):
        r = fresh_predict(deployment, 1.0)
        assert r.status_code == 200, r.text
        replicas.add(r.headers[REPLICA_HEADER])
    return replicas


def predict_request(name: str = MODEL, input_name: str = "x") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    from_numpy(np.array([[1.0], [2.0]], dtype=np.float32), request.inputs[input_name])
    return request


def grpc_code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code()  # type: ignore[no-any-return]


def triton_status(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as failed:
        call()
    return str(failed.value.status())


@dataclasses.dataclass
class Answer:
    at: float  # time.monotonic() when it came back
    status: int  # HTTP status, or -1 for an error without one (connection refused, timeout)
    replica: str = ""
    version: str = ""
    error: str = ""


class ClientLoad:
    """``clients`` closed-loop REST clients (one ``requests.Session`` each) predicting until stopped."""

    def __init__(self, deployment: RayDeployment, clients: int) -> None:
        self.deployment = deployment
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                try:
                    r = rest_predict(session, self.deployment, 1.0)
                    answer = Answer(
                        time.monotonic(),
                        r.status_code,
                        r.headers.get(REPLICA_HEADER, ""),
                        r.headers.get(VERSION_HEADER, ""),
                        "" if r.status_code == 200 else r.text[:300],
                    )
                except requests.RequestException as exc:
                    answer = Answer(time.monotonic(), -1, error=repr(exc)[:300])
                with self._lock:
                    self.answers.append(answer)

    def since(self, moment: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.at >= moment]

    def failures(self, since: float = 0.0) -> list[Answer]:
        return [a for a in self.since(since) if a.status != 200]

    def replicas(self, since: float = 0.0) -> set[str]:
        return {a.replica for a in self.since(since) if a.status == 200}

    def __enter__(self) -> ClientLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


# --------------------------------------------------------------------------------------------------------- tests
def test_two_replicas_answer_every_protocol_export_their_series_and_shut_down_clean(
    ray_cluster: RayCluster, deploy: Callable[..., RayDeployment], runtime_dir: Path, repository: Path
) -> None:
    """One deployment, four looks at it in turn (a deployment takes ~20 s to start, more on a busy machine)."""
    for name, source in (("parrot", PARROT), ("hasher", HASHER), ("ticker", TICKER), ("templated", TEMPLATED)):
        write_model(repository, name, source)
    deployment = deploy(num_replicas=2, serve_flags=["--allow_python_models"])
    assert len(set(replica_nodes().values())) == 2, "one replica on each worker node"
    _answers_every_protocol_through_rays_proxies(deployment)
    _answers_openais_client_through_rays_http_proxy(deployment, repository)
    _exports_the_per_version_series_on_each_replicas_node(ray_cluster, deployment)
    _is_listed_for_jupyter_and_shuts_down_leaving_no_actor_or_process(deployment)


def _answers_every_protocol_through_rays_proxies(deployment: RayDeployment) -> None:
    """TF Serving's REST and gRPC APIs and v2 (Triton's clients), from both replicas, with precise error codes."""

    # TF Serving's REST API through Ray's HTTP proxy: the latest version (2: 0.5x + 3) answers, and says so.
    rest_replicas: set[str] = set()
    with requests.Session() as session:

        def both_replicas_answered() -> bool:
            r = fresh_predict(deployment, 1.0, 2.0)
            assert r.status_code == 200, r.text
            assert r.json() == {"predictions": [[3.5], [4.0]]}
            assert r.headers[VERSION_HEADER] == "2"
            rest_replicas.add(r.headers[REPLICA_HEADER])
            return len(rest_replicas) == 2

        # Ray's proxy learns of a new replica by long poll, shortly after the controller reports it RUNNING.
        wait_until(both_replicas_answered, ROUTED, 0.0, "both replicas answering REST")

        # Precise codes through Ray: an unknown model is 404, a malformed body 400 (never a 500).
        r = session.post(f"{deployment.rest_url}/v1/models/nope:predict", json=predict_body(1.0), timeout=30)
        assert r.status_code == 404, r.text
        assert "nope" in r.json()["error"]
        r = session.post(f"{deployment.rest_url}/v1/models/{MODEL}:predict", data=b"{not json", timeout=30)
        assert r.status_code == 400, r.text
        r = session.post(f"{deployment.rest_url}/v1/models/{MODEL}:predict", json={"instances": "x"}, timeout=30)
        assert r.status_code == 400, r.text

    # TF Serving's gRPC API through Ray's gRPC proxy, with the stubs TF Serving clients use, no extra metadata.
    with grpc.insecure_channel(deployment.grpc_target) as channel:
        prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        grpc_replicas: set[str] = set()

        def both_replicas_answered_grpc() -> bool:
            # A channel a call, for the reason fresh_predict gives: one channel's calls may stay on one replica.
            with grpc.insecure_channel(deployment.grpc_target) as own_channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(own_channel)
                response, call = stub.Predict.with_call(predict_request(), timeout=30)
            assert response.model_spec.name == MODEL
            assert response.model_spec.version.value == 2
            np.testing.assert_allclose(to_numpy(response.outputs["y"], "y"), [[3.5], [4.0]])
            grpc_replicas.update(value for key, value in call.trailing_metadata() if key == REPLICA_METADATA)
            return len(grpc_replicas) == 2

        wait_until(both_replicas_answered_grpc, ROUTED, 0.0, "both replicas answering gRPC")
        assert grpc_replicas == rest_replicas, "the same replicas, under the same ids"

        metadata_request = get_model_metadata_pb2.GetModelMetadataRequest()
        metadata_request.model_spec.name = MODEL
        metadata_request.metadata_field.append("signature_def")
        metadata = prediction.GetModelMetadata(metadata_request, timeout=30)
        assert metadata.model_spec.version.value == 2
        signatures = get_model_metadata_pb2.SignatureDefMap()
        metadata.metadata["signature_def"].Unpack(signatures)
        assert list(signatures.signature_def["serving_default"].inputs) == ["x"]

        assert grpc_code(lambda: prediction.Predict(predict_request(name="nope"), timeout=30)) == (
            grpc.StatusCode.NOT_FOUND
        )
        assert grpc_code(lambda: prediction.Predict(predict_request(input_name="not_x"), timeout=30)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        reload = model_management_pb2.ReloadConfigRequest()
        assert grpc_code(lambda: models.HandleReloadConfigRequest(reload, timeout=30)) == (
            grpc.StatusCode.UNIMPLEMENTED
        )

    # The Open Inference Protocol (v2) with Triton's own clients, over Ray's gRPC and HTTP proxies.
    x = np.array([[1.0], [2.0]], dtype=np.float32)
    with triton_grpc.InferenceServerClient(deployment.grpc_target) as client:
        assert client.is_server_live()
        v2_input = triton_grpc.InferInput("x", list(x.shape), "FP32")
        v2_input.set_data_from_numpy(x)
        result = client.infer(MODEL, [v2_input])
        np.testing.assert_allclose(result.as_numpy("y"), [[3.5], [4.0]])
        assert result.get_response().model_version == "2"
        assert triton_status(lambda: client.infer("nope", [v2_input])) == "StatusCode.NOT_FOUND"
    http_client = triton_http.InferenceServerClient(f"{deployment.host}:{deployment.http_port}")
    try:
        v2_input_http = triton_http.InferInput("x", list(x.shape), "FP32")
        v2_input_http.set_data_from_numpy(x)
        result_http = http_client.infer(MODEL, [v2_input_http])
        np.testing.assert_allclose(result_http.as_numpy("y"), [[3.5], [4.0]])
        assert result_http.get_response()["model_version"] == "2"
        assert triton_status(lambda: http_client.infer("nope", [v2_input_http])) == "404"
    finally:
        http_client.close()


def _answers_openais_client_through_rays_http_proxy(deployment: RayDeployment, repository: Path) -> None:
    """OpenAI's endpoints on the application's REST address, with OpenAI's own client: chat (whole, streamed with
    the usage chunk, with the model's own chat template), completions, embeddings, the models, errors in OpenAI's
    shape, and a client leaving mid-stream, which closes the model's generator in the replica."""
    with openai_client(deployment.rest_url) as client:
        assert {"parrot", "parrot:1", "hasher", "templated"} <= {model.id for model in client.models.list()}
        answer = chat(client, "one two three", temperature=0)
        assert answer.choices[0].message.content == "three two one " and answer.usage.completion_tokens == 3
        streamed = list(
            client.chat.completions.create(
                model="parrot",
                messages=[{"role": "user", "content": "a b c"}],
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "c b a "
        assert streamed[-1].choices == [] and streamed[-1].usage.completion_tokens == 3
        templated = chat(client, "hi", model="templated")
        assert templated.choices[0].message.content == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert client.completions.create(model="parrot", prompt="x y", temperature=0).choices[0].text == "y x "
        vectors = client.embeddings.create(model="hasher", input=["a b", "c"])
        np.testing.assert_allclose(vectors.data[0].embedding, hashed("a b"), rtol=1e-6)
        with pytest.raises(openai.NotFoundError):
            chat(client, "hi", model="nope")
        with pytest.raises(openai.BadRequestError) as refused:
            chat(client, "hi", logit_bias={"1": 5})
        assert refused.value.param == "logit_bias"

        go = [{"role": "user", "content": "go"}]
        ticks = client.chat.completions.create(model="ticker", messages=go, stream=True)
        assert len(list(itertools.islice(ticks, 3))) == 3
        ticks.close()
    closed = repository / "ticker" / "1" / "closed.txt"
    wait_until(closed.exists, ROUTED, 0.1, "the ticker's generator closed in the replica once its client left")
    retrieved = requests.get(f"{deployment.rest_url}/openai/v1/models/parrot", timeout=30)
    assert retrieved.status_code == 200 and retrieved.json()["id"] == "parrot", retrieved.text


def test_a_promotion_through_the_management_api_reaches_every_replica(
    deploy: Callable[..., RayDeployment],
) -> None:
    # Replicas re-read the repository's routing.json every half second.
    deployment = deploy(num_replicas=2, serve_flags=["--file_system_poll_wait_seconds=0.5"])
    with requests.Session() as session:
        assert rest_predict(session, deployment, 1.0).headers[VERSION_HEADER] == "2"

        # One replica takes the promotion (through Ray's HTTP proxy) and writes it into the repository.
        r = session.post(f"{deployment.rest_url}/workbench/v1/models/{MODEL}:promote", json={"version": 1}, timeout=300)
        assert r.status_code == 200, r.text

        def promoted_everywhere() -> bool:
            """20 answers in a row from version 1 (0.5x + 2), from both replicas."""
            answers = [fresh_predict(deployment, 1.0) for _ in range(20)]
            return (
                all(
                    a.status_code == 200 and a.headers[VERSION_HEADER] == "1" and a.json() == {"predictions": [[2.5]]}
                    for a in answers
                )
                and len({a.headers[REPLICA_HEADER] for a in answers}) == 2
            )

        wait_until(promoted_everywhere, ROUTED, 0.1, "every replica answering from the promoted version 1")

    # The dashboard on the application's REST address: the stats (and their stream, through Ray's proxy) describe
    # both replicas, whichever answers, and the live chart fills from them.
    stats = requests.get(f"{deployment.rest_url}/workbench/v1/stats", timeout=30).json()
    assert sorted(row["answered"] for row in stats["workers"]) == [True, True]
    chart = LiveChart(deployment.rest_url, window_seconds=5, interval=0.1, min_redraw_seconds=0.1)
    try:
        for _ in range(20):
            assert fresh_predict(deployment, 1.0).status_code == 200
        wait_until(lambda: chart.points(MODEL, 1) >= 3, ROUTED, 0.1, "the live chart's points from Ray's proxy")
    finally:
        chart.close()
    assert chart.threads == []

    # Every request this test made is counted, on one replica or the other (peers' figures lag by up to ~2 s).
    def counted() -> int:
        rows = requests.get(f"{deployment.rest_url}/workbench/v1/stats", timeout=30).json()["workers"]
        return sum(row.get("total_requests", 0) for row in rows)

    wait_until(lambda: counted() >= 40, ROUTED, 0.2, "both replicas' requests in the whole application's stats")


def test_autoscaling_goes_from_one_to_two_replicas_under_load(deploy: Callable[..., RayDeployment]) -> None:
    deployment = deploy(
        autoscaling_config={
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": 1,
            "upscale_delay_s": 0.5,
            "downscale_delay_s": 60,
            "metrics_interval_s": 0.2,
            "look_back_period_s": 1,
        }
    )
    assert replica_states(deployment) == running(1)
    with ClientLoad(deployment, clients=6) as load:
        wait_until(
            lambda: replica_states(deployment) == running(2),
            REPLICA_START,
            0.2,
            lambda: (
                f"a second replica under load (replicas: {replica_states(deployment)}, "
                f"{len(load.answers)} answers, failures: {load.failures()[-3:]})"
            ),
        )
        wait_until(lambda: len(answering_replicas(deployment)) == 2, ROUTED, 0.1, "both replicas answering")
    assert load.failures() == []
    assert len(load.answers) > 0
    print(f"\nautoscaling: {len(load.answers)} requests, 0 failures, 1 → 2 replicas")


def test_a_node_removed_under_load(ray_cluster: RayCluster, deploy: Callable[..., RayDeployment]) -> None:
    # The clients talk to the head node's proxy only. On this one-machine cluster every node's proxy would share
    # the port (SO_REUSEPORT), and removing a node kills its proxy with the connections it holds: that is the
    # load balancer's part on a real cluster (a proxy on a draining node answers 503 on /-/healthz), not Serve's.
    http_port, grpc_port = free_port(), free_port()
    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": "127.0.0.1", "port": http_port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": SERVICER_FUNCTIONS},
    )
    deployment = deploy(num_replicas=2, http_port=http_port, grpc_port=grpc_port)
    # The spare nodes, one for each removal, start before the clients do: a node started under their load lost
    # the race between its raylet and its dashboard agent (see tests/waiting.py's start_ray_node) again and again,
    # and each new start waited for a calm that the clients' load never let come.
    spares = {ray_cluster.add_worker().node_id for _ in range(2)}
    with ClientLoad(deployment, clients=4) as load:
        wait_until(lambda: len(answering_replicas(deployment)) == 2, ROUTED, 0.1, "both replicas answering")

        # (a) The graceful way: drain the node (as Ray's autoscaler does before it removes one), then remove it.
        from ray.core.generated import autoscaler_pb2

        drained_id = next(iter(replica_nodes().values()))
        gcs = ray._raylet.GcsClient(address=ray_cluster.cluster.gcs_address)
        accepted, why = gcs.drain_node(
            drained_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "workbench test: node going away",
            int(time.time() * 1000) + 60_000,
        )
        assert accepted, why
        wait_until(
            lambda: drained_id not in replica_nodes().values() and replica_states(deployment) == running(2),
            REPLICA_START,
            0.2,
            "the replica migrated off the draining node",
        )
        assert spares & set(replica_nodes().values()), "the replica migrated onto a spare node"
        ray_cluster.cluster.remove_node(ray_cluster.worker(drained_id))
        wait_until(lambda: len(answering_replicas(deployment)) == 2, ROUTED, 0.1, "both replicas answering")
        drained_failures = load.failures()
        drained_requests = len(load.answers)
        assert drained_failures == [], drained_failures

        # (b) Abruptly: kill a replica's node without a word (the other spare node has room for the replacement).
        killed_id = next(iter(replica_nodes().values()))
        killed_at = time.monotonic()
        ray_cluster.cluster.remove_node(ray_cluster.worker(killed_id), allow_graceful=False)
        wait_until(
            lambda: killed_id not in replica_nodes().values() and replica_states(deployment) == running(2),
            REPLICA_START,
            0.2,
            "the killed replica replaced",
        )
        recovered = time.monotonic()
        # The replacement's proxy route and first answer: over a minute with every core busy.
        wait_until(
            lambda: len(answering_replicas(deployment)) == 2, REPLICA_START, 0.1, "both replicas answering again"
        )
        served_again = time.monotonic()
    abrupt_failures = load.failures(since=killed_at)
    abrupt_requests = len(load.since(killed_at))
    print(
        f"\nnode removal under 4 clients: drained: {drained_requests} requests, {len(drained_failures)} failed; "
        f"killed: {abrupt_requests} requests after the kill, {len(abrupt_failures)} failed "
        f"({collections.Counter((a.status, a.error[:120]) for a in abrupt_failures)}); "
        f"replaced in {recovered - killed_at:.1f} s; replicas that answered the clients: {len(load.replicas())}"
    )
    # Only requests the killed replica had accepted fail: at most one per closed-loop client.
    assert len(abrupt_failures) <= 4, abrupt_failures
    # Ray's HTTP proxy answers 500 for a replica that died under a request, or, when the replica had already sent
    # the start of its answer, cuts that answer short (the client reads fewer bytes than announced). Never a hang
    # (a timeout), never a refused connection, never a wrong answer.
    assert {a.status for a in abrupt_failures} <= {500, -1}, abrupt_failures
    cut_short = [a for a in abrupt_failures if a.status == -1]
    assert all("IncompleteRead" in a.error or "Connection broken" in a.error for a in cut_short), abrupt_failures
    # ... and they all happened while the replica was being lost, none once the deployment was whole again.
    assert not load.failures(since=served_again)


def _series(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of metric ``name`` (a counter may carry ``_total``) in Prometheus text."""
    found = []
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:_total)?\{{(.*)\}} ", line)
        if match:
            found.append(dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1))))
    return found


def _exports_the_per_version_series_on_each_replicas_node(ray_cluster: RayCluster, deployment: RayDeployment) -> None:
    """Ray's metrics agent on each replica's node exports workbench's per-version request series: the answers of
    version 2 given so far, by protocol, labelled with the replica and the application."""
    worker_ports = [ray_cluster.metrics_ports[node] for node in set(replica_nodes().values())]
    replicas = wait_until(
        lambda: found if len(found := answering_replicas(deployment)) == 2 else None, ROUTED, 0.1, "both replicas"
    )
    protocols = {"rest", "grpc", "v2-rest", "v2-grpc"}  # what _answers_every_protocol_through_rays_proxies sent

    def exported_on_every_replica_node() -> list[dict[str, str]] | None:
        series = []
        for port in worker_ports:
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            found = [
                labels
                for labels in _series(text, "ray_workbench_requests")
                if labels.get("model") == MODEL
                and labels.get("version") == "2"
                and labels.get("code") == "OK"
                and labels.get("replica") in replicas  # this test's replicas, not earlier tests' on the node
            ]
            if not found:
                return None
            series.extend(found)
        return series if {labels["protocol"] for labels in series} == protocols else None

    series = wait_until(exported_on_every_replica_node, ROUTED, 0.5, "ray_workbench_requests on each replica's node")
    assert {labels["replica"] for labels in series} == replicas
    assert {labels["api"] for labels in series} == {"predict"}
    assert {labels["application"] for labels in series} == {deployment.name}


def _is_listed_for_jupyter_and_shuts_down_leaving_no_actor_or_process(deployment: RayDeployment) -> None:
    # Listed where JupyterLab's sidebar finds servers, at the application's REST address (this machine's proxy).
    (record,) = registry.list_servers()
    assert (record.rest_port, record.grpc_port, record.name) == (
        deployment.http_port,
        deployment.grpc_port,
        "repository (Ray Serve: workbench)",
    )
    actors = alive_serve_actors()
    kinds = collections.Counter(actor["ActorClassName"].split(":")[0] for actor in actors)
    assert kinds["ServeReplica"] == 2 and kinds["ServeController"] == 1 and kinds["ProxyActor"] >= 1, kinds
    with requests.Session() as session:
        health_pids = {session.get(f"{deployment.rest_url}/workbench/v1/health", timeout=30).json()["pid"]}
    replica_pids = {actor["Pid"] for actor in actors if actor["ActorClassName"].startswith("ServeReplica")}
    assert health_pids <= replica_pids

    deployment.shutdown()
    assert registry.list_servers() == []
    assert alive_serve_actors() == []
    for pid in (actor["Pid"] for actor in actors):
        wait_until(lambda pid=pid: process_gone(pid), GONE, 0.1, f"Serve's process {pid} gone")


def test_deploy_without_a_cluster_starts_a_local_ray_that_shutdown_stops(
    ray_cluster: RayCluster, repository: Path
) -> None:
    """deploy() with no Ray connected starts a local Ray of its own; shutdown() stops every process of it.

    ``address="local"``: with no address, Ray joins the cluster named in /tmp/ray/ray_current_cluster, which the
    module's cluster (or anyone's on this machine) wrote; "local" is Ray's word for a new one regardless.
    """
    ray.shutdown()  # leave the module's cluster running, unconnected
    try:
        # Its node is started as the module's are (start_ray_node): on a busy machine a raylet whose dashboard agent
        # wrote its port files late aborted, and Ray said "The current node timed out during startup".
        deployment = start_ray_node(
            lambda: workbench.ray.deploy(
                repository, num_replicas=1, http_port=free_port(), grpc_port=free_port(), address="local"
            )
        )
        try:
            r = requests.post(f"{deployment.rest_url}/v1/models/{MODEL}:predict", json=predict_body(1.0), timeout=60)
            assert r.status_code == 200 and r.json() == {"predictions": [[3.5]]}, r.text
            local = ray._private.worker._global_node
            assert local.gcs_address != ray_cluster.cluster.gcs_address, "a cluster of its own, not the module's"
            pids = [
                process.process.pid
                for kind, processes in local.all_processes.items()
                for process in processes
                if kind in ("raylet", "gcs_server")
            ]
            assert len(pids) == 2, local.all_processes
        finally:
            deployment.shutdown()
        assert not ray.is_initialized()
        for pid in pids:
            wait_until(lambda pid=pid: process_gone(pid), GONE, 0.1, f"local Ray process {pid} gone")
    finally:
        if ray.is_initialized():  # deploy() failed half-way: the local Ray it started stops
            ray.shutdown()
        ray.init(address=ray_cluster.cluster.address, log_to_driver=False)


def test_proxies_slower_to_start_than_rays_own_wait_are_waited_for(
    ray_cluster: RayCluster, repository: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ray's serve.start waits a minute for its proxies and raises after it, leaving them starting: a busy machine's
    `workbench ray deploy` failed so. deploy() waits for them itself (here Ray's wait is cut to a millisecond)."""
    import ray.serve._private.api as serve_api

    serve.shutdown()  # Serve starts anew, its proxies with it
    monkeypatch.setattr(serve_api, "HTTP_PROXY_TIMEOUT", 0.001)
    try:
        with caplog.at_level("WARNING", logger="workbench.ray.deployment"):
            deployment = workbench.ray.deploy(
                repository, num_replicas=1, http_port=free_port(), grpc_port=free_port(),
                ray_actor_options=ONE_PER_WORKER,
            )  # fmt: skip
        assert "proxies not available after 0.001s" in caplog.text  # Ray's wait did run out
        r = requests.post(f"{deployment.rest_url}/v1/models/{MODEL}:predict", json=predict_body(1.0), timeout=60)
        assert r.status_code == 200 and r.json() == {"predictions": [[3.5]]}, r.text
    finally:
        serve.shutdown()
        wait_until(lambda: not alive_serve_actors(), GONE, 0.2, "Serve's actors gone before the next test")


# ------------------------------------------------------------------------------------------- workbench ray (CLI)
def workbench_ray(*words: str, timeout: float = 480) -> subprocess.CompletedProcess[str]:
    """``workbench ray …`` as a user types it, in a process of its own (a driver of its own on the cluster). The
    limit is a net: `deploy` alone may wait 5 minutes for Serve's proxies on a busy machine (PROXY_START_SECONDS)."""
    command = [sys.executable, "-m", "workbench", "ray", *words]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def test_the_command_line_deploys_onto_a_cluster_reports_status_and_shuts_down(
    ray_cluster: RayCluster, repository: Path, tmp_path: Path
) -> None:
    address = ray_cluster.cluster.address
    http_port, grpc_port, ready_file = free_port(), free_port(), tmp_path / "ready.json"
    try:
        # With --address the application lives on the cluster once the command returns.
        deployed = workbench_ray(
            "deploy",
            f"--address={address}",
            f"--model_repository={repository}",
            "--num_replicas=1",
            "--num_cpus=1",
            f"--http_port={http_port}",
            f"--grpc_port={grpc_port}",
            f"--ready_file={ready_file}",
            "--",
            "--file_system_poll_wait_seconds=0.5",
        )
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        ready = json.loads(ready_file.read_text())
        assert ready["rest_url"] == f"http://127.0.0.1:{http_port}" and ready["grpc_port"] == grpc_port
        answer = requests.post(f"{ready['rest_url']}/v1/models/{MODEL}:predict", json=predict_body(1.0), timeout=60)
        assert answer.status_code == 200 and answer.json() == {"predictions": [[3.5]]}, answer.text

        status = workbench_ray("status", f"--address={address}")
        assert status.returncode == 0, status.stderr[-3000:]
        assert json.loads(status.stdout.strip().splitlines()[-1]) == {
            "name": "workbench",
            "status": "RUNNING",
            "message": "",
            "replicas": {"RUNNING": 1},
        }

        stopped = workbench_ray("shutdown", f"--address={address}")
        assert stopped.returncode == 0 and "Deleted 'workbench'" in stopped.stdout, stopped.stderr[-3000:]
        gone = workbench_ray("status", f"--address={address}")
        assert gone.returncode == 1 and '"status": "NOT_DEPLOYED"' in gone.stdout
        wait_until(lambda: not alive_serve_actors(), GONE, 0.2, "Serve's actors gone after `workbench ray shutdown`")
    finally:
        serve.shutdown()


def test_the_command_line_refuses_bad_flags_before_starting_ray(repository: Path) -> None:
    """Mistakes exit 2 with argparse's message, before any Ray starts (no cluster is named here)."""
    unknown = workbench_ray("deploy", f"--model_repository={repository}", "--", "--no_such_flag=1", timeout=300)
    assert unknown.returncode == 2 and "--no_such_flag" in unknown.stderr, unknown.stderr
    both = workbench_ray(
        "deploy", f"--model_repository={repository}", "--num_replicas=2", "--max_replicas=3", timeout=300
    )
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    # Ray's proxies own the ports: --openai_port is refused rather than leave OpenAI's endpoints nowhere.
    openai_port = workbench_ray("deploy", f"--model_repository={repository}", "--", "--openai_port=8001", timeout=300)
    assert openai_port.returncode == 2, openai_port.stderr
    assert "--openai_port: an embedded server (a Ray Serve replica) opens no ports" in openai_port.stderr
    typo = workbench_ray("deplyo", timeout=300)
    assert typo.returncode == 2 and "deploy" in typo.stderr
