"""What the :class:`~workbench.client.Client` asks of each protocol: one transport class per protocol implements it.

The client checks what is protocol-independent (a known protocol with its target, the arguments' combinations),
fetches and caches signatures, and turns inputs into arrays of the signature's dtypes; a transport only translates
one call into its protocol's request and the answer back.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.core.signatures import Signature


@dataclasses.dataclass(frozen=True)
class Answer:
    """A predict's outputs, the version that answered (None: not said), and the call's latency."""

    outputs: Mapping[str, np.ndarray]
    version: int | None
    latency_ms: float


class Transport(abc.ABC):
    """One protocol's calls (``name`` as :data:`~workbench.client.protocols.PROTOCOLS` spells it)."""

    name: str

    @abc.abstractmethod
    def signatures(self, model: str, version: int | None, label: str | None) -> dict[str, Signature]:
        """A model's signatures by name."""

    @abc.abstractmethod
    def metadata(self, model: str, version: int | None, label: str | None) -> Any:
        """A model's metadata in the protocol's own form."""

    @abc.abstractmethod
    def status(self, model: str, version: int | None, label: str | None) -> list[dict[str, Any]]:
        """The versions' states, in TF Serving's words."""

    @abc.abstractmethod
    def predict(
        self,
        model: str,
        signature: Signature,
        feeds: Mapping[str, np.ndarray],
        *,
        signature_name: str,
        output_filter: Sequence[str],
        version: int | None,
        label: str | None,
        parameters: Mapping[str, bool | int | str] | None,
        key: str | None = None,
    ) -> Answer:
        """Run a predict of ``feeds`` (arrays of the signature's input dtypes); the latency is from the request's
        encoding to its answer. ``key``: the request's stickiness key (it keeps one side of a canary split)."""

    @abc.abstractmethod
    def examples(
        self,
        kind: str,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        version: int | None,
        label: str | None,
        signature_name: str,
    ) -> tuple[Any, float]:
        """A classify or regress (``kind``) of tf.Examples: the results as TF Serving's REST API writes them, and
        the latency."""
