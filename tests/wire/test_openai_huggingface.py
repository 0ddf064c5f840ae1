"""Hugging Face models, exported from Python as a notebook would, served by one server and driven by the official
OpenAI client: a chat model (a tiny Llama with its tokenizer's chat template) and an embedder (a BERT encoder), the
answers equal to what the same models give in-process, concurrent streams batched without changing any of them."""

from __future__ import annotations

import base64
import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import requests

pytest.importorskip("transformers")
import openai
import torch

import workbench
from tests import hf_models
from tests.waiting import wait_until
from workbench.server.running import ServerThread

QUESTIONS = [
    "Who wrote the first program?",
    "What is the capital of France?",
    "Tell me about the weather in Paris today, and about the trains.",
    "Models answer questions.",
]
ONE_SEAT = "one_seat"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    repository = tmp_path_factory.mktemp("hf-openai")
    chat_tokenizer = hf_models.chat_tokenizer()
    chat_model = hf_models.chat_model(len(chat_tokenizer))
    encoder_tokenizer = hf_models.tokenizer()
    encoder = hf_models.model("feature-extraction", len(encoder_tokenizer))
    workbench.export(chat_model, "chat", tokenizer=chat_tokenizer, task="text-generation", model_repository=repository)
    workbench.export(
        encoder, "embed", tokenizer=encoder_tokenizer, task="feature-extraction", model_repository=repository
    )
    # The same weights with one seat and a queue of one, and a context long enough that a generation holds its
    # seat until its client leaves (rotary positions: a longer context changes no answer).
    workbench.export(
        chat_model, ONE_SEAT, tokenizer=chat_tokenizer, task="text-generation", model_repository=repository
    )
    folder = repository / ONE_SEAT / "1"
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1 << 16}))
    settings = json.loads((folder / "workbench.json").read_text())
    (folder / "workbench.json").write_text(json.dumps({**settings, "max_sequences": 1, "max_queued": 1}))
    return SimpleNamespace(
        repository=repository,
        chat_tokenizer=chat_tokenizer,
        chat_model=chat_model,
        encoder_tokenizer=encoder_tokenizer,
        encoder=encoder,
    )


@pytest.fixture(scope="module")
def server(models: SimpleNamespace) -> Iterator[ServerThread]:
    from workbench.config.options import ServerOptions

    started = ServerThread(
        ServerOptions(model_repository=str(models.repository), rest_api_port=-1, port=0, enable_batching=True)
    ).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.rest_url + "/v1", api_key="unused", max_retries=0, timeout=120) as made:
        yield made


def greedy_in_process(models: SimpleNamespace, question: str, max_tokens: int) -> tuple[str, int]:
    """The chat model's greedy answer to ``question`` by ``model.generate``, and its prompt's token count."""
    prompt = models.chat_tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids = models.chat_tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = models.chat_model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    return models.chat_tokenizer.decode(out[0, ids.shape[1] :]), ids.shape[1]


def ask(client: openai.OpenAI, question: str, model: str = "chat", **params: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], temperature=0, **params
    )


def test_both_models_are_listed(client: openai.OpenAI) -> None:
    assert {"chat", "embed"} <= {model.id for model in client.models.list()}


def test_a_chat_answer_is_the_models_greedy_generation_with_its_usage(
    client: openai.OpenAI, models: SimpleNamespace
) -> None:
    expected, prompt_tokens = greedy_in_process(models, QUESTIONS[0], 12)
    answer = ask(client, QUESTIONS[0], max_tokens=12)
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens == prompt_tokens
    assert answer.usage.completion_tokens == 12


