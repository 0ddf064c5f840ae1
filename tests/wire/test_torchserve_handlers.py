"""TorchServe's default handlers without a handler file of the archive: object_detector, image_segmenter and
text_classifier, answering as TorchServe's own handlers (ts/torch_handler/*.py) answer.

Each expected answer is computed here from the model and TorchServe's documented pre- and post-processing, not from
workbench's handler code: detection gets ``ToTensor`` and keeps boxes scored at least 0.5 as
``{label: [x1, y1, x2, y2], "score": s}``; segmentation gets ImageNet's resize/crop/normalisation and answers per
pixel ``[class, probability]`` (``[H][W][2]``); text classification cleans and tokenises the text, adds bigrams,
looks them up in a ``{token: index}`` vocabulary and answers ``{label: probability}``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import requests
from model_archives import write_mar

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from workbench.config.options import ServerOptions  # noqa: E402
from workbench.server import ServerThread  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

DETECTOR_MODEL = '''
from typing import Dict, List

import torch


class TinyDetector(torch.nn.Module):
    """TorchVision's detection interface: images in, per image {"boxes", "labels", "scores"}."""

    def __init__(self):
        super().__init__()
        boxes = [[1.0, 2.0, 30.0, 40.0], [5.0, 5.0, 9.0, 9.0], [0.0, 0.0, 63.5, 47.25]]
        self.register_buffer("box", torch.tensor(boxes))
        self.register_buffer("label", torch.tensor([1, 2, 3]))
        self.register_buffer("offset", torch.tensor([2.0, -2.0, 1.0]))

    def forward(self, images: List[torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
        results: List[Dict[str, torch.Tensor]] = []
        for image in images:
            scores = torch.sigmoid(self.offset + (image.mean() - 0.5) * 4)
            results.append({"boxes": self.box * image.shape[-1] / 64, "labels": self.label, "scores": scores})
        return results
'''

SEGMENTER_MODEL = '''
class TinySegmenter(torch.nn.Module):
    """TorchVision's segmentation interface: a dict whose "out" holds [N, classes, H, W]."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"out": self.classifier(x)}
'''

TEXT_MODEL = """
import torch


class TextSentiment(torch.nn.Module):
    def __init__(self, vocab_size=16, embed_dim=8, num_class=2):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(vocab_size, embed_dim)
        self.fc = torch.nn.Linear(embed_dim, num_class)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))
