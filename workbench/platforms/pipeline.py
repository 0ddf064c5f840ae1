"""Pipelines (Triton's ensembles): a version folder whose ``pipeline.yaml`` chains other models of the server.

::

    # pipeline.yaml
    inputs:                                   # what clients send, as for any model
      pixels: {dtype: float32, shape: [-1, 64]}
    outputs:                                  # what they get back: tensors the steps produce
      label: {dtype: string, shape: [-1]}
    steps:
      - name: scale                           # named in errors; defaults to the model's name
        model: scaler
        inputs: {x: pixels}                   # the model's input ← a pipeline input or an earlier step's tensor
        outputs: {y: scaled}                  # the model's output → a tensor name for later steps and outputs
      - name: classify
        model: digits
        label: stable                         # or version: 2; neither: the model's default (its canary too)
        inputs: {pixels: scaled}
        outputs: {probabilities: probabilities}
      - name: name_it
        model: labeller
        signature: serving_default            # the default
        inputs: {probabilities: probabilities}
        outputs: {label: label}

Types are TF Serving's names or numpy's. A step reads only pipeline inputs and tensors of steps above it (so a
pipeline has no cycles by construction), every tensor a step maps out is read by something, and each tensor
has one producer; the file is checked when the version loads and every mistake is named with its place.

Each step runs through its model's own batcher (as a request for that model would: its labels, canary and
version resolution apply) as soon as the tensors it reads are ready, so independent steps run concurrently.
A failing step fails the request with its own code, the message naming the step and its model. A pipeline is a
model like any other: versioned, labelled and canaried; its version becomes AVAILABLE only once every model its
steps name is serving (the manager checks :meth:`PipelineServable.members`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import Composite, Members, Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.platforms._user_code import conform_outputs, tensor_specs
from workbench.platforms.base import LoadPolicy

PIPELINE_FILE = "pipeline.yaml"
_TOP_KEYS = ("inputs", "outputs", "steps")
_STEP_KEYS = ("name", "model", "version", "label", "signature", "inputs", "outputs")


@dataclasses.dataclass(frozen=True)
class Step:
    """One model call of a pipeline: ``inputs`` maps the model's input names to tensor names, ``outputs`` the
    model's output names to new tensor names."""

    name: str
    model: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    version: int | None = None
    label: str | None = None
    signature: str = ""

    def describe(self) -> str:
        at = f" version {self.version}" if self.version is not None else f" label {self.label}" if self.label else ""
        return f'step "{self.name}" (model {self.model}{at})'


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipeline description: what ``workbench.export`` writes as ``pipeline.yaml``.

    ``inputs`` and ``outputs`` map tensor names to ``(dtype, shape)``, e.g. ``{"pixels": ("float32", [-1, 64])}``.
    """

    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    steps: Sequence[Step]

    def to_document(self) -> dict[str, Any]:
        """The YAML document, with every tensor as ``{dtype, shape}``."""

        def tensors(declared: Mapping[str, Any], where: str) -> dict[str, Any]:
            return {
                alias: {"dtype": _dtype_text(spec), "shape": None if spec.shape is None else list(spec.shape)}
                for alias, spec in tensor_specs(declared, where).items()
            }

        steps = []
        for step in self.steps:
            entry: dict[str, Any] = {"name": step.name, "model": step.model}
            if step.version is not None:
                entry["version"] = step.version
            if step.label is not None:
                entry["label"] = step.label
            if step.signature:
                entry["signature"] = step.signature
            entry["inputs"] = dict(step.inputs)
            entry["outputs"] = dict(step.outputs)
            steps.append(entry)
        return {"inputs": tensors(self.inputs, "inputs"), "outputs": tensors(self.outputs, "outputs"), "steps": steps}


def _dtype_text(spec: TensorSpec) -> str:
    return "string" if spec.dtype.kind == "O" else spec.dtype.name


# ------------------------------------------------------------------------------------------ the file
def _fail(where: str, message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, f"{where}: {message}")


def _names(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not value:
        raise _fail(where, "must map names to tensor names, e.g. {x: pixels}")
    for key, target in value.items():
        if not isinstance(key, str) or not key or not isinstance(target, str) or not target:
            raise _fail(where, f"names are non-empty strings; got {key!r}: {target!r}")
    return dict(value)


def _step(entry: Any, where: str) -> Step:
    if not isinstance(entry, Mapping):
        raise _fail(where, "a step is a mapping with model, inputs and outputs")
    model = entry.get("model")
    name = entry.get("name", model)
    if isinstance(name, str) and name:
        where = f"{where} ({name})"
    unknown = sorted(set(entry) - set(_STEP_KEYS))
    if unknown:
        raise _fail(where, f"unknown keys {unknown} (a step has {', '.join(_STEP_KEYS)})")
    if not isinstance(model, str) or not model:
        raise _fail(where, "names no model (model: NAME)")
    if not isinstance(name, str) or not name:
        raise _fail(where, "name must be a non-empty string")
    version, label = entry.get("version"), entry.get("label")
    if version is not None and label is not None:
        raise _fail(where, "names a version and a label; keep one")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise _fail(where, f"version must be a version number; got {version!r}")
    if label is not None and (not isinstance(label, str) or not label):
        raise _fail(where, f"label must be a non-empty string; got {label!r}")
    signature = entry.get("signature", "")
    if not isinstance(signature, str):
        raise _fail(where, f"signature must be a signature name; got {signature!r}")
    return Step(
        name=name,
        model=model,
        inputs=_names(entry.get("inputs"), f"{where}.inputs"),
        outputs=_names(entry.get("outputs"), f"{where}.outputs"),
        version=version,
        label=label,
        signature=signature,
    )


def parse(document: Any, where: str = PIPELINE_FILE) -> tuple[Signature, tuple[Step, ...]]:
    """The pipeline's signature and steps, or an INVALID_ARGUMENT naming the first mistake and its place."""
    if isinstance(document, Pipeline):
        document = document.to_document()
    if not isinstance(document, Mapping):
        raise _fail(where, "must be a mapping with inputs, outputs and steps")
    unknown = sorted(set(document) - set(_TOP_KEYS))
    missing = [key for key in _TOP_KEYS if key not in document]
    if unknown or missing:
        raise _fail(where, f"a pipeline has exactly {', '.join(_TOP_KEYS)}; unknown: {unknown}, missing: {missing}")
    inputs = tensor_specs(document["inputs"], f"{where}: inputs")
    outputs = tensor_specs(document["outputs"], f"{where}: outputs")
    entries = document["steps"]
    if not isinstance(entries, Sequence) or isinstance(entries, str) or not entries:
        raise _fail(where, "steps must be a list of at least one step")
    steps = tuple(_step(entry, f"{where}: steps[{i}]") for i, entry in enumerate(entries))

    producer: dict[str, str] = {alias: "the pipeline's inputs" for alias in inputs}
    unread: dict[str, str] = {}  # tensor → the step that produces it, until something reads it
    seen: set[str] = set()
    for i, step in enumerate(steps):
        place = f"{where}: steps[{i}] ({step.name})"
        if step.name in seen:
            raise _fail(place, f'another step is named "{step.name}"; give each step its own name')
        seen.add(step.name)
        for model_input, tensor in step.inputs.items():
            if tensor not in producer:
                raise _fail(
                    f"{place}.inputs.{model_input}",
                    f'reads "{tensor}", which is neither a pipeline input nor a tensor of a step above '
                    f"(known: {', '.join(producer)})",
                )
            unread.pop(tensor, None)
        for model_output, tensor in step.outputs.items():
            if tensor in producer:
                raise _fail(f"{place}.outputs.{model_output}", f'"{tensor}" is already {_origin(producer[tensor])}')
            producer[tensor] = f'step "{step.name}"'
            unread[tensor] = step.name
    for alias in outputs:
        if alias not in producer:
            raise _fail(f"{where}: outputs.{alias}", f"no step produces it (tensors: {', '.join(producer)})")
        unread.pop(alias, None)
    if unread:
        tensor, step_name = next(iter(unread.items()))
        raise _fail(
            where,
            f'step "{step_name}" maps out "{tensor}", which no later step and no output reads '
            "(map only the model outputs the pipeline uses)",
        )
    signature = Signature(DEFAULT_SIGNATURE, PREDICT_METHOD, inputs, outputs, batchable=False)
    return signature, steps


