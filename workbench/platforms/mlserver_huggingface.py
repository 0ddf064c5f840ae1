"""MLServer's Hugging Face runtime (``"implementation": "mlserver_huggingface.HuggingFaceRuntime"``), answered as it
answers, by workbench's own code: MLServer's package is not installed (its runtime imports TensorFlow, Optimum and
transformers 4's conversational pipeline, which transformers 5 removed).

The settings' ``parameters.extra`` name the pipeline: ``task`` (with ``task_suffix``), ``pretrained_model`` (a local
folder, relative to the settings file or absolute; else ``parameters.uri``), ``pretrained_tokenizer`` (else the
model's folder), ``model_kwargs``, ``device``. Nothing is downloaded: a model id that is not a folder is refused. The
folder's weights are safetensors, or pickles under ``--allow_pickle`` (:mod:`workbench.platforms.huggingface_folders`).

A request is decoded as MLServer's ``HuggingfaceRequestCodec`` decodes it: each input by its ``content_type`` (the
request's, else its own; by default ``str``: the BYTES elements as a list of strings; ``hg_json`` one JSON object,
``hg_jsonlist`` a list of them, ``raw`` the first element, ``np`` an array), keyed by name; ``args`` becomes the
positional arguments (``pipeline(*args, **rest)``: one string in ``args`` is the pipeline's one text) and
``array_inputs`` one list before them. The answer is MLServer's: one output ``output``, BYTES ``[n, 1]``, each element
the JSON of one item of what the pipeline returned (``content_type: hg_jsonlist``), written by ``json.dumps`` as
MLServer writes it; TF Serving's APIs get the same ``output`` (their inputs decoded as ``str``). The pipeline is
``transformers.pipeline`` of the installed transformers (5), called one request at a time
on a thread of the model's; question-answering, whose pipeline transformers 5 removed, is workbench's own
(:class:`~workbench.platforms.huggingface_tasks.QuestionAnswering`), answering ``{"score", "start", "end",
"answer"}`` as the pipeline did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config.mlserver_settings import ModelSettings
from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.core.whole_requests import Tensor, WholeRequest, WholeRequestServable, WholeResponse
from workbench.platforms import huggingface_folders as folders
from workbench.platforms import pytorch
from workbench.platforms.base import LoadPolicy
from workbench.platforms.mlserver_runtime import RuntimeVersionName

RUNTIME = "mlserver_huggingface.HuggingFaceRuntime"
OUTPUT = "output"
JSON_LIST = "hg_jsonlist"


def load(name: str, version: int, settings: ModelSettings, policy: LoadPolicy) -> WholeRequestServable:
    """The pipeline the settings name (see the module's docstring), as version ``version`` of ``name``."""
    extra = settings.extra
    task = extra.get("task")
    if not isinstance(task, str) or not task:
        raise ServingError(
            Code.INVALID_ARGUMENT, f'{settings.source}: parameters.extra names no "task" (e.g. "text-classification")'
        )
    task += str(extra.get("task_suffix") or "") if task == "translation" else ""
    model = _folder(settings, extra.get("pretrained_model"), "pretrained_model") or Path(settings.model_uri)
    tokenizer = _folder(settings, extra.get("pretrained_tokenizer"), "pretrained_tokenizer") or model
    folders.read_config(model)
    safetensors = folders.weights_are_safetensors(model, policy.allow_pickle)
    device = extra.get("device")
    placed = pytorch.resolve_device(policy.pytorch_device if device is None else _device_name(device))
    pytorch.configure_threads(policy.pytorch_threads)
    call = _question_answering(model, tokenizer, placed, safetensors) if task == folders.QUESTION_ANSWERING else None
    if call is None:
        call = _pipeline(task, model, tokenizer, placed, safetensors, extra.get("model_kwargs"))
    return HuggingFaceRuntimeServable(name, version, settings, call, str(placed))


def _folder(settings: ModelSettings, value: Any, key: str) -> Path | None:
    """A ``pretrained_*`` setting as a local folder (relative to the settings file, else as written)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ServingError(Code.INVALID_ARGUMENT, f"{settings.source}: parameters.extra.{key} must be a folder")
    for candidate in (settings.folder / value, Path(value)):
        if candidate.is_dir():
            return candidate
    raise ServingError(
        Code.FAILED_PRECONDITION,
        f"{settings.source}: parameters.extra.{key} {value!r} is not a folder here; workbench downloads nothing from "
        "the Hugging Face Hub: save_pretrained the model into a folder and name that",
    )


def _device_name(device: Any) -> str:
    """MLServer's ``device`` (an ordinal, -1 for the CPU, or a name) as ``--pytorch_device`` words it."""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu" if device < 0 else f"cuda:{device}"
    return str(device)


def _pipeline(
    task: str, model: Path, tokenizer: Path, device: Any, safetensors: bool, model_kwargs: Any
) -> Callable[..., Any]:
    import transformers

    from workbench.platforms.huggingface_loading import load_lock, quiet_transformers

    keywords = dict(model_kwargs) if isinstance(model_kwargs, Mapping) else {}
    keywords.update(use_safetensors=safetensors)  # the folders are local: nothing is looked up on the Hub
    try:
        with load_lock, quiet_transformers():
            build: Callable[..., Any] = transformers.pipeline  # its overloads want a literal task
            made: Callable[..., Any] = build(
                task,
                model=str(model),
                tokenizer=str(tokenizer),
                device=device,
                model_kwargs=keywords,
                trust_remote_code=False,
            )
    except KeyError as exc:  # an unknown or removed task: transformers says which
        raise ServingError(Code.INVALID_ARGUMENT, f"task {task!r}: {str(exc).strip(chr(39))}") from None
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        raise ServingError(Code.DATA_LOSS, f"transformers cannot load {model} for {task}: {exc}") from None
    return made


def _question_answering(model: Path, tokenizer: Path, device: Any, safetensors: bool) -> Callable[..., Any]:
    """workbench's extractive QA as a pipeline would be called (``question=``, ``context=``; lists or strings)."""
    from workbench.platforms.huggingface import load_model
    from workbench.platforms.huggingface_tasks import QuestionAnswering

    task = QuestionAnswering(load_model(model, tokenizer, QuestionAnswering.model_class, device, safetensors), {})

    def answer(question: Any = None, context: Any = None, **unknown: Any) -> Any:
        if unknown:
            raise TypeError(f"question-answering takes question and context, not {', '.join(sorted(unknown))}")
        single = isinstance(question, str)
        questions = [question] if single else list(question or [])
        contexts = [context] if isinstance(context, str) else list(context or [])
        if len(contexts) == 1 and len(questions) > 1:
            contexts *= len(questions)
        if not questions or len(questions) != len(contexts):
            raise ValueError("question-answering needs as many questions as contexts")
        found = task.compute(list(zip(questions, contexts, strict=True)))
        answers = [{"score": score, "start": start, "end": end, "answer": text} for text, score, start, end in found]
        return answers[0] if len(answers) == 1 else answers

    return answer


class HuggingFaceRuntimeServable(WholeRequestServable):
    """A pipeline answering whole v2 requests as MLServer's Hugging Face runtime does."""

    streams_as_responses = True  # MLServer's ModelStreamInfer answers bare responses

    def __init__(self, name: str, version: int, settings: ModelSettings, call: Callable[..., Any], device: str) -> None:
        self.name, self.version, self.path = name, version, str(settings.folder)
        self.platform = "mlserver"
        self.device = device
        self.version_name = settings.version or None
        self.v2_dialect = RuntimeVersionName(settings.version)  # the metadata's version string
        self._call = call
        # One call at a time, on a thread of the model's: a pipeline keeps per-call state (its tokenizer's settings).
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hf-{name}")
        inputs = {"args": TensorSpec("args", "args", np.dtype(object), (-1,))}
        outputs = {OUTPUT: TensorSpec(OUTPUT, OUTPUT, np.dtype(object), (-1, 1))}
        self.signatures = {
            DEFAULT_SIGNATURE: Signature(DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs, batchable=False)
        }

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._call = _closed

    async def answer(self, request: WholeRequest) -> WholeResponse:
        keywords = decode_request(request)
        loop = asyncio.get_running_loop()
        prediction = await loop.run_in_executor(self._thread, self._predict, keywords)
        return WholeResponse(outputs=(encode_output(prediction),), id=request.id, model_version=self.version_name)

    def _predict(self, keywords: dict[str, Any]) -> Any:
        args = keywords.pop("args", [])
        array_inputs = keywords.pop("array_inputs", [])
        if array_inputs:
            args = [list(array_inputs), *args]
        try:
            return self._call(*args, **keywords)
        except (ValueError, TypeError, KeyError) as exc:  # MLServer answers a pipeline's refusal with a 400
            raise invalid_argument(f"{type(exc).__name__}: {exc}") from None
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model's own failure
            raise ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}") from None

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """A request of numpy inputs (TF Serving's APIs, warmup): each input decoded as MLServer's ``str`` codec."""
        tensors = tuple(Tensor(alias, "BYTES", value.shape, value.reshape(-1)) for alias, value in inputs.items())
        keywords = decode_request(WholeRequest(tensors))
        answer = encode_output(self._thread.submit(self._predict, keywords).result())
        return {OUTPUT: answer.data.reshape(answer.shape)}

    async def answer_stream(self, requests: AsyncIterator[WholeRequest]) -> AsyncGenerator[WholeResponse, None]:
        """MLModel's default ``predict_stream``: the stream's first request, answered once."""
        async for request in requests:
            yield await self.answer(request)
            return