"""

VOCAB = {
    "<unk>": 0,
    "the": 1,
    "movie": 2,
    "was": 3,
    "great": 4,
    "really": 5,
    "cafe": 6,
    "the movie": 7,
    "movie was": 8,
    "was great": 9,
    "great really": 10,
    "really great": 11,
}  # "great cafe" is not in it: an unknown token takes index 0
SENTENCE = "<b>The movie</b> was GREAT, really great! Café"
# TorchServe's text classifier: HTML tags removed, lower case, accents and punctuation removed, basic_english
# tokens, then ngrams_iterator(tokens, 2): the tokens, then the bigrams.
TOKENS = ["the", "movie", "was", "great", "really", "great", "cafe"]
GRAMS = [*TOKENS, "the movie", "movie was", "was great", "great really", "really great", "great cafe"]
DETECTION_LABELS = {"1": "cat", "2": "dog", "3": "bird"}
SENTIMENT_LABELS = {"0": "negative", "1": "positive"}


def png(seed: int, size: tuple[int, int]) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def to_tensor(image: bytes) -> Any:
    pixels = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy())


def state_dict_bytes(model: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def script_bytes(model: Any) -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The models' classes, from a file (TorchScript compiles from source)."""
    path = tmp_path_factory.mktemp("model-source") / "ts_default_models.py"
    path.write_text(DETECTOR_MODEL + SEGMENTER_MODEL)  # a model file holds one class; this holds both
    spec = importlib.util.spec_from_file_location("ts_default_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, models: ModuleType) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("default-handler-store")
    torch.manual_seed(11)
    detector, segmenter = models.TinyDetector().eval(), models.TinySegmenter().eval()
    namespace: dict[str, Any] = {}
    exec(TEXT_MODEL, namespace)  # noqa: S102 - the archive's model file, run here for the expected answers
    text = namespace["TextSentiment"]().eval()
    labels = json.dumps(DETECTION_LABELS).encode()
    write_mar(  # an eager detector: modelFile + state_dict, given the stacked batch as TorchServe gives it
        root / "detector.mar",
        {
            "modelName": "detector",
            "serializedFile": "weights.pth",
            "modelFile": "models.py",
            "handler": "object_detector",
        },
        {"weights.pth": state_dict_bytes(detector), "models.py": DETECTOR_MODEL.encode(), "index_to_name.json": labels},
    )
    write_mar(  # a scripted detector takes List[Tensor], as a scripted torchvision detector does
        root / "scripted_detector.mar",
        {"modelName": "scripted_detector", "serializedFile": "model.pt", "handler": "object_detector"},
        {"model.pt": script_bytes(detector), "index_to_name.json": labels},
    )
    write_mar(
        root / "segmenter.mar",
        {"modelName": "segmenter", "serializedFile": "model.pt", "handler": "image_segmenter"},
        {"model.pt": script_bytes(segmenter)},
    )
    vocab = io.BytesIO()
    torch.save(VOCAB, vocab)
    write_mar(
        root / "sentiment.mar",
        {
            "modelName": "sentiment",
            "serializedFile": "weights.pth",
            "modelFile": "text.py",
            "handler": "text_classifier",
        },
        {
            "weights.pth": state_dict_bytes(text),
            "text.py": TEXT_MODEL.encode(),
            "source_vocab.pt": vocab.getvalue(),
            "index_to_name.json": json.dumps(SENTIMENT_LABELS).encode(),
        },
    )
    return root, {"detector": detector, "segmenter": segmenter, "text": text}


@pytest.fixture(scope="module")
def server(store: tuple[Path, dict[str, Any]]) -> Iterator[ServerThread]:
    root, _ = store
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(root), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


def expected_detections(detector: Any, image: bytes) -> list[dict[str, Any]]:
    with torch.no_grad():
        (row,) = detector([to_tensor(image)])
    answer = []
    for box, label, score in zip(row["boxes"].tolist(), row["labels"].tolist(), row["scores"].tolist(), strict=True):
        if score >= 0.5:
            answer.append({DETECTION_LABELS[str(label)]: box, "score": score})
    return answer


def assert_detections(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [sorted(d) for d in got] == [sorted(d) for d in want]
    for g, w in zip(got, want, strict=True):
        for key in w:
            assert np.allclose(g[key], w[key], atol=1e-5), (key, g, w)


@pytest.mark.parametrize("model", ["detector", "scripted_detector"])
def test_object_detector_answers_as_torchserve(server: ServerThread, store: tuple[Path, dict], model: str) -> None:
    _, built = store
    image = png(3, (64, 48))
    want = expected_detections(built["detector"], image)
    assert [list(d)[0] for d in want] == ["cat", "bird"]  # the "dog" box scores below 0.5 and is left out
    r = requests.post(f"{server.rest_url}/predictions/{model}", data=image, timeout=60)
    assert r.status_code == 200, r.text
    assert_detections(r.json(), want)
    assert r.text == json.dumps(r.json(), indent=2)


def test_image_segmenter_answers_a_class_and_probability_per_pixel(
    server: ServerThread, store: tuple[Path, dict]
) -> None:
    _, built = store
    image = png(4, (256, 256))
    pixels = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"), dtype=np.float32) / 255.0
    crop = (pixels[16:240, 16:240] - MEAN) / STD  # Resize(256) leaves it; CenterCrop(224); Normalize
    with torch.no_grad():
        out = built["segmenter"](torch.from_numpy(crop.transpose(2, 0, 1).copy())[None])["out"]
    best = torch.max(torch.softmax(out, dim=1), dim=1)
    want = torch.stack([best.indices.type(best.values.dtype), best.values], dim=3)[0].numpy()
    r = requests.post(f"{server.rest_url}/predictions/segmenter", files={"data": image}, timeout=60)
    assert r.status_code == 200, r.text
    got = np.array(r.json(), dtype=np.float32)
    assert got.shape == (224, 224, 2)  # [H][W][class, probability] per image
    # Served on a GPU where there is one (as TorchServe does), whose sums may round differently: a pixel whose two
    # best classes are within that rounding may name either; every other pixel names the CPU's class.
    top_two = torch.topk(torch.softmax(out, dim=1), 2, dim=1).values[0].numpy()
    clear = top_two[0] - top_two[1] > 1e-4
    assert np.array_equal(got[..., 0][clear], want[..., 0][clear]) and clear.mean() > 0.9
    assert np.allclose(got[..., 1], want[..., 1], atol=1e-4)


def test_text_classifier_with_a_vocabulary_dict(server: ServerThread, store: tuple[Path, dict]) -> None:
    _, built = store
    indices = torch.tensor([VOCAB.get(g, 0) for g in GRAMS])
    with torch.no_grad():
        probs = torch.softmax(built["text"](indices, torch.tensor([0])), dim=1)[0].tolist()
    r = requests.post(f"{server.rest_url}/predictions/sentiment", data=SENTENCE.encode(), timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert list(got) == ["negative", "positive"]
    assert np.allclose([got["negative"], got["positive"]], probs, atol=1e-6)
    not_text = requests.post(
        f"{server.rest_url}/predictions/sentiment", json={"not": "text"}, timeout=60
    )  # parsed JSON is no text: a bad request, and the server serves on
    assert not_text.status_code == 400 and not_text.json()["type"] == "BadRequestException"
    again = requests.post(f"{server.rest_url}/predictions/sentiment", data=SENTENCE.encode(), timeout=60)
    assert again.json() == got
