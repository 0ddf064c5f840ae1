"""What an explanation is, whatever made it: attributions per input element that add up to one model output.

Every explainer here answers the same shape (:class:`Explanation`), so the REST answer, the client and the notebook's
plots know one thing: for each row, the output explained (``targets``: a column of the explained output, e.g. a
class), the output's value at a reference (``base_values``: SHAP's expected value over the background, or the model
at integrated gradients' baseline), and one attribution per input element (``attributions``, the row's shape). For
SHAP ``base_value + sum(attributions)`` is the explained output exactly; for integrated gradients it is up to the
integral's approximation, which ``deltas`` reports.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError

TREE, LINEAR, KERNEL, INTEGRATED_GRADIENTS = (
    "TreeExplainer",
    "LinearExplainer",
    "KernelExplainer",
    "IntegratedGradients",
)
EXPLAINERS = {"tree": TREE, "linear": LINEAR, "kernel": KERNEL, "integrated_gradients": INTEGRATED_GRADIENTS}


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Attributions for ``n`` rows of one input."""

    method: str  # one of EXPLAINERS' values
    input_name: str  # the signature input explained (its alias)
    output_name: str  # the signature output explained (its alias), or what the explainer reads instead
    output_space: str  # what the output's numbers are: "probability", "log-odds", "raw", "prediction", ...
    targets: np.ndarray  # [n] int: the column of the output explained for each row (0 for a single output)
    attributions: np.ndarray  # [n, *row shape] float64
    base_values: np.ndarray  # [n] float64
    values: np.ndarray  # [n] float64: the explained output for each row, as the model computed it
    feature_names: tuple[str, ...] = ()
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # nsamples, steps, deltas...
    predictions: Any = None  # a client's: the answer's ``predictions`` (what :predict answers for the rows)

    def to_json(self) -> dict[str, Any]:
        """KServe v1's ``explanations`` list (one object per row) with what explained them, JSON-ready."""
        rows = []
        for i in range(len(self.targets)):
            rows.append(
                {
                    "target": int(self.targets[i]),
                    "base_value": float(self.base_values[i]),
                    "value": float(self.values[i]),
                    "attributions": self.attributions[i].tolist(),
                }
            )
        head: dict[str, Any] = {
            "explainer": self.method,
            "input": self.input_name,
            "output": self.output_name,
            "output_space": self.output_space,
        }
        if self.feature_names:
            head["feature_names"] = list(self.feature_names)
        head.update({k: _plain(v) for k, v in self.details.items()})
        return {"explainer": head, "explanations": rows}

    def tensors(self) -> dict[str, np.ndarray]:
        """The explanation as v2 output tensors, beside the model's own outputs (see :data:`TENSORS`)."""
        return {
            ATTRIBUTIONS: self.attributions.astype(np.float64),
            BASE_VALUES: self.base_values.astype(np.float64),
            VALUES: self.values.astype(np.float64),
            TARGETS: self.targets.astype(np.int64),
        }

    def head(self) -> dict[str, str | int | float]:
        """What explained it, as v2 response parameters (plain values; feature names comma-joined)."""
        head: dict[str, str | int | float] = {
            "explainer": self.method,
            "explained_input": self.input_name,
            "explained_output": self.output_name,
            "output_space": self.output_space,
        }
        if self.feature_names:
            head["feature_names"] = ",".join(self.feature_names)
        for key, value in self.details.items():
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                head[key] = value
        return head

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Explanation:
        """An ``:explain`` answer (:meth:`to_json` with ``predictions``) read back, numbers as numpy arrays."""
        head = dict(document["explainer"])
        rows = document["explanations"]
        known = ("explainer", "input", "output", "output_space", "feature_names")
        return cls(
            method=head["explainer"],
            input_name=head["input"],
            output_name=head["output"],
            output_space=head["output_space"],
            targets=np.array([r["target"] for r in rows], dtype=np.int64),
            attributions=np.array([r["attributions"] for r in rows], dtype=np.float64),
            base_values=np.array([r["base_value"] for r in rows], dtype=np.float64),
            values=np.array([r["value"] for r in rows], dtype=np.float64),
            feature_names=tuple(head.get("feature_names", ())),
            details={k: v for k, v in head.items() if k not in known},
            predictions=document.get("predictions", document.get("outputs")),
        )


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


