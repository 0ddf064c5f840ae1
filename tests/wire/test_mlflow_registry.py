"""MLflow's model registry as a model source, against a real ``mlflow server``: its versions serve, its aliases route.

One tracking server for the module (SQLite store, artifacts served by it), a registered model ``wb-iris`` of two
versions that answer 1.0 and 2.0 whatever they are asked, and two replicas polling it: ``reader`` leaves the routing
to the registry (``--mlflow_write_aliases`` off) and serves the model three ways (``models:/wb-iris``, its
``@champion`` and the first version's run, ``runs:/<run>/model``); ``writer`` may move the aliases.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from replica import REACH_TIMEOUT_S, Replica
from waiting import wait_until

from workbench.config.options import ModelConfig
from workbench.core.errors import Code, ServingError
from workbench.models.manager import Manager
from workbench.models.mlflow_registry import MlflowRegistry
from workbench.models.routing.mlflow_aliases import (
    CANARY_WEIGHT_TAG,
    ROUTING_TAG,
    AliasNames,
    MlflowAliasStore,
)
from workbench.models.routing.policy import Routing
from workbench.models.routing.routing_file import RoutingConflict
from workbench.models.source import RepositorySource
from workbench.runtime import mlflow_uris

mlflow = pytest.importorskip("mlflow")

MODEL = "wb-iris"
START_TIMEOUT_S = 240  # the tracking server's first start migrates its database: tens of seconds on a busy machine
ROW = {"instances": [[5.1, 3.5, 1.4, 0.2]]}


# ------------------------------------------------------------------------------------------------ fixtures
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on a free port, with a SQLite store and artifacts it serves itself."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        *(sys.executable, "-m", "mlflow", "server"),
        *("--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"),
        *("--artifacts-destination", str(root / "artifacts"), "--serve-artifacts"),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    # Its job runner (a dozen helper processes) is for MLflow's GenAI features, none of which this module uses.
    environment = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log_path = root / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=root, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            return requests.get(f"{url}/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(healthy, timeout=START_TIMEOUT_S, interval=0.2, what="mlflow server's /health")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def client(tracking_uri: str) -> Any:
    return mlflow.MlflowClient(tracking_uri, registry_uri=tracking_uri)


def _log_constant(constant: float, registered_model_name: str) -> str:
    """Log (and register) a model answering ``constant``; returns its run's id."""
    from sklearn.datasets import load_iris
    from sklearn.dummy import DummyRegressor

    features, target = load_iris(return_X_y=True)
    model = DummyRegressor(strategy="constant", constant=constant).fit(features, target)
    with mlflow.start_run() as run:
        mlflow.sklearn.log_model(
            model, name="model", registered_model_name=registered_model_name, pip_requirements=["scikit-learn"]
        )
    return str(run.info.run_id)


@pytest.fixture(scope="module")
def first_run(tracking_uri: str, client: Any) -> str:
    """``wb-iris`` versions 1 (answers 1.0) and 2 (2.0), ``champion`` at 1; returns version 1's run."""
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        run = _log_constant(1.0, MODEL)
        _log_constant(2.0, MODEL)
    finally:
        mlflow.set_tracking_uri(before)
    client.set_registered_model_alias(MODEL, "champion", "1")
    return run


def _start(workdir: Path, tracking_uri: str, models: dict[str, str], *flags: str) -> Replica:
    config = workdir / "models.config"
    workdir.mkdir(parents=True, exist_ok=True)
    entries = "".join(f'  config {{ name: "{name}" base_path: "{path}" }}\n' for name, path in models.items())
    config.write_text(f"model_config_list {{\n{entries}}}\n")
    return Replica(
        workdir,
        f"--model_config_file={config}",
        "--file_system_poll_wait_seconds=0.5",
        f"--mlflow_tracking_uri={tracking_uri}",
        *flags,
    )


@pytest.fixture(scope="module")
def logged_model_id(client: Any, first_run: str) -> str:
    """The id MLflow 3 gave the model the first run logged ("m-" and 32 hex digits)."""
    run = client.get_run(first_run)
    (logged,) = client.search_logged_models(
        experiment_ids=[run.info.experiment_id], filter_string=f"source_run_id = '{first_run}'"
    )
    return str(logged.model_id)


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, tracking_uri: str, first_run: str, logged_model_id: str
) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("replicas")
    reader_models = {
        "iris": f"models:/{MODEL}",
        "champion": f"models:/{MODEL}@champion",
        "run": f"runs:/{first_run}/model",
        "logged": f"models:/{logged_model_id}",
    }
    reader = _start(root / "reader", tracking_uri, reader_models)
    writer = _start(root / "writer", tracking_uri, {"iris": f"models:/{MODEL}"}, "--mlflow_write_aliases")
    try:
        yield reader.wait_ready(), writer.wait_ready()
    finally:
        reader.stop()
        writer.stop()


