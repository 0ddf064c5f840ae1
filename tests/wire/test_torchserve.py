"""TorchServe model archives served from a model store, queried with TorchServe's own REST APIs (and TF Serving's).

The archives are written here as torch-model-archiver writes them: a zip with ``MAR-INF/MANIFEST.json``, the
serialized model and the handler. Requests are sent as TorchServe's docs show them (``curl -T`` sends the raw file,
``curl -F data=@file`` a multipart form).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from workbench.config.options import ServerOptions  # noqa: E402
from workbench.server import ServerThread  # noqa: E402

LABELS = {str(i): f"class_{i}" for i in range(10)}
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

EAGER_MODEL = """
import torch


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=4)
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1))
"""

CUSTOM_HANDLER = """
import json
import torch


class Doubler:
    '''TorchServe's handler interface without its base class: JSON {"x": [...]} in, {"y": [...]} out.'''

    def initialize(self, context):
        self.model_dir = context.system_properties["model_dir"]
        self.scale = float(open(self.model_dir + "/scale.txt").read())
        self.initialized = True

    def preprocess(self, data):
        rows = []
        for row in data:
            body = row.get("data") or row.get("body")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            rows.append(body["x"])
        return torch.tensor(rows, dtype=torch.float32)

    def inference(self, x):
        return x * self.scale

    def postprocess(self, y):
        return [{"y": row, "batch": len(y)} for row in y.tolist()]

    def handle(self, data, context):
        if context.get_request_header(0, "x-shout") == "yes":
            context.set_response_content_type(0, "text/plain")
            return ["HELLO"] * len(data)
        return self.postprocess(self.inference(self.preprocess(data)))
"""

BASE_HANDLER = """
import torch
from ts.torch_handler.base_handler import BaseHandler


class Summer(BaseHandler):
    def preprocess(self, data):
        return torch.tensor([row.get("body")["x"] for row in data], dtype=torch.float32)

    def postprocess(self, data):
        return data.tolist()
