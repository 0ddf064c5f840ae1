"""What a servable whose framework differentiates offers explanations: its gradients (integrated gradients).

A platform's servable that can be differentiated (a SavedModel's, a PyTorch module's) implements
:class:`Differentiable`; :mod:`workbench.explain` asks for the capability and never for a framework, so a new
differentiable platform is its own module alone.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from workbench.core.signatures import Signature


class Gradients(Protocol):
    """One signature output of a model as a differentiable function of one of its inputs."""

    output_name: str  # the signature output explained

    def outputs(self, rows: np.ndarray) -> np.ndarray:
        """The explained output for ``rows``, as [n, k]."""

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """d output[i, targets[i]] / d rows[i], shaped as ``rows``."""


@runtime_checkable
class Differentiable(Protocol):
    """A servable whose framework gives gradients of its outputs with respect to its inputs."""

    def gradients(self, signature: Signature, input_alias: str, output_alias: str) -> Gradients:
        """``output_alias`` of ``signature`` as a function of its input ``input_alias``, differentiated as the
        servable's own ``run`` computes it."""
