"""What a Hugging Face ``save_pretrained`` folder holds: which weights (safetensors; pickles only when allowed;
TensorFlow's never), its ``config.json``, and the task it is served for.

A folder's task is its ``workbench.json``'s ``task`` (``workbench.export`` writes it), else its config's
architecture: ``...ForSequenceClassification`` is text-classification, ``...ForTokenClassification``
token-classification, ``...ForMaskedLM`` fill-mask, ``...ForQuestionAnswering`` question-answering, a causal language
model text-generation, an encoder-decoder text2text-generation, and a plain encoder (``BertModel``, a
sentence-transformers folder) feature-extraction. Zero-shot classification runs an NLI classifier, which looks like
any text classifier: it is served only when the ``task`` says so.

Nothing here imports transformers: a folder is judged from its files, before the framework loads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.core.errors import Code, ServingError
from workbench.platforms.base import PICKLE_SETTING, VERSION_CONFIG
from workbench.platforms.tabular import version_config

PLATFORM = "huggingface"
CONFIG_FILE = "config.json"
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLED_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TENSORFLOW_FILES = ("tf_model.h5",)
# The files that say a folder is a Hugging Face model (config.json alone is too common a name to claim a folder).
PLATFORM_FILES = (*SAFETENSORS_FILES, *PICKLED_FILES, *TENSORFLOW_FILES)

TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
FILL_MASK = "fill-mask"
QUESTION_ANSWERING = "question-answering"
ZERO_SHOT = "zero-shot-classification"
FEATURE_EXTRACTION = "feature-extraction"
TEXT_GENERATION = "text-generation"
TEXT2TEXT_GENERATION = "text2text-generation"
SERVED_TASKS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, FILL_MASK, QUESTION_ANSWERING, ZERO_SHOT, FEATURE_EXTRACTION)
GENERATIVE_TASKS = (TEXT_GENERATION, TEXT2TEXT_GENERATION)
TASKS = (*SERVED_TASKS, *GENERATIVE_TASKS)
# transformers' pipeline aliases, and the names embedders go by elsewhere.
TASK_ALIASES = {
    "sentiment-analysis": TEXT_CLASSIFICATION,
    "ner": TOKEN_CLASSIFICATION,
    "sentence-embeddings": FEATURE_EXTRACTION,
    "text-embedding": FEATURE_EXTRACTION,
    "embeddings": FEATURE_EXTRACTION,
}

# An architecture's class name ending → its task, longest endings first where one contains another.
_ARCHITECTURE_TASKS = (
    ("ForSequenceClassification", TEXT_CLASSIFICATION),
    ("ForTokenClassification", TOKEN_CLASSIFICATION),
    ("ForMaskedLM", FILL_MASK),
    ("ForQuestionAnswering", QUESTION_ANSWERING),
    ("ForCausalLM", TEXT_GENERATION),
    ("LMHeadModel", TEXT_GENERATION),
    ("ForConditionalGeneration", TEXT2TEXT_GENERATION),
    ("ForSeq2SeqLM", TEXT2TEXT_GENERATION),
)


@dataclasses.dataclass(frozen=True)
class Folder:
    """A version folder judged from its files: its task, its settings (``workbench.json``) and its config."""

    path: Path
    task: str
    settings: Mapping[str, Any]
    config: Mapping[str, Any]
    safetensors: bool  # False: pickled weights, allowed by the policy


def normalise_task(task: str, where: str) -> str:
    """A task's canonical name (pipeline aliases resolved); INVALID_ARGUMENT naming the served ones."""
    name = TASK_ALIASES.get(task, task)
    if name not in TASKS:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"{where}: task {task!r} is not served; the huggingface platform serves {', '.join(TASKS)}",
        )
    return name


def task_of_architectures(architectures: Any) -> str:
    """The task an architecture list names (``["BertForSequenceClassification"]`` → text-classification); "" when
    none is known."""
    if not isinstance(architectures, list):
        return ""
    for architecture in architectures:
        if not isinstance(architecture, str):
            continue
        for ending, task in _ARCHITECTURE_TASKS:
            if architecture.endswith(ending):
                return task
        if architecture.endswith(("Model", "EncoderModel")) and "For" not in architecture:
            return FEATURE_EXTRACTION  # a plain encoder (BertModel): its hidden states, pooled
    return ""


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise ServingError(
            Code.NOT_FOUND, f"{folder} has no {CONFIG_FILE}: a Hugging Face model folder is written by save_pretrained"
        ) from None
    except (OSError, ValueError) as exc:
        raise ServingError(Code.DATA_LOSS, f"{path} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ServingError(Code.DATA_LOSS, f"{path} is not a JSON object")
    return document


def weights_are_safetensors(folder: Path, allow_pickle: bool) -> bool:
    """Whether the folder's weights are safetensors (True) or pickles the policy allows (False); refused otherwise:
    pickled weights run code when loaded, and TensorFlow's are not served (transformers 5 is PyTorch-only)."""
    if any((folder / name).is_file() for name in SAFETENSORS_FILES):
        return True
    pickled = [name for name in PICKLED_FILES if (folder / name).is_file()]
    if pickled:
        if not allow_pickle:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{folder / pickled[0]} holds pickled PyTorch weights, and unpickling runs code: load it only if you "
                f"trust it, with {PICKLE_SETTING}, or save the model again with safetensors (save_pretrained writes "
                "model.safetensors)",
            )
        return False
    if any((folder / name).is_file() for name in TENSORFLOW_FILES):
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{folder} holds TensorFlow weights ({TENSORFLOW_FILES[0]}), which are not served: transformers 5 runs "
            "PyTorch only. Load the model in PyTorch (from_pretrained(..., from_tf=True) with transformers 4) and "
            "save_pretrained it again",
        )
    raise ServingError(
        Code.NOT_FOUND, f"No Hugging Face weights in {folder}: expected one of {', '.join(SAFETENSORS_FILES)}"
    )


def read_folder(path: str | Path, allow_pickle: bool) -> Folder:
    """The folder's weights checked, its config read and its task chosen (see the module's docstring)."""
    folder = Path(path)
    settings = version_config(folder)
    config = read_config(folder)
    safetensors = weights_are_safetensors(folder, allow_pickle)
    declared = settings.get("task")
    if declared is not None:
        if not isinstance(declared, str) or not declared:
            raise ServingError(Code.INVALID_ARGUMENT, f'{folder / VERSION_CONFIG}: "task" must be a task\'s name')
        task = normalise_task(declared, str(folder / VERSION_CONFIG))
    else:
        task = task_of_architectures(config.get("architectures"))
        if not task:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"{folder / CONFIG_FILE} names architectures {config.get('architectures')!r}, which say no task: "
                f'name it in {folder / VERSION_CONFIG} ({{"platform": "{PLATFORM}", "task": "text-classification"}}; '
                f"served: {', '.join(TASKS)})",
            )
    return Folder(folder, task, settings, config, safetensors)
