"""TorchServe's default handlers (``image_classifier``, ``image_segmenter``, ``object_detector``,
``text_classifier``), written on torch, PIL and numpy alone.

TorchServe's own classes need torchvision (their transforms) and captum (explanations) at import time; these give the
same answers without them: the same model loading as ``BaseHandler.initialize`` (TorchScript through
``torch.jit.load`` when the manifest names no ``modelFile``; else the one ``nn.Module`` class of the model file,
created and given ``load_state_dict(torch.load(serializedFile))``), the same pre- and post-processing (ImageNet's
resize to 256, center crop to 224 and normalisation; ``index_to_name.json``; the top 5 classes as
``{label: probability}``; boxes as ``{label: [x1, y1, x2, y2], "score": s}``), one answer per request.

Differences, on purpose: every handler here takes a batch (TorchServe's text classifier reads only the first
request), images of any mode are converted to RGB before normalising (TorchServe fails on RGBA and grayscale), and
the classifier's top k is at most the number of classes (TorchServe fails below 5).
"""

from __future__ import annotations

import base64
import importlib
import inspect
import io
import json
import logging
import os
import re
import string
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own name for it
from PIL import Image

from workbench.platforms.torchserve_imports import import_plain

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLEANUP_REGEX = re.compile("<.*?>|&([a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")  # ts.utils.util's
# torchtext's basic_english normalisation, as ts.handler_utils.text_utils copies it.
_BASIC_ENGLISH = [
    (re.compile(p), r)
    for p, r in [
        (r"\'", " '  "),
        (r"\"", ""),
        (r"\.", " . "),
        (r"<br \/>", " "),
        (r",", " , "),
        (r"\(", " ( "),
        (r"\)", " ) "),
        (r"\!", " ! "),
        (r"\?", " ? "),
        (r"\;", " "),
        (r"\:", " "),
        (r"\s+", " "),
    ]
]


