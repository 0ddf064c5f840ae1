"""OpenAI's request bodies read and checked: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, and
the ``model`` field's names for versions and labels.

Pure translation: bytes in, frozen dataclasses out, or :class:`InvalidParameter` naming the parameter at fault (the
``param`` of OpenAI's error). What a parameter does here, where OpenAI's API has it:

- **honoured**: ``model``, ``messages``, ``prompt``, ``max_tokens`` / ``max_completion_tokens`` (the latter wins),
  ``temperature``, ``top_p``, ``stop``, ``seed``, ``n``, ``stream``, ``stream_options.include_usage``, ``logprobs``
  / ``top_logprobs``, ``echo``; ``input``, ``encoding_format``.
- **refused with a 400 when set to anything but its neutral value** (the model cannot honour it, and a silent
  "yes" would be a wrong answer): ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``suffix``,
  ``best_of`` other than ``n``, ``response_format`` other than text, ``tools`` / ``functions`` /
  ``tool_choice`` / ``function_call`` other than none, ``audio``, ``modalities`` other than text,
  ``prediction``, ``web_search_options``, ``dimensions``, token arrays as ``prompt`` or ``input``, non-text message
  parts (images, audio, files), ``echo`` together with ``logprobs``.
- **ignored** (as vLLM ignores what it does not know): ``user``, ``store``, ``metadata``, ``service_tier``,
  ``parallel_tool_calls``, ``reasoning_effort``, ``stream_options.include_obfuscation``, and any other field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import orjson

from workbench.core.errors import Code, ServingError
from workbench.core.text_generation import SamplingParameters

MAX_N = 128  # OpenAI's bound on n
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (OpenAI's bound, and SamplingParameters')
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# "m:2" names version 2 of model m, "m:canary" its label canary (as workbench's --pin MODEL:VERSION, Ollama's name:tag)
VERSION_SEPARATOR = ":"


class InvalidParameter(ServingError):
    """A request OpenAI's API would refuse with 400 ``invalid_request_error``: ``param`` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(Code.INVALID_ARGUMENT, message)
        self.param = param


# ------------------------------------------------------------------------------------------------ model names
@dataclasses.dataclass(frozen=True)
class ModelName:
    """What OpenAI's ``model`` field names: a model, and at most one of a version or a label."""

    model: str
    version: int | None = None
    label: str | None = None


def parse_model_name(text: str, is_model: Callable[[str], bool]) -> ModelName:
    """``m`` (the model's default routing: canary share, sticky keys), ``m:2`` (version 2), ``m:canary`` (the
    version labelled canary). A model whose own name has a colon is found by its whole name first."""
    if is_model(text):
        return ModelName(text)
    name, colon, suffix = text.rpartition(VERSION_SEPARATOR)
    if not colon or not name or not suffix:
        return ModelName(text)
    if suffix.isdigit():
        return ModelName(name, version=int(suffix))
    return ModelName(name, label=suffix)


def model_id(model: str, version: int | None = None, label: str | None = None) -> str:
    """The ``model`` text naming what :func:`parse_model_name` reads back."""
    if version is not None:
        return f"{model}{VERSION_SEPARATOR}{version}"
    if label is not None:
        return f"{model}{VERSION_SEPARATOR}{label}"
    return model


# ---------------------------------------------------------------------------------------------------- requests
@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """What chat and completions requests share: the model, how many choices, streaming, and sampling."""

    model: str
    sampling: SamplingParameters
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    logprobs: bool = False  # the client asked for log-probabilities (sampling.logprobs: how many alternatives)


