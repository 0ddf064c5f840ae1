"""The OpenAI-compatible endpoints with OpenAI's own Python client, unchanged: chat, completions and embeddings of
Python models that follow the text conventions (tests/text_models.py), streaming with the usage chunk, n choices,
stop strings, seeds, log-probabilities, errors in OpenAI's shape, a client leaving mid-stream, routing through the
``model`` field, the metrics, the shadow and the request log; then the management token as the API key, and the
endpoints on a port of their own."""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pandas as pd
import pytest
import requests
import trustme
from text_models import (
    HASHER,
    PARROT,
    PROMPTED,
    SCORED,
    TEMPLATED,
    TICKER,
    chat,
    hashed,
    openai_client,
    write_model,
)
from waiting import wait_until

import workbench
from workbench.config.options import ServerOptions
from workbench.server import ServerThread

TOKEN = "openai-key-7d1e"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openai-models")
    write_model(root, "parrot", PARROT)
    write_model(root, "scored", SCORED)
    write_model(root, "ticker", TICKER)
    write_model(root, "hasher", HASHER)
    write_model(root, "templated", TEMPLATED)
    write_model(root, "prompted", PROMPTED)
    write_model(root, "routed", PARROT, versions=(1, 2))
    write_model(root, "shadowed", PARROT, versions=(1, 2))
    logged = write_model(root, "logged", PARROT)
    prefix = root.parent / f"{root.name}-logs" / "requests"
    (logged / "logging_config.txt").write_text(
        f'log_collector_config {{ type: "parquet" filename_prefix: "{prefix}" }} '
        "sampling_config { sampling_rate: 1.0 }"
    )
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(
        model_repository=str(repository),
        rest_api_port=-1,
        port=0,
        allow_python_models=True,
        enable_batching=True,
        request_log_flush_seconds=0.1,
    )
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai_client(server.rest_url) as made:
        yield made


# -------------------------------------------------------------------------------------------------------- models
def test_models_lists_the_generators_and_embedders_with_their_versions(client: openai.OpenAI) -> None:
    ids = {model.id for model in client.models.list()}
    assert {"parrot", "parrot:1", "scored", "ticker", "hasher", "hasher:1", "routed", "routed:2"} <= ids
    assert all(model.object == "model" and model.owned_by == "workbench" for model in client.models.list())
    assert all(model.created > 0 for model in client.models.list())


def test_one_model_is_retrieved_under_openai_v1_on_the_rest_port(server: ServerThread) -> None:
    with openai.OpenAI(base_url=server.openai_url, api_key="x", max_retries=0) as kserve_prefix:
        assert server.openai_url.endswith("/openai/v1")
        found = kserve_prefix.models.retrieve("parrot:1")
        assert (found.id, found.object, found.owned_by) == ("parrot:1", "model", "workbench")
        with pytest.raises(openai.NotFoundError) as missing:
            kserve_prefix.models.retrieve("nothing")
    assert missing.value.code == "model_not_found"
    # /v1/models/{m} is TF Serving's model status there, unchanged.
    status = requests.get(f"{server.rest_url}/v1/models/parrot", timeout=30).json()
    assert status["model_version_status"][0]["state"] == "AVAILABLE"


# ---------------------------------------------------------------------------------------------------------- chat
def test_chat_answers_the_models_text_with_usage(client: openai.OpenAI) -> None:
    answer = chat(client, "one two three", temperature=0)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "parrot:1"  # the version that answered
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.message.content == "three two one "
    assert choice.finish_reason == "stop"
    # The model's counts: the prompt "user: one two three\nassistant:" is 5 words, 3 pieces came.
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (5, 3, 8)


def test_max_tokens_and_stop_end_the_text(client: openai.OpenAI) -> None:
    short = chat(client, "a b c d e f", temperature=0, max_tokens=2)
    assert short.choices[0].message.content == "f e " and short.choices[0].finish_reason == "length"
    newer = chat(client, "a b c d e f", temperature=0, max_completion_tokens=3, max_tokens=1)
    assert newer.choices[0].message.content == "f e d "  # max_completion_tokens wins
    stopped = chat(client, "a b c d e f", temperature=0, stop=["c "])
    assert stopped.choices[0].message.content == "f e d " and stopped.choices[0].finish_reason == "stop"


