"""The non-generative tasks of Hugging Face models: each task's signature, how a request's tensors become rows, how
the rows of every request of a batch run as one padded model call, and how a request's rows become its answer.

Every task answers as the ``transformers.pipeline`` of the same model and task answers one text (its defaults: the
best label, "simple" entity aggregation, the 5 best tokens, the best answer span), computed on the whole batch at once:
the texts of every request in it are tokenized together, padded to the batch's longest (not to the model's maximum)
and truncated to the model's maximum length, and run in one forward pass. Per task, ``serving_default`` is:

- text-classification: ``text`` BYTES [-1] → ``label`` BYTES [-1], ``score`` FP32 [-1] and ``scores`` FP32
  [-1, labels] (every label's score, in the config's id order: Triton's classification extension reads it);
- token-classification: ``text`` → the entities of each text, padded to the request's longest row:
  ``entity_group`` and ``word`` BYTES [-1, -1], ``score`` FP32 [-1, -1], ``start`` and ``end`` INT64 [-1, -1] (a
  text's characters; -1 past its entities), ``num_entities`` INT32 [-1];
- fill-mask: ``text`` (one mask token each) → the best ``top_k`` fillers: ``token_str`` and ``sequence`` BYTES
  [-1, k], ``token`` INT64 [-1, k], ``score`` FP32 [-1, k];
- question-answering: ``question`` and ``context`` BYTES [-1] → ``answer`` BYTES [-1], ``score`` FP32 [-1], ``start``
  and ``end`` INT64 [-1] (the answer's characters in the context);
- zero-shot-classification: ``text`` BYTES [-1] and ``candidate_labels`` BYTES [-1, -1] (empty strings are padding)
  → ``labels`` BYTES [-1, -1] (best first, padded with empty strings) and ``scores`` FP32 [-1, -1] (0 there);
- feature-extraction: the embedder convention of :mod:`workbench.core.text_generation`: ``text`` → ``embedding``
  FP32 [-1, hidden] (mean pooled over the attention mask and L2-normalised, as sentence-transformers does) and
  ``num_tokens`` INT32 [-1].

A request whose rows are wrong (a fill-mask text without its mask, an empty list of labels) fails alone; the other
requests of its batch are answered. The tokenizer (a Rust object whose padding settings change per call) is used by
one thread at a time; the forward passes run side by side under ``torch.inference_mode()``.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workbench.core.errors import Code, ServingError, from_exception, invalid_argument
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.core.text_generation import EMBED_INPUT, EMBED_TOKENS, EMBEDDING
from workbench.platforms import huggingface_folders as folders
from workbench.platforms import huggingface_tracing as tracing

if TYPE_CHECKING:  # annotations only: torch is imported when a version loads
    import torch

STRING = np.dtype(object)
FLOAT = np.dtype(np.float32)
INT64 = np.dtype(np.int64)
INT32 = np.dtype(np.int32)

TEXT = "text"
FILL_MASK_TOP_K = 5  # the fill-mask pipeline's default
MAX_ANSWER_TOKENS = 15  # the question-answering pipeline's defaults (transformers 4)
QUESTION_ANSWERING_MAX_TOKENS = 384
QUESTION_ANSWERING_STRIDE = 128
DEFAULT_HYPOTHESIS = "This example is {}."
IGNORED_ENTITY = "O"


def spec(alias: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(alias=alias, name=alias, dtype=dtype, shape=shape)


def strings(values: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Python strings (a sequence, nested, or an object array) as a BYTES tensor (numpy objects holding UTF-8 bytes)."""
    flat = np.asarray(values, dtype=object).ravel()
    array = np.empty(len(flat), dtype=object)
    array[:] = [value.encode() for value in flat]
    return array.reshape(shape if shape is not None else np.shape(values))


def decode_rows(feed: Mapping[str, np.ndarray], alias: str, rank: int = 1) -> np.ndarray:
    """A BYTES input as an object array of Python strings; INVALID_ARGUMENT for another type, rank or encoding."""
    value = feed[alias]
    if value.dtype.kind not in "OSU":
        raise invalid_argument(f'Input "{alias}" expects strings (BYTES) but received {value.dtype.name} values')
    if value.ndim != rank:
        wanted = "[-1]" if rank == 1 else "[-1,-1]"
        raise invalid_argument(f'Input "{alias}" expects shape {wanted} but received {list(value.shape)}')
    decoded = np.empty(value.shape, dtype=object)
    for index, item in np.ndenumerate(value):
        if isinstance(item, (bytes, bytearray, memoryview)):
            try:
                decoded[index] = bytes(item).decode()
            except UnicodeDecodeError:
                raise invalid_argument(f'Input "{alias}" holds bytes that are not UTF-8 text') from None
        else:
            decoded[index] = str(item)
    return decoded


