"""Stand-ins for Triton's test backends, which its QA and its example clients serve models with.

Triton's repository of test models names backends that are not frameworks but small C++ backends built for testing
(``src/test/dyna_sequence``, the ``identity`` and ``repeat`` backends). Their version folders hold the backend's
shared library or nothing; workbench loads no library and serves each model as its backend is documented to
behave, under the model's own config (its tensors, batching, sequences and transaction policy):

- ``identity``: each output is the input at the same position of the config, unchanged (``INPUT0`` → ``OUTPUT0``);
- ``repeat`` (decoupled): for a request of ``IN`` (INT32 [n]), ``DELAY`` (UINT32 [n], milliseconds) and ``WAIT``
  (UINT32 [1], milliseconds), after ``DELAY[i]`` it sends a response ``OUT = [IN[i]]``, ``IDX = [i]``, for each i in
  order; it then waits ``WAIT`` before the final flag (an empty ``IN`` sends the final flag only);
- ``dyna_sequence`` (sequence batching): an INT32 accumulator per sequence, kept by the server as the sequence's
  state: START sets it to the sum of ``INPUT``'s elements, each later request adds that sum, END adds the sequence's
  correlation id (a number, or a string of digits, truncated to 32 bits), and ``OUTPUT`` is the accumulator in every
  element of the input's shape.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from workbench.config.triton_model_config import TritonConfig, config_json
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls, missing_correlation_id
from workbench.core.servable import Servable, streams_only
from workbench.core.signatures import Signature
from workbench.platforms.triton_backends import DYNA_SEQUENCE, IDENTITY, REPEAT
from workbench.platforms.triton_sequences import check_one_row
from workbench.platforms.triton_tensors import model_inputs, signature_of


def load(name: str, version: int, path: str, config: TritonConfig) -> Servable:
    """The stand-in for ``config``'s test backend (its version folder's files are not read)."""
    kinds: dict[str, type[_StandIn]] = {
        IDENTITY: IdentityServable,
        REPEAT: RepeatServable,
        DYNA_SEQUENCE: DynaSequenceServable,
    }
    return kinds[config.platform](name, version, path, config)


class _StandIn(Servable):
    def __init__(self, name: str, version: int, path: str, config: TritonConfig) -> None:
        self.name, self.version, self.path = name, version, path
        self._config = config
        self._inputs = {t.name: t for t in config.inputs}
        self.signatures = {"serving_default": signature_of(config, config.inputs, config.outputs)}
        self.model_config = config_json(config, name)
        self._check()

    def _check(self) -> None:
        """What the backend requires of its config, refused at load as the backend refuses it."""

    def _fail(self, detail: str) -> ServingError:
        return ServingError(Code.INVALID_ARGUMENT, f"{self._config.file}: the {self._config.platform} backend {detail}")

    def _feed(self, signature: Signature, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return model_inputs(self._config, signature, self._inputs, inputs)


class IdentityServable(_StandIn):
    """Triton's ``identity`` backend: output i is input i."""

    def _check(self) -> None:
        if len(self._config.inputs) != len(self._config.outputs):
            raise self._fail(
                f"pairs each input with the output at its position: the config has {len(self._config.inputs)} "
                f"inputs and {len(self._config.outputs)} outputs"
            )
        for given, answered in zip(self._config.inputs, self._config.outputs, strict=True):
            if given.dtype != answered.dtype:
                raise self._fail(f'answers input "{given.name}" as output "{answered.name}": their data types differ')
        self._pairs = {o.name: i.name for i, o in zip(self._config.inputs, self._config.outputs, strict=True)}

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feed = self._feed(signature, inputs)
        return {alias: feed[self._pairs[alias]] for alias in outputs}


class RepeatServable(_StandIn):
    """Triton's ``repeat`` backend: one response per element of IN, each after its DELAY, then WAIT."""

    decoupled = True

    def _check(self) -> None:
        needed = {"IN", "DELAY", "WAIT"} - set(self._inputs)
        if needed or not {"OUT", "IDX"} <= {t.name for t in self._config.outputs}:
            raise self._fail("needs the inputs IN, DELAY and WAIT and the outputs OUT and IDX")

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        raise streams_only(f"Model {self.name} version {self.version} (the repeat backend)")

    def run_decoupled(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        feed = self._feed(signature, inputs)
        values = feed["IN"].reshape(-1)
        delays = feed["DELAY"].reshape(-1)
        wait = int(feed["WAIT"].reshape(-1)[0]) if feed["WAIT"].size else 0
        if len(delays) < len(values):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Model {self.name}: DELAY has {len(delays)} elements for the {len(values)} of IN (one each)",
            )
        return self._responses(values, delays, wait, outputs)

    @staticmethod
    def _responses(
        values: np.ndarray, delays: np.ndarray, wait: int, outputs: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        wanted = outputs or ("OUT", "IDX")
        for index, (value, delay) in enumerate(zip(values, delays, strict=False)):
            time.sleep(int(delay) / 1000)
            answer = {"OUT": np.array([value], np.int32), "IDX": np.array([index], np.uint32)}
            yield {name: answer[name] for name in wanted}
        time.sleep(wait / 1000)


class DynaSequenceServable(_StandIn):
    """Triton's ``dyna_sequence`` test backend: an INT32 accumulator per sequence (the server keeps it)."""

    def _check(self) -> None:
        sequence = self._config.sequence_batching
        if sequence is None or {c.kind for c in sequence.controls} != {"START", "END", "READY", "CORRID"}:
            raise self._fail("needs sequence_batching with the START, END, READY and CORRID controls")
        if "INPUT" not in self._inputs or "OUTPUT" not in {t.name for t in self._config.outputs}:
            raise self._fail("needs an INT32 input INPUT and an INT32 output OUTPUT")
        self.sequence = sequence.settings

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        raise missing_correlation_id(self.name)  # the data plane runs a stateful model's requests as steps

    def run_step(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        state: Any,
        controls: Controls,
    ) -> tuple[dict[str, np.ndarray], Any]:
        check_one_row(inputs, self._config, self.name)
        value = self._feed(signature, inputs)["INPUT"]
        total = int(value.sum(dtype=np.int64))
        accumulator = total if controls.start or state is None else int(state) + total
        if controls.end:
            accumulator += _corrid(controls.correlation_id)
        accumulator = int(np.array(accumulator, np.int64).astype(np.int32))  # an INT32 accumulator wraps
        return {alias: np.full(value.shape, accumulator, np.int32) for alias in outputs}, accumulator


def _corrid(correlation_id: int | str) -> int:
    """The id as the backend adds it: a number, or a string of digits read as one, truncated to 32 bits."""
    if isinstance(correlation_id, str):
        try:
            correlation_id = int(correlation_id)
        except ValueError:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"the dyna_sequence backend reads a string sequence id as a number: {correlation_id!r} is not one",
            ) from None
    return int(np.array(correlation_id, np.uint64).astype(np.int64).astype(np.int32))