def test_a_seed_makes_sampling_reproducible_and_n_gives_several_choices(client: openai.OpenAI) -> None:
    first = chat(client, "anything", temperature=1.0, seed=7)
    again = chat(client, "anything", temperature=1.0, seed=7)
    other = chat(client, "anything", temperature=1.0, seed=8)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content
    several = chat(client, "anything", temperature=1.0, seed=7, n=3)
    texts = [c.message.content for c in several.choices]
    assert [c.index for c in several.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert texts[0] == first.choices[0].message.content  # choice 0 is the seed's own; the others seed + index
    assert several.usage.prompt_tokens == first.usage.prompt_tokens  # the prompt counted once
    assert several.usage.completion_tokens == 3 * 8


def test_chat_streams_chunks_as_openai_does_with_the_usage_last(client: openai.OpenAI) -> None:
    stream = chat(client, "red green blue", temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.model == "parrot:1" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "blue green red "
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == ["stop"]
    *_, last = chunks
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (5, 3)
    assert all(c.usage is None for c in chunks[:-1])


def test_the_stream_ends_with_done_and_interleaves_n_choices(server: ServerThread) -> None:
    body = {"model": "parrot", "prompt": "x y", "temperature": 0, "n": 2, "stream": True}
    response = requests.post(f"{server.rest_url}/v1/completions", json=body, stream=True, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in response.iter_lines(decode_unicode=True) if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    events = [json.loads(line[6:]) for line in lines[:-1]]
    texts = {0: "", 1: ""}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {0: "y x ", 1: "y x "}
    assert "usage" not in events[0]  # only asked for with stream_options


def test_completions_take_a_list_of_prompts_and_echo(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="parrot", prompt=["a b", "c d"], temperature=0, n=2)
    assert answer.object == "text_completion"
    assert [(c.index, c.text) for c in answer.choices] == [(0, "b a "), (1, "b a "), (2, "d c "), (3, "d c ")]
    assert answer.usage.prompt_tokens == 4 and answer.usage.completion_tokens == 8
    echoed = client.completions.create(model="parrot", prompt="p q", temperature=0, echo=True)
    assert echoed.choices[0].text == "p qq p "


def test_logprobs_where_the_model_offers_them(client: openai.OpenAI) -> None:
    answer = chat(client, "two words", model="scored", logprobs=True, top_logprobs=2)
    assert answer.choices[0].message.content == "USER: TWO WORDS ASSISTANT: "
    content = answer.choices[0].logprobs.content
    assert [t.token for t in content] == ["USER: ", "TWO ", "WORDS ", "ASSISTANT: "]
    assert [t.logprob for t in content] == [-0.5, -1.0, -1.5, -2.0]
    assert [[a.token for a in t.top_logprobs] for t in content][0] == ["alt0 ", "alt1 "]
    # No counts from this model: the prompt's words, and the pieces that came.
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 4)
    legacy = client.completions.create(model="scored", prompt="ab cd", logprobs=1)
    assert legacy.choices[0].logprobs.tokens == ["AB ", "CD "]
    assert legacy.choices[0].logprobs.text_offset == [0, 3]
    assert legacy.choices[0].logprobs.top_logprobs == [{"alt0 ": -1.0}, {"alt0 ": -1.0}]
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, "hi", model="parrot", logprobs=True)
    assert refused.value.param == "logprobs" and "does not offer log-probabilities" in refused.value.message


# ------------------------------------------------------------------------------------------------------ errors
def test_an_unknown_model_version_or_label_is_model_not_found(client: openai.OpenAI) -> None:
    for name in ("nothing", "parrot:9", "parrot:nolabel"):
        with pytest.raises(openai.NotFoundError) as missing:
            chat(client, "hi", model=name)
        assert missing.value.code == "model_not_found" and missing.value.status_code == 404, name
        assert missing.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_or_unsupported_parameters_are_400_naming_them(
    client: openai.OpenAI, options: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, "hi", **options)
    assert refused.value.param == param and refused.value.body["type"] == "invalid_request_error"


def test_neutral_values_and_fields_openai_knows_are_accepted(client: openai.OpenAI) -> None:
    answer = chat(
        client, "ok", temperature=0, presence_penalty=0, frequency_penalty=0, user="u1", store=False, metadata={}
    )
    assert answer.choices[0].message.content == "ok "


def test_requests_the_models_cannot_take_are_400_never_500(client: openai.OpenAI, server: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as not_a_generator:
        chat(client, "hi", model="hasher")
    assert not_a_generator.value.param == "model" and "not a text generator" in not_a_generator.value.message
    with pytest.raises(openai.BadRequestError) as not_an_embedder:
        client.embeddings.create(model="parrot", input="hi")
    assert "not a text embedder" in not_an_embedder.value.message
    with pytest.raises(openai.BadRequestError) as suffix:
        client.completions.create(model="parrot", prompt="a", suffix="b")
    assert suffix.value.param == "suffix"
    with pytest.raises(openai.BadRequestError) as tokens:
        client.completions.create(model="parrot", prompt=[1, 2, 3])
    assert "token ids" in tokens.value.message
    with pytest.raises(openai.BadRequestError) as image:
        client.chat.completions.create(
            model="parrot",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )
    assert image.value.param == "messages.[0].content"
    for body in (b"not json", b"[1]", b'{"model": "parrot"}'):
        answer = requests.post(f"{server.rest_url}/v1/chat/completions", data=body, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error", body


# -------------------------------------------------------------------------------------------------- embeddings
def test_embeddings_as_floats_and_base64_with_usage(client: openai.OpenAI) -> None:
    texts = ["the cat sat", "on the mat today"]
    floats = client.embeddings.create(model="hasher", input=texts)
    assert floats.model == "hasher:1" and [d.index for d in floats.data] == [0, 1]
    for datum, text in zip(floats.data, texts, strict=True):
        assert datum.embedding == pytest.approx(hashed(text), abs=1e-6)
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (7, 7)
    # The client asks for base64 itself and decodes it; this checks the bytes as OpenAI encodes them.
    raw = client.embeddings.with_raw_response.create(model="hasher", input="one", encoding_format="base64")
    encoded = json.loads(raw.text)["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist() == pytest.approx(hashed("one"), abs=1e-6)
    one = client.embeddings.create(model="hasher", input="one")  # the client's default: base64, decoded by it
    assert one.data[0].embedding == pytest.approx(hashed("one"), abs=1e-6)
    with pytest.raises(openai.BadRequestError) as dimensions:
        client.embeddings.create(model="hasher", input="one", dimensions=4)
    assert dimensions.value.param == "dimensions"


# ------------------------------------------------------------------------------------------- a notebook's class
class Shouter(workbench.TextGenerator):
    """A notebook's generator: exported as model.py, it is a chat model."""

    def generate(self, prompt, params):  # type: ignore[no-untyped-def]
        for word in prompt.split():
            yield word.upper() + "! "


def test_an_exported_text_generator_is_a_chat_model(client: openai.OpenAI, repository: Path) -> None:
    result = workbench.export(Shouter, "shouter", repository)
    source = (Path(result.path) / "model.py").read_text()
    assert "class Shouter(workbench.TextGenerator):" in source and "import workbench" in source
    wait_until(lambda: "shouter" in {m.id for m in client.models.list()}, timeout=60, what="shouter served")
    answer = client.completions.create(model="shouter", prompt="hey you", max_tokens=1)
    assert answer.choices[0].text == "HEY! " and answer.choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------------------------ chat prompts
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who wrote the first program?"},
    {"role": "assistant", "content": "Ada Lovelace. "},
    {"role": "user", "content": [{"type": "text", "text": "When?"}]},  # content parts: their text
]


def test_a_python_generator_renders_its_chat_template(client: openai.OpenAI) -> None:
    """TEMPLATED answers with the prompt it was given: its own Jinja template's, not the plain role lines."""
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWho wrote the first program?<|im_end|>\n"
        "<|im_start|>assistant\nAda Lovelace.<|im_end|>\n"
        "<|im_start|>user\nWhen?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    answer = client.chat.completions.create(model="templated", messages=CONVERSATION)
    assert answer.choices[0].message.content == expected
    assert answer.usage.prompt_tokens == len(expected.split())  # its count_tokens, of the rendered prompt
    streamed = client.chat.completions.create(model="templated", messages=CONVERSATION, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == expected
    # Completions take the prompt as it is: no template.
    assert client.completions.create(model="templated", prompt="as is").choices[0].text == "as is"


def test_a_chat_its_template_refuses_is_400_with_the_templates_words(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="templated", messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
    assert "Conversation roles must alternate" in refused.value.message
    assert refused.value.body["type"] == "invalid_request_error"


def test_a_python_generator_builds_its_chat_prompt_in_python(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="prompted", messages=CONVERSATION)
    assert answer.choices[0].message.content == "3 before: [When?]"
    # Its ValueError is the request's fault: 400, in OpenAI's shape, with the model's words.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="prompted", messages=[{"role": "system", "content": "x"}])
    assert "a chat needs a user message" in refused.value.message


# -------------------------------------------------------------------------------------------------- disconnects
def test_a_client_leaving_mid_stream_closes_the_models_generator(
    client: openai.OpenAI, repository: Path, server: ServerThread
) -> None:
    closed = repository / "ticker" / "1" / "closed.txt"
    stream = client.completions.create(model="ticker", prompt="go", stream=True)
    pieces = []
    for chunk in stream:
        pieces.append(chunk.choices[0].text)
        if len(pieces) == 3:
            break
    stream.close()  # the connection goes: the server closes the model's generator
    assert pieces == ["tick0 ", "tick1 ", "tick2 "]
    wait_until(closed.exists, timeout=30, what="the generator's finally to run")

    def cancelled() -> bool:
        metrics = requests.get(f"{server.rest_url}/metrics", timeout=30).text
        return 'workbench_requests_total{api="completions",code="CANCELLED",model="ticker"' in metrics

    wait_until(cancelled, timeout=30, what="the request counted as cancelled")


def test_a_client_leaving_before_a_whole_answer_closes_the_models_generator(
    repository: Path, server: ServerThread
) -> None:
    closed = repository / "ticker" / "1" / "closed.txt"
    closed.unlink(missing_ok=True)
    with pytest.raises(requests.exceptions.ReadTimeout):  # the client gives up and closes its connection
        requests.post(f"{server.rest_url}/v1/completions", json={"model": "ticker", "prompt": "go"}, timeout=1.0)
    wait_until(closed.exists, timeout=30, what="the generator's finally to run")


# ------------------------------------------------------------------------------------------------- the data plane
def test_the_model_field_names_versions_labels_and_follows_the_canary(
    client: openai.OpenAI, server: ServerThread
) -> None:
    def version_of(model: str, **headers: str) -> str:
        answer = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "which version?"}], temperature=0, extra_headers=headers
        )
        content = answer.parse().choices[0].message.content
        assert answer.headers["X-Model-Version"] == content.split()[1]
        return content

    assert version_of("routed") == "version 2 "  # the latest
    assert version_of("routed:2") == "version 2 "
    management = f"{server.rest_url}/workbench/v1/models/routed"
    assert requests.post(f"{management}:promote", json={"version": 1}, timeout=30).status_code == 200
    assert version_of("routed:1") == "version 1 "
    assert requests.post(f"{management}:canary", json={"version": 2, "weight": 1.0}, timeout=30).status_code == 200
    assert version_of("routed:canary") == "version 2 " and version_of("routed:stable") == "version 1 "
    assert version_of("routed", **{"X-Workbench-Key": "user-1"}) == "version 2 "  # all of the default traffic
    assert requests.post(f"{management}:canary", json={"version": 2, "weight": 0}, timeout=30).status_code == 200
    assert version_of("routed") == "version 1 "


def test_time_to_first_token_and_tokens_reach_the_metrics(client: openai.OpenAI, server: ServerThread) -> None:
    chat(client, "count these four words", temperature=0)
    client.embeddings.create(model="hasher", input=["five more words to embed"])
    metrics = requests.get(f"{server.rest_url}/metrics", timeout=30).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line[:1] != "#"
    }
    labels = '{model="parrot",version="1"}'
    assert samples[f"workbench_time_to_first_token_seconds_count{labels}"] >= 1
    assert samples[f"workbench_time_per_output_token_seconds_count{labels}"] >= 1
    assert samples[f"workbench_generation_tokens_total{labels}"] >= 4
    assert samples[f"workbench_prompt_tokens_total{labels}"] >= 6
    assert samples['workbench_prompt_tokens_total{model="hasher",version="1"}'] >= 5
    chats = 'workbench_requests_total{api="chat",code="OK",model="parrot",protocol="openai",version="1"}'
    assert samples[chats] >= 1


def test_a_shadow_gets_a_copy_of_each_generation(client: openai.OpenAI, server: ServerThread) -> None:
    management = f"{server.rest_url}/workbench/v1/models/shadowed"
    assert requests.post(f"{management}:promote", json={"version": 1}, timeout=30).status_code == 200
    assert requests.post(f"{management}:shadow", json={"version": 2, "fraction": 1.0}, timeout=30).status_code == 200
    for _ in range(2):
        assert chat(client, "same words", model="shadowed", temperature=0).model == "shadowed:1"

    def compared() -> dict[str, Any] | None:
        found = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json().get("shadow", {})
        record = found.get("shadowed")
        return record if record is not None and record["compared"] == 2 else None

    record = wait_until(compared, timeout=60, what="two copies compared")
    assert (record["version"], record["failed"]) == (2, 0)
    assert record["outputs"]["text_output"]["agreement"] == 1.0  # the same words from both versions


def test_generations_are_logged_with_their_text(client: openai.OpenAI, repository: Path, server: ServerThread) -> None:
    chat(client, "log me", model="logged", temperature=0)

    def logged() -> dict[str, Any] | None:
        health = requests.get(f"{server.rest_url}/workbench/v1/health", timeout=30).json()
        info = health["request_log"].get("logged", {})
        return info if info.get("logged", 0) >= 1 else None

    info = wait_until(logged, timeout=60, what="the generation logged")
    assert info["sink"] == "parquet" and info["dropped"] == 0
    frame = pd.read_parquet(repository.parent / f"{repository.name}-logs")
    (row,) = frame.itertuples()
    assert row.protocol == "openai" and row.method == "predict"
    assert [t.decode() for t in frame["output.text_output"].iloc[0]] == ["me ", "log ", ""]
    assert frame["input.text_input"].iloc[0][0].decode() == "user: log me\nassistant:"


# -------------------------------------------------------------------------------- the token, TLS, its own port
@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A test CA's certificate, and a server certificate for 127.0.0.1 (with its key) that it issued."""
    folder = tmp_path_factory.mktemp("openai-tls")
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(folder / "ca.pem"))
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    return folder / "ca.pem", folder / "server.pem"


