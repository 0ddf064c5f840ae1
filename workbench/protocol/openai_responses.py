"""OpenAI's answer bodies: completions and chat completions (whole, and as server-sent chunks), embeddings, the
model list, usage, log-probabilities, and errors in OpenAI's shape with OpenAI's status codes.

Pure translation, like :mod:`workbench.protocol.openai_requests`: what the frontend collected in, JSON bytes out.
:func:`error_answer` is the one place workbench's :class:`~workbench.core.errors.Code` becomes OpenAI's status,
``type`` and ``code``.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from workbench.core.errors import Code, ServingError

OWNED_BY = "workbench"
DONE = b"data: [DONE]\n\n"  # the end of every stream, as OpenAI sends it

# Code → (HTTP status, OpenAI's error type, OpenAI's error code). A request the model cannot serve as sent is the
# client's to fix (400), never a server error; overload is 429 (a queue is full) or 503 (nothing serves now), which
# OpenAI's clients retry.
_ERRORS: Mapping[Code, tuple[int, str, str | None]] = {
    Code.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    Code.FAILED_PRECONDITION: (400, "invalid_request_error", None),
    Code.OUT_OF_RANGE: (400, "invalid_request_error", None),
    Code.UNIMPLEMENTED: (400, "invalid_request_error", None),
    Code.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    Code.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key"),
    Code.PERMISSION_DENIED: (403, "permission_error", None),
    Code.ALREADY_EXISTS: (409, "invalid_request_error", None),
    Code.ABORTED: (409, "invalid_request_error", None),
    Code.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    Code.CANCELLED: (499, "invalid_request_error", None),
    Code.DEADLINE_EXCEEDED: (504, "timeout_error", "timeout"),
    Code.UNAVAILABLE: (503, "server_error", "service_unavailable"),
}
_SERVER_ERROR = (500, "server_error", None)


def error_answer(error: ServingError) -> tuple[int, dict[str, Any]]:
    """``{"error": {"message", "type", "param", "code"}}`` and its HTTP status; ``param`` from an error that names
    one (:class:`~workbench.protocol.openai_requests.InvalidParameter`)."""
    status, kind, code = _ERRORS.get(error.code, _SERVER_ERROR)
    param = getattr(error, "param", None)
    return status, {"error": {"message": error.message, "type": kind, "param": param, "code": code}}


def unknown_url(method: str, path: str) -> dict[str, Any]:
    """OpenAI's 404 for a path it has no endpoint at."""
    return {
        "error": {
            "message": f"Invalid URL ({method} {path})",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


def json_bytes(doc: Any) -> bytes:
    return orjson.dumps(doc)


def event(doc: Any) -> bytes:
    """One server-sent event as OpenAI streams them: ``data: {...}`` and a blank line."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


# ------------------------------------------------------------------------------------------------------ models
def model_entry(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": OWNED_BY}


def model_list(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": list(entries)}


# ------------------------------------------------------------------------------------------------------- usage
@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def json(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}


# ----------------------------------------------------------------------------------------------- log-probabilities
def chat_logprobs(tokens: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Chat's ``choices[].logprobs`` from the convention's per-token entries (``token``, ``logprob``,
    ``top_logprobs``)."""
    return {"content": [_chat_token(t, with_top=True) for t in tokens], "refusal": None}


def _chat_token(token: Mapping[str, Any], with_top: bool) -> dict[str, Any]:
    text = str(token.get("token", ""))
    entry: dict[str, Any] = {"token": text, "logprob": float(token.get("logprob", 0.0)), "bytes": list(text.encode())}
    if with_top:
        entry["top_logprobs"] = [_chat_token(t, with_top=False) for t in token.get("top_logprobs") or ()]
    return entry


def completion_logprobs(tokens: Sequence[Mapping[str, Any]], start: int = 0) -> dict[str, Any]:
    """Completions' legacy ``logprobs``: tokens, their log-probabilities, the alternatives by token, and where each
    token starts in the choice's text (``start``: where the generated text starts, after an echoed prompt)."""
    offsets, at = [], start
    for token in tokens:
        offsets.append(at)
        at += len(str(token.get("token", "")))
    return {
        "tokens": [str(t.get("token", "")) for t in tokens],
        "token_logprobs": [float(t.get("logprob", 0.0)) for t in tokens],
        "top_logprobs": [
            {str(alt.get("token", "")): float(alt.get("logprob", 0.0)) for alt in t.get("top_logprobs") or ()}
            for t in tokens
        ],
        "text_offset": offsets,
    }


# ---------------------------------------------------------------------------------------------------- answers
@dataclasses.dataclass(frozen=True)
class Choice:
    """One generated choice, whole."""

    index: int
    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None


def chat_completion(
    answer_id: str, created: int, model: str, choices: Sequence[Choice], usage: Usage
) -> dict[str, Any]:
    return {
        "id": answer_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text, "refusal": None},
                "logprobs": c.logprobs,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage.json(),
    }


def completion(answer_id: str, created: int, model: str, choices: Sequence[Choice], usage: Usage) -> dict[str, Any]:
    return {
        "id": answer_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": c.index, "text": c.text, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
            for c in choices
        ],
        "usage": usage.json(),
    }


@dataclasses.dataclass(frozen=True)
class Chunks:
    """The chunks of one streamed answer: ``chat`` (``chat.completion.chunk``, text in ``delta``) or completions
    (``text_completion``, text in ``text``). Every chunk has ``"usage": null`` when the client asked for the usage,
    which then comes in a last chunk of its own with no choices (:meth:`usage`)."""

    answer_id: str
    created: int
    model: str
    chat: bool
    include_usage: bool

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.answer_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            doc["usage"] = None
        return doc

    def role(self, index: int) -> bytes:
        """Chat's first chunk of a choice: the assistant's role, no text yet."""
        delta = {"role": "assistant", "content": ""}
        return event(self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]))

    def text(self, index: int, text: str, logprobs: dict[str, Any] | None = None) -> bytes:
        if self.chat:
            choice = {"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
        return event(self._chunk([choice]))

    def finish(self, index: int, finish_reason: str) -> bytes:
        if self.chat:
            choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason}
        return event(self._chunk([choice]))

    def usage(self, usage: Usage) -> bytes:
        doc = self._chunk([])
        doc["usage"] = usage.json()
        return event(doc)


def error_event(error: ServingError) -> bytes:
    """An error after the stream began (its status is sent): an event of OpenAI's error shape, which OpenAI's
    clients raise as ``APIError``."""
    return event(error_answer(error)[1])


# ------------------------------------------------------------------------------------------------- embeddings
def embedding_list(model: str, vectors: np.ndarray, encoding_format: str, prompt_tokens: int) -> dict[str, Any]:
    """``/v1/embeddings``' answer: one ``embedding`` per input, floats or base64 of little-endian float32 (as
    OpenAI encodes them)."""
    rows = np.asarray(vectors, dtype=np.float32)
    if encoding_format == "base64":
        little = rows.astype("<f4", copy=False)
        data = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        data = rows.tolist()
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
