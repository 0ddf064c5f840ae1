"""A generation request's text: characters never split across responses, stop strings cut and held back, the
token limit, the end token, and the responses in the generator convention."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import orjson
import pytest

from workbench.core import text_generation as tg
from workbench.core.errors import Code, ServingError
from workbench.core.servable import FinalResponse
from workbench.platforms.generation_requests import (
    GenerationRequest,
    GenerationResponses,
    IncrementalText,
    RequestOptions,
    TokenDraw,
)

# A byte-level vocabulary: token i is byte i (the snowman is three tokens), 300 ends a sequence.
END = 300


def decode(ids: Sequence[int]) -> str:
    return bytes(i for i in ids if i < 256).decode(errors="replace")


def tokens(text: str) -> list[int]:
    return list(text.encode())


def request(params: tg.SamplingParameters, max_new: int = 100, logprobs: bool = False) -> GenerationRequest:
    return GenerationRequest(
        "prompt", tokens("prompt"), params, max_new, {END}, decode, lambda t: decode([t]), logprobs=logprobs
    )


def test_a_character_split_across_tokens_comes_whole() -> None:
    text = IncrementalText(decode, tokens("say "), ())
    pieces = []
    for token in tokens("a☃b"):
        text.add(token)
        pieces.append(text.take(final=False))
    assert pieces == ["a", "", "", "☃", "b"]


def test_a_stop_string_cuts_the_text_and_its_start_is_held_back() -> None:
    text = IncrementalText(decode, [], ("END",))
    taken = []
    for token in tokens("okEN"):
        text.add(token)
        taken.append(text.take(final=False))
    assert taken == ["o", "k", "", ""]  # "E" and "EN" may begin the stop string
    text.add(ord("D"))
    assert text.stopped and text.text == "ok" and text.take(final=False) == ""


def test_a_held_back_start_that_is_no_stop_string_comes_out() -> None:
    text = IncrementalText(decode, [], ("END",))
    for token in tokens("okEx"):
        text.add(token)
    assert text.take(final=False) == "okEx"


def responses(req: GenerationRequest, **options: bool) -> GenerationResponses:
    outputs = [tg.TEXT_OUTPUT, tg.FINISH_REASON, tg.NUM_INPUT_TOKENS, tg.NUM_OUTPUT_TOKENS, tg.LOGPROBS]
    return GenerationResponses(req, RequestOptions(**options), outputs, lambda r: None)


def test_the_token_limit_and_the_end_token_finish_it() -> None:
    limited = request(tg.SamplingParameters(), max_new=3)
    assert [limited.accept(TokenDraw(t)) for t in tokens("abc")] == [False, False, True]
    assert limited.finish_reason == tg.FINISHED_BY_LENGTH
    ended = request(tg.SamplingParameters())
    assert not ended.accept(TokenDraw(ord("a")))
    assert ended.accept(TokenDraw(END))
    assert ended.finish_reason == tg.FINISHED_BY_STOP and ended.output_tokens == 2
    (answer,) = list(responses(ended, finish_reason=True, output_tokens=True, exclude_input=True))
    assert isinstance(answer, FinalResponse)
    assert answer[tg.TEXT_OUTPUT].tolist() == [b"a"]
    assert answer[tg.FINISH_REASON].tolist() == [b"stop"]
    assert answer[tg.NUM_OUTPUT_TOKENS].tolist() == [2]


def test_a_whole_answer_leads_with_the_prompt_unless_excluded() -> None:
    req = request(tg.SamplingParameters(), max_new=2)
    for token in tokens("hi"):
        req.accept(TokenDraw(token))
    (whole,) = list(responses(req))
    assert whole[tg.TEXT_OUTPUT].tolist() == [b"prompthi"]
    assert set(whole) == {tg.TEXT_OUTPUT}  # no return_* flag, no optional output


def test_a_stream_answers_what_each_step_added_and_ends_with_the_reason() -> None:
    req = request(tg.SamplingParameters(stop=("!",)), logprobs=True)
    stream = responses(req, stream=True, finish_reason=True, input_tokens=True, logprobs=True)
    got: list[dict[str, np.ndarray]] = []
    reader = threading.Thread(target=lambda: got.extend(stream))
    reader.start()
    for token in tokens("yo!"):
        req.accept(TokenDraw(token, -0.5, ((token, -0.5),)))
    reader.join(30)
    assert b"".join(r[tg.TEXT_OUTPUT][0] for r in got) == b"yo"
    assert isinstance(got[-1], FinalResponse) and got[-1][tg.FINISH_REASON].tolist() == [b"stop"]
    assert all(tg.FINISH_REASON not in r for r in got[:-1])
    assert all(r[tg.NUM_INPUT_TOKENS].tolist() == [6] for r in got)
    entries = [e for r in got for e in orjson.loads(r[tg.LOGPROBS][0])]
    assert [e["token"] for e in entries] == ["y", "o", "!"]
    assert entries[0] == {"token": "y", "logprob": -0.5, "top_logprobs": [{"token": "y", "logprob": -0.5}]}


def test_cancel_ends_a_waiting_next_and_tells_the_scheduler() -> None:
    told: list[GenerationRequest] = []
    req = request(tg.SamplingParameters())
    stream = GenerationResponses(req, RequestOptions(stream=True), [tg.TEXT_OUTPUT], told.append)
    ended = threading.Event()

    def read() -> None:
        with pytest.raises(StopIteration):
            next(stream)
        ended.set()

    reader = threading.Thread(target=read)
    reader.start()
    stream.cancel()
    reader.join(30)
    assert ended.is_set() and told == [req]
    assert req.accept(TokenDraw(ord("a")))  # the scheduler drops it at its next step


def test_a_failed_generation_raises_its_error_to_the_client() -> None:
    req = request(tg.SamplingParameters())
    req.fail(ServingError(Code.UNAVAILABLE, "unloading"))
    with pytest.raises(ServingError) as raised:
        next(responses(req, stream=True))
    assert raised.value.code == Code.UNAVAILABLE


def test_an_awaited_stream_gets_each_step_from_the_scheduler_thread_with_no_thread_of_its_own() -> None:
    """``async for`` on the event loop: the tokens a thread accepts reach the coroutine through the loop; it answers
    what ``next()`` answers, and no thread waits on the request's condition meanwhile."""
    req = request(tg.SamplingParameters(stop=("!",)))
    stream = responses(req, stream=True, finish_reason=True)

    async def read() -> list[dict[str, np.ndarray]]:
        loop = asyncio.get_running_loop()
        feeder = threading.Thread(target=feed, args=(loop,))
        feeder.start()
        got = [response async for response in stream]
        feeder.join(30)
        return got

    def feed(loop: asyncio.AbstractEventLoop) -> None:
        for token in tokens("yo!"):
            waiting = threading.Event()
            loop.call_soon_threadsafe(waiting.set)  # the loop got round to it: the coroutine awaits the next step
            waiting.wait(30)
            req.accept(TokenDraw(token))

    threads_before = set(threading.enumerate())
    got = asyncio.run(read())
    assert set(threading.enumerate()) - threads_before == set(), "a thread was started to read the stream"
    assert b"".join(r[tg.TEXT_OUTPUT][0] for r in got) == b"yo"
    assert isinstance(got[-1], FinalResponse) and got[-1][tg.FINISH_REASON].tolist() == [b"stop"]


def test_cancel_ends_an_awaiting_stream_and_a_failure_raises_in_it() -> None:
    told: list[GenerationRequest] = []
    req = request(tg.SamplingParameters())
    stream = GenerationResponses(req, RequestOptions(stream=True), [tg.TEXT_OUTPUT], told.append)
    failing = request(tg.SamplingParameters())

    async def main() -> None:
        reading = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # it awaits its first step
        assert not reading.done()
        stream.cancel()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(reading, 30)
        failed = asyncio.ensure_future(responses(failing, stream=True).__anext__())
        await asyncio.sleep(0)
        threading.Thread(target=failing.fail, args=(ServingError(Code.UNAVAILABLE, "unloading"),)).start()
        with pytest.raises(ServingError) as raised:
            await asyncio.wait_for(failed, 30)
        assert raised.value.code == Code.UNAVAILABLE

    asyncio.run(main())
    assert told == [req]
