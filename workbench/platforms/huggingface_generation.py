"""Hugging Face text generation (``text-generation``, ``text2text-generation``) as a decoupled servable.

A version folder written by ``save_pretrained`` (a causal LM or a sequence-to-sequence model with its tokenizer)
serves as a text generator in the generator convention of ``core/text_generation.py``: ``text_input`` in, responses
with ``text_output`` out, streamed a step at a time or whole, with the optional ``sampling_parameters`` and
``return_*`` outputs. Generations share the model's forward passes: the platform's Hugging Face loader
(``huggingface.py``) hands these tasks to :func:`load`, which starts one scheduler thread per version
(``generation_scheduler.py``) batching them per iteration over the model's KV caches (``huggingface_decoding.py``).

Weights are read from safetensors only, unless ``--allow_pickle`` allows a ``pytorch_model.bin`` (a pickle, which
runs code when loaded). The model goes to ``--pytorch_device``. ``--max_batched_tokens`` bounds the tokens one
iteration runs (decode steps and a chunk of prompts; by default 160 on a CPU, 512 on a GPU); a version's
``workbench.json`` may set its own ``max_batched_tokens``, ``max_sequences`` (sequences in the batch at once),
``max_queued`` (waiting beyond them before requests are refused with RESOURCE_EXHAUSTED), and ``hold_steps`` /
``admit_together`` (how long arrivals wait for others to share their prefill pass: off by default, see
``generation_scheduler.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core import text_generation as tg
from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.footprint import Footprint
from workbench.core.servable import Servable, streams_only
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.platforms import huggingface_folders as folders
from workbench.platforms.base import LoadPolicy
from workbench.platforms.generation_requests import GenerationRequest, GenerationResponses, RequestOptions
from workbench.platforms.generation_scheduler import (
    DEFAULT_ADMIT_TOGETHER,
    DEFAULT_HOLD_STEPS,
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MAX_SEQUENCES,
    GenerationScheduler,
)
from workbench.platforms.huggingface_decoding import BatchedDecoder, ModelCalls
from workbench.platforms.huggingface_loading import load_lock, quiet_transformers
from workbench.platforms.pytorch import configure_threads, module_held, resolve_device
from workbench.platforms.tabular import version_config

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

TEXT_GENERATION = folders.TEXT_GENERATION
TEXT2TEXT_GENERATION = folders.TEXT2TEXT_GENERATION
TASKS = folders.GENERATIVE_TASKS
# Where a model names no limit of its own (an encoder-decoder with relative positions and no max_length set).
FALLBACK_MAX_NEW_TOKENS = 256
CPU_MAX_BATCHED_TOKENS = 160  # an iteration's token budget on a CPU (see default_max_batched_tokens)

_FLAGS = (
    tg.STREAM,
    tg.EXCLUDE_INPUT_IN_OUTPUT,
    tg.RETURN_FINISH_REASON,
    tg.RETURN_NUM_INPUT_TOKENS,
    tg.RETURN_NUM_OUTPUT_TOKENS,
    tg.RETURN_LOGPROBS,
)


def generator_signature() -> Signature:
    """The generator convention's ``serving_default``: Triton's vLLM backend's tensors, every input but the prompt
    optional."""
    one = (1,)
    inputs = {tg.TEXT_INPUT: TensorSpec(tg.TEXT_INPUT, tg.TEXT_INPUT, np.dtype(object), one)}
    inputs[tg.SAMPLING_PARAMETERS] = TensorSpec(tg.SAMPLING_PARAMETERS, tg.SAMPLING_PARAMETERS, np.dtype(object), one)
    defaults: dict[str, np.ndarray] = {tg.SAMPLING_PARAMETERS: np.array([b""], dtype=object)}
    for flag in _FLAGS:
        inputs[flag] = TensorSpec(flag, flag, np.dtype(bool), one)
        defaults[flag] = np.array([False])
    outputs = {
        tg.TEXT_OUTPUT: TensorSpec(tg.TEXT_OUTPUT, tg.TEXT_OUTPUT, np.dtype(object), (-1,)),
        tg.FINISH_REASON: TensorSpec(tg.FINISH_REASON, tg.FINISH_REASON, np.dtype(object), (-1,)),
        tg.NUM_INPUT_TOKENS: TensorSpec(tg.NUM_INPUT_TOKENS, tg.NUM_INPUT_TOKENS, np.dtype(np.uint32), one),
        tg.NUM_OUTPUT_TOKENS: TensorSpec(tg.NUM_OUTPUT_TOKENS, tg.NUM_OUTPUT_TOKENS, np.dtype(np.uint32), one),
        tg.LOGPROBS: TensorSpec(tg.LOGPROBS, tg.LOGPROBS, np.dtype(object), (-1,)),
    }
    return Signature(DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs, defaults=defaults, batchable=False)


def load(name: str, version: int, path: str, policy: LoadPolicy, task: str) -> Servable:
    """The ``save_pretrained`` folder ``path`` as a decoupled text generator for ``task``."""
    if task not in TASKS:
        raise ServingError(Code.INVALID_ARGUMENT, f"{path}: task {task!r} is not a generation task ({TASKS})")
    return HuggingFaceGenerator(name, version, path, policy, task)


class HuggingFaceGenerator(Servable):
    """A text generator whose concurrent requests share each forward pass (and :class:`tg.ChatTemplating`)."""

    decoupled = True

    def __init__(self, name: str, version: int, path: str, policy: LoadPolicy, task: str) -> None:
        self.name, self.version, self.path, self.task = name, version, path, task
        self.label = f"Model {name} version {version}"
        configure_threads(policy.pytorch_threads)
        self.device = resolve_device(policy.pytorch_device)
        settings = _batching_settings(Path(path), policy, self.device)
        self.tokenizer = _tokenizer(path)
        self.model = _model(path, task, policy, self.device)
        self.signatures = MappingProxyType({DEFAULT_SIGNATURE: generator_signature()})
        self.labels = MappingProxyType({})
        self._context = _context_length(self.model)
        self._end_tokens = _end_tokens(self.model, self.tokenizer)
        calls = ModelCalls.of(self.model, seq2seq=task == TEXT2TEXT_GENERATION)
        if not calls.seq2seq and not calls.rows_pad_freely:
            raise ServingError(
                Code.UNIMPLEMENTED,
                f"{self.label}: {type(self.model).__name__}.forward takes no position_ids, which batching "
                "sequences of different lengths needs",
            )
        self.engine = BatchedDecoder(self.model, calls, self.device)
        self.scheduler: GenerationScheduler[GenerationRequest] = GenerationScheduler(
            self.engine,
            self.label,
            max_batched_tokens=settings["max_batched_tokens"],
            max_sequences=settings["max_sequences"],
            max_queued=settings.get("max_queued"),
            hold_steps=settings.get("hold_steps", DEFAULT_HOLD_STEPS),
            admit_together=settings.get("admit_together", DEFAULT_ADMIT_TOGETHER),
        )

    # ------------------------------------------------------------------------------------------------ serving
    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        raise streams_only(self.label)

    def run_decoupled(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        prompt = _text(inputs, tg.TEXT_INPUT)
        raw = inputs.get(tg.SAMPLING_PARAMETERS)
        params = tg.SamplingParameters.from_json(_text(inputs, tg.SAMPLING_PARAMETERS) if raw is not None else b"")
        options = RequestOptions(
            stream=_flag(inputs, tg.STREAM),
            exclude_input=_flag(inputs, tg.EXCLUDE_INPUT_IN_OUTPUT),
            finish_reason=_flag(inputs, tg.RETURN_FINISH_REASON),
            input_tokens=_flag(inputs, tg.RETURN_NUM_INPUT_TOKENS),
            output_tokens=_flag(inputs, tg.RETURN_NUM_OUTPUT_TOKENS),
            logprobs=_flag(inputs, tg.RETURN_LOGPROBS),
        )
        request = self._request(prompt, params, options.logprobs)
        self.scheduler.submit(request)
        return GenerationResponses(request, options, outputs, self.scheduler.cancel)

    def _request(self, prompt: str, params: tg.SamplingParameters, logprobs: bool) -> GenerationRequest:
        ids = self.encode(prompt)
        if not ids:
            raise invalid_argument(f"{self.label}: the prompt is empty (and the tokenizer adds no start token)")
        limit = self._max_new_tokens(len(ids))
        if limit < 1:
            raise invalid_argument(
                f"{self.label}: the prompt is {len(ids)} tokens, and the model's context is {self._context}"
            )
        seq2seq = self.task == TEXT2TEXT_GENERATION
        return GenerationRequest(
            prompt,
            ids,
            params,
            min(limit, params.max_tokens) if params.max_tokens is not None else limit,
            self._end_tokens,
            self._decode,
            self._token_text,
            context=() if seq2seq else ids,
            logprobs=logprobs,
        )

    def _max_new_tokens(self, prompt_tokens: int) -> int:
        """The model's own limit on new tokens for a prompt: its context less the prompt (a causal model), else
        its generation config's."""
        config = self.model.generation_config
        configured = getattr(config, "max_new_tokens", None)
        if self._context is not None:
            room = self._context - prompt_tokens
            return room if configured is None else min(room, configured)
        if configured is not None:
            return int(configured)
        return int(getattr(config, "max_length", None) or FALLBACK_MAX_NEW_TOKENS)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    # ------------------------------------------------------------------------------------------- chat templating
    def chat_prompt(self, messages: Sequence[Mapping[str, Any]]) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            return tg.plain_chat_prompt(messages)
        from jinja2 import TemplateError

        plain = [{**m, "content": tg.message_text(m)} for m in messages]
        try:
            prompt = self.tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
        except (TemplateError, ValueError, TypeError) as exc:  # the template's own checks (roles must alternate...)
            raise invalid_argument(f"{self.label}: its chat template refused the messages: {exc}") from None
        return str(prompt)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, with the tokenizer's special tokens unless the text already starts with its
        start token (a chat template writes it)."""
        bos = getattr(self.tokenizer, "bos_token", None)
        special = not (bos and text.startswith(bos))
        ids: list[int] = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        return ids

    def memory_held(self) -> Footprint | None:
        """The model's parameters and buffers on its device. Not its KV caches: nothing is reserved for them at load
        (each batch's cache grows a column a step and shrinks as sequences leave), so a memory budget charges the
        weights, and the caches of the generations running take room beside them (see docs/memory-budget.md)."""
        model = getattr(self, "model", None)
        return module_held(model) if model is not None else None

    def close(self) -> None:
        self.scheduler.close()
        if self.device.type == "cuda":
            import torch

            del self.model, self.engine
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- the folder
def default_max_batched_tokens(device: torch.device) -> int:
    """The token budget of an iteration where neither ``--max_batched_tokens`` nor the version sets one.

    On a GPU a pass costs mostly its fixed overhead, so wide passes are nearly free: 512. On a CPU a pass's cost
    grows with its tokens from a few rows on (the benchmarks' GPT-2 of 4 layers, one thread, prompts of 40 tokens:
    5.8 ms for one, 14.8 for 4, 54.6 for 16 in one pass, so 3.7 ms a prompt at 4 against 3.4 at 16), and every
    prompt in a pass waits for the whole pass for its first token. 160 tokens (4 such prompts) costs at most a tenth
    more a prompt and lets a burst's first prompts answer while the rest are prefilled: 16 streams arriving together
    got their median first token 0.79-0.82x as late as with 512, at the same tokens/s
    (``benchmarks/llm_serving.py --generation_server_flags``, docs/openai.md)."""
    return DEFAULT_MAX_BATCHED_TOKENS if device.type != "cpu" else CPU_MAX_BATCHED_TOKENS


def _batching_settings(folder: Path, policy: LoadPolicy, device: torch.device) -> dict[str, int]:
    settings = {
        "max_batched_tokens": policy.max_batched_tokens or default_max_batched_tokens(device),
        "max_sequences": DEFAULT_MAX_SEQUENCES,
    }
    document = version_config(folder)
    for key in ("max_batched_tokens", "max_sequences", "max_queued", "admit_together", "hold_steps"):
        value = document.get(key)
        if value is None:
            continue
        least = 0 if key == "hold_steps" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "a positive integer" if least else "an integer of at least 0"
            raise ServingError(Code.INVALID_ARGUMENT, f"{folder}/workbench.json: {key} must be {kind}")
        settings[key] = value
    return settings


def _model(path: str, task: str, policy: LoadPolicy, device: torch.device) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    safetensors = folders.weights_are_safetensors(Path(path), policy.allow_pickle)
    auto = AutoModelForSeq2SeqLM if task == TEXT2TEXT_GENERATION else AutoModelForCausalLM
    try:
        with load_lock, quiet_transformers():
            model = auto.from_pretrained(
                path, local_files_only=True, use_safetensors=safetensors, trust_remote_code=False, dtype="auto"
            )
    except (OSError, ValueError, KeyError) as exc:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{path} is not a {task} model transformers can load: {exc}"
        ) from None
    placed: PreTrainedModel = model.to(device)  # type: ignore[arg-type]
    return placed.eval()


def _tokenizer(path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        with load_lock, quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{path} has no tokenizer transformers can load: {exc}") from None
    return tokenizer  # type: ignore[no-any-return]


def _context_length(model: PreTrainedModel) -> int | None:
    """The most positions a causal model takes (None: an encoder-decoder, or a model that names none)."""
    if model.config.is_encoder_decoder:
        return None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model.config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _end_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The tokens that end a generation: the generation config's end-of-sequence ids, and the tokenizer's."""
    found: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            found.update(v for v in value if isinstance(v, int))
    return found


# ------------------------------------------------------------------------------------------------- the request
def _text(inputs: Mapping[str, np.ndarray], alias: str) -> str:
    value = inputs[alias]
    if value.size != 1:
        raise invalid_argument(f'Input "{alias}" takes one string per request; got {value.size}')
    item = value.reshape(-1)[0]
    if isinstance(item, bytes):
        try:
            return item.decode()
        except UnicodeDecodeError:
            raise invalid_argument(f'Input "{alias}" is not UTF-8 text') from None
    return str(item)


def _flag(inputs: Mapping[str, np.ndarray], alias: str) -> bool:
    value = inputs.get(alias)
    if value is None or value.size == 0:
        return False
    if value.size != 1:
        raise invalid_argument(f'Input "{alias}" takes one boolean per request; got {value.size}')
    return bool(value.reshape(-1)[0])
