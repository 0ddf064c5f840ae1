"""``%serve`` with MLflow's registry: ``%serve export ... --mlflow`` registers versions, ``%serve start`` serves
``models:/NAME`` with the MLflow flags, and promote, canary and rollback move the registered model's aliases.

The tracking store is a SQLite file in a temporary folder, named by ``MLFLOW_TRACKING_URI`` as a notebook names it
(the server process inherits it): MLflow's embedded default, no ``mlflow server``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell
from sklearn.datasets import load_iris
from sklearn.dummy import DummyRegressor
from waiting import wait_until

from workbench.models.routing.mlflow_aliases import CANARY_WEIGHT_TAG
from workbench.notebook.handle import ServerHandle, models_table_text, repository_location
from workbench.notebook.magics import ServingStatus
from workbench.notebook.versions_panel import routing_summary
from workbench.publishing import ExportResult

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    before = mlflow.get_tracking_uri()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        try:
            mlflow.set_experiment(experiment_id=mlflow.create_experiment("magics", str(root / "artifacts")))
            yield uri
        finally:
            mlflow.set_tracking_uri(before)


@pytest.fixture(scope="module")
def ip(ipython_shell: InteractiveShell) -> Iterator[InteractiveShell]:
    yield ipython_shell
    ipython_shell.run_line_magic("serve", "stop --all")


def constant(value: float) -> Any:
    features, target = load_iris(return_X_y=True)
    return DummyRegressor(strategy="constant", constant=value).fit(features, target)


def aliases(client: Any) -> dict[str, int]:
    return {alias: int(version) for alias, version in client.get_registered_model("wine").aliases.items()}


def test_the_handle_serves_a_base_path_naming_mlflow_with_its_flags() -> None:
    handle = ServerHandle(
        model_base_path="models:/wine",
        model_name="wine",
        mlflow_tracking_uri="sqlite:///x.db",
        mlflow_write_aliases=True,
    )
    command = handle.command()
    assert "--model_base_path=models:/wine" in command and "--model_name=wine" in command
    assert "--mlflow_tracking_uri=sqlite:///x.db" in command and "--mlflow_write_aliases" in command
    assert not any(word.startswith("--model_repository") for word in command)
    assert repository_location("models:/wine@champion") == "models:/wine@champion"  # no "://", still no folder
    assert "model wine from models:/wine" in repr(handle)


def test_export_start_canary_promote_and_rollback_through_the_registry(ip: InteractiveShell, tracking_uri: str) -> None:
    client = mlflow.MlflowClient(tracking_uri)
    ip.user_ns.update(first=constant(1.0), second=constant(2.0), rows=load_iris(return_X_y=True)[0][:3])

    exported = ip.run_line_magic("serve", "export first wine --mlflow --examples rows")  # no server yet: the result
    assert isinstance(exported, ExportResult) and (exported.version, exported.path) == (1, "models:/wine/1")
    client.set_registered_model_alias("wine", "champion", "1")

    line = "start --server_name reg --model_name wine --model_base_path models:/wine --mlflow_write_aliases"
    handle = ip.run_line_magic("serve", line)
    assert handle.model_base_path == "models:/wine"
    handle.wait_for_version("wine", 1)

    status = ip.run_line_magic("serve", "export second wine --mlflow --examples rows")  # served: waited for
    assert isinstance(status, ServingStatus) and "exported wine v2" in status.note and "models:/wine/2" in status.note
    assert {v["version"]: v["state"] for v in status.models[0]["versions"]} == {1: "AVAILABLE", 2: "AVAILABLE"}

    def answer() -> float:
        outputs = handle.client.predict("wine", np.array([[5.1, 3.5, 1.4, 0.2]]))
        return float(np.asarray(next(iter(outputs.values()))).ravel()[0])

    assert handle.client.model("wine")["stable"] == 1 and answer() == 1.0

    ip.run_line_magic("serve", "canary wine 2 0.5")
    assert aliases(client) == {"champion": 1, "challenger": 2}
    assert float(client.get_registered_model("wine").tags[CANARY_WEIGHT_TAG]) == 0.5
    # The model's description (what the dashboard and %serve status show) carries the registry and its aliases.
    described = handle.client.model("wine")
    assert described["registry"] == {"uri": "models:/wine", "aliases": {"champion": 1, "challenger": 2}}
    table = models_table_text([described])
    assert "v1" in table and "@champion" in table.splitlines()[1] and "@challenger" in table.splitlines()[0]
    assert "models:/wine: @champion v1, @challenger v2" in routing_summary(described)

    ip.run_line_magic("serve", "promote wine 2")
    assert aliases(client)["champion"] == 2
    wait_until(lambda: answer() == 2.0, timeout=60, what="the promoted champion answering")

    ip.run_line_magic("serve", "rollback wine")
    assert aliases(client)["champion"] == 1
    wait_until(lambda: answer() == 1.0, timeout=60, what="the rolled back champion answering")