@dataclasses.dataclass(frozen=True)
class Parameters:
    """What a request may say of its explanation (its ``"parameters"`` object; every key optional)."""

    explainer: str = "auto"  # "auto", or one of EXPLAINERS' keys
    target: int | None = None  # the output column to explain; default: the row's predicted one
    output: str = ""  # the signature output to explain (models with several)
    nsamples: int | None = None  # KernelExplainer: the most model evaluations per row (fewer when time is short)
    steps: int = 50  # integrated gradients: the integral's steps
    baseline: float = 0.0  # integrated gradients: the reference input, every element this value

    @classmethod
    def of(cls, document: Any) -> Parameters:
        """Read from a request's ``parameters`` (None: the defaults); a bad value is INVALID_ARGUMENT, naming it."""
        if document is None:
            return cls()
        if not isinstance(document, Mapping):
            raise _bad("parameters must be an object")
        unknown = sorted(set(document) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise _bad(f"unknown explain parameter(s): {', '.join(unknown)}; known: {', '.join(_KNOWN)}")
        explainer = document.get("explainer", "auto")
        if explainer != "auto" and explainer not in EXPLAINERS:
            raise _bad(f"explainer must be one of auto, {', '.join(EXPLAINERS)}; got {explainer!r}")
        target = _integer(document, "target", None, 0)
        nsamples = _integer(document, "nsamples", None, 1)
        steps = _integer(document, "steps", 50, 1, 10_000)
        baseline = document.get("baseline", 0.0)
        if isinstance(baseline, bool) or not isinstance(baseline, (int, float)):
            raise _bad(f"baseline must be a number; got {baseline!r}")
        output = document.get("output", "")
        if not isinstance(output, str):
            raise _bad(f"output must be the name of a signature output; got {output!r}")
        return cls(explainer, target, output, nsamples, steps if steps is not None else 50, float(baseline))


_KNOWN = ("explainer", "target", "output", "nsamples", "steps", "baseline")

# v2 (REST and gRPC): an inference request with the parameter "explain": true is explained; its other explain
# parameters are read from the same map (the rest of which belongs to other features: sequences, stickiness).
EXPLAIN_PARAMETER = "explain"
# The output tensors of an explained v2 request, beside the model's own.
ATTRIBUTIONS, BASE_VALUES, VALUES, TARGETS = (
    "explain_attributions", "explain_base_values", "explain_values", "explain_targets",
)  # fmt: skip
TENSORS = (ATTRIBUTIONS, BASE_VALUES, VALUES, TARGETS)


def v2_parameters(values: Mapping[str, Any]) -> Parameters | None:
    """A v2 request's explain parameters, or None when it asks for no explanation."""
    wanted = values.get(EXPLAIN_PARAMETER)
    if wanted is None or wanted is False:
        return None
    if wanted is not True:
        raise _bad(f'the parameter "{EXPLAIN_PARAMETER}" must be a boolean; got {wanted!r}')
    return Parameters.of({k: v for k, v in values.items() if k in _KNOWN})


def _integer(
    document: Mapping[str, Any], key: str, default: int | None, low: int, high: int | None = None
) -> int | None:
    value = document.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f" and at most {high}" if high is not None else ""
        raise _bad(f"{key} must be an integer of at least {low}{bound}; got {value!r}")
    return value


def _bad(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, f"Explain request: {message}")


class Budget:
    """The time an explanation may take: until ``deadline`` (a ``time.monotonic()``), checked between steps.

    The dataplane answers DEADLINE_EXCEEDED when the request's deadline passes; this lets the worker thread stop
    too, rather than finishing work nobody waits for, and lets KernelExplainer size its sampling to what is left.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise ServingError(
                Code.DEADLINE_EXCEEDED,
                f"The explanation ran out of its {self.seconds:g} s before {what}: send fewer rows, ask for fewer "
                "samples or steps, or allow it longer (the request's deadline, --rest_api_timeout_in_ms over REST)",
            )


def pick_targets(outputs: np.ndarray, target: int | None, what: str) -> np.ndarray:
    """The column explained for each row of ``outputs`` [n, k]: ``target`` if given, else the row's largest."""
    k = outputs.shape[1]
    if target is not None:
        if target >= k:
            raise _bad(f"target {target} is out of range: {what} has {k} output column(s), 0..{k - 1}")
        return np.full(len(outputs), target, dtype=np.int64)
    if k == 1:
        return np.zeros(len(outputs), dtype=np.int64)
    return np.argmax(outputs, axis=1).astype(np.int64)


def as_columns(values: Any) -> np.ndarray:
    """A model's output for n rows as [n, k] float64 (a vector is one column)."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        return array.reshape(-1, 1)
    return array.reshape(len(array), -1)


def per_target(stacked: np.ndarray, targets: Sequence[int] | np.ndarray) -> np.ndarray:
    """Row i's slice for column ``targets[i]`` of ``stacked`` [n, ..., k]."""
    index = np.asarray(targets)
    return np.stack([stacked[i, ..., int(index[i])] for i in range(len(index))]) if len(index) else stacked[..., 0]
