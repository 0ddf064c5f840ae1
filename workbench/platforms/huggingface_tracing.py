"""A non-generative model's forward pass traced with TorchScript, used only where it answers as the model does.

Why: transformers' eager forward is a few hundred small PyTorch calls, and the interpreter lock is taken back after
each. In a server, while the event loop runs Python, the forward waits for it at every call (measured in one
process: an eager forward slowed twentyfold beside a thread spinning in Python, a traced one by under 2x). A
TorchScript module runs the whole graph in C++ with the lock released, so the loop and the model share the cores
instead of taking turns.

A trace records one run's shapes and branches. transformers' models branch in Python on shapes (is there padding?
is the sequence longer than one token?), so a trace is kept only if it answers as the eager model on inputs of other
batch sizes, lengths and padding than it was traced on; otherwise the model runs eagerly. The traced module holds
the eager model's own parameters (no second copy), and a call with inputs it was not traced with (other tensor
names) runs eagerly.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Batches of texts of these many words: traced on the first (unequal lengths, so padding is present), checked on the
# rest (no padding, one row; more rows, longer and shorter than the trace).
TRACED_ON: tuple[int, ...] = (12, 7, 3)
CHECKED_ON: tuple[tuple[int, ...], ...] = ((5,), (20, 2, 9, 14), (4, 4))


@dataclasses.dataclass(frozen=True)
class TracedForward:
    """The traced module, the tensor names it takes (in its order) and the eager output's class, to answer with."""

    module: Any
    names: tuple[str, ...]
    output_class: type

    def takes(self, inputs: Mapping[str, Any]) -> bool:
        return len(inputs) == len(self.names) and all(name in inputs for name in self.names)

    def __call__(self, inputs: Mapping[str, Any]) -> Any:
        return self.output_class(**self.module(**{name: inputs[name] for name in self.names}))


def trace(
    model: Any, tokenize: Callable[[Sequence[str]], Mapping[str, Any]], inputs_of: Callable[[Any], dict[str, Any]]
) -> tuple[TracedForward | None, str]:
    """``model`` traced on texts ``tokenize`` encodes (``inputs_of`` picks the model's tensors from an encoding), or
    None and why not: the trace failed, or answered differently from the eager model on the checked inputs."""
    import torch

    def texts(lengths: Sequence[int]) -> list[str]:
        return [" ".join(["hello", "world"] * (n // 2) + ["hello"] * (n % 2)) for n in lengths]

    try:
        example = inputs_of(tokenize(texts(TRACED_ON)))
        with torch.inference_mode():
            eager = model(**example)
        if not isinstance(eager, Mapping):
            return None, f"its forward answers a {type(eager).__name__}, not a model output"
        # TracerWarnings say that shape branches were recorded: expected, and checked below; nothing is printed.
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            module = torch.jit.trace(model, example_kwarg_inputs=example, strict=False, check_trace=False)
        traced = TracedForward(module, tuple(example), type(eager))
        for lengths in CHECKED_ON:
            checked = inputs_of(tokenize(texts(lengths)))
            with torch.inference_mode():
                differs = _differs(model(**checked), traced(checked))
            if differs:
                return None, f"the trace answered differently on a batch of {len(lengths)}: {differs}"
    except Exception as exc:  # noqa: BLE001 - any failure to trace means the eager model, never a failed load
        first = str(exc).strip().splitlines()
        return None, f"TorchScript cannot trace it ({type(exc).__name__}: {first[0] if first else ''})"
    return traced, "traced"


def _differs(eager: Mapping[str, Any], traced: Mapping[str, Any]) -> str:
    """What differs between two model outputs ('' when every tensor is close)."""
    import torch

    if set(eager) != set(traced):
        return f"outputs {sorted(traced)} against {sorted(eager)}"
    for name, value in eager.items():
        other = traced[name]
        if not isinstance(value, torch.Tensor):
            continue
        if not isinstance(other, torch.Tensor) or other.shape != value.shape:
            return f"{name}'s shape"
        tolerance = 1e-4 if value.dtype == torch.float32 else 1e-2
        if value.is_floating_point() and not torch.allclose(value, other, rtol=tolerance, atol=tolerance):
            return f"{name} by up to {(value - other).abs().max().item():.3g}"
        if not value.is_floating_point() and not torch.equal(value, other):
            return f"{name}'s values"
    return ""
