"""Python text models for the OpenAI-compatible endpoints' tests, as ``model.py`` sources that follow the text
conventions (workbench.core.text_generation): a generator built on ``workbench.TextGenerator``, one written by hand
with log-probabilities, an endless one that notes when its generator closed, two that make their own chat prompts
(a Jinja chat template, a Python method), and an embedder."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Reverses the last message's words at temperature 0; samples seeded words from a vocabulary above it. Each word
# is a piece (a token to the API); the prompt's tokens are its words.
PARROT = """
import random

import workbench

VOCABULARY = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "kiwi", "lynx"]


class Parrot(workbench.TextGenerator):
    def load(self, path):
        self.version = path.name

    def generate(self, prompt, params):
        lines = [line for line in prompt.strip().splitlines() if line.strip() != "assistant:"]
        last = lines[-1].split(": ", 1)[-1] if lines else ""
        if params.temperature == 0:
            words = last.split()[::-1]
        else:
            rng = random.Random(params.seed)
            words = [rng.choice(VOCABULARY) for _ in range(8)]
        if last == "which version?":
            words = ["version", self.version]
        for word in words:
            yield word + " "
"""

# The convention by hand, no workbench import: the log-probabilities of each word, no token counts (the endpoints
# count pieces and words then).
SCORED = """
import json

import numpy as np


class Model:
    inputs = {
        "text_input": ("string", [1]),
        "sampling_parameters": ("string", [1]),
        "return_logprobs": ("bool", [1]),
    }
    outputs = {"text_output": ("string", [1]), "logprobs": ("string", [1])}
    decoupled = True

    def predict(self, inputs):
        prompt = inputs["text_input"][0].decode()
        asked = bool(inputs["return_logprobs"][0])
        top = json.loads(inputs["sampling_parameters"][0] or b"{}").get("logprobs") or 0
        for i, word in enumerate(prompt.split()):
            piece = word.upper() + " "
            entry = {
                "token": piece,
                "logprob": -0.5 * (i + 1),
                "top_logprobs": [{"token": f"alt{k} ", "logprob": -1.0 - k} for k in range(top)],
            }
            yield {"text_output": [piece], "logprobs": [json.dumps([entry]) if asked else ""]}
"""

# Ticks until its client leaves; its generator's finally writes closed.txt into the version folder.
TICKER = """
import time

import workbench


class Ticker(workbench.TextGenerator):
    def load(self, path):
        self.folder = path

    def generate(self, prompt, params):
        try:
            for i in range(100000):
                yield f"tick{i} "
                time.sleep(0.02)
        finally:
            (self.folder / "closed.txt").write_text("closed")
"""

# Its chat prompt comes from its own Jinja template (ChatML-like; a system message first, then user and assistant
# turns that must alternate, as many templates on the Hub insist); it answers with the prompt it was given, whole.
CHATML = (
    "{% if messages[0]['role'] == 'system' %}{% set rest = messages[1:] %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% else %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATED = f"""
import workbench


class Templated(workbench.TextGenerator):
    chat_template = {CHATML!r}

    def generate(self, prompt, params):
        yield prompt
"""

# Its chat prompt is built in Python: the last user message, in brackets, after how many messages came before.
PROMPTED = """
import workbench


class Prompted(workbench.TextGenerator):
    def chat_prompt(self, messages):
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise ValueError("a chat needs a user message")
        return f"{len(messages) - 1} before: [{users[-1]}]"

    def generate(self, prompt, params):
        yield prompt
"""

# Hashes each word into one of 8 dimensions; the vector is normalised.
HASHER = """
import zlib

import numpy as np

import workbench


class Hasher(workbench.TextEmbedder):
    def embed(self, texts):
        vectors = np.zeros((len(texts), 8), np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                vectors[row, zlib.crc32(word.encode()) % 8] += 1.0
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)
"""


def hashed(text: str) -> list[float]:
    """What HASHER embeds ``text`` as, computed here."""
    import zlib

    import numpy as np

    vector = np.zeros(8, np.float32)
    for word in text.split():
        vector[zlib.crc32(word.encode()) % 8] += 1.0
    return (vector / max(float(np.linalg.norm(vector)), 1e-12)).tolist()


def write_model(repository: Path, name: str, source: str, versions: tuple[int, ...] = (1,)) -> Path:
    for version in versions:
        folder = repository / name / str(version)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.py").write_text(textwrap.dedent(source))
    return repository / name


@contextlib.contextmanager
def openai_client(rest_url: str) -> Iterator[Any]:
    """The official client on a server's REST port, failing at once (no retries) so that a test sees each answer."""
    import openai

    with openai.OpenAI(base_url=rest_url + "/v1", api_key="anything", max_retries=0, timeout=60) as made:
        yield made


def chat(client: Any, text: str, model: str = "parrot", **options: Any) -> Any:
    """One user message to ``model``; ``options`` are the call's other parameters."""
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **options)