@pytest.fixture(scope="module")
def guarded(repository: Path, ca_file: tuple[Path, Path]) -> Iterator[ServerThread]:
    """A server with a management token and TLS, the endpoints on a port of their own."""
    options = ServerOptions(
        model_repository=str(repository),
        rest_api_port=-1,
        port=0,
        openai_port=-1,
        allow_python_models=True,
        management_token=TOKEN,
        rest_api_ssl_cert_file=str(ca_file[1]),
    )
    with ServerThread(options) as running:
        yield running


def tls_client(server: ServerThread, ca: Path, key: str) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(ca)))
    return openai.OpenAI(base_url=server.openai_url, api_key=key, max_retries=0, http_client=http)


def test_the_management_token_is_the_api_key(guarded: ServerThread, ca_file: tuple[Path, Path]) -> None:
    ca = ca_file[0]
    with tls_client(guarded, ca, "wrong") as stranger:
        with pytest.raises(openai.AuthenticationError) as refused:
            stranger.models.list()
        with pytest.raises(openai.AuthenticationError):
            chat(stranger, "hi")
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    keyless = requests.get(f"{guarded.openai_url}/models", timeout=30, verify=str(ca))
    assert keyless.status_code == 401 and keyless.json()["error"]["type"] == "invalid_request_error"
    with tls_client(guarded, ca, TOKEN) as holder:
        assert chat(holder, "let me in", temperature=0).choices[0].message.content == "in me let "


