"""Chat with a served model over its OpenAI-compatible endpoint (``POST /v1/chat/completions``), streamed.

What the notebook's ``%serve chat`` and chat widget stand on: the answer's pieces as they come (server-sent events,
OpenAI's chunk shape), and what the caller wants to see of them (time to the first token, tokens per second, usage).
Plain ``requests``, so the package needs no OpenAI client; the client's token and TLS settings apply.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from workbench.client.http import HttpConnection, code_of_status
from workbench.core.errors import Code, ServingError
from workbench.core.sticky import STICKY_HEADER

CHAT_PATH = "/v1/chat/completions"


@dataclasses.dataclass
class ChatAnswer:
    """One answer of a chat model: its text, why it ended, and how fast it came."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    first_token_seconds: float | None  # from sending the request to the first piece of text
    seconds: float  # from sending the request to the end of the stream

    @property
    def tokens_per_second(self) -> float | None:
        """Completion tokens per second after the first one came (None when too few to say)."""
        if not self.completion_tokens or self.first_token_seconds is None or self.completion_tokens < 2:
            return None
        decoding = self.seconds - self.first_token_seconds
        return (self.completion_tokens - 1) / decoding if decoding > 0 else None

    def summary(self) -> str:
        """``12 tokens · first after 45 ms · 180 tokens/s · stop``, for a cell or a widget."""
        parts = []
        if self.completion_tokens is not None:
            parts.append(f"{self.completion_tokens} tokens")
        if self.first_token_seconds is not None:
            parts.append(f"first after {self.first_token_seconds * 1000:.0f} ms")
        rate = self.tokens_per_second
        if rate is not None:
            parts.append(f"{rate:.0f} tokens/s")
        if self.finish_reason:
            parts.append(self.finish_reason)
        return " · ".join(parts)

    def __str__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # A cell that streamed the text shows how it came, not the text twice.
        printer.text(f"<{self.summary() or 'no answer'}>")


def stream_chat(
    http: HttpConnection,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    on_piece: Callable[[str], None] | None = None,
    key: str | None = None,
    **parameters: Any,
) -> ChatAnswer:
    """Ask ``model`` for the next message after ``messages``, streamed; ``on_piece`` gets each piece of text as it
    comes. ``parameters`` are OpenAI's (``max_tokens``, ``temperature``, ``seed``...), passed as they are; ``key`` is
    a stickiness key (one conversation stays on one version under a canary split)."""
    body = {
        "model": model,
        "messages": list(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
        **{k: v for k, v in parameters.items() if v is not None},
    }
    started = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    finish_reason: str | None = None
    usage: Mapping[str, Any] = {}
    for chunk in _events(http, body, {STICKY_HEADER: key} if key else None):
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece:
                if first is None:
                    first = time.perf_counter() - started
                pieces.append(piece)
                if on_piece is not None:
                    on_piece(piece)
            finish_reason = choice.get("finish_reason") or finish_reason
    return ChatAnswer(
        text="".join(pieces),
        finish_reason=finish_reason,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        first_token_seconds=first,
        seconds=time.perf_counter() - started,
    )


def _events(
    http: HttpConnection, body: Mapping[str, Any], headers: Mapping[str, str] | None
) -> Iterator[dict[str, Any]]:
    """The stream's JSON chunks, until ``data: [DONE]``; an error answer or event as a ServingError."""
    response = http.post_stream(CHAT_PATH, body, headers)
    with response:
        if response.status_code != 200:
            raise _error(response.status_code, response.content)
        for line in response.iter_lines():
            if not line.startswith(b"data:"):
                continue  # blank lines between events, comments (": keep-alive")
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            chunk = orjson.loads(data)
            if isinstance(chunk, dict) and "error" in chunk:
                raise _error(0, data)
            yield chunk


def _error(status: int, content: bytes) -> ServingError:
    """OpenAI's error shape (``{"error": {"message": ...}}``) as a ServingError with the status's code."""
    try:
        doc = orjson.loads(content)
        error = doc.get("error") if isinstance(doc, dict) else None
        message = str(error.get("message") if isinstance(error, dict) else error or content[:300])
    except orjson.JSONDecodeError:
        message = content[:300].decode(errors="replace")
    return ServingError(code_of_status(status) if status else Code.UNKNOWN, message)
