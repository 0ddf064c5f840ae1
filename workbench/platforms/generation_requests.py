"""One text generation request: its tokens turned into text as they come, when it ends, and its stream of responses.

The scheduler's thread hands a :class:`GenerationRequest` each token its engine drew (:meth:`GenerationRequest.accept`);
the request decodes it into text, checks the stop strings, the token limit and the end-of-sequence token, and
tells the scheduler when it is finished. The client's side is :class:`GenerationResponses`, the decoupled servable's
iterator: each ``next()`` waits for what the steps since the last response added and answers it in the generator
convention's tensors (``core/text_generation.py``). It is an async iterator too, which the data plane prefers: a
token then reaches its stream's coroutine through one callback on the event loop, where ``next()`` on a worker thread
cost a thread's wake-up and a hop back to the loop for every token of every stream. It needs no framework: only a
tokenizer's ``decode``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import orjson

from workbench.core import text_generation as tg
from workbench.core.errors import ServingError
from workbench.core.servable import FinalResponse

# Tokens of context decoded before the new ones, so a tokenizer that joins words (SentencePiece's leading spaces,
# byte-level merges) gives the new text as it reads in the whole (vLLM's and TGI's detokenizers do the same).
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"  # what decode gives for the first bytes of a character whose last bytes are still to come


class Decoder(Protocol):
    def __call__(self, ids: Sequence[int]) -> str: ...


@dataclasses.dataclass(frozen=True)
class TokenDraw:
    """A token the engine chose for a sequence, with its log-probability and the best alternatives when asked."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class IncrementalText:
    """Token ids in, text out, without splitting a character across responses, and cut before a stop string.

    Text that may be the start of a stop string is held back until the next tokens say whether it is one.
    """

    def __init__(self, decode: Decoder, context: Sequence[int], stop: Sequence[str]) -> None:
        self._decode = decode
        self._ids = list(context[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0  # where the decoded window starts
        self._read_offset = len(self._ids)  # the tokens before it are text already
        self._stop = tuple(stop)
        self.text = ""  # everything decoded so far (cut at a stop string once one appears)
        self._sent = 0  # how much of it was handed out
        self.stopped = False

    def add(self, token: int) -> None:
        if self.stopped:
            return
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._append(after[len(before) :])
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)

    def flush(self) -> None:
        """The generation ended: whatever the last tokens decode to, complete or not, is text."""
        if self.stopped or self._read_offset == len(self._ids):
            return
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        self._read_offset = len(self._ids)
        if len(after) > len(before):
            self._append(after[len(before) :])

    def _append(self, piece: str) -> None:
        start = max(0, len(self.text) - max((len(s) for s in self._stop), default=0) + 1)
        self.text += piece
        cuts = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        if cuts:
            self.text = self.text[: min(cuts)]
            self.stopped = True

    def take(self, final: bool) -> str:
        """The text not handed out yet, less a tail that may still become a stop string (unless ``final``)."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        piece = self.text[self._sent : end]
        self._sent = max(self._sent, end)
        return piece

    def _held_back(self) -> int:
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


@dataclasses.dataclass(frozen=True)
class Update:
    """What a response answers: the new text, the new tokens' log-probabilities, whether it is the last, and the
    tokens generated so far."""

    text: str
    logprobs: list[dict[str, Any]]
    final: bool
    output_tokens: int


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    """What a request asked for beside its prompt (the generator convention's optional inputs)."""

    stream: bool = False
    exclude_input: bool = False
    finish_reason: bool = False
    input_tokens: bool = False
    output_tokens: bool = False
    logprobs: bool = False


class GenerationRequest:
    """A generation's state, shared by the scheduler's thread (:meth:`accept`) and its client's (:meth:`wait`)."""

    def __init__(
        self,
        prompt: str,
        prompt_ids: Sequence[int],
        params: tg.SamplingParameters,
        max_new_tokens: int,
        end_tokens: Collection[int],
        decode: Decoder,
        token_text: Callable[[int], str],
        context: Sequence[int] = (),
        logprobs: bool = False,
    ) -> None:
        self.prompt = prompt
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.max_new_tokens = max_new_tokens
        # Alternatives per token when log-probabilities are wanted (the engine computes them then), else None.
        self.top_logprobs = (params.logprobs or 0) if logprobs else None
        self._end_tokens = frozenset(end_tokens)
        self._token_text = token_text
        self._text = IncrementalText(decode, context, params.stop)
        self._changed = threading.Condition()
        # The coroutine awaiting the next change (wait_async), on its event loop: told once, then forgotten.
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self.output_tokens = 0
        self._logprobs: list[dict[str, Any]] = []
        self._logprobs_sent = 0
        self.finish_reason: str | None = None
        self.error: ServingError | None = None
        self.cancelled = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def accept(self, step: TokenDraw) -> bool:
        with self._changed:
            if self.finished or self.cancelled:
                return True
            self.output_tokens += 1
            if step.token in self._end_tokens:
                self.finish_reason = tg.FINISHED_BY_STOP
            else:
                if step.logprob is not None:
                    self._logprobs.append(self._logprob_entry(step))
                self._text.add(step.token)
                if self._text.stopped:
                    self.finish_reason = tg.FINISHED_BY_STOP
                elif self.output_tokens >= self.max_new_tokens:
                    self.finish_reason = tg.FINISHED_BY_LENGTH
            if self.finish_reason is not None:
                self._text.flush()
            self._tell()
            return self.finish_reason is not None

    def _tell(self) -> None:
        """Under the lock: wake whoever waits for a change, a thread in :meth:`wait` or a coroutine in
        :meth:`wait_async` (through its event loop, from any thread)."""
        self._changed.notify_all()
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody awaits it any more
                loop.call_soon_threadsafe(_wake, future)

    def _logprob_entry(self, step: TokenDraw) -> dict[str, Any]:
        return {
            "token": self._token_text(step.token),
            "logprob": step.logprob,
            "top_logprobs": [{"token": self._token_text(t), "logprob": p} for t, p in step.top],
        }

    def fail(self, error: ServingError) -> None:
        with self._changed:
            if not self.finished:
                self.error = error
            self._tell()

    def cancel(self) -> None:
        with self._changed:
            self.cancelled = True
            self._tell()

    def wait(self, stream: bool) -> Update | None:
        """Block until there is something to answer (all of it, unless ``stream``); None once cancelled. Raises
        the generation's error."""
        with self._changed:
            while True:
                ready, update = self._ready(stream)
                if ready:
                    return update
                self._changed.wait()

    async def wait_async(self, stream: bool) -> Update | None:
        """:meth:`wait`, awaited on the event loop instead of blocking a thread."""
        loop = asyncio.get_running_loop()
        while True:
            with self._changed:
                ready, update = self._ready(stream)
                if ready:
                    return update
                future = loop.create_future()
                self._waiter = (loop, future)
            await future

    def _ready(self, stream: bool) -> tuple[bool, Update | None]:
        """Under the lock: (whether there is something to answer, what: None once cancelled). Raises the
        generation's error."""
        if self.cancelled:
            return True, None
        if self.error is not None:
            raise self.error
        final = self.finish_reason is not None
        if final or stream:
            text = self._text.take(final)
            if text or final:
                logprobs = self._logprobs[self._logprobs_sent :]
                self._logprobs_sent = len(self._logprobs)
                return True, Update(text, logprobs, final, self.output_tokens)
        return False, None


class GenerationResponses(Iterator[dict[str, np.ndarray]], AsyncIterator[dict[str, np.ndarray]]):
    """A decoupled generator's responses to one request: a response per step that added text when streaming (the
    steps a slow client missed come as one), else one with the whole text. Iterated with ``next()`` on a thread, or
    awaited (``async for``) on an event loop. ``cancel()``/``close()`` (the client left) end it and take its
    sequence out of the batch before the next step."""

    def __init__(
        self,
        request: GenerationRequest,
        options: RequestOptions,
        outputs: Sequence[str],
        on_cancel: Callable[[GenerationRequest], None],
    ) -> None:
        self._request = request
        self._options = options
        self._outputs = frozenset(outputs)
        self._on_cancel = on_cancel
        self._first = True
        self._over = False

    def __next__(self) -> dict[str, np.ndarray]:
        if self._over:
            raise StopIteration
        try:
            answer = self._request.wait(self._options.stream)
        except ServingError:
            self._over = True
            raise
        response = self._answering(answer)
        if response is None:
            raise StopIteration
        return response

    async def __anext__(self) -> dict[str, np.ndarray]:
        if self._over:
            raise StopAsyncIteration
        try:
            answer = await self._request.wait_async(self._options.stream)
        except ServingError:
            self._over = True
            raise
        response = self._answering(answer)
        if response is None:
            raise StopAsyncIteration
        return response

    def _answering(self, answer: Update | None) -> dict[str, np.ndarray] | None:
        """The response for ``answer``; None once the request was cancelled (the responses are over)."""
        if answer is None:
            self._over = True
            return None
        if self._first and not self._options.stream and not self._options.exclude_input:
            # Triton's vLLM backend: the prompt leads a whole answer
            answer = dataclasses.replace(answer, text=self._request.prompt + answer.text)
        self._first = False
        response = self._response(answer)
        if answer.final:
            self._over = True
            return FinalResponse(response)
        return response

    def _response(self, answer: Update) -> dict[str, np.ndarray]:
        request, options, wanted = self._request, self._options, self._outputs
        response: dict[str, np.ndarray] = {}
        if tg.TEXT_OUTPUT in wanted:
            response[tg.TEXT_OUTPUT] = np.array([answer.text.encode()], dtype=object)
        if options.finish_reason and answer.final and tg.FINISH_REASON in wanted:
            response[tg.FINISH_REASON] = np.array([(request.finish_reason or "").encode()], dtype=object)
        if options.input_tokens and tg.NUM_INPUT_TOKENS in wanted:
            response[tg.NUM_INPUT_TOKENS] = np.array([request.prompt_tokens], dtype=np.uint32)
        if options.output_tokens and tg.NUM_OUTPUT_TOKENS in wanted:
            response[tg.NUM_OUTPUT_TOKENS] = np.array([answer.output_tokens], dtype=np.uint32)
        if options.logprobs and tg.LOGPROBS in wanted:
            response[tg.LOGPROBS] = np.array([orjson.dumps(answer.logprobs)], dtype=object)
        return response

    def cancel(self) -> None:
        """Told from the event loop the moment the request ends early, even while a ``next`` waits."""
        if not self._request.finished:
            self._request.cancel()
            self._on_cancel(self._request)

    def close(self) -> None:
        self._over = True
        self.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # its coroutine may have been cancelled meanwhile
        future.set_result(None)
