"""The Hugging Face platform: a ``save_pretrained`` folder (a pipeline's, or a model's with its tokenizer) served by
``transformers`` on PyTorch.

A version folder holds ``config.json``, the tokenizer's files and the weights: ``model.safetensors`` (or its sharded
index). Pickled weights (``pytorch_model.bin``) load only with ``--allow_pickle``; TensorFlow's (``tf_model.h5``) are
refused, as transformers 5 runs PyTorch only. The task is the folder's ``workbench.json`` ``task`` (which
``workbench.export`` writes) or else its config's architecture (:mod:`workbench.platforms.huggingface_folders`).

The non-generative tasks (:mod:`workbench.platforms.huggingface_tasks`: their signatures, and answers equal to the
pipelines') are a :class:`~workbench.core.servable.PerRequestServable`: the batcher hands it the requests it grouped,
their texts are tokenized together, padded per batch and run in one forward pass, and each request is answered with
its own rows (its padding never depends on the others, and its bad row fails it alone). Text generation is
:mod:`workbench.platforms.huggingface_generation`'s.

The model is placed once, at load, on ``--pytorch_device`` (``auto``: the first CUDA GPU, else the CPU), sized by
``--pytorch_threads`` as the PyTorch platform's models are, and counted by a memory budget as they are (what its load
adds to the process, or to the GPU's allocations), and at least its parameters' and buffers' bytes on the device they
are on, which the servable reports (``memory_held``). Remote code (``trust_remote_code``) is never run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.footprint import Footprint
from workbench.core.servable import PerRequestServable, Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.platforms import huggingface_folders as folders
from workbench.platforms import pytorch
from workbench.platforms.base import LoadPolicy
from workbench.platforms.export_request import ExportRefused, ExportRequest, VersionWriter
from workbench.platforms.huggingface_loading import load_lock, quiet_transformers
from workbench.platforms.huggingface_tasks import TASK_CLASSES, Model, Task, model_max_length
from workbench.platforms.tabular import write_version_config

PLATFORM = folders.PLATFORM
log = logging.getLogger(__name__)


def places_on_gpu(policy: LoadPolicy) -> bool:
    """Whether ``--pytorch_device`` puts the model on a GPU (asked before a first load, without importing torch)."""
    return pytorch.places_on_gpu(policy)


@functools.cache
def warm_up() -> None:
    """Import what every load uses (transformers' Auto classes, its tokenizers) ahead of a measured load, so a memory
    budget charges the model, not the library."""
    import transformers

    for name in ("AutoConfig", "AutoTokenizer", "AutoModel", "PreTrainedTokenizerFast"):
        getattr(transformers, name)


class HuggingFaceServable(PerRequestServable):
    """A non-generative task's model on one device (see the module's docstring)."""

    def __init__(self, name: str, version: int, folder: folders.Folder, policy: LoadPolicy) -> None:
        self.name, self.version, self.path = name, version, str(folder.path)
        self.task_name = folder.task
        pytorch.configure_threads(policy.pytorch_threads)
        self._threads = policy.pytorch_threads
        self.device = pytorch.resolve_device(policy.pytorch_device)
        task_class = TASK_CLASSES[folder.task]
        traced = traces(folder.settings)
        model = load_model(folder.path, folder.path, task_class.model_class, self.device, folder.safetensors)
        self.task: Task | None = task_class(model, folder.settings)
        # What serves the forward pass: its TorchScript trace ("traced"), or the eager model and why.
        with load_lock, quiet_transformers():
            self.forward_pass = model.trace() if traced else 'eager: workbench.json says "traced": false'
        log.info("%s version %s: forward pass %s", name, version, self.forward_pass)
        self.signatures = {DEFAULT_SIGNATURE: self.task.signature}
        self.labels = self.task.labels()

    def run_requests(
        self, signature: Signature, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
    ) -> list[dict[str, np.ndarray] | ServingError]:
        import torch

        task = self.task
        if task is None:
            raise ServingError(Code.UNAVAILABLE, f"{self.name} version {self.version} is unloaded")
        if self._threads > 0 and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)  # OpenMP keeps the count per thread
        parsed: list[list[Any] | ServingError] = []
        for feed in feeds:
            try:
                parsed.append(task.parse(feed))
            except ServingError as exc:
                parsed.append(exc)
        rows = [row for own in parsed if not isinstance(own, ServingError) for row in own]
        results = task.compute(rows) if rows else []
        answers: list[dict[str, np.ndarray] | ServingError] = []
        first = 0
        for own in parsed:
            if isinstance(own, ServingError):
                answers.append(own)
                continue
            mine = results[first : first + len(own)]
            first += len(own)
            failed = next((r for r in mine if isinstance(r, ServingError)), None)
            if failed is not None:
                answers.append(failed)
                continue
            answer = task.assemble(mine)
            answers.append({alias: answer[alias] for alias in outputs})
        return answers

    def memory_held(self) -> Footprint | None:
        """The model's parameters and buffers, on the device they were placed on (the tokenizer is not counted)."""
        task = self.task
        return pytorch.module_held(task.model.model) if task is not None else None

    def close(self) -> None:
        import torch

        self.task = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def traces(settings: Mapping[str, Any]) -> bool:
    """Whether workbench.json leaves the forward pass to be traced (``"traced"``, true by default)."""
    traced = settings.get("traced", True)
    if not isinstance(traced, bool):
        raise ServingError(Code.INVALID_ARGUMENT, f'workbench.json: "traced" is true or false; got {traced!r}')
    return traced


