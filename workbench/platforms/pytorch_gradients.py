"""A PyTorch module's gradients, for integrated gradients (:class:`~workbench.core.differentiable.Differentiable`).

Differentiated with ``torch.autograd``, outside the server's inference mode, on the very module the servable runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError


class ModuleGradients:
    """A served PyTorch module, differentiated with ``torch.autograd`` (outside the server's inference mode).

    ``call(x)`` runs the module on one input tensor as the platform runs it (its own argument structure) and gives
    back ``forward()``'s result; ``output`` picks the explained tensor out of it.
    """

    def __init__(self, call: Callable[[Any], Any], output: Callable[[Any], Any], output_name: str, device: Any) -> None:
        self._call_module, self._pick, self.output_name, self._device = call, output, output_name, device

    def _call(self, x: Any) -> Any:
        out = self._pick(self._call_module(x))
        return out.reshape(out.shape[0], -1).double()

    def outputs(self, rows: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(rows)).to(self._device)
            return np.asarray(self._call(x).cpu().numpy())

    def gradients(self, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(rows)).to(self._device).requires_grad_(True)
        with torch.enable_grad():
            picked = self._call(x).gather(1, torch.from_numpy(targets).to(self._device).reshape(-1, 1)).sum()
            if not picked.requires_grad:
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"The output {self.output_name} does not depend differentiably on the input: integrated "
                    "gradients cannot explain it",
                )
            (grads,) = torch.autograd.grad(picked, x, allow_unused=True)
        if grads is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"The output {self.output_name} does not depend on the input: integrated gradients cannot explain it",
            )
        return np.asarray(grads.detach().cpu().numpy())