def _origin(producer: str) -> str:
    return "a pipeline input" if producer == "the pipeline's inputs" else f"produced by {producer}"


# ------------------------------------------------------------------------------------------ running
class PipelineServable(Composite):
    """Runs its steps on the server's other models; useless (and refused) outside a server."""

    def __init__(self, name: str, version: int, path: str, signature: Signature, steps: Sequence[Step]) -> None:
        self.name, self.version, self.path = name, version, path
        self.signatures = {signature.name: signature}
        self.steps = tuple(steps)

    def members(self) -> Sequence[str]:
        return sorted({step.model for step in self.steps})

    def _needed(self, outputs: Sequence[str]) -> list[Step]:
        """The steps the asked-for outputs depend on, in file order (an output filter skips the others)."""
        wanted = set(outputs)
        needed: list[Step] = []
        for step in reversed(self.steps):
            if wanted & set(step.outputs.values()):
                needed.append(step)
                wanted |= set(step.inputs.values())
        return needed[::-1]

    async def run_with(
        self, members: Members, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        tensors: dict[str, asyncio.Future[np.ndarray]] = {}
        for alias, value in inputs.items():
            tensors[alias] = loop.create_future()
            tensors[alias].set_result(value)
        steps = self._needed(outputs)
        for step in steps:
            for tensor in step.outputs.values():
                tensors[tensor] = loop.create_future()

        async def run_step(step: Step) -> None:
            feed = {model_input: await tensors[tensor] for model_input, tensor in step.inputs.items()}
            try:
                result = await members.predict(step.model, step.version, step.label, step.signature, feed)
            except Exception as exc:  # noqa: BLE001 - every failure is answered, naming the step
                error = from_exception(exc)
                raise ServingError(
                    error.code, f"Pipeline {self.name}: {step.describe()} failed: {error.message}"
                ) from None
            for model_output, tensor in step.outputs.items():
                if model_output not in result:
                    raise ServingError(
                        Code.FAILED_PRECONDITION,
                        f'Pipeline {self.name}: {step.describe()} maps out "{model_output}", which the model does '
                        f"not give (it gives {', '.join(sorted(result))})",
                    )
                tensors[tensor].set_result(result[model_output])

        tasks = [asyncio.ensure_future(run_step(step)) for step in steps]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in tasks:
                if task in done and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
        answer = {alias: tensors[alias].result() for alias in outputs}
        return conform_outputs(signature, answer, outputs, f"Pipeline {self.name}")

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"Pipeline {self.name} runs in a server: its steps are the server's models "
            f"({', '.join(self.members())}), reached through their batchers",
        )


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    import yaml

    file = Path(path) / PIPELINE_FILE
    try:
        document = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ServingError(Code.NOT_FOUND, f"{file} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{file} is not valid YAML: {exc}") from None
    signature, steps = parse(document, str(file))
    for i, step in enumerate(steps):
        if step.model == name:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{file}: steps[{i}] ({step.name}) names the pipeline itself ({name})"
            )
    return PipelineServable(name, version, path, signature, steps)