def load_model(model: Path, tokenizer: Path, model_class: str, device: Any, safetensors: bool) -> Model:
    """A model folder's model (by ``model_class``, transformers' Auto class for its task, on ``device``, in eval mode)
    with the tokenizer of folder ``tokenizer``."""
    import transformers

    try:
        with load_lock, quiet_transformers():
            loaded_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
            loaded = getattr(transformers, model_class).from_pretrained(
                str(model), local_files_only=True, use_safetensors=safetensors, trust_remote_code=False
            )
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ServingError(Code.DATA_LOSS, f"transformers cannot load {model}: {_first_line(exc)}") from None
    if loaded_tokenizer.pad_token is None:  # GPT-2-like tokenizers pad with their end of text, as the pipelines do
        loaded_tokenizer.pad_token = loaded_tokenizer.eos_token
    placed = loaded.to(device).eval()
    return Model(placed, loaded_tokenizer, device, model_max_length(loaded_tokenizer, placed.config))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    """The platform's loader: a non-generative task's servable, or the generator of a generative one."""
    folder = folders.read_folder(path, policy.allow_pickle)
    if folder.task in folders.GENERATIVE_TASKS:
        from workbench.platforms import huggingface_generation

        generator: Servable = huggingface_generation.load(name, version, path, policy, folder.task)
        return generator
    return HuggingFaceServable(name, version, folder, policy)


# ================================================================================================= export side
def exports(obj: Any) -> bool:
    """Whether ``obj`` is a transformers pipeline or model; decided without importing transformers."""
    import sys

    if "transformers" not in sys.modules:
        return False
    import transformers

    return isinstance(obj, (transformers.Pipeline, transformers.PreTrainedModel))


def task_for(obj: Any, asked: str | None) -> str:
    """The task ``obj`` is exported for: ``task=``, else a pipeline's own, else its architecture's."""
    import transformers

    if asked is not None:
        try:
            return folders.normalise_task(asked, "task=")
        except ServingError as exc:
            raise ExportRefused(exc.message) from None
    if isinstance(obj, transformers.Pipeline):
        return folders.normalise_task(str(obj.task), f"a {type(obj).__name__}")
    found = folders.task_of_architectures([type(obj).__name__])
    if not found:
        raise ExportRefused(
            f"Which task does this {type(obj).__name__} serve? Name it: workbench.export(model, name, task=...), "
            f"one of {', '.join(folders.TASKS)}"
        )
    return found


def write(obj: Any, folder: Path, tokenizer: Any = None, task: str | None = None) -> None:
    """``save_pretrained`` of the model (safetensors) and its tokenizer into ``folder``, and ``workbench.json`` with
    the platform and the task. ``obj`` is a pipeline (its model, tokenizer and task) or a model with ``tokenizer``."""
    import transformers

    chosen = task_for(obj, task)
    if isinstance(obj, transformers.Pipeline):
        model, tokenizer = obj.model, tokenizer if tokenizer is not None else obj.tokenizer
    else:
        model = obj
    if tokenizer is None:
        raise ExportRefused(
            f"A {type(model).__name__} is served with its tokenizer: workbench.export(model, name, "
            "tokenizer=tokenizer), or export the pipeline that holds both"
        )
    if not isinstance(model, transformers.PreTrainedModel):
        raise ExportRefused(f"A {type(model).__name__} is not a transformers PyTorch model (PreTrainedModel)")
    with load_lock, quiet_transformers():
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
    write_version_config(folder, PLATFORM, task=chosen)


def writer(model: Any, request: ExportRequest) -> VersionWriter | None:
    """How ``workbench.export`` writes a pipeline or a model (``tokenizer=``, ``task=``); None for anything else, and
    for a model asked to be traced as a PyTorch module (``example_inputs=``, ``format="pt2"``/``"torchscript"``)."""
    if not exports(model) or request.example_inputs is not None or request.format in pytorch.FORMATS:
        return None
    if request.format not in (None, "safetensors"):
        raise ExportRefused(
            f"A transformers model is written with save_pretrained (safetensors), not {request.format!r}"
        )
    if request.signatures:
        raise ExportRefused("signatures= is for TensorFlow models; a transformers model's signature is its task's")
    tokenizer, task = request.options.get("tokenizer"), request.options.get("task")
    task_for(model, task)  # refused now, before anything is written
    return functools.partial(write, model, tokenizer=tokenizer, task=task)
