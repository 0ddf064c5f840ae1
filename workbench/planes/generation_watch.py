"""Every text generation observed once, where every decoupled stream passes (:meth:`Dataplane.stream
<workbench.planes.dataplane.Dataplane.stream>`): its time to first token and its tokens, into the generation metrics
(Prometheus) and the rolling stats (the live charts) from the same observation, whichever frontend drove it
(OpenAI's chat and completions, v2 ``generate``/``generate_stream``, gRPC ``ModelStreamInfer``, a shadow's copy).

A stream is a generation when its servable follows the generator convention (:mod:`workbench.core.text_generation`).
A token is counted when it comes: the model's :data:`~workbench.core.text_generation.NUM_OUTPUT_TOKENS` (counted so
far) where its responses carry it, else one per response carrying text. The first token is the first response that
carries text or a token; its time runs from the request's arrival. The prompt's tokens are the model's
:data:`~workbench.core.text_generation.NUM_INPUT_TOKENS` where it says, else :func:`count_tokens`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Mapping

import numpy as np

from workbench.core import text_generation as tg
from workbench.core.inference import signature_name_or_default
from workbench.core.servable import Servable
from workbench.observability.generation_metrics import GenerationMetrics
from workbench.observability.stats import RollingStats
from workbench.planes import decoupled


def is_generation(servable: Servable, signature_name: str) -> bool:
    """Whether a stream of ``servable``'s signature ``signature_name`` is a text generation."""
    signature = servable.signatures.get(signature_name_or_default(signature_name))
    return tg.is_text_generator(signature, servable.decoupled)


def count_tokens(servable: Servable, text: str) -> int:
    """``text``'s tokens by the model's tokenizer where it offers one, else its whitespace-separated words."""
    if isinstance(servable, tg.ChatTemplating):
        return int(servable.count_tokens(text))
    return len(text.split())


def _last_count(value: np.ndarray | None) -> int | None:
    if value is None or np.asarray(value).size == 0:
        return None
    return int(np.asarray(value).ravel()[-1])


def _has_text(value: np.ndarray | None) -> bool:
    return value is not None and any(len(v) for v in np.asarray(value).ravel())


def _prompt_text(value: np.ndarray | None) -> str:
    if value is None:
        return ""
    texts = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in np.asarray(value).ravel())
    return " ".join(texts)


async def watched(
    responses: decoupled.Begun[dict[str, np.ndarray]],
    servable: Servable,
    inputs: Mapping[str, np.ndarray],
    arrived: float,
    metrics: GenerationMetrics,
    stats: RollingStats,
) -> AsyncGenerator[dict[str, np.ndarray], None]:
    """``responses`` passed on as they come, the generation recorded on the way: its first token and its tokens
    when they come (so the charts and ``rate()`` are live during a long generation), its prompt's tokens and its
    time per output token once it ends. ``arrived``: the request's arrival (``time.perf_counter()``).

    A generation its caller left (a client that disconnected) or that failed is recorded as far as it went, once it
    produced a token: those tokens were generated."""
    model, version = servable.name, servable.version
    counted = pieces = 0  # tokens recorded so far; responses that carried text
    reported: int | None = None  # the model's own count so far, once it gives one
    prompt_tokens: int | None = None
    first: float | None = None
    last = 0.0
    ended = False
    try:
        async with contextlib.aclosing(responses):
            async for response in responses:
                text = _has_text(response.get(tg.TEXT_OUTPUT))
                pieces += int(text)
                count = _last_count(response.get(tg.NUM_OUTPUT_TOKENS))
                if count is not None:
                    reported = max(count, reported or 0)
                prompt_tokens = _last_count(response.get(tg.NUM_INPUT_TOKENS)) or prompt_tokens
                # A count below what was already recorded (a model whose count starts late) cannot be taken back.
                new = (reported if reported is not None else pieces) - counted
                if new > 0 or text:
                    last = time.perf_counter()
                    if first is None:
                        first = last
                        metrics.observe_first_token(model, version, first - arrived)
                        stats.record_first_token(model, version, first - arrived)
                if new > 0:
                    counted += new
                    metrics.observe_tokens(model, version, new)
                    stats.record_tokens(model, version, new)
                yield response
        ended = True
    finally:
        if ended or first is not None:
            if prompt_tokens is None:  # the model does not say (or was not asked): its tokenizer, else words
                prompt_tokens = count_tokens(servable, _prompt_text(inputs.get(tg.TEXT_INPUT)))
            metrics.observe_end(model, version, prompt_tokens, counted, last - (first or last))
