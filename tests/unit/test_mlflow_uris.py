"""MLflow's URIs as base paths: what each names, which are refused, and a folder holding one MLflow model."""

from __future__ import annotations

import pytest

from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.models.source import scan_versions
from workbench.runtime.mlflow_uris import MlflowSource, is_mlflow_uri, parse
from workbench.runtime.storage import is_remote


def test_each_uri_names_a_registered_model_a_version_an_alias_or_one_logged_model():
    assert parse("models:/iris") == MlflowSource("models:/iris", name="iris")
    assert parse("models:/iris").registered
    assert parse("models:/iris/3") == MlflowSource("models:/iris/3", name="iris", version=3)
    assert parse("models:/iris@champion") == MlflowSource("models:/iris@champion", name="iris", alias="champion")
    assert not parse("models:/iris/3").registered and not parse("models:/iris@champion").registered
    assert parse("models:/iris").version_uri(7) == "models:/iris/7"
    for one in ("runs:/0123abc/model", "mlflow-artifacts:/0/models/m-1/artifacts"):
        assert parse(one) == MlflowSource(one) and not parse(one).name
    # MLflow 3's logged models: "m-" and 32 hex digits is a model's id, as MLflow's own parser reads it
    logged = "models:/m-e0f2936613784dee83b31e9a2a6d60f4"
    assert parse(logged) == MlflowSource(logged, model_id="m-e0f2936613784dee83b31e9a2a6d60f4")
    assert not parse(logged).registered and not parse(logged).name
    assert parse("models:/m-iris").registered  # any other name stays a registered model's


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("models:/iris/Production", "takes a version number"),
        ("models:/iris@", "names no alias"),
        ("models:/", "a registered model URI is"),
        ("runs:/", "runs:/<run_id>/<path>"),
    ],
)
def test_a_malformed_uri_is_refused_at_start_up_saying_what_one_looks_like(uri, says):
    with pytest.raises(ValueError, match=says):
        parse(uri)
    with pytest.raises(ServingError) as refused:
        ServerOptions(model_base_path=uri).initial_models()
    assert refused.value.code == Code.INVALID_ARGUMENT and says in refused.value.message


def test_mlflow_uris_are_no_local_paths():
    for uri in ("models:/iris", "runs:/abc/model", "mlflow-artifacts:/0/x"):
        assert is_mlflow_uri(uri) and is_remote(uri)
        assert ServerOptions(model_base_path=uri).initial_models()[0].base_path == uri  # not made absolute
    assert not is_mlflow_uri("models/iris") and not is_remote("models/iris")


def test_a_folder_holding_one_mlflow_model_is_version_1(tmp_path):
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    (tmp_path / "model.skops").write_bytes(b"")
    found = scan_versions(str(tmp_path))
    assert list(found) == [1] and found[1].path == str(tmp_path)
    (tmp_path / "2").mkdir()  # numbered version folders are the versions, as ever
    assert list(scan_versions(str(tmp_path))) == [2]