def answer(replica: Replica, name: str) -> float | None:
    r = requests.post(f"{replica.rest_url}/v1/models/{name}:predict", json=ROW, timeout=30)
    return float(r.json()["predictions"][0]) if r.status_code == 200 else None


def follows(replicas: tuple[Replica, ...], check: Callable[[Replica], bool], what: str) -> None:
    for replica in replicas:
        wait_until(lambda r=replica: check(r), timeout=REACH_TIMEOUT_S, interval=0.1, what=what)


def aliases(client: Any) -> dict[str, str]:
    return dict(client.get_registered_model(MODEL).aliases)


# --------------------------------------------------------------------------------------------------- tests
def test_the_registry_versions_serve_and_the_stable_alias_routes(replicas, client):
    reader, writer = replicas
    both = (reader, writer)
    # latest(1) serves version 2, and champion's version 1 is loaded as the stable one, the default
    follows(both, lambda r: r.states("iris") == {"1": "AVAILABLE", "2": "AVAILABLE"}, "the registry's versions")
    follows(both, lambda r: r.model("iris")["stable"] == 1 and answer(r, "iris") == 1.0, "champion as the stable")
    assert requests.post(f"{reader.rest_url}/v1/models/iris/versions/2:predict", json=ROW, timeout=30).json() == {
        "predictions": [2.0]
    }
    # a version of its own: models:/NAME@ALIAS serves the alias's version, runs:/ the run's model as version 1
    assert reader.states("champion") == {"1": "AVAILABLE"} and answer(reader, "champion") == 1.0
    assert reader.states("run") == {"1": "AVAILABLE"} and answer(reader, "run") == 1.0

    client.set_registered_model_alias(MODEL, "champion", "2")  # moved in MLflow: every replica follows
    follows(both, lambda r: r.model("iris")["stable"] == 2 and answer(r, "iris") == 2.0, "the moved champion")
    follows((reader,), lambda r: r.states("champion").get("2") == "AVAILABLE", "models:/NAME@champion following it")
    follows((reader,), lambda r: answer(r, "champion") == 2.0, "the alias's new version answering")

    # the challenger is the canary, its share the model's tag
    client.set_registered_model_alias(MODEL, "challenger", "1")
    client.set_registered_model_tag(MODEL, CANARY_WEIGHT_TAG, "0.5")
    follows(both, lambda r: r.model("iris")["canary"] == {"version": 1, "weight": 0.5}, "the challenger as canary")
    client.delete_registered_model_alias(MODEL, "challenger")
    client.delete_registered_model_tag(MODEL, CANARY_WEIGHT_TAG)
    follows(both, lambda r: r.model("iris")["canary"] is None, "the challenger's end")


def test_an_mlflow_3_logged_model_serves_by_its_id(replicas, logged_model_id):
    """models:/m-<id> names a logged model, as MLflow resolves it (not a registered model of that name)."""
    reader, _ = replicas
    assert logged_model_id.startswith("m-")
    wait_until(lambda: reader.states("logged") == {"1": "AVAILABLE"}, timeout=REACH_TIMEOUT_S, what="the logged model")
    assert answer(reader, "logged") == 1.0


def test_without_alias_writes_the_registry_owns_the_routing(replicas, client):
    reader, _ = replicas
    before = aliases(client)
    for target, body in (
        ("iris:promote", {"version": 1}),
        ("iris:rollback", {}),
        ("iris:canary", {"version": 1, "weight": 0.5}),
    ):
        refused = reader.manage(target, body)
        assert refused.status_code == 400, (target, refused.text)  # FAILED_PRECONDITION
        message = refused.json()["error"]
        assert message.startswith("The routing of model iris cannot be changed: "), message
        assert "the MLflow registry owns this model's routing" in message and "--mlflow_write_aliases" in message
    refused = reader.manage("champion:promote", {"version": 2})  # one version, following an alias: nothing to route
    assert refused.status_code == 400 and "Move the alias in MLflow" in refused.json()["error"], refused.text
    assert aliases(client) == before


def test_promote_canary_and_rollback_move_the_aliases_and_every_replica_follows(replicas, client):
    reader, writer = replicas
    both = (reader, writer)
    follows(both, lambda r: r.model("iris")["stable"] == 2, "champion at 2 (the first test)")

    promoted = writer.manage("iris:promote", {"version": 1})
    assert promoted.status_code == 200, promoted.text
    assert aliases(client)["champion"] == "1"
    follows(both, lambda r: r.model("iris")["stable"] == 1 and answer(r, "iris") == 1.0, "the promotion")

    canary = writer.manage("iris:canary", {"version": 2, "weight": 0.25})
    assert canary.status_code == 200, canary.text
    model = client.get_registered_model(MODEL)
    assert model.aliases["challenger"] == "2" and float(model.tags[CANARY_WEIGHT_TAG]) == 0.25
    follows(both, lambda r: r.model("iris")["canary"] == {"version": 2, "weight": 0.25}, "the canary")

    ended = writer.manage("iris:canary", {"version": 2, "weight": 0})
    assert ended.status_code == 200, ended.text
    model = client.get_registered_model(MODEL)
    assert "challenger" not in model.aliases and CANARY_WEIGHT_TAG not in model.tags

    rolled_back = writer.manage("iris:rollback", {})
    assert rolled_back.status_code == 200, rolled_back.text
    assert aliases(client)["champion"] == "2"  # back to the champion before the promotion
    follows(both, lambda r: r.model("iris")["stable"] == 2 and answer(r, "iris") == 2.0, "the rollback")
    generation = json.loads(client.get_registered_model(MODEL).tags[ROUTING_TAG])["generation"]
    follows(both, lambda r: r.model("iris")["generation"] == generation, "one generation on both replicas")