# ------------------------------------------------------------------------------------------ images
def resize_shorter(image: Image.Image, size: int) -> Image.Image:
    """torchvision's ``Resize(size)`` on a PIL image: the shorter side to ``size``, the other in proportion."""
    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    if short == size:
        return image
    new_short, new_long = size, int(size * long / short)
    new_size = (new_short, new_long) if width <= height else (new_long, new_short)
    return image.resize(new_size, Image.Resampling.BILINEAR)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """torchvision's ``CenterCrop(size)`` on an image at least ``size`` on each side."""
    width, height = image.size
    if width < size or height < size:  # torchvision pads with zeros first
        padded = Image.new(image.mode, (max(width, size), max(height, size)))
        padded.paste(image, ((max(size - width, 0)) // 2, (max(size - height, 0)) // 2))
        image, (width, height) = padded, padded.size
    top = int(round((height - size) / 2.0))
    left = int(round((width - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def to_tensor(image: Image.Image) -> torch.Tensor:
    """torchvision's ``ToTensor``: an RGB image as float32 CHW in [0, 1]."""
    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(torch.float32).div(255.0)


def normalize(tensor: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    return (tensor - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)


def imagenet_transform(image: Image.Image) -> torch.Tensor:
    """``Resize(256)``, ``CenterCrop(224)``, ``ToTensor()``, ``Normalize(ImageNet)``: TorchServe's classifier's."""
    return normalize(
        to_tensor(center_crop(resize_shorter(image.convert("RGB"), 256), 224)), IMAGENET_MEAN, IMAGENET_STD
    )


def request_value(row: Any) -> Any:
    """A request's input: its ``data`` field, else its ``body`` (what every TorchServe handler reads)."""
    if not isinstance(row, dict):
        return row
    value = row.get("data")
    return value if value is not None else row.get("body")


# ------------------------------------------------------------------------------------------ loading
def load_label_mapping(path: str) -> dict[str, str] | None:
    """``index_to_name.json`` as ts.utils.util reads it: {"0": "label"} (a [id, label] list keeps its last item)."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict):
        raise ValueError('index->name JSON mapping should be in "class": "label" format.')
    if "object_type_names" in mapping and isinstance(mapping["object_type_names"], list):
        return {str(k): v for k, v in enumerate(mapping["object_type_names"])}
    labels = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) else value
        if not isinstance(label, str):
            raise ValueError("labels in index->name mapping must be either str or List[str]")
        labels[str(key)] = label
    return labels


def map_class_to_label(
    probs: list[list[Any]], mapping: dict[str, str] | None = None, classes: list[list[Any]] | None = None
) -> list[dict[str, Any]]:
    """ts.utils.util's: one ``{label: probability}`` per row (labels are class numbers without a mapping)."""
    rows = classes if classes is not None else [list(range(len(p))) for p in probs]
    return [
        {(mapping[str(c)] if mapping is not None else str(c)): p for c, p in zip(row_classes, row_probs, strict=False)}
        for row_classes, row_probs in zip(rows, probs, strict=False)
    ]


def model_classes(module: Any) -> list[type]:
    """The classes a module defines itself (ts.utils.util.list_classes_from_module)."""
    return [member for _, member in inspect.getmembers(module, inspect.isclass) if member.__module__ == module.__name__]


class DefaultHandler:
    """TorchServe's ``BaseHandler``: loads the archive's model and runs preprocess → inference → postprocess."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device = torch.device("cpu")
        self.initialized = False
        self.context: Any = None
        self.manifest: dict[str, Any] = {}
        self.model_pt_path: str | None = None

    def initialize(self, context: Any) -> None:
        properties = context.system_properties
        gpu = properties.get("gpu_id")
        if gpu is not None and torch.cuda.is_available():
            self.device = torch.device(f"cuda:{gpu}")
        self.manifest = context.manifest
        model_dir = properties.get("model_dir")
        model = self.manifest["model"]
        serialized = model.get("serializedFile")
        self.model_pt_path = os.path.join(model_dir, serialized) if serialized else None
        model_file = model.get("modelFile", "")
        if model_file:
            self.model = self._load_eager_model(model_dir, model_file, self.model_pt_path)
        elif self.model_pt_path and self.model_pt_path.endswith(".pt"):
            self.model = torch.jit.load(self.model_pt_path, map_location=self.device)
        else:
            raise RuntimeError(
                f"No model weights could be loaded: serializedFile {serialized!r} is neither TorchScript (.pt) nor "
                "a state_dict with a modelFile (ONNX and AOT-compiled .so archives are not served)"
            )
        self.model.eval()
        self.mapping = load_label_mapping(os.path.join(model_dir, "index_to_name.json"))
        self.initialized = True

    def _load_eager_model(self, model_dir: str, model_file: str, weights: str | None) -> Any:
        if not os.path.isfile(os.path.join(model_dir, model_file)):
            raise RuntimeError("Missing the model.py file")
        # The archive's modules import by their plain names (workbench.platforms.torchserve_imports), as in TorchServe.
        module = import_plain(model_file.split(".")[0])
        classes = model_classes(module)
        if len(classes) != 1:
            raise ValueError(f"Expected only one class as model definition. {classes}")
        model = classes[0]()
        if weights:
            model.load_state_dict(torch.load(weights, map_location=self.device, weights_only=True))
        return model.to(self.device)

    def preprocess(self, data: list[Any]) -> Any:
        return torch.as_tensor(data, device=self.device)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            return self.model(data.to(self.device), *args, **kwargs)

    def postprocess(self, data: Any) -> list[Any]:
        return data.tolist()  # type: ignore[no-any-return]

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        self.context = context
        return self.postprocess(self.inference(self.preprocess(data)))


class VisionHandler(DefaultHandler):
    """Images as bytes (or base64 text), or tensors as JSON lists."""

    image_processing: Callable[[Image.Image], torch.Tensor] = staticmethod(imagenet_transform)

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        images = []
        for row in data:
            image = request_value(row)
            if isinstance(image, str):
                image = base64.b64decode(image)
            if isinstance(image, (bytes, bytearray)):
                try:
                    opened = Image.open(io.BytesIO(image))
                    opened.load()
                except Exception as exc:  # noqa: BLE001 - PIL raises several kinds for bytes that are no image
                    raise ValueError(f"The request is not an image PIL can read: {exc}") from None
                images.append(self.image_processing(opened))
            else:
                images.append(torch.as_tensor(image, dtype=torch.float32))
        return torch.stack(images).to(self.device)


class ImageClassifier(VisionHandler):
    topk = 5

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    def postprocess(self, data: Any) -> list[Any]:
        ps = F.softmax(data, dim=1)
        probs, classes = torch.topk(ps, min(self.topk, ps.shape[1]), dim=1)
        return map_class_to_label(probs.tolist(), self.mapping, classes.tolist())


class ImageSegmenter(VisionHandler):
    """Per image ``[H][W][2]``: each pixel's class and its probability (TorchServe's ``[N, H, W, 2]``)."""

    def postprocess(self, data: Any) -> list[Any]:
        if isinstance(data, dict):
            data = data["out"]
        data = F.softmax(data, dim=1)
        best = torch.max(data, dim=1)
        return torch.stack([best.indices.type(best.values.dtype), best.values], dim=3).tolist()  # type: ignore[no-any-return]


class ObjectDetector(VisionHandler):
    """Per image, the detections scored at least ``threshold``: ``{label: [x1, y1, x2, y2], "score": s}``."""

    threshold = 0.5
    image_processing = staticmethod(to_tensor)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        # TorchServe hands the model the stacked [N, 3, H, W] batch (eager torchvision detectors take it as a list of
        # images); a scripted detector's forward is typed List[Tensor] and takes only a list.
        images = data.to(self.device)
        with torch.inference_mode():
            output = self.model(list(images) if _takes_list(self.model) else images, *args, **kwargs)
        if isinstance(output, tuple):  # a scripted torchvision detector answers (losses, detections)
            output = next(item for item in output if isinstance(item, list))
        return output

    def postprocess(self, data: Any) -> list[Any]:
        result = []
        for row in data:
            keep = row["scores"] >= self.threshold
            boxes, labels, scores = (row[key][keep].tolist() for key in ("boxes", "labels", "scores"))
            detections = []
            for label, box, score in zip(labels, boxes, scores, strict=False):
                detection = map_class_to_label([[box]], self.mapping, [[label]])[0]
                detection["score"] = score
                detections.append(detection)
            result.append(detections)
        return result


def _takes_list(model: Any) -> bool:
    """Whether a TorchScript module's forward takes a list of tensors (a scripted torchvision detector's does)."""
    schema = getattr(getattr(model, "forward", None), "schema", None)
    arguments = getattr(schema, "arguments", None)
    if not isinstance(model, torch.jit.ScriptModule) or not arguments or len(arguments) < 2:
        return False
    return str(arguments[1].type).startswith("List[")


class TextClassifier(DefaultHandler):
    """Text → cleaned tokens and their bigrams → vocabulary indices → ``model(indices, offsets)`` → class scores.

    The vocabulary is the archive's ``source_vocab.pt`` (or the manifest's ``sourceVocab``) as a ``{token: index}``
    dict saved with ``torch.save``; a pickled torchtext ``Vocab`` (TorchServe's examples) needs torchtext, which is
    deprecated, and is refused with that reason. Unknown tokens take index 0 (torchtext's ``<unk>``).
    """

    ngrams = 2

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        model_dir = context.system_properties.get("model_dir")
        path = self.manifest["model"].get("sourceVocab") or os.path.join(model_dir, "source_vocab.pt")
        if not os.path.isabs(path):
            path = os.path.join(model_dir, path)
        if not os.path.isfile(path):
            raise RuntimeError(
                "Missing the source_vocab file. Refer default handler documentation for details on using text_handler."
            )
        try:
            vocab = torch.load(path, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a torchtext Vocab pickle, or a broken file
            raise RuntimeError(
                f"{os.path.basename(path)} must be a {{token: index}} dict saved with torch.save: {exc}"
            ) from None
        if not isinstance(vocab, dict):
            raise RuntimeError(f"{os.path.basename(path)} must be a {{token: index}} dict, not {type(vocab).__name__}")
        self.source_vocab: dict[str, int] = vocab
        try:  # TorchServe's contraction table, when its package is installed (it is data: no torchvision needed)
            self._contractions: dict[str, str] = importlib.import_module(
                "ts.torch_handler.contractions"
            ).CONTRACTION_MAP
        except ImportError:
            self._contractions = {}

    def _tokens(self, text: str) -> list[str]:
        text = CLEANUP_REGEX.sub("", text).lower()
        if self._contractions:
            pattern = re.compile("({})".format("|".join(self._contractions)), flags=re.IGNORECASE | re.DOTALL)
            text = pattern.sub(
                lambda m: (
                    m.group(0)[0]
                    + self._contractions.get(m.group(0), self._contractions.get(m.group(0).lower(), m.group(0)))[1:]
                ),
                text,
            )
        text = re.sub("'", "", text)
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("utf-8", "ignore")
        text = text.translate(str.maketrans("", "", string.punctuation)).lower()
        for pattern_re, replacement in _BASIC_ENGLISH:
            text = pattern_re.sub(replacement, text)
        return text.split()

    def preprocess(self, data: list[Any]) -> list[torch.Tensor]:
        rows = []
        for row in data:
            text = request_value(row)
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            if not isinstance(text, str):
                raise ValueError(f"The text classifier takes text, not {type(text).__name__}")
            tokens = self._tokens(text)
            grams = list(tokens) + [" ".join(tokens[i : i + 2]) for i in range(len(tokens) - 1)]
            rows.append(torch.as_tensor([self.source_vocab.get(g, 0) for g in grams], dtype=torch.int64))
        return rows

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        offsets = torch.as_tensor([0], device=self.device)
        with torch.inference_mode():
            return torch.cat([self.model(row.to(self.device), offsets) for row in data])

    def postprocess(self, data: Any) -> list[Any]:
        return map_class_to_label(F.softmax(data, dim=1).tolist(), self.mapping)


DEFAULT_HANDLERS: dict[str, type[DefaultHandler]] = {
    "image_classifier": ImageClassifier,
    "image_segmenter": ImageSegmenter,
    "object_detector": ObjectDetector,
    "text_classifier": TextClassifier,
}
