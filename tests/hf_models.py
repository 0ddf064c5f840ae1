"""Tiny Hugging Face models built in the tests, nothing downloaded: a WordPiece tokenizer trained here on a few
sentences (wrapped as transformers' fast tokenizer, BERT's special tokens and template), and BERT-like encoders with
random weights from a small config, one per task. Seeded, so every build answers the same."""

from __future__ import annotations

from typing import Any

SENTENCES = (
    "Ada Lovelace wrote the first program in London.",
    "The weather in Paris is lovely today.",
    "I really hate waiting for the train.",
    "Alan Turing worked at Bletchley Park near Milton Keynes.",
    "This movie was wonderful and the actors were great.",
    "The capital of France is Paris.",
    "Grace Hopper built compilers for the Navy.",
    "What a terrible, boring afternoon it was!",
    "Models answer questions about the context they are given.",
    "Serving transformers from a notebook should be easy.",
)
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_LENGTH = 64

SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
ENTITIES = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
NLI = {0: "contradiction", 1: "neutral", 2: "entailment"}


def tokenizer() -> Any:
    """A lower-casing WordPiece tokenizer trained on :data:`SENTENCES`, as BERT's fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    raw.normalizer = normalizers.BertNormalizer(lowercase=True)
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=list(SPECIAL), min_frequency=1)
    raw.train_from_iterator(SENTENCES, trainer)
    cls, sep = raw.token_to_id("[CLS]"), raw.token_to_id("[SEP]")
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    raw.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_LENGTH,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def config(vocab_size: int, labels: dict[int, str] | None = None, seed_offset: int = 0) -> Any:
    from transformers import BertConfig

    extra: dict[str, Any] = {}
    if labels is not None:
        extra = {"id2label": labels, "label2id": {v: k for k, v in labels.items()}}
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=MAX_LENGTH,
        initializer_range=0.5,  # random weights far apart: scores whose ranks a padded batch cannot swap
        **extra,
    )


def model(task: str, vocab_size: int, seed: int = 0) -> Any:
    """A random-weight BERT for ``task`` (seeded), in eval mode."""
    import torch
    import transformers

    classes = {
        "text-classification": ("BertForSequenceClassification", SENTIMENT),
        "zero-shot-classification": ("BertForSequenceClassification", NLI),
        "token-classification": ("BertForTokenClassification", ENTITIES),
        "fill-mask": ("BertForMaskedLM", None),
        "question-answering": ("BertForQuestionAnswering", None),
        "feature-extraction": ("BertModel", None),
    }
    name, labels = classes[task]
    torch.manual_seed(seed)
    built = getattr(transformers, name)(config(vocab_size, labels))
    return built.eval()


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on :data:`SENTENCES`, with a chat template (no end token: random weights
    would end generations at random)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(SENTENCES * 5, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"]))
    made = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>")
    made.chat_template = CHAT_TEMPLATE
    return made


def chat_model(vocab_size: int, seed: int = 0) -> Any:
    """A random-weight Llama-like causal language model (seeded, 2 layers), in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=vocab_size,
        max_position_embeddings=256,
        initializer_range=0.3,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()