def test_the_alias_store_refuses_a_write_based_on_what_moved_since(client, first_run):
    name = "wb-store"
    client.create_registered_model(name)
    source = f"runs:/{first_run}/model"
    for _ in range(3):
        client.create_model_version(name, source=source, run_id=first_run)
    store = MlflowAliasStore(lambda: client, name, AliasNames(), writable=True, registry="test")
    assert store.read() is None  # nothing stored yet

    written = store.write(Routing(stable=1), store.read() or _nothing())
    assert (written.routing.stable, written.generation) == (1, 1)
    assert client.get_registered_model(name).aliases == {"champion": "1"}

    client.set_registered_model_alias(name, "champion", "2")  # by hand, in MLflow
    moved = store.read()
    assert moved is not None and moved.routing.stable == 2
    assert moved.routing.history == (1,)  # a rollback returns to the champion it left
    with pytest.raises(RoutingConflict):
        store.write(Routing(stable=3), written)  # based on what was read before the hand move: nothing written
    assert client.get_registered_model(name).aliases == {"champion": "2"}

    again = store.write(Routing(stable=3, history=(1, 2)), moved)
    assert (again.routing.stable, again.routing.history, again.generation) == (3, (1, 2), 2)


def test_a_version_whose_download_fails_leaves_what_serves(replicas, client, first_run):
    reader, writer = replicas
    run = client.get_run(first_run)
    broken = client.create_model_version(MODEL, source=f"{run.info.artifact_uri}/missing", run_id=first_run)
    version = str(broken.version)
    for replica in (reader, writer):
        wait_until(
            lambda r=replica: r.states("iris").get(version) == "END",
            timeout=REACH_TIMEOUT_S,
            what=f"version {version}'s failed load",
        )
        assert answer(replica, "iris") == 2.0  # the stable version serves on
        states = replica.states("iris")
        assert states["2"] == "AVAILABLE", states
    detail = requests.get(f"{reader.rest_url}/v1/models/iris", timeout=10).json()["model_version_status"]
    failed = next(s for s in detail if s["version"] == version)
    assert failed["status"]["error_code"] != "OK" and failed["status"]["error_message"], failed


def _nothing() -> Any:
    from workbench.models.routing.routing_file import NOTHING_STORED

    return NOTHING_STORED


class CountingClient:
    """An ``MlflowClient`` that counts the calls made of it: each one call is one request to the tracking server
    (a version search of fewer than a page of versions included)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted


def _refuse_to_load(name: str, version: int, path: str, platform: str) -> Any:
    raise ServingError(Code.UNAVAILABLE, "this test counts the registry's requests and loads nothing")


def test_a_poll_asks_the_registry_once_about_a_registered_model(tracking_uri, first_run):
    """A poll of a server of models:/NAME, models:/NAME@champion and models:/NAME/1 asks the registry for NAME's
    versions once and for the registered model (its aliases and tags) once: the version listing, the routing and
    the other two models share the answers. A management change's read asks afresh."""
    registry = MlflowRegistry(tracking_uri)
    counting = CountingClient(mlflow_uris.client(tracking_uri))
    registry._client = counting
    manager = Manager(_refuse_to_load, routing_stores=registry.routing_store)
    try:
        manager.set_models(
            [
                ModelConfig("iris", f"models:/{MODEL}"),
                ModelConfig("champion", f"models:/{MODEL}@champion"),
                ModelConfig("first", f"models:/{MODEL}/1"),
            ]
        )
        source = RepositorySource(manager, poll_wait_seconds=60.0, registry=registry)
        for _ in range(2):
            counting.calls.clear()
            source.poll()
            assert counting.calls == {"search_model_versions": 1, "get_registered_model": 1}
        listed = {entry["version"] for entry in manager.served.describe("iris")[0]["versions"]}
        assert {1, 2} <= listed and {v["version"] for v in manager.served.describe("first")[0]["versions"]} == {1}
        counting.calls.clear()
        manager.reread_routing("iris")
        assert counting.calls == {"get_registered_model": 1}
    finally:
        manager.stop()