def model_max_length(tokenizer: Any, config: Any) -> int:
    """How many tokens a text is truncated to: the tokenizer's maximum, bounded by the model's positions."""
    limits = [
        n
        for n in (getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None))
        if isinstance(n, int) and 0 < n < 1_000_000
    ]
    return min(limits) if limits else 512


@dataclasses.dataclass
class Model:
    """A loaded model and its tokenizer, with what every task needs: a batched, truncated tokenization (one thread
    at a time) and a forward pass on the model's device."""

    model: Any
    tokenizer: Any
    device: torch.device
    max_length: int
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    traced: tracing.TracedForward | None = None  # the forward's TorchScript trace, where it answers as the model

    @property
    def config(self) -> Any:
        return self.model.config

    def tokenize(self, *texts: Sequence[str], **options: Any) -> Any:
        """The texts (or text pairs) as one padded batch of PyTorch tensors; the tokenizer's lock must be held."""
        options.setdefault("truncation", True)
        return self.tokenizer(
            *(list(t) for t in texts), padding=True, max_length=self.max_length, return_tensors="pt", **options
        )

    def inputs(self, encoded: Mapping[str, Any]) -> dict[str, Any]:
        """The tensors of ``encoded`` that the model takes, moved to its device."""
        import torch

        names = set(self.tokenizer.model_input_names) | {"input_ids", "attention_mask"}
        return {k: v.to(self.device) for k, v in encoded.items() if k in names and isinstance(v, torch.Tensor)}

    def forward(self, encoded: Mapping[str, Any]) -> Any:
        """The model's outputs on ``encoded``: by its TorchScript trace where it has one that takes these tensors."""
        import torch

        inputs, traced = self.inputs(encoded), self.traced
        try:
            with torch.inference_mode():
                return traced(inputs) if traced is not None and traced.takes(inputs) else self.model(**inputs)
        except torch.cuda.OutOfMemoryError as exc:
            raise ServingError(Code.RESOURCE_EXHAUSTED, f"PyTorch: {str(exc).splitlines()[0]}") from None
        except Exception as exc:  # noqa: BLE001 - the model's own failure on text it was given
            raise from_exception(exc) from None

    def trace(self) -> str:
        """Trace the forward pass (:mod:`workbench.platforms.huggingface_tracing`); what became of it, in words."""
        with self.lock:
            self.traced, outcome = tracing.trace(self.model, self.tokenize, self.inputs)
        return outcome


def float_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A model output as float32 numpy on the CPU (bfloat16 and float16 widened, as the pipelines do)."""
    import torch

    return tensor.detach().to(torch.float32).cpu().numpy()


def softmax(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The pipelines' numpy softmax (shifted by the maximum)."""
    shifted = np.exp(values - values.max(axis=axis, keepdims=True))
    result: np.ndarray = shifted / shifted.sum(axis=axis, keepdims=True)
    return result


class Task(abc.ABC):
    """One task's signature and its three steps: a request's rows (:meth:`parse`), every request's rows as one model
    call (:meth:`compute`, a result or a ServingError per row), and one request's answer (:meth:`assemble`)."""

    name: ClassVar[str]
    model_class: ClassVar[str]  # transformers' Auto class that loads the model for the task

    def __init__(self, model: Model, settings: Mapping[str, Any]) -> None:
        self.model = model
        self.settings = settings
        self.signature = Signature(
            DEFAULT_SIGNATURE,
            PREDICT_METHOD,
            {s.alias: s for s in self.inputs()},
            {s.alias: s for s in self.outputs()},
            batchable=True,
        )

    @abc.abstractmethod
    def inputs(self) -> Sequence[TensorSpec]: ...

    @abc.abstractmethod
    def outputs(self) -> Sequence[TensorSpec]: ...

    def labels(self) -> Mapping[str, Sequence[str]]:
        """Class labels of outputs, for Triton's classification extension."""
        return {}

    def parse(self, feed: Mapping[str, np.ndarray]) -> list[Any]:
        """A request's rows (one text each, by default); INVALID_ARGUMENT for that request alone."""
        return list(decode_rows(feed, TEXT))

    @abc.abstractmethod
    def compute(self, rows: Sequence[Any]) -> list[Any]:
        """Every request's rows in one model call: one result (or a ServingError) per row."""

    @abc.abstractmethod
    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        """One request's results as its output tensors (every output of the signature)."""


