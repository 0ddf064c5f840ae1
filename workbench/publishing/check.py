"""The check before publishing: the export loaded exactly as the server will load it, its warmup file written and
replayed (or a zero batch, or each example as a sequence of its own, run), and its signatures described."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.platforms import Loader, LoadPolicy
from workbench.publishing.export_errors import ExportError, one_line
from workbench.publishing.warmup_requests import example_requests, write_warmup

if TYPE_CHECKING:  # only for annotations
    from workbench.core.signatures import Signature, TensorSpec

__all__ = ["write_warmup_and_verify"]

log = logging.getLogger(__name__)


def write_warmup_and_verify(name: str, path: Path, examples: Any) -> tuple[dict[str, str], int]:
    """Load the export as the server will, write the warmup file, run it (or a zero batch); describe signatures."""
    from workbench.core import inference
    from workbench.core.errors import Code, ServingError
    from workbench.core.servable import Composite
    from workbench.models import warmup_replay

    # Loaded as the server will; the user's own kernel wrote any Python here, so the check may import it.
    loader = Loader(LoadPolicy(allow_pickle=False, allow_python=True))
    try:
        servable = loader(name, 0, str(path))
    except Exception as exc:
        raise ExportError(f"The exported model failed its check: it does not load: {one_line(exc)}") from exc
    try:
        signature = servable.signatures.get(DEFAULT_SIGNATURE)
        if signature is None:
            raise ExportError(f"The exported model failed its check: it has no {DEFAULT_SIGNATURE} signature")
        described = {key: _describe(sig) for key, sig in servable.signatures.items() if not key.startswith("__")}
        if isinstance(servable, Composite) and servable.members():
            return described, 0  # its steps run on other models: only a server has them
        if servable.sequence is not None or servable.decoupled:  # run apart from batches: nothing replays
            _check_unbatched(servable, signature, examples)
            return described, 0
        if examples is None:
            batch = _zero_example(signature)
            try:
                inference.predict(servable, signature, batch)
            except ServingError as exc:
                # Made-up zeros may be data the model rightly rejects (a tf.Example parser, a minimum size): that
                # says nothing about the export. Anything else (e.g. a variable the session cannot find) does.
                if exc.code != Code.INVALID_ARGUMENT:
                    raise ExportError(f"The exported model failed its check: {one_line(exc)}") from exc
                log.warning(
                    "A zero-filled example for %s was rejected (%s); pass examples= to check it", name, one_line(exc)
                )
            return described, 0
        requests = example_requests(examples, signature)
        write_warmup(name, path, requests, signature)
        try:
            warmup_replay.warm_up(servable)  # replays the very file the server will replay
        except Exception as exc:
            raise ExportError(f"The exported model failed its check: {one_line(exc)}") from exc
        return described, len(requests)
    finally:
        servable.close()


def _check_unbatched(servable: Any, signature: Signature, examples: Any) -> None:
    """Run a stateful model's examples (or zeros), each as the one request of a sequence of its own; a decoupled
    model's, each to its last response.

    No warmup file is written: the server's warmup replays plain requests, which neither kind of model takes.
    """
    from workbench.core.errors import Code, ServingError
    from workbench.core.sequence_contract import Controls

    batches = [_made_up_example(servable, signature)] if examples is None else example_requests(examples, signature)
    for number, batch in enumerate(batches):
        try:
            if servable.decoupled:
                for _ in servable.run_decoupled(signature, batch, list(signature.outputs)):
                    pass
            else:
                controls = Controls(True, True, True, number)
                servable.run_step(signature, batch, list(signature.outputs), None, controls)
        except ServingError as exc:
            if examples is None and exc.code == Code.INVALID_ARGUMENT:  # made-up zeros, rightly refused
                log.warning(
                    "A zero-filled example for %s was rejected (%s); pass examples= to check it",
                    servable.name,
                    one_line(exc),
                )
                return
            raise ExportError(f"The exported model failed its check: {one_line(exc)}") from exc


def _describe(signature: Signature) -> str:
    """``(pixels: float32[?, 64]) -> (probabilities: float32[?, 10])``."""

    def one(spec: TensorSpec) -> str:
        dims = "..." if spec.shape is None else ", ".join("?" if d < 0 else str(d) for d in spec.shape)
        dtype = "string" if spec.dtype.kind == "O" else spec.dtype.name  # float32 rather than TF's "float"
        return f"{spec.alias}: {dtype}[{dims}]"

    inputs = ", ".join(one(s) for s in signature.inputs.values())
    outputs = ", ".join(one(s) for s in signature.outputs.values())
    return f"({inputs}) -> ({outputs})"


def _made_up_example(servable: Any, signature: Signature) -> dict[str, np.ndarray]:
    """Zeros, or for a text generator a short prompt asking for one token: an empty prompt is rightly refused, and
    the model's own limit (hundreds of tokens) would make the check a long generation."""
    from workbench.core import text_generation as tg

    batch = _zero_example(signature)
    if tg.is_text_generator(signature, servable.decoupled):
        batch[tg.TEXT_INPUT] = np.array([b"Hello"], dtype=object).reshape(batch[tg.TEXT_INPUT].shape)
        if tg.SAMPLING_PARAMETERS in batch:
            parameters = tg.SamplingParameters(max_tokens=1, temperature=0.0).to_json()
            batch[tg.SAMPLING_PARAMETERS] = np.array([parameters], dtype=object).reshape(
                batch[tg.SAMPLING_PARAMETERS].shape
            )
    return batch


def _zero_example(signature: Signature) -> dict[str, np.ndarray]:
    """One zero (or empty-string) batch that fits the signature, unknown dimensions taken as 1."""
    batch = {}
    for alias, spec in signature.inputs.items():
        shape = (1,) if spec.shape is None else tuple(1 if d < 0 else d for d in spec.shape)
        batch[alias] = np.full(shape, b"", dtype=object) if spec.dtype.kind == "O" else np.zeros(shape, spec.dtype)
    return batch
