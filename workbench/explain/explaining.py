"""Which explainer explains a servable, and running it: the one entry the dataplane calls (on a worker thread).

The choice, for ``"explainer": "auto"`` (a request may name one instead):

- a tabular model (scikit-learn, XGBoost, LightGBM): TreeExplainer when shap reads it as trees; LinearExplainer
  for scikit-learn's linear models, with the version's background; else KernelExplainer on its probabilities
  (``predict_proba``) or predictions, with the version's background;
- a SavedModel (Keras, TensorFlow) or a PyTorch model: integrated gradients, on images and tables alike;
- any other model with one numeric matrix input (ONNX, a Python model): KernelExplainer, with a background;
- a composite (pipeline, handler around other models) or a model without any of that: UNIMPLEMENTED, naming
  what is missing. A missing background is FAILED_PRECONDITION, naming the export argument that adds one.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.core.differentiable import Differentiable, Gradients
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Composite, Servable
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.explain import gradients, shapley
from workbench.explain.background import read_background
from workbench.platforms.tabular import MATRIX, TabularServable
from workbench.protocol.attributions import (
    EXPLAINERS,
    INTEGRATED_GRADIENTS,
    KERNEL,
    LINEAR,
    TREE,
    Budget,
    Explanation,
    Parameters,
    pick_targets,
)

PROBABILITIES_SIGNATURE = "predict_proba"
# Each served version's background rows (None: it has none), dropped with the version.
_BACKGROUNDS: weakref.WeakKeyDictionary[Servable, np.ndarray | None] = weakref.WeakKeyDictionary()
_BACKGROUNDS_LOCK = threading.Lock()
_TREE_SPACES = {"log_odds": "log-odds", "probability": "probability", "raw_value": "prediction"}


@dataclasses.dataclass(frozen=True)
class Answer:
    """An explanation, and the signature's own answer for the same rows (KServe's ``predictions``)."""

    explanation: Explanation
    signature: Signature
    predictions: dict[str, np.ndarray]


def explain(
    servable: Servable, signature: Signature, feed: Mapping[str, np.ndarray], parameters: Parameters, budget: Budget
) -> Answer:
    """Explain the rows of ``feed`` (validated for ``signature``) within ``budget``."""
    label = f"Model {servable.name} version {servable.version}"
    if isinstance(servable, Composite):
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"{label} is a composite (a pipeline or a handler around other models) and has no explainer: explain "
            "the models it runs",
        )
    if len(feed) != 1:
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"{label}: explanations attribute one input; signature {signature.name} has {len(feed)} "
            f"({', '.join(sorted(feed))})",
        )
    ((alias, rows),) = feed.items()
    if isinstance(servable, TabularServable):
        explanation = _tabular(servable, signature, rows, parameters, budget, label)
    else:
        model = _differentiable(servable, signature, alias, parameters, label)
        if model is not None:
            explanation = _integrated_gradients(model, alias, rows, parameters, budget, label)
        else:
            explanation = _kernel_any(servable, signature, alias, rows, parameters, budget, label)
    predictions = servable.run(signature, feed, list(signature.outputs))
    return Answer(explanation, signature, predictions)


# --------------------------------------------------------------------------------------------- tabular
def _tabular(
    servable: TabularServable, signature: Signature, rows: np.ndarray, p: Parameters, budget: Budget, label: str
) -> Explanation:
    model = servable.model.source
    names = servable.model.matrix.features
    wanted = p.explainer
    if wanted in ("auto", "tree") and model is not None:
        explainer = shapley.tree_explainer(model)
        if explainer is not None:
            budget.check("the trees were read")
            values, expected = shapley.tree(explainer, rows)
            space = _TREE_SPACES.get(str(getattr(explainer.model, "tree_output", None)), "raw (margin)")
            return _shapley(TREE, "raw_output", space, values, expected, p.target, names, label)
        if wanted == "tree":
            raise ServingError(
                Code.FAILED_PRECONDITION, f"{label}: TreeExplainer does not read a {type(model).__name__}"
            )
    if wanted == "tree":
        raise ServingError(Code.FAILED_PRECONDITION, f"{label}: the platform keeps no model TreeExplainer can read")
    if wanted in ("auto", "linear") and model is not None and shapley.is_linear(model):
        background = _background(servable, LINEAR, label)
        values, expected = shapley.linear(model, background.astype(np.float64), rows)
        space = "log-odds" if hasattr(model, "predict_proba") else "margin" if servable.model.classes else "prediction"
        return _shapley(LINEAR, "decision_function", space, values, expected, p.target, names, label)
    if wanted == "linear":
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{label}: LinearExplainer reads scikit-learn's linear models; this is a {type(model).__name__}",
        )
    if wanted == "integrated_gradients":
        raise ServingError(
            Code.FAILED_PRECONDITION, f"{label}: integrated gradients need a differentiable model (Keras, PyTorch)"
        )
    # KernelExplainer on probabilities where there are any: class labels are not a quantity to attribute.
    if not p.output and signature.name == DEFAULT_SIGNATURE and PROBABILITIES_SIGNATURE in servable.signatures:
        signature = servable.signatures[PROBABILITIES_SIGNATURE]
    return _kernel(servable, signature, MATRIX, rows, p, budget, label, names)


def _shapley(
    method: str,
    output: str,
    space: str,
    values: np.ndarray,
    expected: np.ndarray,
    target: int | None,
    names: tuple[str, ...],
    label: str,
    details: Mapping[str, Any] | None = None,
) -> Explanation:
    explained = expected[np.newaxis, :] + values.sum(axis=1)  # [n, k]: SHAP's additivity gives the outputs
    targets = pick_targets(explained, target, label)
    n = np.arange(len(targets))
    return Explanation(
        method=method,
        input_name=MATRIX,
        output_name=output,
        output_space=space,
        targets=targets,
        attributions=values[n, :, targets],
        base_values=expected[targets],
        values=explained[n, targets],
        feature_names=names,
        details=dict(details or {}),
    )


# --------------------------------------------------------------------------------------------- kernel
def _kernel_any(
    servable: Servable,
    signature: Signature,
    alias: str,
    rows: np.ndarray,
    p: Parameters,
    budget: Budget,
    label: str,
) -> Explanation:
    platform = servable.platform or "unknown"
    if p.explainer not in ("auto", "kernel"):
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{label} (platform {platform}): {EXPLAINERS[p.explainer]} does not apply to it. TreeExplainer and "
            "LinearExplainer read scikit-learn, XGBoost and LightGBM models; integrated gradients explain "
            "TensorFlow and PyTorch models; KernelExplainer explains any model of one numeric matrix input",
        )
    if rows.ndim != 2 or rows.dtype.kind not in "biuf":
        raise ServingError(
            Code.UNIMPLEMENTED,
            f"{label} (platform {platform}) has no explainer for this input: KernelExplainer, the general "
            f"fallback, explains one numeric matrix input [rows, features]; input {alias} is {rows.dtype} "
            f"{list(rows.shape)}. Integrated gradients explain TensorFlow and PyTorch models",
        )
    return _kernel(servable, signature, alias, rows, p, budget, label, signature.features)


def _kernel(
    servable: Servable,
    signature: Signature,
    alias: str,
    rows: np.ndarray,
    p: Parameters,
    budget: Budget,
    label: str,
    names: tuple[str, ...],
) -> Explanation:
    background = _background(servable, KERNEL, label)
    output = _output(signature, p, label)
    dtype = signature.inputs[alias].dtype

    def predict(x: np.ndarray) -> np.ndarray:
        answer = servable.run(signature, {alias: np.asarray(x, dtype=dtype)}, [output])[output]
        return np.asarray(answer, dtype=np.float64)

    if background.ndim != 2 or background.shape[1] != rows.shape[1]:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{label}: its background data set has shape {list(background.shape)}; the model takes rows of "
            f"{rows.shape[1]} features",
        )
    values, expected, used = shapley.kernel(predict, background.astype(np.float64), rows, budget, p.nsamples)
    space = "probability" if signature.name == PROBABILITIES_SIGNATURE else "prediction"
    details = {"signature": signature.name, "nsamples": used}
    return dataclasses.replace(
        _shapley(KERNEL, output, space, values, expected, p.target, names, label, details), input_name=alias
    )


def _output(signature: Signature, p: Parameters, label: str) -> str:
    # Floating-point outputs first: scores and probabilities are what is explained, not the class ids beside them.
    numeric = [a for a, spec in signature.outputs.items() if spec.dtype.kind == "f"]
    numeric += [a for a, spec in signature.outputs.items() if spec.dtype.kind in "biu"]
    if p.output:
        if p.output not in signature.outputs:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{label}: signature {signature.name} has no output {p.output}; it has {', '.join(signature.outputs)}",
            )
        if p.output not in numeric:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{label}: output {p.output} is not numeric; it cannot be explained"
            )
        return p.output
    if not numeric:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{label}: signature {signature.name} has no numeric output to explain (its outputs: "
            f"{', '.join(signature.outputs)})",
        )
    return numeric[0]


def _background(servable: Servable, method: str, label: str) -> np.ndarray:
    # Read once per servable: a version's folder does not change under it (a new model is a new version).
    with _BACKGROUNDS_LOCK:
        if servable not in _BACKGROUNDS:
            _BACKGROUNDS[servable] = read_background(servable.path)
        background = _BACKGROUNDS[servable]
    if background is None:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{label} has no background data set, which {method} needs: export the model with one, "
            "workbench.export(model, name, background=X_train[:100]), or save explain_background.npy in the "
            "version's folder",
        )
    return background


# --------------------------------------------------------------------------------------------- gradients
def _differentiable(
    servable: Servable, signature: Signature, alias: str, p: Parameters, label: str
) -> Gradients | None:
    """The servable's gradients where its platform gives them (None: it has none, or the request asked for another
    explainer)."""
    if p.explainer not in ("auto", "integrated_gradients"):
        return None
    if isinstance(servable, Differentiable):
        return servable.gradients(signature, alias, _output(signature, p, label))
    if p.explainer == "integrated_gradients":
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"{label} (platform {servable.platform or 'unknown'}) is not differentiable here: integrated gradients "
            "explain TensorFlow and PyTorch models",
        )
    return None


def _integrated_gradients(
    model: Gradients, alias: str, rows: np.ndarray, p: Parameters, budget: Budget, label: str
) -> Explanation:
    targets, attributions, base, values, deltas = gradients.integrated_gradients(
        model, rows, p.baseline, p.steps, p.target, budget, label
    )
    return Explanation(
        method=INTEGRATED_GRADIENTS,
        input_name=alias,
        output_name=model.output_name,
        output_space="raw",
        targets=targets,
        attributions=attributions,
        base_values=base,
        values=values,
        details={"steps": p.steps, "baseline": p.baseline, "deltas": deltas},
    )
