"""The bundled demo repository: what write_demo_repository writes, serving it, and ``workbench demo``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from workbench.cli import build_parser
from workbench.demo import write_demo_repository


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory) -> Path:
    """Written once for the module: it trains the small digits classifier (a few seconds)."""
    return write_demo_repository(tmp_path_factory.mktemp("demo") / "repo")


@pytest.fixture(scope="module")
def digits_held_out() -> tuple[np.ndarray, np.ndarray]:
    """200 digits the classifier was not trained on (the builder's own split), scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)
    _, x_test, _, y_test = train_test_split(pixels, digits.target, test_size=0.2, random_state=0)
    return x_test[:200], y_test[:200]


@pytest.fixture
def server(serve, demo_repo):
    return serve(model_config_file=str(demo_repo / "models.config"))


def post(server, path: str, body: object) -> requests.Response:
    return requests.post(server.rest_url + path, data=json.dumps(body), timeout=60)


# ------------------------------------------------------------------------------------------ the repository
def test_layout(demo_repo):
    assert demo_repo.is_absolute()
    for version in ("half_plus_two/1", "half_plus_two/2", "digits/1"):
        assert (demo_repo / version / "saved_model.pb").is_file(), version
        assert (demo_repo / version / "variables").is_dir(), version
    assert sorted(p.name for p in demo_repo.iterdir()) == ["digits", "half_plus_two", "models.config"]
    # Nothing half-written is left behind (the builders stage into hidden folders and rename).
    assert not [p for p in demo_repo.rglob(".tmp-*")]


def test_models_config(demo_repo):
    config = model_server_config_pb2.ModelServerConfig()
    text_format.Parse((demo_repo / "models.config").read_text(), config)
    models = {m.name: m for m in config.model_config_list.config}
    assert sorted(models) == ["digits", "half_plus_two"]
    assert models["half_plus_two"].base_path == str(demo_repo / "half_plus_two")
    assert models["digits"].base_path == str(demo_repo / "digits")
    assert models["half_plus_two"].model_version_policy.WhichOneof("policy_choice") == "all"
    assert all(m.model_platform == "tensorflow" for m in models.values())


def test_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        write_demo_repository(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_refuses_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ValueError):
        write_demo_repository(target)
    assert target.read_text() == "x"


# ----------------------------------------------------------------------------------------------- serving it
def test_half_plus_two_serves_both_versions(server):
    status = requests.get(server.rest_url + "/v1/models/half_plus_two", timeout=10).json()
    versions = {s["version"]: s["state"] for s in status["model_version_status"]}
    assert versions == {"1": "AVAILABLE", "2": "AVAILABLE"}
    for path in (
        "/v1/models/half_plus_two",
        "/v1/models/half_plus_two/versions/1",
        "/v1/models/half_plus_two/versions/2",
    ):
        r = post(server, path + ":predict", {"instances": [[2.0], [3.0], [-4.0]]})
        assert r.status_code == 200, r.text
        assert r.json() == {"predictions": [[3.0], [3.5], [0.0]]}, path
    r = post(
        server, "/v1/models/half_plus_two:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 10.0}]}
    )
    assert r.json() == {"results": [7.0]}


def test_digits_status_and_metadata(server):
    status = requests.get(server.rest_url + "/v1/models/digits", timeout=10).json()
    assert [(s["version"], s["state"]) for s in status["model_version_status"]] == [("1", "AVAILABLE")]
    meta = requests.get(server.rest_url + "/v1/models/digits/metadata", timeout=10).json()
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert set(signature["inputs"]) == {"pixels"}
    assert set(signature["outputs"]) == {"probabilities", "classes"}


def check_digits(predictions: list[dict], labels: np.ndarray) -> float:
    assert len(predictions) == len(labels)
    for p in predictions:
        assert set(p) == {"probabilities", "classes"}
        assert len(p["probabilities"]) == 10
        assert sum(p["probabilities"]) == pytest.approx(1.0, abs=1e-4)
        assert all(0.0 <= v <= 1.0 for v in p["probabilities"])
        assert isinstance(p["classes"], int)
        assert p["classes"] == int(np.argmax(p["probabilities"]))
    return float(np.mean([p["classes"] for p in predictions] == labels))


def test_digits_classifies_objects_instances(server, digits_held_out):
    x, y = digits_held_out
    r = post(server, "/v1/models/digits:predict", {"instances": [{"pixels": row.tolist()} for row in x]})
    assert r.status_code == 200, r.text[:500]
    accuracy = check_digits(r.json()["predictions"], y)
    assert accuracy > 0.9, accuracy


def test_digits_classifies_plain_list_instances(server, digits_held_out):
    x, y = digits_held_out
    r = post(server, "/v1/models/digits:predict", {"instances": x.tolist()})
    assert r.status_code == 200, r.text[:500]
    accuracy = check_digits(r.json()["predictions"], y)
    assert accuracy > 0.9, accuracy


def test_digits_columnar_and_wrong_width(server, digits_held_out):
    x, y = digits_held_out
    r = post(server, "/v1/models/digits:predict", {"inputs": {"pixels": x[:5].tolist()}})
    outputs = r.json()["outputs"]
    assert len(outputs["classes"]) == 5 and len(outputs["probabilities"]) == 5
    r = post(server, "/v1/models/digits:predict", {"instances": [[0.0] * 63]})
    assert r.status_code == 400
    assert "error" in r.json()


# ------------------------------------------------------------------------------------------ workbench demo
def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_demo_command_writes_and_prints_the_serve_command(tmp_path):
    target = tmp_path / "my demo"  # a space: the printed command must still be copy-pasteable
    done = run_cli("demo", str(target), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (target / "models.config").is_file()
    assert (target / "digits" / "1" / "saved_model.pb").is_file()
    serve_lines = [line for line in done.stdout.splitlines() if "workbench serve" in line]
    assert len(serve_lines) == 1, done.stdout
    command = shlex.split(serve_lines[0][serve_lines[0].index("workbench serve") :])
    assert command[:2] == ["workbench", "serve"]
    args = build_parser().parse_args(command[1:])
    assert Path(args.model_config_file) == target / "models.config"
    assert args.rest_api_port > 0


def test_demo_command_refuses_a_non_empty_folder(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    done = run_cli("demo", str(target), cwd=tmp_path)
    assert done.returncode == 2
    assert "not empty" in done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
