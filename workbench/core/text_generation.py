"""What a model that generates or embeds text looks like to the engine: tensor names and parameters, no framework.

OpenAI-compatible endpoints, Triton's generate extension and the chat magic drive any model that follows these
conventions, whichever platform loaded it (a Hugging Face generator, a Python model that yields text). They are
Triton's vLLM backend's, so a model written for Triton's OpenAI frontend is one here too:

- **A text generator** is a decoupled servable whose ``serving_default`` takes :data:`TEXT_INPUT` (BYTES, one
  prompt per request, already templated) and answers with responses carrying :data:`TEXT_OUTPUT` (BYTES: the new
  text of that response, or the whole text when ``stream`` is false). Optional inputs: :data:`STREAM` (BOOL),
  :data:`SAMPLING_PARAMETERS` (BYTES, a JSON object: :class:`SamplingParameters`), and the ``return_*`` flags
  (BOOL) asking for the optional outputs :data:`FINISH_REASON` ("stop" or "length"), :data:`NUM_INPUT_TOKENS`,
  :data:`NUM_OUTPUT_TOKENS` (UINT32, counted so far) and :data:`LOGPROBS` (BYTES, JSON: one
  ``{"token": str, "logprob": float, "top_logprobs": [...]}`` per new token). A model without a flag's input does
  not offer that output; a caller reads what it gets.
- **A text embedder** is a batchable servable whose ``serving_default`` takes :data:`EMBED_INPUT` (BYTES, ``[-1]``)
  and answers :data:`EMBEDDING` (float, ``[-1, dim]``) and, optionally, :data:`EMBED_TOKENS` (INT32, ``[-1]``: each
  text's token count, for usage).
- A servable may also offer :class:`ChatTemplating` (its tokenizer's chat template and token counts); one that does
  not gets :func:`plain_chat_prompt`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import orjson

from workbench.core.errors import invalid_argument
from workbench.core.signatures import Signature

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
STREAM = "stream"
SAMPLING_PARAMETERS = "sampling_parameters"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
RETURN_FINISH_REASON = "return_finish_reason"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"
RETURN_LOGPROBS = "return_logprobs"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
LOGPROBS = "logprobs"

EMBED_INPUT = "text"
EMBEDDING = "embedding"
EMBED_TOKENS = "num_tokens"

FINISHED_BY_STOP = "stop"
FINISHED_BY_LENGTH = "length"


@dataclasses.dataclass(frozen=True)
class SamplingParameters:
    """How one generation samples and when it ends (the JSON of :data:`SAMPLING_PARAMETERS`; vLLM's names).

    ``temperature`` 0 is greedy decoding. ``stop`` strings end the text before them (not included); ``max_tokens``
    None means the model's own limit. ``logprobs`` (0..20) asks for that many alternatives per token beside the
    chosen one's log-probability, where the model offers :data:`LOGPROBS`.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: int | None = None

    @classmethod
    def from_json(cls, text: bytes | str) -> SamplingParameters:
        """Parse and check the input's JSON; a bad value is INVALID_ARGUMENT naming it."""
        try:
            doc = orjson.loads(text) if text else {}
        except orjson.JSONDecodeError as exc:
            raise invalid_argument(f"{SAMPLING_PARAMETERS} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise invalid_argument(f"{SAMPLING_PARAMETERS} must be a JSON object")
        return cls.from_mapping(doc)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> SamplingParameters:
        unknown = sorted(set(doc) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise invalid_argument(f"Unknown sampling parameters: {', '.join(unknown)}")
        stop = doc.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise invalid_argument("stop must be a non-empty string or a list of them")
        params = cls(
            max_tokens=_optional_int(doc, "max_tokens", 1),
            temperature=_number(doc, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(doc, "top_p", 1.0, 0.0, 1.0),
            stop=tuple(stop),
            seed=_optional_int(doc, "seed", None),
            logprobs=_optional_int(doc, "logprobs", 0, 20),
        )
        if params.top_p == 0.0:
            raise invalid_argument("top_p must be greater than 0")
        return params

    def to_json(self) -> bytes:
        doc = {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, ())}
        return orjson.dumps(doc)


def _optional_int(doc: Mapping[str, Any], key: str, low: int | None, high: int | None = None) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_argument(f"{key} must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise invalid_argument(f"{key} must be {bounds}; got {value}")
    return value


def _number(doc: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_argument(f"{key} must be a number")
    if not low <= value <= high:
        raise invalid_argument(f"{key} must be between {low:g} and {high:g}; got {value}")
    return float(value)


@runtime_checkable
class ChatTemplating(Protocol):
    """A servable that knows its tokenizer: chat messages to a prompt as the model was trained on, and counts."""

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """``messages`` (OpenAI's: ``role``, ``content``) as one prompt, ending where the assistant's turn starts."""

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is to this model."""


def plain_chat_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt of a model with no chat template of its own: ``role: content`` lines, then ``assistant:``."""
    lines = [f"{m.get('role', 'user')}: {message_text(m)}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message's text: its ``content`` string, or the text parts of a list of content parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    raise invalid_argument("a message's content must be a string or a list of content parts")


def is_text_generator(signature: Signature | None, decoupled: bool) -> bool:
    """Whether a servable with this ``serving_default`` follows the generator convention."""
    return decoupled and signature is not None and TEXT_INPUT in signature.inputs and TEXT_OUTPUT in signature.outputs


def is_text_embedder(signature: Signature | None, decoupled: bool) -> bool:
    """Whether a servable with this ``serving_default`` follows the embedder convention."""
    return (
        not decoupled and signature is not None and EMBED_INPUT in signature.inputs and EMBEDDING in signature.outputs
    )
