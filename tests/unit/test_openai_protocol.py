"""OpenAI's requests read and answers built (workbench.protocol.openai_requests, openai_responses), pure: the model
field's names, what each parameter does, errors in OpenAI's shape; and workbench.TextGenerator's stop strings."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import orjson
import pytest

from workbench.core.errors import Code, ServingError
from workbench.platforms.python_text import _until_stopped
from workbench.protocol import openai_responses as answers
from workbench.protocol.openai_requests import (
    InvalidParameter,
    ModelName,
    model_id,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_model_name,
)


def body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def chat_body(**fields: Any) -> bytes:
    return body(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


@pytest.mark.parametrize(
    ("text", "known", "expected"),
    [
        ("m", {"m"}, ModelName("m")),
        ("m:2", {"m"}, ModelName("m", version=2)),
        ("m:canary", {"m"}, ModelName("m", label="canary")),
        ("a:b", {"a:b"}, ModelName("a:b")),  # a name with a colon is found whole first
        ("ft:x:3", set(), ModelName("ft:x", version=3)),
        ("m:", set(), ModelName("m:")),
    ],
)
def test_the_model_field_names_a_model_a_version_or_a_label(text: str, known: set[str], expected: ModelName) -> None:
    assert parse_model_name(text, known.__contains__) == expected


def test_model_ids_read_back() -> None:
    assert [model_id("m"), model_id("m", 2), model_id("m", label="stable")] == ["m", "m:2", "m:stable"]


def test_chat_parameters_become_sampling_parameters() -> None:
    parsed = parse_chat(
        chat_body(
            max_tokens=5,
            max_completion_tokens=7,
            temperature=0.5,
            top_p=0.9,
            stop="END",
            seed=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            top_logprobs=4,
            user="ignored",
            service_tier="auto",
            some_future_field={"x": 1},
        )
    )
    sampling = parsed.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.stop, sampling.seed) == (
        7,
        0.5,
        0.9,
        ("END",),
        3,
    )
    assert (parsed.n, parsed.stream, parsed.include_usage, parsed.logprobs, sampling.logprobs) == (
        2,
        True,
        True,
        True,
        4,
    )
    assert parsed.messages == ({"role": "user", "content": "hi"},)


def test_defaults_are_openais() -> None:
    parsed = parse_chat(chat_body())
    assert (parsed.n, parsed.stream, parsed.include_usage, parsed.logprobs) == (1, False, False, False)
    assert (parsed.sampling.temperature, parsed.sampling.top_p, parsed.sampling.max_tokens) == (1.0, 1.0, None)
    assert parsed.sampling.logprobs is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 129}, "n"),
        ({"n": True}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 1, "max_tokens": -1}, "max_tokens"),
        ({"seed": 1.5}, "seed"),
        ({"stop": [1]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 1}, "top_logprobs"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_a_bad_or_unsupported_chat_parameter_is_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParameter) as refused:
        parse_chat(chat_body(**fields))
    assert refused.value.param == param and refused.value.code == Code.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("fields", "accepted"),
    [
        ({"frequency_penalty": 0, "presence_penalty": 0.0}, True),
        ({"logit_bias": {}}, True),
        ({"response_format": {"type": "text"}}, True),
        ({"tools": [], "tool_choice": "none"}, True),
        ({"modalities": ["text"]}, True),
    ],
)
def test_neutral_values_of_unsupported_parameters_are_accepted(fields: dict[str, Any], accepted: bool) -> None:
    assert parse_chat(chat_body(**fields)).model == "m"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"role": "robot", "content": "x"}], "messages.[0].role"),
        ([{"role": "user", "content": 5}], "messages.[0].content"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "messages.[0].content"),
    ],
)
def test_messages_are_checked(messages: Any, param: str) -> None:
    with pytest.raises(InvalidParameter) as refused:
        parse_chat(body(model="m", messages=messages))
    assert refused.value.param == param


def test_text_parts_and_assistant_messages_without_content_are_taken() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "hi"},
    ]
    assert len(parse_chat(body(model="m", messages=messages)).messages) == 3


@pytest.mark.parametrize(("raw", "param"), [(b"", None), (b"{", None), (b"[]", None), (b'{"messages": []}', "model")])
def test_a_body_that_is_no_request_is_refused(raw: bytes, param: str | None) -> None:
    with pytest.raises(InvalidParameter) as refused:
        parse_chat(raw)
    assert refused.value.param == param


def test_completions_take_prompts_and_refuse_what_they_cannot_do() -> None:
    parsed = parse_completion(body(model="m", prompt=["a", "b"], echo=True, n=2, best_of=2, logprobs=None))
    assert (parsed.prompts, parsed.echo, parsed.n, parsed.logprobs) == (("a", "b"), True, 2, False)
    assert parse_completion(body(model="m", prompt="a", logprobs=2)).sampling.logprobs == 2
    assert parse_completion(body(model="m", prompt="a", suffix="")).prompts == ("a",)
    for fields, param in [
        ({"prompt": [1, 2]}, "prompt"),
        ({"prompt": [[1, 2]]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
        ({"prompt": "a", "best_of": 3}, "best_of"),
        ({"prompt": "a", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "a", "logprobs": True}, "logprobs"),
    ]:
        with pytest.raises(InvalidParameter) as refused:
            parse_completion(body(model="m", **fields))
        assert refused.value.param == param, fields


def test_embeddings_take_texts_and_refuse_tokens_and_dimensions() -> None:
    parsed = parse_embedding(body(model="e", input=["a", "b"], encoding_format="base64", user="u"))
    assert (parsed.inputs, parsed.encoding_format) == (("a", "b"), "base64")
    assert parse_embedding(body(model="e", input="a")).encoding_format == "float"
    for fields, param in [
        ({"input": [[1, 2]]}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": "a", "dimensions": 4}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ]:
        with pytest.raises(InvalidParameter) as refused:
            parse_embedding(body(model="e", **fields))
        assert refused.value.param == param, fields


# ----------------------------------------------------------------------------------------------------- answers
@pytest.mark.parametrize(
    ("code", "status", "kind", "error_code"),
    [
        (Code.INVALID_ARGUMENT, 400, "invalid_request_error", None),
        (Code.FAILED_PRECONDITION, 400, "invalid_request_error", None),
        (Code.UNIMPLEMENTED, 400, "invalid_request_error", None),
        (Code.NOT_FOUND, 404, "invalid_request_error", "model_not_found"),
        (Code.UNAUTHENTICATED, 401, "invalid_request_error", "invalid_api_key"),
        (Code.RESOURCE_EXHAUSTED, 429, "rate_limit_error", "rate_limit_exceeded"),
        (Code.UNAVAILABLE, 503, "server_error", "service_unavailable"),
        (Code.DEADLINE_EXCEEDED, 504, "timeout_error", "timeout"),
        (Code.INTERNAL, 500, "server_error", None),
    ],
)
def test_errors_take_openais_shape_and_status(code: Code, status: int, kind: str, error_code: str | None) -> None:
    got_status, doc = answers.error_answer(ServingError(code, "why"))
    assert got_status == status
    assert doc == {"error": {"message": "why", "type": kind, "param": None, "code": error_code}}


def test_a_parameters_error_names_it() -> None:
    assert answers.error_answer(InvalidParameter("bad", "top_p"))[1]["error"]["param"] == "top_p"


def event_doc(raw: bytes) -> Any:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return json.loads(raw[6:])


def test_chat_chunks_are_openais() -> None:
    chunks = answers.Chunks("chatcmpl-1", 10, "m:1", chat=True, include_usage=True)
    role, text, finish = event_doc(chunks.role(0)), event_doc(chunks.text(0, "hi")), event_doc(chunks.finish(0, "stop"))
    assert role["object"] == "chat.completion.chunk" and role["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }
    assert text["choices"][0]["delta"] == {"content": "hi"} and text["usage"] is None
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    usage = event_doc(chunks.usage(answers.Usage(3, 2)))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert answers.DONE == b"data: [DONE]\n\n"


def test_completion_chunks_carry_text_and_no_usage_unless_asked() -> None:
    chunks = answers.Chunks("cmpl-1", 10, "m", chat=False, include_usage=False)
    doc = event_doc(chunks.text(1, "x"))
    assert doc["object"] == "text_completion" and doc["choices"][0]["text"] == "x" and "usage" not in doc


def test_logprobs_in_chats_and_completions_shapes() -> None:
    tokens = [
        {"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "b", "logprob": -2.0}]},
        {"token": "é", "logprob": -0.2},
    ]
    chat = answers.chat_logprobs(tokens)
    assert chat["content"][0] == {
        "token": "a",
        "logprob": -0.1,
        "bytes": [97],
        "top_logprobs": [{"token": "b", "logprob": -2.0, "bytes": [98]}],
    }
    assert chat["content"][1]["bytes"] == [195, 169] and chat["content"][1]["top_logprobs"] == []
    legacy = answers.completion_logprobs(tokens, start=4)
    assert legacy == {
        "tokens": ["a", "é"],
        "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"b": -2.0}, {}],
        "text_offset": [4, 5],
    }


def test_embeddings_as_floats_or_little_endian_float32_base64() -> None:
    vectors = np.array([[1.0, -2.5], [0.25, 3.0]], np.float32)
    floats = answers.embedding_list("e:1", vectors, "float", 6)
    assert [d["embedding"] for d in floats["data"]] == [[1.0, -2.5], [0.25, 3.0]]
    assert floats["usage"] == {"prompt_tokens": 6, "total_tokens": 6} and floats["model"] == "e:1"
    encoded = answers.embedding_list("e", vectors, "base64", 6)["data"][1]["embedding"]
    assert base64.b64decode(encoded) == np.array([0.25, 3.0], "<f4").tobytes()


# ------------------------------------------------------------------------------------------------- stop strings
@pytest.mark.parametrize(
    ("pieces", "stop", "expected"),
    [
        (["ab", "cd"], [], ["ab", "cd"]),
        (["hello ", "wor", "ld"], ["world"], ["hello "]),
        (["a", "bS", "TOPc"], ["STOP"], ["a", "b"]),
        (["xx", "S", "Ty"], ["STOP"], ["xx", "STy"]),  # held back, then let go when it is no stop
        (["one two"], ["two", "one"], []),  # the first stop in the text wins
        (["abc"], ["z"], ["abc"]),
    ],
)
def test_stop_strings_end_the_text_before_them(pieces: list[str], stop: list[str], expected: list[str]) -> None:
    assert list(_until_stopped(iter(pieces), stop)) == expected


def test_a_stop_string_closes_the_models_generator() -> None:
    closed = []

    def model() -> Any:
        try:
            yield from ["a", "STOP", "never"]
        finally:
            closed.append(True)

    assert list(_until_stopped(model(), ["STOP"])) == ["a"] and closed == [True]