"""


class TinyCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=4)
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1))


class RowSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def write_mar(path: Path, manifest_model: dict[str, object], files: dict[str, bytes]) -> None:
    manifest = {
        "createdOn": "01/01/2026 00:00:00",
        "runtime": "python",
        "model": manifest_model,
        "archiverVersion": "0.12.0",
    }
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        for name, data in files.items():
            archive.writestr(name, data)


def saved_script(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buffer)
    return buffer.getvalue()


def scripted(seed: int) -> tuple[bytes, torch.nn.Module]:
    torch.manual_seed(seed)
    model = TinyCnn().eval()
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buffer)
    return buffer.getvalue(), model


def png(seed: int, size: tuple[int, int] = (256, 256)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def expected_top5(model: torch.nn.Module, image: bytes) -> dict[str, float]:
    """TorchServe's image classifier's answer, computed here for a 256x256 image: no resize, a 16-pixel crop."""
    pixels = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"), dtype=np.float32) / 255.0
    crop = (pixels[16:240, 16:240] - MEAN) / STD
    with torch.no_grad():
        probs = torch.softmax(model(torch.from_numpy(crop.transpose(2, 0, 1).copy())[None]), dim=1)[0]
    top = torch.topk(probs, 5)
    return {LABELS[str(int(c))]: float(p) for c, p in zip(top.indices, top.values, strict=True)}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("model-store")
    labels = json.dumps(LABELS).encode()
    models = {}
    for version, seed in (("1.0", 1), ("2.0", 2)):
        pt, models[version] = scripted(seed)
        write_mar(
            root / f"classifier_v{version[0]}.mar",
            {
                "modelName": "classifier",
                "modelVersion": version,
                "serializedFile": "model.pt",
                "handler": "image_classifier",
            },
            {"model.pt": pt, "index_to_name.json": labels},
        )
    torch.manual_seed(3)
    eager = TinyCnn().eval()
    weights = io.BytesIO()
    torch.save(eager.state_dict(), weights)
    models["eager"] = eager
    write_mar(
        root / "eager.mar",
        {
            "modelName": "eager",
            "modelVersion": "1.0",
            "serializedFile": "weights.pth",
            "modelFile": "model.py",
            "handler": "image_classifier",
        },
        {"weights.pth": weights.getvalue(), "model.py": EAGER_MODEL.encode(), "index_to_name.json": labels},
    )
    write_mar(  # handler.py, the name most archives use (and workbench's own handler file's name: not taken for one)
        root / "doubler.mar",
        {"modelName": "doubler", "modelVersion": "1.0", "handler": "handler.py"},
        {"handler.py": CUSTOM_HANDLER.encode(), "scale.txt": b"2.0"},
    )
    write_mar(
        root / "summer.mar",
        {"modelName": "summer", "modelVersion": "1.0", "serializedFile": "model.pt", "handler": "summer_handler.py"},
        {"summer_handler.py": BASE_HANDLER.encode(), "model.pt": saved_script(RowSum())},
    )
    write_mar(
        root / "broken.mar",
        {"modelName": "broken", "modelVersion": "1.0", "handler": "bad_handler.py"},
        {"bad_handler.py": b"import a_module_that_is_not_there\n"},
    )
    (root / "corrupt.mar").write_bytes(b"this is not a zip archive")
    return root, models


@pytest.fixture(scope="module")
def server(store: tuple[Path, dict[str, torch.nn.Module]]) -> Iterator[ServerThread]:
    root, _ = store
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(root), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


def test_image_classifier_answers_as_torchserve(server: ServerThread, store: tuple[Path, dict]) -> None:
    _, models = store
    image = png(7)
    want = expected_top5(models["2.0"], image)  # the default version: the latest
    raw = requests.post(f"{server.rest_url}/predictions/classifier", data=image, timeout=60)  # curl -T kitten.jpg
    assert raw.status_code == 200, raw.text
    assert raw.headers["content-type"].startswith("application/json")
    got = raw.json()
    assert list(got) == list(want)
    assert np.allclose(list(got.values()), list(want.values()), atol=1e-5)
    form = requests.post(f"{server.rest_url}/predictions/classifier", files={"data": image}, timeout=60)  # curl -F
    assert form.json() == got
    assert raw.text == json.dumps(got, indent=2)  # TorchServe's worker indents JSON answers by 2


def test_versions_are_torchserve_strings(server: ServerThread, store: tuple[Path, dict]) -> None:
    _, models = store
    image = png(8)
    got = requests.post(f"{server.rest_url}/predictions/classifier/1.0", data=image, timeout=60).json()
    want = expected_top5(models["1.0"], image)
    assert np.allclose([got[k] for k in want], list(want.values()), atol=1e-5)
    missing = requests.post(f"{server.rest_url}/predictions/classifier/3.0", data=image, timeout=60)
    assert missing.status_code == 404
    assert missing.json() == {
        "code": 404,
        "type": "ModelVersionNotFoundException",
        "message": "Model version: 3.0 does not exist for model: classifier",
    }


def test_eager_model_file_and_state_dict(server: ServerThread, store: tuple[Path, dict]) -> None:
    _, models = store
    image = png(9)
    got = requests.post(f"{server.rest_url}/predictions/eager", data=image, timeout=60).json()
    want = expected_top5(models["eager"], image)
    assert np.allclose([got[k] for k in want], list(want.values()), atol=1e-5)


def test_custom_handler_json_headers_and_content_type(server: ServerThread) -> None:
    r = requests.post(f"{server.rest_url}/predictions/doubler", json={"x": [1.0, 2.5]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {"y": [2.0, 5.0], "batch": 1}
    shout = requests.post(
        f"{server.rest_url}/predictions/doubler", json={"x": [1]}, headers={"x-shout": "yes"}, timeout=60
    )
    assert (shout.status_code, shout.headers["content-type"], shout.text) == (200, "text/plain; charset=utf-8", "HELLO")
    bad = requests.post(f"{server.rest_url}/predictions/doubler", data=b"{not json", timeout=60)
    assert bad.status_code == 400 and bad.json()["type"] == "BadRequestException"


def test_base_handler_subclass_with_torchserve_package(server: ServerThread) -> None:
    pytest.importorskip("ts.torch_handler.base_handler")
    r = requests.post(f"{server.rest_url}/predictions/summer", json={"x": [1.0, 2.0, 3.5]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == 6.5


def test_archive_over_tf_serving_rest(server: ServerThread) -> None:
    r = requests.post(
        f"{server.rest_url}/v1/models/doubler:predict",
        json={"inputs": {"data": ['{"x": [3]}', '{"x": [4]}']}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    assert [json.loads(o) for o in outputs["output"]] == [{"y": [6.0], "batch": 2}, {"y": [8.0], "batch": 2}]
    assert outputs["status"] == [200, 200]


def test_broken_archives_fail_alone(server: ServerThread) -> None:
    status = requests.get(f"{server.rest_url}/v1/models/broken", timeout=30).json()["model_version_status"][0]
    assert status["state"] == "END"
    message = status["status"]["error_message"]
    assert "bad_handler.py" in message and "a_module_that_is_not_there" in message
    corrupt = requests.get(f"{server.rest_url}/v1/models/corrupt", timeout=30).json()["model_version_status"][0]
    assert "corrupt.mar cannot be read as a model archive" in corrupt["status"]["error_message"]
    unknown = requests.post(f"{server.rest_url}/predictions/nope", data=b"x", timeout=30)
    assert unknown.status_code == 404
    assert unknown.json() == {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}
    assert requests.get(f"{server.rest_url}/ping", timeout=30).json() == {"status": "Healthy"}


def test_management_api(server: ServerThread) -> None:
    base = server.rest_url
    listed = requests.get(f"{base}/models", timeout=30).json()
    names = [m["modelName"] for m in listed["models"]]
    assert names == ["classifier", "doubler", "eager", "summer"] or names == ["classifier", "doubler", "eager"]
    page = requests.get(f"{base}/models?limit=1&next_page_token=1", timeout=30).json()
    assert page == {"nextPageToken": "2", "models": [{"modelName": "doubler", "modelUrl": "doubler.mar"}]}
    every = requests.get(f"{base}/models/classifier/all", timeout=30).json()
    assert [(d["modelVersion"], d["modelUrl"]) for d in every] == [
        ("1.0", "classifier_v1.mar"),
        ("2.0", "classifier_v2.mar"),
    ]
    scaled = requests.put(f"{base}/models/doubler?min_worker=2&synchronous=true", timeout=30)
    assert scaled.json() == {"status": "Workers scaled to 2 for model: doubler"}
    assert requests.get(f"{base}/models/doubler", timeout=30).json()[0]["minWorkers"] == 2
    refused = requests.delete(f"{base}/models/classifier/2.0", timeout=30)
    assert refused.status_code == 403 and refused.json()["type"] == "InvalidModelVersionException"
    gone = requests.delete(f"{base}/models/classifier/1.0", timeout=60)
    assert gone.json() == {"status": 'Model "classifier" unregistered'}
    assert requests.get(f"{base}/models/classifier/1.0", timeout=30).status_code == 404
    back = requests.post(f"{base}/models?url=classifier_v1.mar&initial_workers=1", timeout=60)
    assert back.json() == {"status": 'Model "classifier" Version: 1.0 registered with 1 initial workers'}
    assert requests.get(f"{base}/models/classifier/1.0", timeout=30).json()[0]["modelVersion"] == "1.0"
    missing = requests.post(f"{base}/models?url=absent.mar", timeout=60)
    assert missing.status_code == 404 and missing.json()["type"] == "ModelNotFoundException"
