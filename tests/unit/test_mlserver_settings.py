"""MLServer's settings files read as MLServer reads them: defaults, relative uris, batching, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli.mlserver_command import serve_flags
from workbench.config.mlserver_settings import (
    environment_model_settings,
    find_model_settings,
    read_model_settings,
    read_server_settings,
)
from workbench.core.errors import Code, ServingError


def write(path: Path, document: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def test_model_settings_with_mlservers_defaults(tmp_path):
    file = write(
        tmp_path / "models" / "svm" / "model-settings.json", {"implementation": "mlserver_sklearn.SKLearnModel"}
    )
    settings = read_model_settings(file)
    assert settings.name == "svm" and settings.version == "" and settings.model_uri == str(file.parent)
    assert settings.batching() is None


def test_uri_is_relative_to_the_files_folder_and_batching_is_read(tmp_path):
    file = write(
        tmp_path / "m" / "model-settings.json",
        {
            "name": "mnist-svm",
            "implementation": "mlserver_sklearn.SKLearnModel",
            "max_batch_size": 8,
            "max_batch_time": 0.002,
            "inputs": [{"name": "a", "datatype": "BYTES", "shape": [11], "parameters": {"content_type": "str"}}],
            "parameters": {"uri": "./mnist-svm.joblib", "version": "v0.1.0", "extra": {"predict_fn": "predict_proba"}},
        },
    )
    settings = read_model_settings(file)
    assert settings.model_uri == str(tmp_path / "m" / "mnist-svm.joblib")
    assert settings.version == "v0.1.0" and settings.extra == {"predict_fn": "predict_proba"}
    assert settings.inputs[0].content_type == "str" and settings.inputs[0].shape == (11,)
    batching = settings.batching()
    assert batching is not None and batching.max_batch_size == 8 and batching.batch_timeout_micros == 2000


def test_a_wrong_field_is_refused_naming_the_file_and_field(tmp_path):
    file = write(tmp_path / "m" / "model-settings.json", {"parameters": {"version": 1}})
    with pytest.raises(ServingError) as refused:
        read_model_settings(file)
    assert refused.value.code is Code.INVALID_ARGUMENT
    assert str(file) in refused.value.message and "parameters.version must be a string" in refused.value.message


def test_hidden_folders_are_not_searched(tmp_path):
    write(tmp_path / "a" / "model-settings.json", {})
    write(tmp_path / ".workbench" / "b" / "model-settings.json", {})
    assert list(find_model_settings(tmp_path)) == [tmp_path / "a" / "model-settings.json"]


def test_server_settings_become_serve_flags(tmp_path):
    write(tmp_path / "settings.json", {"debug": "true", "http_port": 9080, "grpc_port": 9081, "host": "0.0.0.0"})
    settings = read_server_settings(tmp_path)
    assert settings.debug is True and settings.model_repository_root == str(tmp_path)
    assert serve_flags(str(tmp_path)) == [
        f"--model_repository={tmp_path}",
        "--rest_api_port=9080",
        "--port=9081",
        "--allow_pickle",
        "--allow_python_models",
        "--host=0.0.0.0",
    ]


# ------------------------------------------------------------------------ MLServer's environment variables
def test_the_environment_fills_what_settings_json_leaves_out(tmp_path):
    write(tmp_path / "settings.json", {"http_port": 9080})
    environ = {"MLSERVER_HTTP_PORT": "7000", "MLSERVER_GRPC_PORT": "9000", "mlserver_host": "0.0.0.0"}
    settings = read_server_settings(tmp_path, {**environ, "MLSERVER_LOAD_MODELS_AT_STARTUP": "false"})
    assert (settings.http_port, settings.grpc_port, settings.host) == (9080, 9000, "0.0.0.0")  # the file wins
    assert settings.load_models_at_startup is False


def test_without_settings_json_the_environment_is_the_servers_settings(tmp_path):
    environ = {"MLSERVER_HTTP_PORT": "8080", "MLSERVER_GRPC_PORT": "9000", "MLSERVER_DEBUG": "true"}
    settings = read_server_settings(tmp_path, environ)
    assert (settings.http_port, settings.grpc_port, settings.debug) == (8080, 9000, True)


def test_mlserver_start_serves_its_folder_whatever_the_root_setting_says(tmp_path, monkeypatch):
    # mlserver start FOLDER sets model_repository_root to FOLDER (mlserver/cli/serve.py).
    monkeypatch.setenv("MLSERVER_MODEL_REPOSITORY_ROOT", "/elsewhere")
    assert serve_flags(str(tmp_path))[0] == f"--model_repository={tmp_path}"


def test_a_bad_variable_is_refused_naming_it(tmp_path):
    with pytest.raises(ServingError) as refused:
        read_server_settings(tmp_path, {"MLSERVER_HTTP_PORT": "eighty"})
    assert refused.value.code is Code.INVALID_ARGUMENT and "http_port must be an integer" in refused.value.message
    with pytest.raises(ServingError) as refused:
        environment_model_settings(tmp_path, {"MLSERVER_MODEL_IMPLEMENTATION": "m.M", "MLSERVER_MODEL_EXTRA": "{no"})
    assert "MLSERVER_MODEL_EXTRA is not valid JSON" in refused.value.message


def test_the_environment_fills_what_a_model_settings_file_leaves_out(tmp_path):
    file = write(tmp_path / "m" / "model-settings.json", {"parameters": {"version": "v2"}})
    environ = {
        "MLSERVER_MODEL_NAME": "wine",
        "MLSERVER_MODEL_IMPLEMENTATION": "mlserver_sklearn.SKLearnModel",
        "MLSERVER_MODEL_VERSION": "v1",
        "MLSERVER_MODEL_URI": "./model.joblib",
        "MLSERVER_MODEL_EXTRA": '{"predict_fn": "predict_proba"}',
        "MLSERVER_MODEL_MAX_BATCH_SIZE": "4",
    }
    settings = read_model_settings(file, environ)
    assert (settings.name, settings.implementation, settings.version) == ("wine", "mlserver_sklearn.SKLearnModel", "v2")
    assert settings.model_uri == str(tmp_path / "m" / "model.joblib")  # relative to the file, as a file's uri is
    assert settings.extra == {"predict_fn": "predict_proba"} and settings.max_batch_size == 4
    assert not settings.from_environment


def test_the_environment_alone_is_a_model_when_it_names_an_implementation(tmp_path, monkeypatch):
    assert environment_model_settings(tmp_path, {"MLSERVER_MODEL_NAME": "wine"}) is None
    monkeypatch.chdir(tmp_path)
    environ = {
        "MLSERVER_MODEL_NAME": "wine",
        "MLSERVER_MODEL_IMPLEMENTATION": "mlserver_mlflow.MLflowRuntime",
        "MLSERVER_MODEL_URI": "models/wine",  # relative to the working directory, as MLServer takes it
        "MLSERVER_MODEL_VERSION": "v0.1.0",
    }
    settings = environment_model_settings(tmp_path / "mnt", environ)
    assert settings is not None and settings.from_environment
    assert (settings.name, settings.version) == ("wine", "v0.1.0")
    assert settings.model_uri == str(tmp_path / "models" / "wine")
    unnamed = environment_model_settings(tmp_path / "mnt", {"MLSERVER_MODEL_IMPLEMENTATION": "m.M"})
    assert unnamed is not None and unnamed.name == "mnt" and unnamed.model_uri == str(tmp_path / "mnt")


def test_the_environments_model_is_the_repositorys_when_no_file_is(tmp_path, monkeypatch):
    from workbench.config.options import is_model_name
    from workbench.platforms.mlserver import settings_of
    from workbench.platforms.mlserver_repository import repository_models

    monkeypatch.setenv("MLSERVER_MODEL_IMPLEMENTATION", "mlserver_sklearn.SKLearnModel")
    monkeypatch.setenv("MLSERVER_MODEL_NAME", "iris")
    monkeypatch.setenv("MLSERVER_MODEL_URI", str(tmp_path))
    (model,) = repository_models(tmp_path, is_model_name).values()
    settings = settings_of(Path(model.folder) / "1")
    assert settings.from_environment and settings.name == "iris" and settings.model_uri == str(tmp_path)
    write(tmp_path / "a" / "model-settings.json", {"name": "a"})  # a file: the environment only fills it in
    assert set(repository_models(tmp_path, is_model_name)) == {"a"}


def test_editing_a_settings_file_changes_its_versions_folder(tmp_path):
    # A version's fingerprint covers its folder's files: a version that failed to load is retried once this changes.
    import os

    from workbench.config.options import is_model_name
    from workbench.platforms.mlserver_repository import VERSION_FILE, repository_models

    file = write(tmp_path / "m" / "model-settings.json", {"implementation": "nowhere.Model"})
    (model,) = repository_models(tmp_path, is_model_name).values()
    written = Path(model.folder) / "1" / VERSION_FILE
    before = written.read_text()
    write(file, {"implementation": "mlserver_sklearn.SKLearnModel"})
    os.utime(file, ns=(1, 1))  # whatever the clock's resolution
    repository_models(tmp_path, is_model_name)
    assert written.read_text() != before


def test_a_tf_serving_repository_stays_one_where_the_environment_names_a_model(tmp_path, monkeypatch):
    """MLServer reads the environment's model only for a folder without model-settings.json; a pod that sets
    MLSERVER_MODEL_IMPLEMENTATION keeps serving a TF Serving layout (models of numbered versions) as such."""
    from workbench.config.options import discover_models, is_model_name
    from workbench.platforms import packaged_models
    from workbench.platforms.mlserver_repository import repository_models

    monkeypatch.setenv("MLSERVER_MODEL_IMPLEMENTATION", "mlserver_sklearn.SKLearnModel")
    for name in ("half_plus_two", "iris"):
        (tmp_path / "tf" / name / "1").mkdir(parents=True)
    assert {m.name for m in discover_models(tmp_path / "tf", packaged_models)} == {"half_plus_two", "iris"}
    assert repository_models(tmp_path / "tf", is_model_name) == {}
    # KServe's /mnt/models: the model's own files, no version folders: the environment's model.
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt" / "model.joblib").write_bytes(b"")
    (model,) = discover_models(tmp_path / "mnt", packaged_models)
    assert model.name == "mnt"