# ------------------------------------------------------------------------------------------ export
def exports(obj: Any) -> bool:
    """A :class:`Pipeline`, or a dict with exactly its keys (inputs, outputs, steps), as ``pipeline.yaml`` holds."""
    return isinstance(obj, Pipeline) or (isinstance(obj, Mapping) and set(obj) == set(_TOP_KEYS))


def write(obj: Any, folder: Path, **options: Any) -> None:
    """Write ``pipeline.yaml``, checked first (the same checks as at load, but the member models')."""
    import yaml

    if options:
        raise ServingError(Code.INVALID_ARGUMENT, f"A pipeline takes no export options; got {sorted(options)}")
    document = obj.to_document() if isinstance(obj, Pipeline) else _as_plain(obj)
    parse(document, "the pipeline")
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=None)
    (Path(folder) / PIPELINE_FILE).write_text(text)


def _as_plain(document: Mapping[str, Any]) -> dict[str, Any]:
    """A dict description with its steps as mappings and its tensors as {dtype, shape}, ready for YAML."""
    steps = [dataclasses.asdict(s) if isinstance(s, Step) else dict(s) for s in document.get("steps") or ()]
    for step in steps:
        for key in ("version", "label", "signature"):
            if step.get(key) in (None, ""):
                step.pop(key, None)
        step["inputs"], step["outputs"] = dict(step.get("inputs") or {}), dict(step.get("outputs") or {})
    pipeline = Pipeline(document["inputs"], document["outputs"], [_step(s, f"steps[{i}]") for i, s in enumerate(steps)])
    return pipeline.to_document()