@dataclasses.dataclass(frozen=True)
class ChatRequest(GenerationRequest):
    messages: tuple[Mapping[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    prompts: tuple[str, ...] = ()
    echo: bool = False


@dataclasses.dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]
    encoding_format: Literal["float", "base64"] = "float"


def parse_chat(body: bytes) -> ChatRequest:
    doc = _document(body)
    _model(doc)  # the first thing a client must say
    _refuse_unsupported(doc, _CHAT_REFUSALS)
    messages = _messages(doc)
    logprobs = bool(_boolean(doc, "logprobs"))
    top = _integer(doc, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise InvalidParameter("top_logprobs needs logprobs set to true", "top_logprobs")
    common = _generation(doc, logprobs=(top or 0) if logprobs else None)
    return ChatRequest(**common, logprobs=logprobs, messages=messages)


def parse_completion(body: bytes) -> CompletionRequest:
    doc = _document(body)
    _model(doc)
    _refuse_unsupported(doc, _COMPLETION_REFUSALS)
    suffix = doc.get("suffix")
    if suffix not in (None, ""):
        raise InvalidParameter("suffix is not supported: the model completes after the prompt only", "suffix")
    prompts = _texts(doc, "prompt")
    logprobs = _integer(doc, "logprobs", 0, MAX_TOP_LOGPROBS)
    echo = bool(_boolean(doc, "echo"))
    if echo and logprobs is not None:
        why = "echo with logprobs is not supported: the prompt's log-probabilities are not kept"
        raise InvalidParameter(why, "echo")
    common = _generation(doc, logprobs=logprobs)
    best_of = _integer(doc, "best_of", 1, MAX_N)
    if best_of is not None and best_of != common["n"]:
        raise InvalidParameter("best_of is not supported (other than equal to n)", "best_of")
    return CompletionRequest(**common, logprobs=logprobs is not None, prompts=prompts, echo=echo)


def parse_embedding(body: bytes) -> EmbeddingRequest:
    doc = _document(body)
    if doc.get("dimensions") is not None:
        raise InvalidParameter("dimensions is not supported: the model's embeddings have their own size", "dimensions")
    encoding = doc.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise InvalidParameter("encoding_format must be 'float' or 'base64'", "encoding_format")
    return EmbeddingRequest(_model(doc), _texts(doc, "input"), "base64" if encoding == "base64" else "float")


# ------------------------------------------------------------------------------------------------- the fields
def _document(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError as exc:
        raise InvalidParameter(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidParameter("The request body must be a JSON object")
    return doc


def _model(doc: Mapping[str, Any]) -> str:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidParameter("you must provide a model parameter", "model")
    return model


def _generation(doc: Mapping[str, Any], logprobs: int | None) -> dict[str, Any]:
    """The fields of :class:`GenerationRequest` (but ``logprobs``), checked."""
    max_tokens = _integer(doc, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(doc, "max_tokens", 1)
    else:
        _integer(doc, "max_tokens", 1)  # checked even when max_completion_tokens wins
    temperature = _number(doc, "temperature", 0.0, 2.0)
    top_p = _number(doc, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise InvalidParameter("top_p must be greater than 0", "top_p")
    stream = bool(_boolean(doc, "stream"))
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise InvalidParameter("stream_options is only allowed when stream is true", "stream_options")
        if not isinstance(options, dict):
            raise InvalidParameter("stream_options must be an object", "stream_options")
        include_usage = bool(_boolean(options, "include_usage", "stream_options.include_usage"))
    sampling = SamplingParameters(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        stop=_stop(doc),
        seed=_integer(doc, "seed"),
        logprobs=logprobs,
    )
    n = _integer(doc, "n", 1, MAX_N)
    return {
        "model": _model(doc),
        "sampling": sampling,
        "n": 1 if n is None else n,
        "stream": stream,
        "include_usage": include_usage,
    }


def _stop(doc: Mapping[str, Any]) -> tuple[str, ...]:
    stop = doc.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidParameter("stop must be a string or a list of strings", "stop")
    return tuple(s for s in stop if s)  # an empty stop string stops nothing (OpenAI accepts it)


def _messages(doc: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidParameter("messages must be a non-empty list of messages", "messages")
    for index, message in enumerate(messages):
        where = f"messages.[{index}]"
        if not isinstance(message, dict):
            raise InvalidParameter(f"{where} must be an object", where)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidParameter(f"{where}.role must be one of {', '.join(sorted(CHAT_ROLES))}", f"{where}.role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise InvalidParameter(f"{where}.content must be a string or a list of content parts", f"{where}.content")
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidParameter(
                    f"{where}.content has a part of type {kind!r}: this server's models take text parts only",
                    f"{where}.content",
                )
    return tuple(messages)


def _texts(doc: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """``prompt`` or ``input``: a string or a non-empty list of strings; token arrays are refused."""
    value = doc.get(key)
    if isinstance(value, str):
        texts: Sequence[Any] = [value]
    elif isinstance(value, list) and value:
        texts = value
    else:
        raise InvalidParameter(f"{key} must be a string or a non-empty list of strings", key)
    if not all(isinstance(t, str) for t in texts):
        if all(isinstance(t, (int, list)) for t in texts):
            raise InvalidParameter(f"{key} as token ids is not supported: send text", key)
        raise InvalidParameter(f"{key} must be a string or a list of strings", key)
    if key == "input" and any(not t for t in texts):
        raise InvalidParameter("input must not hold empty strings", key)
    return tuple(texts)


def _integer(doc: Mapping[str, Any], key: str, low: int | None = None, high: int | None = None) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"{key} must be an integer", key)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise InvalidParameter(f"{key} must be {bounds}; got {value}", key)
    return value


def _number(doc: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameter(f"{key} must be a number", key)
    if not low <= value <= high:
        raise InvalidParameter(f"{key} must be between {low:g} and {high:g}; got {value}", key)
    return float(value)


def _boolean(doc: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidParameter(f"{param or key} must be true or false", param or key)
    return value


# ------------------------------------------------------------------------------ what is refused when it is set
def _neutral_penalty(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)


def _nothing(value: Any) -> bool:
    return value is None or value == {} or value == []


def _text_format(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "text")


def _no_tools(value: Any) -> bool:
    return value in (None, "none")


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


# field → (whether its value is one the model can honour, why it cannot otherwise)
Refusals = Mapping[str, tuple[Callable[[Any], bool], str]]
_SAMPLING_REFUSALS: Refusals = {
    "frequency_penalty": (_neutral_penalty, "frequency_penalty is not supported (only 0)"),
    "presence_penalty": (_neutral_penalty, "presence_penalty is not supported (only 0)"),
    "logit_bias": (_nothing, "logit_bias is not supported"),
}
_CHAT_REFUSALS: Refusals = {
    **_SAMPLING_REFUSALS,
    "response_format": (_text_format, "response_format is not supported (only {'type': 'text'})"),
    "tools": (_nothing, "tools are not supported"),
    "functions": (_nothing, "functions are not supported"),
    "tool_choice": (_no_tools, "tool_choice is not supported (only 'none')"),
    "function_call": (_no_tools, "function_call is not supported (only 'none')"),
    "audio": (_nothing, "audio output is not supported"),
    "modalities": (_text_only, "modalities other than ['text'] are not supported"),
    "prediction": (_nothing, "prediction (predicted outputs) is not supported"),
    "web_search_options": (_nothing, "web_search_options is not supported"),
}
_COMPLETION_REFUSALS: Refusals = _SAMPLING_REFUSALS


def _refuse_unsupported(doc: Mapping[str, Any], refusals: Refusals) -> None:
    for key, (honoured, why) in refusals.items():
        if key in doc and not honoured(doc[key]):
            raise InvalidParameter(why, key)