def test_the_endpoints_on_a_port_of_their_own_with_rests_tls(guarded: ServerThread, ca_file: tuple[Path, Path]) -> None:
    ca = str(ca_file[0])
    port = guarded.server.openai_port
    assert port and port != guarded.server.rest_port
    assert guarded.openai_url == f"https://127.0.0.1:{port}/v1"
    health = requests.get(f"{guarded.rest_url}/workbench/v1/health", timeout=30, verify=ca).json()
    assert health["openai_port"] == port
    with tls_client(guarded, ca_file[0], TOKEN) as own:
        assert own.models.retrieve("parrot").id == "parrot"  # /v1/models/{m} is OpenAI's here
        assert own.embeddings.create(model="hasher", input="x").data[0].embedding == pytest.approx(hashed("x"))
    with pytest.raises(requests.exceptions.ConnectionError):  # TLS only
        requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=30)
    # The REST port no longer has them, and the OpenAI port nothing else.
    headers = {"Authorization": f"Bearer {TOKEN}"}
    moved = requests.post(f"{guarded.rest_url}/v1/completions", json={}, headers=headers, timeout=30, verify=ca)
    assert moved.status_code in (400, 404) and "error" in moved.json()
    other = requests.get(f"https://127.0.0.1:{port}/v1/models/parrot/metadata", timeout=30, verify=ca)
    assert other.status_code in (401, 404)
    elsewhere = requests.get(f"https://127.0.0.1:{port}/metrics", timeout=30, verify=ca)
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["message"] == "Invalid URL (GET /metrics)"


def test_the_port_is_free_again_once_the_server_stops(repository: Path) -> None:
    options = ServerOptions(model_repository=str(repository), rest_api_port=-1, port=0, openai_port=-1)
    with ServerThread(options) as running:
        port = running.server.openai_port
        assert port
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
