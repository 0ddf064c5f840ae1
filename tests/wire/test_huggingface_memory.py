"""Hugging Face versions under a memory budget: each says what its model's tensors hold (parameters and buffers, on
the device they are on), is charged at least that, and the budget evicts and refuses them as it does any version.

The models are tiny BERT classifiers and a Llama-like generator (tests/hf_models.py) whose embedding tables are
widened to about 16 MiB, so that the weights, not the allocator's noise around a load, decide what fits: a budget of
1.5 times that holds one version and not two. With model runners, each runner's copy says what it holds and the
frontends' budgets count every copy, which a frontend cannot measure (the load is in another process).
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import torch
from test_cli import START_DEADLINE_S, Workbench
from text_models import chat, openai_client
from waiting import wait_until

import workbench
from tests import hf_models
from workbench.config.options import ServerOptions
from workbench.core.footprint import Footprint
from workbench.platforms import Loader
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

MiB = 2**20
# Embedding rows that make each model's weights about 16 MiB (the tokenizers use the first 300 only).
CLASSIFIER_VOCAB = 16 * MiB // (32 * 4)  # BERT's hidden size is 32, float32
GENERATOR_VOCAB = 16 * MiB // (2 * 64 * 4)  # Llama's hidden size is 64; its input and output embeddings are apart
BUDGET = 24 * MiB  # one ~16 MiB version, never two
CLASSIFIERS = ("clf_a", "clf_b")


def tensor_bytes(model: torch.nn.Module) -> int:
    """What the model's parameters and buffers take, counted here independently of workbench."""
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """The in-process models, by the name they are served under."""
    bert_tokenizer, chat_tokenizer = hf_models.tokenizer(), hf_models.chat_tokenizer()
    made: dict[str, Any] = {}
    for seed, name in enumerate(CLASSIFIERS):
        made[name] = (hf_models.model("text-classification", CLASSIFIER_VOCAB, seed=seed), bert_tokenizer, None)
    made["gen"] = (hf_models.chat_model(GENERATOR_VOCAB), chat_tokenizer, "text-generation")
    # Twice the budget: refused before it loads, from its files' size.
    made["big"] = (hf_models.model("text-classification", 2 * BUDGET // (32 * 4)), bert_tokenizer, None)
    return made


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, built: dict[str, Any]) -> Path:
    root = tmp_path_factory.mktemp("hf-budget")
    for name, (model, tokenizer, task) in built.items():
        workbench.export(model, name, root, tokenizer=tokenizer, **({"task": task} if task else {}))
    return root


def test_a_version_says_its_parameters_and_buffers(repository: Path, built: dict[str, Any]) -> None:
    """A classifier and a generator, loaded on the CPU: memory_held is their tensors' bytes, all host memory."""
    loader = Loader(LoadPolicy(pytorch_device="cpu"))
    for name in ("clf_a", "gen"):
        servable = loader(name, 1, str(repository / name / "1"), "huggingface")
        try:
            expected = tensor_bytes(built[name][0])
            assert expected > 16 * MiB * 0.9
            assert servable.memory_held() == Footprint(host=expected, gpu=0), name
        finally:
            servable.close()


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(repository),
        memory_budget=str(BUDGET),
        load_on_demand=True,
        pytorch_device="cpu",
        rest_api_timeout_in_ms=300_000,  # each request waits for a load (and an unload) on a machine that may be busy
    )
    with ServerThread(options) as running:
        yield running


def memory(server: ServerThread, model: str) -> dict[str, Any]:
    doc = requests.get(f"{server.rest_url}/workbench/v1/models/{model}", timeout=10).json()
    return next(v["memory"] for v in doc["versions"] if v["version"] == 1)


def classify(server: ServerThread, model: str) -> requests.Response:
    return requests.post(
        f"{server.rest_url}/v1/models/{model}:predict", json={"instances": ["Ada wrote a program."]}, timeout=120
    )


def test_the_budget_charges_each_version_its_weights_and_evicts_the_least_recently_used(
    server: ServerThread, built: dict[str, Any]
) -> None:
    weights = {name: tensor_bytes(model) for name, (model, _, _) in built.items()}

    def charged_its_weights(name: str) -> None:
        view = memory(server, name)
        assert view["residency"] == "resident", view
        assert view["held_bytes"] == weights[name] and view["held_gpu_bytes"] == 0, view
        assert weights[name] <= view["charged_bytes"] <= BUDGET, view

    r = classify(server, "clf_a")
    assert r.status_code == 200, r.text
    charged_its_weights("clf_a")

    # The generator, asked for through the OpenAI endpoints, loads in the classifier's place.
    with openai_client(server.rest_url) as client:
        answer = chat(client, "Ada wrote", model="gen", max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens >= 1
    charged_its_weights("gen")
    assert memory(server, "clf_a")["residency"] == "evicted"

    r = classify(server, "clf_b")
    assert r.status_code == 200, r.text
    charged_its_weights("clf_b")
    assert memory(server, "gen")["residency"] == "evicted"

    stats = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=10).json()["memory"]
    assert stats["charged_bytes"] <= BUDGET, stats
    wait_until(lambda: memory(server, "gen")["charged_bytes"] == 0, what="the evicted generator's charge released")


def test_a_version_bigger_than_the_budget_is_refused_with_the_reason(server: ServerThread) -> None:
    r = classify(server, "big")
    assert r.status_code == 429, r.text
    assert "Insufficient resources to load servable big:1" in r.json()["error"], r.text
    assert memory(server, "big")["residency"] == "failed"


def test_with_model_runners_every_runners_copy_is_counted(
    tmp_path: Path, repository: Path, built: dict[str, Any]
) -> None:
    """Two runners hold a copy each: the version is charged both copies' tensors (the frontends measure nothing of
    a load in another process), so a budget that holds one copy and not two refuses it once loaded."""
    ready = tmp_path / "ready.json"
    (tmp_path / "cwd").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "clf_a").symlink_to(repository / "clf_a")
    wb = Workbench(
        tmp_path / "cwd",
        f"--model_repository={tmp_path / 'repo'}",
        "--num_workers=1",  # one frontend: the ledger a request and a status read see is the same
        "--model_runners=2",
        f"--memory_budget={BUDGET}",
        "--load_on_demand",
        "--pytorch_device=cpu",
        # Two runner processes import transformers and load the copies: minutes on a busy 2-core machine.
        "--rest_api_timeout_in_ms=600000",
        "--wait_for_model_load_seconds=600",
        "--rest_api_port=-1",
        "--port=0",
        f"--ready_file={ready}",
    )
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['rest_port']}"
        r = requests.post(f"{url}/v1/models/clf_a:predict", json={"instances": ["Ada wrote."]}, timeout=600)
        assert r.status_code == 429, r.text
        assert "took" in r.json()["error"] and "more than the whole memory budget" in r.json()["error"], r.text
        doc = requests.get(f"{url}/workbench/v1/models/clf_a", timeout=10).json()
        view = doc["versions"][0]["memory"]
        assert view["held_bytes"] == 2 * tensor_bytes(built["clf_a"][0]), view
        assert view["residency"] == "failed", view
    finally:
        if wb.proc.poll() is None:
            wb.proc.send_signal(signal.SIGTERM)
            assert wb.wait(120) == 0, wb.stderr[-3000:]
