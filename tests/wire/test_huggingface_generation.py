"""Hugging Face text generation as a decoupled servable: tiny random-weight models (GPT-2, Llama with a chat
template, T5) built here with a tokenizer trained here, loaded by ``huggingface_generation.load`` and driven as the
data plane drives a decoupled model (``run_decoupled``, ``next()`` on other threads, ``cancel()``/``close()``).

What matters most: a greedy generation batched with others gives exactly the tokens it gives alone (and what
``model.generate`` gives), whatever step the others joined at.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.waiting import wait_until
from workbench.core import text_generation as tg
from workbench.core.errors import Code, ServingError
from workbench.core.servable import FinalResponse
from workbench.platforms.base import LoadPolicy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from workbench.platforms import huggingface_generation as hg  # noqa: E402

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, héllo wörld, a snowman ☃ in the snow",
    "a stitch in time saves nine, and nine lives has a cat",
    "to be or not to be, that is the question",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CPU = LoadPolicy(pytorch_device="cpu")


def trained_tokenizer(specials: list[str], **named: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXTS * 5, trainers.BpeTrainer(vocab_size=200, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **named)


def version_folder(root: Path, name: str, model: Any, tokenizer: Any, task: str, **settings: Any) -> str:
    folder = root / name / "1"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "workbench.json").write_text(json.dumps({"platform": "huggingface", "task": task, **settings}))
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    root = tmp_path_factory.mktemp("generators")
    torch.manual_seed(0)
    # No end-of-sequence token: random weights would end generations at random (the end token is a unit test's).
    gpt2_tokenizer = trained_tokenizer([])
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=len(gpt2_tokenizer),
            n_positions=128,
            initializer_range=0.3,
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    llama_tokenizer = trained_tokenizer(["<s>"], bos_token="<s>")
    llama_tokenizer.chat_template = CHAT_TEMPLATE
    llama = LlamaForCausalLM(
        LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=len(llama_tokenizer),
            max_position_embeddings=256,
            initializer_range=0.3,
            bos_token_id=0,
            eos_token_id=None,
            pad_token_id=None,
        )
    )
    t5_tokenizer = trained_tokenizer(["<pad>"], pad_token="<pad>")
    t5 = T5ForConditionalGeneration(
        T5Config(
            vocab_size=len(t5_tokenizer),
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            pad_token_id=0,
            decoder_start_token_id=0,
            eos_token_id=None,
            initializer_factor=5.0,
        )
    )
    causal = hg.TEXT_GENERATION
    return {
        "gpt2": version_folder(root, "gpt2", gpt2, gpt2_tokenizer, causal),
        "gpt2_budget_8": version_folder(root, "gpt2_budget_8", gpt2, gpt2_tokenizer, causal, max_batched_tokens=8),
        "gpt2_one_seat": version_folder(
            root, "gpt2_one_seat", gpt2, gpt2_tokenizer, causal, max_sequences=1, max_queued=1
        ),
        "llama": version_folder(root, "llama", llama, llama_tokenizer, causal),
        "t5": version_folder(root, "t5", t5, t5_tokenizer, hg.TEXT2TEXT_GENERATION),
    }


def loaded(path: str, task: str = hg.TEXT_GENERATION, policy: LoadPolicy = CPU) -> Iterator[hg.HuggingFaceGenerator]:
    servable = hg.load(Path(path).parent.name, 1, path, policy, task)
    assert isinstance(servable, hg.HuggingFaceGenerator)
    try:
        yield servable
    finally:
        servable.close()


@pytest.fixture(scope="module")
def gpt2(folders: dict[str, str]) -> Iterator[hg.HuggingFaceGenerator]:
    yield from loaded(folders["gpt2"])


@pytest.fixture(scope="module")
def llama(folders: dict[str, str]) -> Iterator[hg.HuggingFaceGenerator]:
    yield from loaded(folders["llama"])


@pytest.fixture(scope="module")
def t5(folders: dict[str, str]) -> Iterator[hg.HuggingFaceGenerator]:
    yield from loaded(folders["t5"], hg.TEXT2TEXT_GENERATION)


def start(
    servable: hg.HuggingFaceGenerator, prompt: str, stream: bool = False, flags: tuple[str, ...] = (), **params: Any
) -> Iterator[dict[str, np.ndarray]]:
    """A request as the data plane sends it: the prompt, the flags that are set, the sampling parameters."""
    signature = servable.signatures["serving_default"]
    inputs = {
        tg.TEXT_INPUT: np.array([prompt.encode()], dtype=object),
        tg.STREAM: np.array([stream]),
        tg.EXCLUDE_INPUT_IN_OUTPUT: np.array([True]),
        tg.SAMPLING_PARAMETERS: np.array([json.dumps(params).encode()], dtype=object),
        **{flag: np.array([True]) for flag in flags},
    }
    return servable.run_decoupled(signature, inputs, list(signature.outputs))


def text(responses: Iterator[dict[str, np.ndarray]] | list[dict[str, np.ndarray]]) -> str:
    return b"".join(r[tg.TEXT_OUTPUT][0] for r in responses).decode()


GREEDY = {"temperature": 0, "max_tokens": 24}


def test_a_greedy_generation_batched_with_others_is_exactly_what_it_is_alone(
    gpt2: hg.HuggingFaceGenerator, llama: hg.HuggingFaceGenerator
) -> None:
    prompts = [TEXTS[0], "hello", TEXTS[2] + " " + TEXTS[3], "a", TEXTS[1]]
    for servable in (gpt2, llama):
        alone = [text(start(servable, p, **GREEDY)) for p in prompts]
        # each joins a running batch at a different step: the first has 3 tokens when the next two come, ...
        first = start(servable, prompts[0], stream=True, **GREEDY)
        got = [[next(first) for _ in range(3)]]
        others = [start(servable, p, stream=True, **GREEDY) for p in prompts[1:3]]
        got += [[next(stream)] for stream in others]
        later = [start(servable, p, stream=True, **GREEDY) for p in prompts[3:]]
        for responses, stream in zip(got, [first, *others], strict=True):
            responses.extend(stream)
        got += [list(stream) for stream in later]
        assert [text(responses) for responses in got] == alone
        assert servable.engine.widest >= 3  # they did share steps
        wait_until(lambda s=servable: s.scheduler.active == 0)


def test_rows_that_leave_mid_batch_and_wider_prompts_that_join_leave_every_answer_as_it_is_alone(
    gpt2: hg.HuggingFaceGenerator, llama: hg.HuggingFaceGenerator
) -> None:
    # (prompt, max_tokens): short answers leave while the others go on, their slots taken by the batch's last rows;
    # then prompts wider than the batch's columns join, and the running rows' columns widen on the left
    waves = [
        [("a", 20), (TEXTS[0], 3), ("hello", 16), (TEXTS[3], 5)],
        [(TEXTS[1] + " " + TEXTS[2], 9), ("to be", 2)],
        [(" ".join(TEXTS), 6), (TEXTS[2], 12)],
    ]
    for servable in (gpt2, llama):
        alone = [[text(start(servable, p, temperature=0, max_tokens=m)) for p, m in wave] for wave in waves]
        streams: list[Any] = []
        got: list[list[dict[str, np.ndarray]]] = []
        for wave in waves:
            streams += [start(servable, p, stream=True, temperature=0, max_tokens=m) for p, m in wave]
            got += [[next(stream)] for stream in streams[len(got) :]]
            for responses, stream in zip(got, streams, strict=True):  # a few steps before the next wave
                if len(responses) < 3 and not isinstance(responses[-1], FinalResponse):
                    responses.append(next(stream, {tg.TEXT_OUTPUT: np.array([b""], dtype=object)}))
        for responses, stream in zip(got, streams, strict=True):
            responses.extend(stream)
        assert [text(responses) for responses in got] == [answer for wave in alone for answer in wave]
        wait_until(lambda s=servable: s.scheduler.active == 0)


def test_greedy_decoding_is_what_model_generate_gives(gpt2: hg.HuggingFaceGenerator) -> None:
    ids = gpt2.encode(TEXTS[3])
    with torch.inference_mode():
        generated = gpt2.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            pad_token_id=0,
        )
    expected = gpt2.tokenizer.decode(generated[0, len(ids) :].tolist(), skip_special_tokens=True)
    assert text(start(gpt2, TEXTS[3], **GREEDY)) == expected


def test_a_prompt_wider_than_the_token_budget_is_prefilled_in_chunks_to_the_same_answer(
    folders: dict[str, str], gpt2: hg.HuggingFaceGenerator
) -> None:
    prompt = " ".join(TEXTS)  # far more than 8 tokens
    for small in loaded(folders["gpt2_budget_8"]):
        assert small.scheduler.max_batched_tokens == 8
        running = start(small, TEXTS[0], stream=True, temperature=0, max_tokens=100)
        next(running)
        assert text(start(small, prompt, **GREEDY)) == text(start(gpt2, prompt, **GREEDY))
        running.close()  # type: ignore[attr-defined]


def test_the_token_budget_is_the_flags_else_the_devices_default(
    folders: dict[str, str], gpt2: hg.HuggingFaceGenerator
) -> None:
    # A CPU's passes cost what their tokens cost: a smaller budget than a GPU's, where wide passes are nearly free.
    assert gpt2.scheduler.max_batched_tokens == hg.CPU_MAX_BATCHED_TOKENS == 160
    assert hg.default_max_batched_tokens(torch.device("cuda")) == 512
    for flagged in loaded(folders["gpt2"], policy=LoadPolicy(pytorch_device="cpu", max_batched_tokens=96)):
        assert flagged.scheduler.max_batched_tokens == 96
        assert text(start(flagged, TEXTS[1], **GREEDY)) == text(start(gpt2, TEXTS[1], **GREEDY))


def test_max_tokens_and_finish_reasons_length_and_stop(gpt2: hg.HuggingFaceGenerator) -> None:
    flags = (tg.RETURN_FINISH_REASON, tg.RETURN_NUM_OUTPUT_TOKENS, tg.RETURN_NUM_INPUT_TOKENS)
    (whole,) = list(start(gpt2, TEXTS[0], flags=flags, temperature=0, max_tokens=7))
    assert isinstance(whole, FinalResponse)
    assert whole[tg.FINISH_REASON].tolist() == [b"length"]
    assert whole[tg.NUM_OUTPUT_TOKENS].tolist() == [7]
    assert whole[tg.NUM_INPUT_TOKENS].tolist() == [len(gpt2.tokenizer(TEXTS[0])["input_ids"])]
    full = text([whole])
    stop = next(full[i : i + 2] for i in range(2, len(full) - 2) if full[i : i + 2].isprintable())
    (stopped,) = list(start(gpt2, TEXTS[0], flags=flags, temperature=0, max_tokens=7, stop=[stop, "never"]))
    assert text([stopped]) == full[: full.index(stop)]
    assert stopped[tg.FINISH_REASON].tolist() == [b"stop"]
    assert stopped[tg.NUM_OUTPUT_TOKENS][0] <= 7


def test_streamed_pieces_add_up_to_the_whole_answer_which_leads_with_the_prompt(gpt2: hg.HuggingFaceGenerator) -> None:
    pieces = list(start(gpt2, TEXTS[1], stream=True, flags=(tg.RETURN_NUM_OUTPUT_TOKENS,), **GREEDY))
    assert len(pieces) > 1 and isinstance(pieces[-1], FinalResponse)
    counts = [int(r[tg.NUM_OUTPUT_TOKENS][0]) for r in pieces]
    assert counts == sorted(counts) and counts[-1] == GREEDY["max_tokens"]
    signature = gpt2.signatures["serving_default"]
    inputs = {
        tg.TEXT_INPUT: np.array([TEXTS[1].encode()], dtype=object),
        tg.SAMPLING_PARAMETERS: np.array([json.dumps(GREEDY).encode()], dtype=object),
    }
    (whole,) = list(gpt2.run_decoupled(signature, inputs, [tg.TEXT_OUTPUT]))
    assert whole[tg.TEXT_OUTPUT][0].decode() == TEXTS[1] + text(pieces)


def test_a_seed_gives_the_same_sample_alone_and_batched(gpt2: hg.HuggingFaceGenerator) -> None:
    sampled = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 20}
    alone = text(start(gpt2, TEXTS[0], seed=7, **sampled))
    assert text(start(gpt2, TEXTS[0], seed=7, **sampled)) == alone
    neighbours = [start(gpt2, p, stream=True, **sampled) for p in TEXTS[1:]]
    for stream in neighbours:
        next(stream)
    assert text(start(gpt2, TEXTS[0], seed=7, **sampled)) == alone
    assert text(start(gpt2, TEXTS[0], seed=8, **sampled)) != alone
    for stream in neighbours:
        list(stream)


def test_a_client_that_leaves_frees_its_sequence_at_the_next_step(gpt2: hg.HuggingFaceGenerator) -> None:
    closed = start(gpt2, TEXTS[0], stream=True, temperature=0, max_tokens=120)
    next(closed)
    cancelled = start(gpt2, TEXTS[1], stream=True, temperature=0, max_tokens=120)
    next(cancelled)
    assert gpt2.scheduler.active == 2
    closed.close()  # type: ignore[attr-defined]
    waiting: list[Any] = []
    reader = threading.Thread(target=lambda: waiting.extend(cancelled))  # a next() still waiting when cancelled
    reader.start()
    cancelled.cancel()  # type: ignore[attr-defined]
    reader.join(30)
    assert not reader.is_alive()
    wait_until(lambda: gpt2.scheduler.active == 0, what="both sequences to leave the batch")
    assert text(start(gpt2, TEXTS[2], **GREEDY))  # and the model goes on


def test_a_full_queue_refuses_with_resource_exhausted(folders: dict[str, str]) -> None:
    for servable in loaded(folders["gpt2_one_seat"]):
        running = start(servable, TEXTS[0], stream=True, temperature=0, max_tokens=120)
        next(running)
        queued = start(servable, TEXTS[1], **GREEDY)
        assert servable.scheduler.waiting == 1
        with pytest.raises(ServingError) as refused:
            start(servable, TEXTS[2], **GREEDY)
        assert refused.value.code == Code.RESOURCE_EXHAUSTED
        running.close()  # type: ignore[attr-defined]
        assert text(queued)  # the queued one runs once the seat is free


def test_logprobs_of_each_token_with_the_top_alternatives(gpt2: hg.HuggingFaceGenerator) -> None:
    (whole,) = list(start(gpt2, TEXTS[0], flags=(tg.RETURN_LOGPROBS,), temperature=0, max_tokens=5, logprobs=3))
    entries = orjson.loads(whole[tg.LOGPROBS][0])
    assert len(entries) == 5
    for entry in entries:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        best = entry["top_logprobs"][0]
        assert best["token"] == entry["token"] and best["logprob"] == pytest.approx(entry["logprob"])
        values = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True)
    assert "".join(e["token"] for e in entries) == text([whole])
    (plain,) = list(start(gpt2, TEXTS[0], flags=(tg.RETURN_LOGPROBS,), temperature=0, max_tokens=2))
    assert [e["top_logprobs"] for e in orjson.loads(plain[tg.LOGPROBS][0])] == [[], []]


def test_chat_prompts_from_the_tokenizers_template_else_plain_lines(
    gpt2: hg.HuggingFaceGenerator, llama: hg.HuggingFaceGenerator
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
    ]
    assert isinstance(llama, tg.ChatTemplating) and isinstance(gpt2, tg.ChatTemplating)
    assert llama.chat_prompt(messages) == "<|system|>be brief\n<|user|>hello world\n<|assistant|>"
    assert gpt2.chat_prompt(messages) == tg.plain_chat_prompt(messages)
    assert llama.count_tokens("hello world") == len(llama.encode("hello world")) > 1
    # the Llama tokenizer has a start token: counted once, whether the text already starts with it or not
    assert llama.encode("<s>hello")[0] == llama.tokenizer.bos_token_id
    assert text(start(llama, llama.chat_prompt(messages), **GREEDY))


def test_text2text_generation_batched_is_what_model_generate_gives(t5: hg.HuggingFaceGenerator) -> None:
    expected = []
    for prompt in TEXTS[:3]:
        ids = t5.encode(prompt)
        with torch.inference_mode():
            generated = t5.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)
        expected.append(t5.tokenizer.decode(generated[0, 1:].tolist(), skip_special_tokens=True))
    greedy = {"temperature": 0, "max_tokens": 12}
    first = start(t5, TEXTS[0], stream=True, **greedy)
    got = [[next(first), next(first)]]
    others = [start(t5, p, stream=True, **greedy) for p in TEXTS[1:3]]
    got[0].extend(first)
    got += [list(stream) for stream in others]
    assert [text(responses) for responses in got] == expected
    (whole,) = list(start(t5, TEXTS[0], flags=(tg.RETURN_NUM_OUTPUT_TOKENS,), **greedy))
    assert whole[tg.NUM_OUTPUT_TOKENS].tolist() == [12]


def test_bad_requests_are_invalid_argument(gpt2: hg.HuggingFaceGenerator) -> None:
    for params in ({"temperature": 3}, {"max_tokens": 0}, {"colour": "red"}):
        with pytest.raises(ServingError) as bad:
            start(gpt2, "hello", **params)
        assert bad.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(ServingError) as too_long:
        start(gpt2, " ".join(TEXTS * 20), **GREEDY)
    assert too_long.value.code == Code.INVALID_ARGUMENT and "context is 128" in too_long.value.message
    with pytest.raises(ServingError) as refused:
        next(gpt2.run(gpt2.signatures["serving_default"], {}, []))  # type: ignore[call-overload]
    assert refused.value.code == Code.UNIMPLEMENTED


def test_pickled_weights_load_only_when_allowed(folders: dict[str, str], tmp_path: Path) -> None:
    source = Path(folders["gpt2"])
    folder = tmp_path / "pickled" / "1"
    folder.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "model.safetensors":
            (folder / item.name).write_bytes(item.read_bytes())
    from safetensors.torch import load_file

    torch.save(load_file(source / "model.safetensors"), folder / "pytorch_model.bin")
    with pytest.raises(ServingError) as refused:
        hg.load("pickled", 1, str(folder), CPU, hg.TEXT_GENERATION)
    assert refused.value.code == Code.FAILED_PRECONDITION and "--allow_pickle" in refused.value.message
    for servable in loaded(str(folder), policy=LoadPolicy(allow_pickle=True, pytorch_device="cpu")):
        assert text(start(servable, TEXTS[0], **GREEDY))


def test_a_versions_hold_settings_reach_its_scheduler_and_arrivals_held_answer_as_alone(
    folders: dict[str, str], gpt2: hg.HuggingFaceGenerator, tmp_path: Path
) -> None:
    source = Path(folders["gpt2"])
    folder = tmp_path / "held" / "1"
    folder.mkdir(parents=True)
    for item in source.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    settings = {"platform": "huggingface", "task": hg.TEXT_GENERATION}
    (folder / "workbench.json").write_text(json.dumps({**settings, "hold_steps": 3, "admit_together": 2}))
    for servable in loaded(str(folder)):
        assert (servable.scheduler.hold_steps, servable.scheduler.admit_together) == (3, 2)
        running = start(servable, TEXTS[0], stream=True, temperature=0, max_tokens=40)
        next(running)
        # arrivals while a sequence decodes: held (prefilled together when they come within the hold), each answer
        # still what it is alone
        arrivals = [start(servable, p, **GREEDY) for p in TEXTS[1:3]]
        assert [text(responses) for responses in arrivals] == [text(start(gpt2, p, **GREEDY)) for p in TEXTS[1:3]]
        running.close()  # type: ignore[attr-defined]
    for bad in ({"hold_steps": -1}, {"admit_together": 0}, {"hold_steps": True}):
        (folder / "workbench.json").write_text(json.dumps({**settings, **bad}))
        with pytest.raises(ServingError) as refused:
            hg.load("held", 1, str(folder), CPU, hg.TEXT_GENERATION)
        assert refused.value.code == Code.INVALID_ARGUMENT and next(iter(bad)) in refused.value.message