class TextClassification(Task):
    name = folders.TEXT_CLASSIFICATION
    model_class = "AutoModelForSequenceClassification"

    def __init__(self, model: Model, settings: Mapping[str, Any]) -> None:
        config = model.config
        self.names = [str(config.id2label.get(i, f"LABEL_{i}")) for i in range(config.num_labels)]
        # The pipeline's choice: none for a regression, a sigmoid for one label or several at once, else a softmax.
        if config.problem_type == "regression":
            self.function = "none"
        elif config.problem_type == "multi_label_classification" or config.num_labels == 1:
            self.function = "sigmoid"
        else:
            self.function = "softmax"
        super().__init__(model, settings)

    def inputs(self) -> Sequence[TensorSpec]:
        return [spec(TEXT, STRING, (-1,))]

    def outputs(self) -> Sequence[TensorSpec]:
        return [spec("label", STRING, (-1,)), spec("score", FLOAT, (-1,)), spec("scores", FLOAT, (-1, len(self.names)))]

    def labels(self) -> Mapping[str, Sequence[str]]:
        return {"scores": self.names}

    def compute(self, rows: Sequence[Any]) -> list[Any]:
        with self.model.lock:
            encoded = self.model.tokenize(rows)
        logits = float_numpy(self.model.forward(encoded).logits)
        if self.function == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
        elif self.function == "softmax":
            scores = softmax(logits)
        else:
            scores = logits
        return list(scores.astype(np.float32))

    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        scores = np.stack(results) if results else np.zeros((0, len(self.names)), np.float32)
        best = scores.argmax(axis=-1) if len(results) else np.zeros(0, np.int64)
        return {
            "label": strings([self.names[i] for i in best], (len(results),)),
            "score": scores.max(axis=-1) if len(results) else np.zeros(0, np.float32),
            "scores": scores,
        }


