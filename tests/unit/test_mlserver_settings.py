"""MLServer's settings files read as MLServer reads them: defaults, relative uris, batching, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli.mlserver_command import serve_flags
from workbench.config.mlserver_settings import find_model_settings, read_model_settings, read_server_settings
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