def test_a_stream_adds_up_to_the_same_answer_and_ends_with_the_usage(
    client: openai.OpenAI, models: SimpleNamespace
) -> None:
    expected, prompt_tokens = greedy_in_process(models, QUESTIONS[1], 10)
    chunks = list(ask(client, QUESTIONS[1], max_tokens=10, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == prompt_tokens


def test_concurrent_streams_share_the_model_and_each_gets_its_own_answer(
    client: openai.OpenAI, models: SimpleNamespace
) -> None:
    asked = QUESTIONS * 2
    expected = [greedy_in_process(models, q, 16)[0] for q in asked]

    def streamed(question: str) -> str:
        return "".join(
            c.choices[0].delta.content or "" for c in ask(client, question, max_tokens=16, stream=True) if c.choices
        )

    with concurrent.futures.ThreadPoolExecutor(len(asked)) as pool:
        assert list(pool.map(streamed, asked)) == expected


def test_a_generation_is_queued_before_its_stream_starts_and_a_full_queue_is_429(
    client: openai.OpenAI, server: ServerThread, models: SimpleNamespace
) -> None:
    """Each choice is submitted while its request is handled, before the answer's first byte: a full queue is
    OpenAI's 429 (not a 200 whose stream carries the error), a refused choice withdraws its siblings, and v2's
    generate_stream answers the same refusal with its status."""
    with server.server.manager.served.handle(ONE_SEAT) as servable:
        scheduler = servable.scheduler  # type: ignore[attr-defined]
    seated = ask(client, QUESTIONS[0], model=ONE_SEAT, max_tokens=60000, stream=True)
    try:
        wait_until(lambda: scheduler.active == 1, what="the first generation to take the one seat")
        with pytest.raises(openai.RateLimitError) as siblings:  # choice 0 queues, choice 1 finds the queue full
            ask(client, QUESTIONS[1], model=ONE_SEAT, max_tokens=6, n=2, stream=True)
        assert "queued" in siblings.value.message
        wait_until(lambda: scheduler.waiting == 0, what="the refused request's first choice to leave the queue")
        queued = ask(client, QUESTIONS[3], model=ONE_SEAT, max_tokens=6, stream=True)
        assert scheduler.waiting == 1  # queued before the response began, not when its stream is first read
        with pytest.raises(openai.RateLimitError):
            ask(client, QUESTIONS[2], model=ONE_SEAT, max_tokens=6, stream=True)
        # v2's generate_stream submits in its handler too: the refusal is its status, as Triton answers one
        url = f"{server.rest_url}/v2/models/{ONE_SEAT}/generate_stream"
        refused = requests.post(url, json={"text_input": QUESTIONS[2]}, timeout=60)
        assert refused.status_code == 429 and "queued" in refused.json()["error"]
        assert scheduler.active == 1 and scheduler.waiting == 1
    finally:
        seated.close()  # its client leaves: the seat frees at the next step
    answer = "".join(c.choices[0].delta.content or "" for c in queued if c.choices)
    assert answer == greedy_in_process(models, QUESTIONS[3], 6)[0]
    wait_until(lambda: scheduler.active == 0 and scheduler.waiting == 0, what="both generations to end")


def embeddings_in_process(models: SimpleNamespace, texts: list[str]) -> np.ndarray:
    """Mean pooling over the attention mask, then L2 normalisation: what sentence-transformers does."""
    batch = models.encoder_tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = models.encoder(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_embeddings_as_floats_and_base64_are_the_encoders(client: openai.OpenAI, models: SimpleNamespace) -> None:
    texts = ["The capital of France is Paris.", "Grace Hopper built compilers."]
    expected = embeddings_in_process(models, texts)
    floats = client.embeddings.create(model="embed", input=texts)
    assert np.allclose(np.array([d.embedding for d in floats.data]), expected, atol=1e-5)
    assert floats.usage.prompt_tokens == sum(len(models.encoder_tokenizer(t).input_ids) for t in texts)
    encoded = client.embeddings.create(model="embed", input=texts, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in encoded.data]  # type: ignore[arg-type]
    assert np.allclose(np.array(decoded), expected, atol=1e-5)


def test_the_embedder_is_not_a_chat_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
    assert 400 <= refused.value.status_code < 500


def test_the_exports_check_asks_a_generator_for_a_token_not_an_empty_prompt(
    models: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        result = workbench.export(
            models.chat_model,
            "checked",
            tokenizer=models.chat_tokenizer,
            task="text-generation",
            model_repository=tmp_path,
        )
    assert result.version == 1
    assert not [r for r in caplog.records if "rejected" in r.getMessage()]


def test_a_client_that_leaves_a_stream_frees_its_sequence_and_the_next_answer_is_whole(
    client: openai.OpenAI, server: ServerThread, models: SimpleNamespace
) -> None:
    with server.server.manager.served.handle("chat") as servable:
        scheduler = servable.scheduler  # type: ignore[attr-defined]
    stream = ask(client, QUESTIONS[2], max_tokens=4000, stream=True)
    received = [next(iter(stream)) for _ in range(3)]
    assert all(chunk.choices for chunk in received)
    stream.close()  # the connection goes: the data plane closes the generation, which leaves the batch
    wait_until(lambda: scheduler.active == 0 and scheduler.waiting == 0, what="the generation to leave the batch")
    expected, _ = greedy_in_process(models, QUESTIONS[3], 6)
    assert ask(client, QUESTIONS[3], max_tokens=6).choices[0].message.content == expected
