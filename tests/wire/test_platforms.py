"""Which platform a version folder is, and platforms added by other packages through entry points."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from waiting import wait_until

from workbench import platforms
from workbench.core.errors import Code, ServingError
from workbench.models.configs import parse_model_config_file


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    platforms.registry.cache_clear()
    yield
    platforms.registry.cache_clear()


def folder_with(tmp_path: Path, *files: str) -> Path:
    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"")
    return folder


def test_a_folder_is_the_platform_of_its_one_well_known_file(tmp_path: Path) -> None:
    assert platforms.detect(folder_with(tmp_path, "model.onnx", "README.md")).name == "onnx"


def test_two_platforms_in_one_folder_are_refused_naming_both(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, "saved_model.pb", "model.skops")
    with pytest.raises(ServingError) as caught:
        platforms.detect(folder)
    assert caught.value.code == Code.FAILED_PRECONDITION
    assert "saved_model.pb (tensorflow)" in caught.value.message
    assert "model.skops (sklearn)" in caught.value.message
    assert "model_platform" in caught.value.message and platforms.VERSION_CONFIG in caught.value.message


def test_the_folder_config_names_the_platform_when_files_would_be_ambiguous(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, "saved_model.pb", "model.onnx")
    (folder / platforms.VERSION_CONFIG).write_text(json.dumps({"platform": "onnx"}))
    assert platforms.detect(folder).name == "onnx"


@pytest.mark.parametrize(
    ("content", "words"),
    [("{not json", "is not valid JSON"), ('{"platfrom": "onnx"}', "must name the folder's platform")],
)
def test_a_broken_folder_config_says_what_is_wrong(tmp_path: Path, content: str, words: str) -> None:
    folder = folder_with(tmp_path, "model.onnx")
    (folder / platforms.VERSION_CONFIG).write_text(content)
    with pytest.raises(ServingError) as caught:
        platforms.detect(folder)
    assert caught.value.code == Code.INVALID_ARGUMENT and words in caught.value.message


def test_a_folder_config_naming_an_unknown_platform_lists_the_known_ones(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, "model.onnx")
    (folder / platforms.VERSION_CONFIG).write_text('{"platform": "paddle"}')
    with pytest.raises(ServingError) as caught:
        platforms.detect(folder)
    assert caught.value.code == Code.UNIMPLEMENTED
    assert "paddle" in caught.value.message and "onnx" in caught.value.message and "pytorch" in caught.value.message


def test_a_folder_without_a_model_lists_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(ServingError) as caught:
        platforms.detect(folder_with(tmp_path, "notes.txt"))
    assert caught.value.code == Code.NOT_FOUND
    assert "saved_model.pb" in caught.value.message and "model.onnx" in caught.value.message


def test_the_model_config_platform_wins_over_the_folder(tmp_path: Path, model_store: Path) -> None:
    """model_platform in the config is TF Serving's field: a folder that also holds an ONNX file serves as TF."""
    base = tmp_path / "hp"
    shutil.copytree(model_store / "hp2_tf2", base / "1")
    (base / "1" / "model.onnx").write_bytes(b"not read")
    servable = platforms.Loader()("hp", 1, str(base / "1"), "tensorflow")
    try:
        assert "serving_default" in servable.signatures
    finally:
        servable.close()
    with pytest.raises(ServingError):
        platforms.Loader()("hp", 1, str(base / "1"))  # left to the folder, it is ambiguous


def test_an_unknown_model_platform_in_a_config_file_is_refused_at_parse(tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "m" base_path: "/m" model_platform: "caffe" } }')
    with pytest.raises(ServingError) as caught:
        parse_model_config_file(str(config))
    assert caught.value.code == Code.UNIMPLEMENTED and "caffe" in caught.value.message


PLUGIN = '''
"""A third-party platform: model.const holds a number the model answers for every row."""
from pathlib import Path

import numpy as np

from workbench.core.servable import Servable
from workbench.platforms import Platform
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec

PLATFORM = Platform("constant", ("model.const",), "wb_constant_platform")


class ConstantServable(Servable):
    def __init__(self, name, version, path):
        self.name, self.version, self.path = name, version, path
        self.value = float(Path(path, "model.const").read_text())
        x = TensorSpec("x", "x", np.dtype(np.float32), (-1,))
        y = TensorSpec("y", "y", np.dtype(np.float32), (-1,))
        self.signatures = {DEFAULT_SIGNATURE: Signature(DEFAULT_SIGNATURE, PREDICT_METHOD, {"x": x}, {"y": y})}

    def run(self, signature, inputs, outputs):
        return {"y": np.full(inputs["x"].shape[0], self.value, np.float32)}


def load(name, version, path, policy):
    return ConstantServable(name, version, path)
'''


def test_a_platform_registered_by_another_package_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry: None, serve
) -> None:
    site = tmp_path / "site"
    (site / "wb_constant_platform-1.0.dist-info").mkdir(parents=True)
    (site / "wb_constant_platform.py").write_text(textwrap.dedent(PLUGIN))
    (site / "wb_constant_platform-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: wb-constant-platform\nVersion: 1.0\n"
    )
    (site / "wb_constant_platform-1.0.dist-info" / "entry_points.txt").write_text(
        f"[{platforms.ENTRY_POINT_GROUP}]\nconstant = wb_constant_platform:PLATFORM\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "wb_constant_platform", raising=False)
    assert "constant" in platforms.names()

    repository = tmp_path / "models"
    (repository / "answer" / "1").mkdir(parents=True)
    (repository / "answer" / "1" / "model.const").write_text("42")
    server = serve(model_repository=str(repository))
    url = f"{server.rest_url}/v1/models/answer"
    wait_until(lambda: requests.get(url, timeout=10).status_code == 200, what="the plugin's model to load")
    answer = requests.post(f"{url}:predict", json={"instances": [1.0, 2.0]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": [42.0, 42.0]}
    metadata = requests.get(f"{url}/metadata", timeout=30).json()
    signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["x"]["dtype"] == "DT_FLOAT"
