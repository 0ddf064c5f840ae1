"""Text generation in the live stats and the live chart: a ``workbench.TextGenerator`` driven by OpenAI's client and
by the v2 generate extension has its time to first token and tokens per second in the stats snapshot, counted once
(the Prometheus series agree with the usage), while a version that never generated has none of those fields; and
the notebook's live chart grows its two generation rows with the first generation, beside latency, in each
version's colour."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from test_stats import ENTRY_KEYS
from text_models import HASHER, PARROT, chat, openai_client, write_model
from waiting import wait_until

from workbench.client import Client
from workbench.config.options import ServerOptions
from workbench.notebook.widgets import LiveChart
from workbench.server import ServerThread

GENERATION_KEYS = {"time_to_first_token_p50_ms", "time_to_first_token_p95_ms", "tokens_per_second"}
FIRST_TOKEN_TITLE, TOKENS_TITLE = "time to first token (ms): p50 ─  p95 ┄", "tokens / s"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generation-models")
    for name in ("parrot", "counted", "streamed"):
        write_model(root, name, PARROT)
    write_model(root, "hasher", HASHER)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(model_repository=str(repository), rest_api_port=-1, port=0, allow_python_models=True)
    with ServerThread(options) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai_client(server.rest_url) as made:
        yield made


def entry(server: ServerThread, model: str) -> dict[str, Any]:
    snapshot = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json()
    return snapshot["models"][model]["1"]


def samples(server: ServerThread) -> dict[str, float]:
    text = requests.get(f"{server.rest_url}/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def test_generations_through_openai_fill_the_snapshot_and_others_have_no_generation_fields(
    client: openai.OpenAI, server: ServerThread
) -> None:
    client.embeddings.create(model="hasher", input=["words to embed"])
    whole = chat(client, "one two three four", temperature=0)
    assert whole.choices[0].message.content == "four three two one "
    streamed = list(chat(client, "five six seven", temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "seven six five "

    found = entry(server, "parrot")
    assert set(found) == ENTRY_KEYS | GENERATION_KEYS  # the snapshot's shape otherwise unchanged
    assert found["total_requests"] == 2
    assert 0 < found["time_to_first_token_p50_ms"] <= found["time_to_first_token_p95_ms"]
    assert found["tokens_per_second"] > 0
    # An embedder never generated: its entry has none of the generation fields, nor has a version that only predicts.
    assert set(entry(server, "hasher")) == ENTRY_KEYS


def test_each_generation_is_counted_once_for_the_metrics_and_the_stats(
    client: openai.OpenAI, server: ServerThread
) -> None:
    answers = [chat(client, "a b c d e", model="counted", temperature=0), chat(client, "f g", model="counted", n=2)]
    completion = sum(answer.usage.completion_tokens for answer in answers)
    assert completion == 5 + 2 * 8  # reversed words; two choices of eight sampled words
    found = samples(server)
    labels = '{model="counted",version="1"}'
    assert found[f"workbench_generation_tokens_total{labels}"] == completion
    assert found[f"workbench_time_to_first_token_seconds_count{labels}"] == 3  # one a choice
    assert found[f"workbench_time_per_output_token_seconds_count{labels}"] == 3
    # The prompts' words ("user: a b c d e", "assistant:"), the second's once for each of its choices.
    assert found[f"workbench_prompt_tokens_total{labels}"] == 7 + 2 * 4
    assert entry(server, "counted")["tokens_per_second"] > 0


def test_a_generation_through_v2_generate_stream_is_recorded_too(server: ServerThread) -> None:
    url = f"{server.rest_url}/v2/models/streamed/generate_stream"
    body = {"text_input": "user: seven eight nine", "stream": True, "sampling_parameters": '{"temperature": 0}'}
    with requests.post(url, json=body, stream=True, timeout=60) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line.startswith(b"data: ")]
    assert len(events) == 4  # three words, then the end with its finish reason
    found = entry(server, "streamed")
    assert set(found) == ENTRY_KEYS | GENERATION_KEYS
    assert found["time_to_first_token_p50_ms"] > 0 and found["tokens_per_second"] > 0
    counted = samples(server)
    labels = '{model="streamed",version="1"}'
    assert counted[f"workbench_generation_tokens_total{labels}"] == 3  # the model's own count of its tokens
    assert counted[f"workbench_prompt_tokens_total{labels}"] == 4
    assert counted[f"workbench_time_to_first_token_seconds_count{labels}"] == 1


# ------------------------------------------------------------------------------------------------ the live chart
def titles(chart: LiveChart) -> list[str]:
    return [annotation.text for annotation in chart.figure.layout.annotations]


def drawn(chart: LiveChart, label: str, axis: str, dash: str = "solid") -> list[Any]:
    chart.redraw()
    (trace,) = [t for t in chart.figure.data if t.name == label and t.yaxis == axis and t.line.dash == dash]
    return list(trace.y or ())


def colours(chart: LiveChart, label: str) -> set[str]:
    return {trace.line.color for trace in chart.figure.data if trace.name == label}


@pytest.fixture
def generator_server(serve, tmp_path: Path) -> ServerThread:  # type: ignore[no-untyped-def]
    write_model(tmp_path / "repo", "parrot", PARROT)
    write_model(tmp_path / "repo", "hasher", HASHER)
    return serve(model_repository=str(tmp_path / "repo"), allow_python_models=True)


def test_the_live_chart_grows_the_generation_rows_with_the_first_generation(generator_server: ServerThread) -> None:
    server = generator_server
    with (
        Client(server.rest_url) as client,
        openai.OpenAI(base_url=server.rest_url + "/v1", api_key="unused", max_retries=0, timeout=60) as chat_client,
    ):
        chart = LiveChart(client, window_seconds=5, interval=0.1, min_redraw_seconds=0.1)
        try:
            assert not chart.generation_rows  # nothing generated yet: latency, requests/s and batch size alone
            chat_client.embeddings.create(model="hasher", input=["an embedder generates nothing"])
            wait_until(lambda: chart.points("hasher", 1) >= 3, timeout=30)
            chart.redraw()
            assert not chart.generation_rows and len(titles(chart)) == 3 and len(chart.figure.data) == 5
            hasher_colour = colours(chart, "hasher v1")

            chat(chat_client, "a generation at last", temperature=0)

            def filled() -> bool:
                chart.redraw()
                return chart.generation_rows and any(drawn(chart, "parrot v1", "y5"))

            wait_until(filled, timeout=30, what="the generation rows drawn")
            assert titles(chart)[3:] == [FIRST_TOKEN_TITLE, TOKENS_TITLE]
            assert len(chart.figure.data) == 2 * 8  # per version: the five of every chart, p50 and p95, tokens/s
            assert any(y is not None and y > 0 for y in drawn(chart, "parrot v1", "y4"))  # time to first token: p50
            assert any(y is not None and y > 0 for y in drawn(chart, "parrot v1", "y4", "dash"))  # and p95
            assert any(y is not None and y > 0 for y in drawn(chart, "parrot v1", "y5"))  # tokens / s
            # The embedder's rows stay empty, and each version keeps its one colour across the rebuilt figure.
            assert set(drawn(chart, "hasher v1", "y4")) == set(drawn(chart, "hasher v1", "y5")) == {None}
            assert [trace.line.dash for trace in chart.figure.data if trace.name == "parrot v1"][5:] == [
                "solid",
                "dash",
                "solid",
            ]
            assert colours(chart, "hasher v1") == hasher_colour and len(colours(chart, "parrot v1")) == 1
            assert colours(chart, "parrot v1") != hasher_colour

            # A chart opened now, on a server that has generated, has the rows from the start.
            later = LiveChart(client, window_seconds=5, interval=0.1, min_redraw_seconds=0.1)
            try:
                assert later.generation_rows and titles(later)[3:] == [FIRST_TOKEN_TITLE, TOKENS_TITLE]
            finally:
                later.close()
        finally:
            chart.close()
    assert chart.threads == []