class TokenClassification(Task):
    """Entities with the pipeline's "simple" aggregation: each token's best label, adjacent tokens of the same
    entity (``B-``/``I-`` prefixes) grouped with their mean score, "O" left out."""

    name = folders.TOKEN_CLASSIFICATION
    model_class = "AutoModelForTokenClassification"

    def inputs(self) -> Sequence[TensorSpec]:
        return [spec(TEXT, STRING, (-1,))]

    def outputs(self) -> Sequence[TensorSpec]:
        return [
            spec("entity_group", STRING, (-1, -1)),
            spec("score", FLOAT, (-1, -1)),
            spec("word", STRING, (-1, -1)),
            spec("start", INT64, (-1, -1)),
            spec("end", INT64, (-1, -1)),
            spec("num_entities", INT32, (-1,)),
        ]

    def compute(self, rows: Sequence[Any]) -> list[Any]:
        tokenizer, id2label = self.model.tokenizer, self.model.config.id2label
        with self.model.lock:
            encoded = self.model.tokenize(rows, return_special_tokens_mask=True, return_offsets_mapping=True)
        logits = float_numpy(self.model.forward(encoded).logits)
        ids, masks = encoded["input_ids"].numpy(), encoded["attention_mask"].numpy()
        special, offsets = encoded["special_tokens_mask"].numpy(), encoded["offset_mapping"].numpy()
        results = []
        with self.model.lock:
            for row, text in enumerate(rows):
                positions = np.flatnonzero(masks[row])
                scores = softmax(logits[row][positions])
                tokens = []
                for scored, position in zip(scores, positions, strict=True):
                    if special[row, position]:
                        continue
                    token_id = int(ids[row, position])
                    start, end = (int(n) for n in offsets[row, position])
                    best = int(scored.argmax())
                    word = (
                        text[start:end]
                        if token_id == tokenizer.unk_token_id
                        else tokenizer.convert_ids_to_tokens(token_id)
                    )
                    tokens.append(
                        {"entity": id2label[best], "score": scored[best], "word": word, "start": start, "end": end}
                    )
                results.append([e for e in self._group(tokens) if e["entity_group"] != IGNORED_ENTITY])
        return results

    def _group(self, tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """transformers' ``TokenClassificationPipeline.group_entities``: adjacent tokens of one entity, a ``B-``
        starting a new one."""
        groups: list[dict[str, Any]] = []
        current: list[dict[str, Any]] = []
        for token in tokens:
            if current:
                bi, tag = _tag(token["entity"])
                _, last_tag = _tag(current[-1]["entity"])
                if tag == last_tag and bi != "B":
                    current.append(token)
                    continue
                groups.append(self._entity(current))
            current = [token]
        if current:
            groups.append(self._entity(current))
        return groups

    def _entity(self, tokens: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "entity_group": tokens[0]["entity"].split("-", 1)[-1],
            "score": np.mean(np.nanmean([t["score"] for t in tokens])),
            "word": self.model.tokenizer.convert_tokens_to_string([t["word"] for t in tokens]),
            "start": tokens[0]["start"],
            "end": tokens[-1]["end"],
        }

    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        rows, width = len(results), max((len(r) for r in results), default=0)
        groups = np.full((rows, width), "", dtype=object)
        words = np.full((rows, width), "", dtype=object)
        scores = np.zeros((rows, width), np.float32)
        starts = np.full((rows, width), -1, np.int64)
        ends = np.full((rows, width), -1, np.int64)
        for row, entities in enumerate(results):
            for column, entity in enumerate(entities):
                groups[row, column], words[row, column] = entity["entity_group"], entity["word"]
                scores[row, column] = entity["score"]
                starts[row, column], ends[row, column] = entity["start"], entity["end"]
        return {
            "entity_group": strings(groups),
            "score": scores,
            "word": strings(words),
            "start": starts,
            "end": ends,
            "num_entities": np.array([len(r) for r in results], np.int32),
        }


def _tag(entity: str) -> tuple[str, str]:
    """An entity label's ``B``/``I`` part and its tag (a label without a prefix continues: ``I``)."""
    if entity.startswith(("B-", "I-")):
        return entity[0], entity[2:]
    return "I", entity


class FillMask(Task):
    name = folders.FILL_MASK
    model_class = "AutoModelForMaskedLM"

    def __init__(self, model: Model, settings: Mapping[str, Any]) -> None:
        tokenizer = model.tokenizer
        if tokenizer.mask_token_id is None:
            raise ServingError(Code.FAILED_PRECONDITION, "The tokenizer defines no mask token, which fill-mask needs")
        self.mask = str(tokenizer.mask_token)
        self.top_k = min(FILL_MASK_TOP_K, model.config.vocab_size)
        super().__init__(model, settings)

    def inputs(self) -> Sequence[TensorSpec]:
        return [spec(TEXT, STRING, (-1,))]

    def outputs(self) -> Sequence[TensorSpec]:
        k = self.top_k
        return [
            spec("token_str", STRING, (-1, k)),
            spec("score", FLOAT, (-1, k)),
            spec("token", INT64, (-1, k)),
            spec("sequence", STRING, (-1, k)),
        ]

    def parse(self, feed: Mapping[str, np.ndarray]) -> list[Any]:
        texts = super().parse(feed)
        for row, text in enumerate(texts):
            count = text.count(self.mask)
            if count != 1:
                raise invalid_argument(
                    f'Input "{TEXT}" row {row}: fill-mask fills one {self.mask} token per text; it holds {count}'
                )
        return texts

    def compute(self, rows: Sequence[Any]) -> list[Any]:
        import torch

        tokenizer = self.model.tokenizer
        with self.model.lock:
            encoded = self.model.tokenize(rows)
        logits = self.model.forward(encoded).logits
        ids = encoded["input_ids"]
        # Each text's one mask position (the other rows' are errors), gathered where the logits are: only those rows
        # of the vocabulary's logits come back to the CPU, never the whole [texts, tokens, vocabulary].
        found = [torch.nonzero(ids[row] == tokenizer.mask_token_id).flatten() for row in range(len(rows))]
        filled_rows = [row for row, positions in enumerate(found) if positions.numel() == 1]
        positions = torch.tensor([int(found[row][0]) for row in filled_rows], dtype=torch.long)
        selected = logits[torch.tensor(filled_rows, dtype=torch.long).to(logits.device), positions.to(logits.device)]
        probabilities = selected.to(torch.float32).softmax(dim=-1).cpu()
        best = dict(zip(filled_rows, zip(*probabilities.topk(self.top_k), strict=True), strict=True))
        results: list[Any] = []
        with self.model.lock:
            for row in range(len(rows)):
                if row not in best:
                    results.append(
                        invalid_argument(
                            f"A text's {self.mask} token lies past the model's {self.model.max_length} tokens"
                        )
                    )
                    continue
                values, predictions = best[row]
                fillers = []
                for value, token in zip(values.tolist(), predictions.tolist(), strict=True):
                    filled = ids[row].numpy().copy()
                    filled[int(found[row][0])] = token
                    filled = filled[np.where(filled != tokenizer.pad_token_id)]
                    fillers.append(
                        (value, token, tokenizer.decode([token]), tokenizer.decode(filled, skip_special_tokens=True))
                    )
                results.append(fillers)
        return results

    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        shape = (len(results), self.top_k)
        return {
            "token_str": strings([[f[2] for f in r] for r in results], shape),
            "score": np.array([[f[0] for f in r] for r in results], np.float32).reshape(shape),
            "token": np.array([[f[1] for f in r] for r in results], np.int64).reshape(shape),
            "sequence": strings([[f[3] for f in r] for r in results], shape),
        }


class QuestionAnswering(Task):
    """Extractive question answering as transformers 4's pipeline answered (transformers 5 removed the pipeline):
    the context in overlapping windows, each token's start and end probabilities over the context's tokens, the best
    span of at most 15 tokens across the windows, widened to whole words."""

    name = folders.QUESTION_ANSWERING
    model_class = "AutoModelForQuestionAnswering"

    def __init__(self, model: Model, settings: Mapping[str, Any]) -> None:
        if not getattr(model.tokenizer, "is_fast", False):
            raise ServingError(
                Code.FAILED_PRECONDITION, "question-answering needs a fast tokenizer (its character offsets)"
            )
        self.max_tokens = min(model.max_length, QUESTION_ANSWERING_MAX_TOKENS)
        self.stride = min(self.max_tokens // 2, QUESTION_ANSWERING_STRIDE)
        super().__init__(model, settings)

    def inputs(self) -> Sequence[TensorSpec]:
        return [spec("question", STRING, (-1,)), spec("context", STRING, (-1,))]

    def outputs(self) -> Sequence[TensorSpec]:
        return [
            spec("answer", STRING, (-1,)),
            spec("score", FLOAT, (-1,)),
            spec("start", INT64, (-1,)),
            spec("end", INT64, (-1,)),
        ]

    def parse(self, feed: Mapping[str, np.ndarray]) -> list[Any]:
        questions, contexts = decode_rows(feed, "question"), decode_rows(feed, "context")
        if len(questions) != len(contexts):
            raise invalid_argument(
                f"question and context must have as many rows; received {len(questions)} and {len(contexts)}"
            )
        return list(zip(questions, contexts, strict=True))

    def compute(self, rows: Sequence[Any]) -> list[Any]:
        tokenizer = self.model.tokenizer
        question_first = tokenizer.padding_side == "right"
        questions, contexts = [q for q, _ in rows], [c for _, c in rows]
        with self.model.lock:
            encoded = tokenizer(
                questions if question_first else contexts,
                contexts if question_first else questions,
                padding=True,
                truncation="only_second" if question_first else "only_first",
                max_length=self.max_tokens,
                stride=self.stride,
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
                return_tensors="pt",
            )
        outputs = self.model.forward(encoded)
        starts, ends = float_numpy(outputs.start_logits), float_numpy(outputs.end_logits)
        windows = encoded["overflow_to_sample_mapping"].numpy()
        masks, ids = encoded["attention_mask"].numpy(), encoded["input_ids"].numpy()
        context_sequence = 1 if question_first else 0
        best: list[tuple[float, int, int]] = [(-1.0, 0, 0)] * len(rows)
        with self.model.lock:
            for window, row in enumerate(windows):
                encoding = encoded.encodings[window]
                # The tokens an answer may hold: the context's, and CLS (some models point there for "no answer").
                allowed = np.array([s == context_sequence for s in encoding.sequence_ids], dtype=np.int64)
                if tokenizer.cls_token_id is not None:
                    allowed[ids[window] == tokenizer.cls_token_id] = 1
                allowed &= masks[window]
                span = _best_span(starts[window], ends[window], allowed)
                if span is None:
                    continue
                score, first, last = span
                if score > best[row][0]:
                    begin, finish = _word_chars(encoding, first, last, context_sequence)
                    best[row] = (score, begin, finish)
        return [(contexts[i][b:f], max(s, 0.0), b, f) for i, (s, b, f) in enumerate(best)]

    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        return {
            "answer": strings([r[0] for r in results], (len(results),)),
            "score": np.array([r[1] for r in results], np.float32),
            "start": np.array([r[2] for r in results], np.int64),
            "end": np.array([r[3] for r in results], np.int64),
        }


def _best_span(start: np.ndarray, end: np.ndarray, allowed: np.ndarray) -> tuple[float, int, int] | None:
    """transformers' ``select_starts_ends`` and ``decode_spans`` for the best span: probabilities over the allowed
    tokens, the first token (CLS) never an answer, spans of at most :data:`MAX_ANSWER_TOKENS` tokens."""
    refused = allowed == 0
    start = np.exp(np.where(refused, -10000.0, start) - np.where(refused, -10000.0, start).max())
    start = start / start.sum()
    end = np.exp(np.where(refused, -10000.0, end) - np.where(refused, -10000.0, end).max())
    end = end / end.sum()
    start[0] = end[0] = 0.0
    candidates = np.tril(np.triu(np.outer(start, end)), MAX_ANSWER_TOKENS - 1)
    first, last = np.unravel_index(int(np.argmax(candidates)), candidates.shape)
    if not (allowed[first] and allowed[last]):
        return None
    return float(candidates[first, last]), int(first), int(last)


def _word_chars(encoding: Any, first: int, last: int, sequence: int) -> tuple[int, int]:
    """A token span's characters, widened to the words holding its tokens (the pipeline's ``align_to_words``)."""
    try:
        begin = encoding.word_to_chars(encoding.token_to_word(first), sequence_index=sequence)[0]
        finish = encoding.word_to_chars(encoding.token_to_word(last), sequence_index=sequence)[1]
    except Exception:  # noqa: BLE001 - a tokenizer without words: the tokens' own offsets, as the pipeline does
        begin, finish = encoding.offsets[first][0], encoding.offsets[last][1]
    return int(begin), int(finish)


class ZeroShotClassification(Task):
    """An NLI model's entailment of "This example is {label}." for each candidate label: softmax over the labels'
    entailment logits, or (``multi_label``, or one label) each label's entailment against its contradiction. The
    template and ``multi_label`` are the model's settings (workbench.json: ``"hypothesis_template"``,
    ``"multi_label"``), as a pipeline's keywords would be: TF Serving's REST decoding asks every input of a request."""

    name = folders.ZERO_SHOT
    model_class = "AutoModelForSequenceClassification"

    def __init__(self, model: Model, settings: Mapping[str, Any]) -> None:
        label2id = model.config.label2id
        self.entailment = next((i for label, i in label2id.items() if label.lower().startswith("entail")), -1)
        self.contradiction = -1 if self.entailment == 0 else 0
        self.template = settings.get("hypothesis_template", DEFAULT_HYPOTHESIS)
        self.multi_label = settings.get("multi_label", False)
        if not isinstance(self.template, str) or self.template.format("label") == self.template:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'workbench.json: "hypothesis_template" must hold {{}} where the label goes (as in '
                f'"{DEFAULT_HYPOTHESIS}"); got {self.template!r}',
            )
        if not isinstance(self.multi_label, bool):
            raise ServingError(Code.INVALID_ARGUMENT, 'workbench.json: "multi_label" must be true or false')
        super().__init__(model, settings)

    def inputs(self) -> Sequence[TensorSpec]:
        return [spec(TEXT, STRING, (-1,)), spec("candidate_labels", STRING, (-1, -1))]

    def outputs(self) -> Sequence[TensorSpec]:
        return [spec("labels", STRING, (-1, -1)), spec("scores", FLOAT, (-1, -1))]

    def parse(self, feed: Mapping[str, np.ndarray]) -> list[Any]:
        texts = decode_rows(feed, TEXT)
        labels = decode_rows(feed, "candidate_labels", rank=2)
        if len(labels) != len(texts):
            raise invalid_argument(
                f"text and candidate_labels must have as many rows; received {len(texts)} and {len(labels)}"
            )
        parsed = []
        for row, text in enumerate(texts):
            names = [str(label) for label in labels[row] if label]
            if not names:
                raise invalid_argument(f'Input "candidate_labels" row {row} names no label')
            parsed.append((text, names))
        return parsed

    def compute(self, rows: Sequence[Any]) -> list[Any]:
        premises = [text for text, names in rows for _ in names]
        hypotheses = [self.template.format(name) for _, names in rows for name in names]
        with self.model.lock:
            try:
                encoded = self.model.tokenize(premises, hypotheses, truncation="only_first")
            except Exception as exc:  # the pipeline's way: a hypothesis longer than the maximum
                if "too short" not in str(exc):
                    raise
                encoded = self.model.tokenize(premises, hypotheses, truncation=False)
        logits = float_numpy(self.model.forward(encoded).logits)
        results, first = [], 0
        for _, names in rows:
            own = logits[first : first + len(names)]
            first += len(names)
            if self.multi_label or len(names) == 1:
                pair = own[:, [self.contradiction, self.entailment]]
                scores = (np.exp(pair) / np.exp(pair).sum(-1, keepdims=True))[:, 1]
            else:
                entailment = own[:, self.entailment]
                scores = np.exp(entailment) / np.exp(entailment).sum(-1, keepdims=True)
            order = list(reversed(scores.argsort()))
            results.append(([names[i] for i in order], scores[order].astype(np.float32)))
        return results

    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        rows, width = len(results), max((len(names) for names, _ in results), default=0)
        labels = np.full((rows, width), "", dtype=object)
        scores = np.zeros((rows, width), np.float32)
        for row, (names, values) in enumerate(results):
            labels[row, : len(names)] = names
            scores[row, : len(names)] = values
        return {"labels": strings(labels), "scores": scores}


class FeatureExtraction(Task):
    """Sentence embeddings: the last hidden states pooled over each text's tokens (mean, as sentence-transformers'
    default; ``"pooling": "cls"`` or ``"max"`` in workbench.json), L2-normalised unless ``"normalize": false``."""

    name = folders.FEATURE_EXTRACTION
    model_class = "AutoModel"
    POOLINGS = ("mean", "cls", "max")

    def __init__(self, model: Model, settings: Mapping[str, Any]) -> None:
        self.pooling = settings.get("pooling", "mean")
        self.normalize = settings.get("normalize", True)
        if self.pooling not in self.POOLINGS or not isinstance(self.normalize, bool):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'workbench.json: "pooling" is one of {", ".join(self.POOLINGS)} and "normalize" true or false; got '
                f"{self.pooling!r} and {self.normalize!r}",
            )
        self.width = int(getattr(model.config, "hidden_size", -1) or -1)
        super().__init__(model, settings)

    def inputs(self) -> Sequence[TensorSpec]:
        return [spec(EMBED_INPUT, STRING, (-1,))]

    def outputs(self) -> Sequence[TensorSpec]:
        return [spec(EMBEDDING, FLOAT, (-1, self.width)), spec(EMBED_TOKENS, INT32, (-1,))]

    def parse(self, feed: Mapping[str, np.ndarray]) -> list[Any]:
        return list(decode_rows(feed, EMBED_INPUT))

    def compute(self, rows: Sequence[Any]) -> list[Any]:
        import torch

        with self.model.lock:
            encoded = self.model.tokenize(rows)
        hidden = self.model.forward(encoded)[0]
        with torch.inference_mode():
            mask = encoded["attention_mask"].to(hidden.device)
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.pooling == "max":
                pooled = hidden.masked_fill(weights == 0, -1e9).max(dim=1).values
            else:
                pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            counts = mask.sum(dim=1)
        embeddings, tokens = float_numpy(pooled), counts.cpu().numpy().astype(np.int32)
        return list(zip(embeddings, tokens, strict=True))

    def assemble(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        width = max(self.width, 0)
        return {
            EMBEDDING: np.stack([r[0] for r in results]) if results else np.zeros((0, width), np.float32),
            EMBED_TOKENS: np.array([r[1] for r in results], np.int32),
        }


TASK_CLASSES: dict[str, type[Task]] = {
    task.name: task
    for task in (
        TextClassification,
        TokenClassification,
        FillMask,
        QuestionAnswering,
        ZeroShotClassification,
        FeatureExtraction,
    )
}
