"""Python text models in a few lines: :class:`TextGenerator` (any generator of text is a chat and completion model)
and :class:`TextEmbedder` (any function of texts to vectors is an embedding model).

They are :class:`~workbench.platforms.python.PythonModel` subclasses that declare the text conventions'
tensors (:mod:`workbench.core.text_generation`) and translate them, so the OpenAI-compatible endpoints, Triton's
generate extension and ``ModelStreamInfer`` serve them as they serve any generator or embedder; ``workbench.export``
writes them as any Python model (``model.py``)::

    import workbench

    class Echo(workbench.TextGenerator):
        def generate(self, prompt, params):       # params: workbench.core.text_generation.SamplingParameters
            for word in prompt.split():
                yield word + " "

    workbench.export(Echo, "echo")                # then: chat with model="echo" (docs/openai.md)

A chat's messages become the prompt by :meth:`TextGenerator.chat_prompt`: the class's ``chat_template`` (a Jinja
template, as a Hugging Face tokenizer's) where it sets one, its own ``chat_prompt`` where it overrides it, else
``role: content`` lines then ``assistant:``.

``max_tokens`` and ``stop`` are honoured here (the text ends before a stop string; a piece is a token), so
``generate`` only needs to read ``params`` for what it samples (``temperature``, ``top_p``, ``seed``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from workbench.core import text_generation as tg
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature
from workbench.platforms._user_code import tensor_specs
from workbench.platforms.chat_templates import render_chat_template
from workbench.platforms.python import PythonModel

_FLAGS = (tg.STREAM, tg.EXCLUDE_INPUT_IN_OUTPUT, tg.RETURN_FINISH_REASON, tg.RETURN_NUM_INPUT_TOKENS)
_GENERATOR_SIGNATURE = Signature(
    name=DEFAULT_SIGNATURE,
    method_name=PREDICT_METHOD,
    inputs=tensor_specs(
        {
            tg.TEXT_INPUT: ("string", [1]),
            tg.SAMPLING_PARAMETERS: ("string", [1]),
            **{flag: ("bool", [1]) for flag in (*_FLAGS, tg.RETURN_NUM_OUTPUT_TOKENS)},
        },
        "TextGenerator.inputs",
    ),
    outputs=tensor_specs(
        {
            tg.TEXT_OUTPUT: ("string", [1]),
            tg.FINISH_REASON: ("string", [1]),
            tg.NUM_INPUT_TOKENS: ("uint32", [1]),
            tg.NUM_OUTPUT_TOKENS: ("uint32", [1]),
        },
        "TextGenerator.outputs",
    ),
    # Triton's vLLM defaults: a request may send the prompt alone (its whole text then comes in one response).
    defaults={
        tg.SAMPLING_PARAMETERS: np.array([b"{}"], dtype=object),
        **{flag: np.array([False]) for flag in (*_FLAGS, tg.RETURN_NUM_OUTPUT_TOKENS)},
    },
    batchable=False,
)


def _scalar(inputs: Mapping[str, np.ndarray], name: str) -> Any:
    return np.asarray(inputs[name]).ravel()[0]


class TextGenerator(PythonModel):
    """A chat and completion model from a Python generator of text: implement :meth:`generate`.

    Each piece ``generate`` yields is one token to the API (``max_tokens`` counts them, usage reports them) and one
    streamed chunk. Chat messages reach it as one prompt, which :meth:`chat_prompt` makes: ``role: content`` lines,
    then ``assistant:``, unless the class sets :attr:`chat_template` or overrides :meth:`chat_prompt`.
    """

    signatures: ClassVar[Mapping[str, Any]] = {DEFAULT_SIGNATURE: _GENERATOR_SIGNATURE}
    decoupled: ClassVar[bool] = True
    # A Jinja template that makes the chat's prompt, as a Hugging Face tokenizer's chat_template does (the same
    # sandboxed environment; variables: messages, add_generation_prompt): None keeps the plain prompt.
    chat_template: ClassVar[str | None] = None

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """The chat's messages (OpenAI's, each ``content`` as text) as this model's prompt, ending where its answer
        begins: :attr:`chat_template` rendered with ``add_generation_prompt`` true, or else ``role: content`` lines
        then ``assistant:``. Override it to build the prompt in Python; it runs on the server's event loop, so keep
        it quick. A ``ValueError`` it raises is the request's fault (HTTP 400)."""
        if self.chat_template:
            return render_chat_template(self.chat_template, messages, type(self).__name__)
        return tg.plain_chat_prompt(messages)

    def generate(self, prompt: str, params: tg.SamplingParameters) -> Iterator[str]:
        """The text that follows ``prompt``, piece by piece."""
        raise NotImplementedError(f"{type(self).__name__} does not implement generate")

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is (the prompt's, for usage): its whitespace-separated words unless overridden."""
        return len(text.split())

    def predict(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        """The convention's responses: each piece (or the whole text unless ``stream``), then the finish reason."""
        raw = _scalar(inputs, tg.TEXT_INPUT)
        prompt = raw.decode() if isinstance(raw, bytes) else str(raw)
        params = tg.SamplingParameters.from_json(_scalar(inputs, tg.SAMPLING_PARAMETERS))
        stream = bool(_scalar(inputs, tg.STREAM))
        include_prompt = not stream and not bool(_scalar(inputs, tg.EXCLUDE_INPUT_IN_OUTPUT))
        prompt_tokens = self.count_tokens(prompt)
        count = 0
        whole: list[str] = [prompt] if include_prompt else []

        def response(text: str, finish_reason: str = "") -> dict[str, Any]:
            return {
                tg.TEXT_OUTPUT: [text],
                tg.FINISH_REASON: [finish_reason],
                tg.NUM_INPUT_TOKENS: [prompt_tokens],
                tg.NUM_OUTPUT_TOKENS: [count],
            }

        pieces = _until_stopped(self.generate(prompt, params), params.stop)
        finish_reason = tg.FINISHED_BY_STOP
        try:
            for piece in pieces:
                count += 1
                if stream:
                    yield response(piece)
                else:
                    whole.append(piece)
                if params.max_tokens is not None and count >= params.max_tokens:  # as vLLM: "length" at the limit
                    finish_reason = tg.FINISHED_BY_LENGTH
                    break
        finally:
            _close(pieces)  # ends the model's generator now (its finally runs), not when collected
        yield response("".join(whole), finish_reason)


def _until_stopped(pieces: Iterator[str], stop: Sequence[str]) -> Iterator[str]:
    """``pieces`` up to the first stop string (left out, and nothing after it): text that may begin a stop string
    is held back until the next piece tells."""
    if not stop:
        try:
            yield from (str(piece) for piece in pieces)
        finally:
            _close(pieces)
        return
    held = ""
    try:
        for piece in pieces:
            held += str(piece)
            found = [at for at in (held.find(s) for s in stop) if at >= 0]
            if found:
                if held[: min(found)]:
                    yield held[: min(found)]
                return
            keep = max((_prefix_overlap(held, s) for s in stop), default=0)
            if len(held) > keep:
                yield held[: len(held) - keep]
                held = held[len(held) - keep :]
        if held:
            yield held
    finally:
        _close(pieces)


def _prefix_overlap(text: str, stop: str) -> int:
    """The length of the longest end of ``text`` that begins ``stop``."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0


def _close(pieces: Iterator[str]) -> None:
    close = getattr(pieces, "close", None)
    if callable(close):
        close()


class TextEmbedder(PythonModel):
    """An embedding model from a Python function of texts: implement :meth:`embed`. Requests are batched (with
    ``--enable_batching``): ``embed`` gets every text of a batch at once."""

    inputs: ClassVar[Mapping[str, Any]] = {tg.EMBED_INPUT: ("string", [-1])}
    outputs: ClassVar[Mapping[str, Any]] = {tg.EMBEDDING: ("float32", [-1, -1]), tg.EMBED_TOKENS: ("int32", [-1])}

    def embed(self, texts: list[str]) -> Any:
        """One vector per text, as rows of a 2-D array-like (all of one size)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement embed")

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is (for usage): its whitespace-separated words unless overridden."""
        return len(text.split())

    def predict(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        texts = [t.decode() if isinstance(t, bytes) else str(t) for t in np.asarray(inputs[tg.EMBED_INPUT]).ravel()]
        vectors = np.asarray(self.embed(texts), dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(f"embed must return one vector per text: {len(texts)} texts, {list(vectors.shape)}")
        return {tg.EMBEDDING: vectors, tg.EMBED_TOKENS: [self.count_tokens(t) for t in texts]}