def _closed(*args: Any, **keywords: Any) -> Any:
    raise ServingError(Code.UNAVAILABLE, "The model is unloaded")


# ================================================================================== MLServer's codecs, as it has them
def decode_request(request: WholeRequest) -> dict[str, Any]:
    """Each input by its content type (its own, else the request's, else ``str``), keyed by name."""
    default = str(request.parameters.get("content_type") or "")
    return {
        tensor.name: decode_input(tensor, str(tensor.parameters.get("content_type") or default))
        for tensor in request.inputs
    }


def _text(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            raise invalid_argument("a BYTES element is not UTF-8 text") from None
    return value


def decode_input(tensor: Tensor, content_type: str) -> Any:
    elements = list(tensor.data.ravel())
    if content_type == "hg_json":
        return _json(elements[0] if elements else b"null", tensor.name)
    if content_type == JSON_LIST:
        return [_json(element, tensor.name) for element in elements]
    if content_type == "raw":
        return _text(elements[0]) if elements else None
    if content_type in ("np", "nplist"):
        array = np.asarray(tensor.data).reshape(tensor.shape)
        return list(array) if content_type == "nplist" else array
    if content_type == "base64":
        import base64

        return [base64.b64decode(_text(element)) for element in elements]
    if content_type not in ("", "str", "hf"):
        raise invalid_argument(
            f"Input {tensor.name}: content type {content_type!r} is not decoded here (str, hg_json, hg_jsonlist, raw, "
            "np, nplist, base64)"
        )
    return [_text(element) for element in elements]  # MLServer's StringCodec


def _json(element: Any, name: str) -> Any:
    try:
        return json.loads(_text(element))
    except ValueError as exc:
        raise invalid_argument(f"Input {name} is not JSON: {exc}") from None


class _Encoder(json.JSONEncoder):
    """MLServer's ``JSONEncoderWithArray``: numpy arrays and scalars as JSON."""

    def default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return obj.tolist()
        if isinstance(obj, np.floating):
            return float(obj)
        if isinstance(obj, np.integer):
            return int(obj)
        return super().default(obj)


def encode_output(prediction: Any) -> Tensor:
    """``HuggingfaceListJSONCodec.encode_output("output", ...)``: one JSON element per item, shape [n, 1]."""
    items = prediction if isinstance(prediction, list) else [prediction]
    data = np.empty(len(items), dtype=object)
    data[:] = [json.dumps(item, cls=_Encoder).encode() for item in items]
    return Tensor(OUTPUT, "BYTES", (len(items), 1), data, {"content_type": JSON_LIST})
