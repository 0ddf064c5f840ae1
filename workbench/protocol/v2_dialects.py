"""Servables that read v2 requests in their own server's way (MLServer's runtimes), and what the frontends ask of them.

The v2 frontends hold a request to the model's signature: input names and datatypes as declared, the outputs named,
versions as numbers. A model served as another server serves it (a ``model-settings.json`` of MLServer's) answers
that server's clients instead: any name for its one input, numbers cast to the model's type, its content types, its
default outputs and its version strings. Such a servable carries a :class:`V2Dialect` as ``v2_dialect``, and both
v2 frontends (REST and gRPC) hand it the decoded request rather than checking it against the signature themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from workbench.protocol.v2_json import InferRequest


class V2Dialect(Protocol):
    """How one servable reads v2 requests and what its answers carry."""

    # The version as the model's own server names it ("v0.1.0"): v2 answers' model_version and metadata's versions.
    version_name: str

    def feed(self, request: InferRequest) -> tuple[dict[str, np.ndarray], list[str]]:
        """The serving_default signature's inputs and the outputs to fetch for ``request``; INVALID_ARGUMENT, in the
        words of the model's own server, for one it refuses."""

    def answer(
        self, request: InferRequest, outputs: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """The outputs as the model's own server names, shapes and encodes them for ``request`` (its outputs'
        content types), and the parameters each carries (its content type)."""


def dialect_of(servable: object) -> V2Dialect | None:
    """The servable's dialect, or None: the v2 protocol as Triton and KServe speak it."""
    dialect: V2Dialect | None = getattr(servable, "v2_dialect", None)
    return dialect
