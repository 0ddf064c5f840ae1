"""Running predict, classify and regress on a servable, with TF Serving's validation and messages.

This is protocol-neutral: inputs are numpy arrays and serialized ``tf.Example``s; the REST and gRPC
frontends, and warmup replay, all come through here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.servable import Servable
from workbench.core.signatures import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    REGRESS_METHOD,
    Signature,
    TensorSpec,
    describe_array,
    describe_inputs,
    input_error,
    shape_text,
    type_name,
)

CLASSES = "classes"
SCORES = "scores"
REGRESS_OUTPUTS = "outputs"


def signature_name_or_default(name: str) -> str:
    return name or DEFAULT_SIGNATURE


def predict_signature(servable: Servable, name: str) -> Signature:
    sig = servable.signatures.get(signature_name_or_default(name))
    if sig is None:
        raise ServingError(
            Code.FAILED_PRECONDITION, f'Serving signature key "{signature_name_or_default(name)}" not found.'
        )
    return sig


def _join(names: Sequence[str]) -> str:
    return ",".join(sorted(names))


def predict(
    servable: Servable,
    signature: Signature,
    inputs: Mapping[str, np.ndarray],
    output_filter: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Validate a predict request against ``signature`` and run it (TF Serving's predict_util)."""
    feed, outputs = prepare_predict(signature, inputs, output_filter)
    try:
        return servable.run(signature, feed, outputs)
    except ServingError as exc:
        raise name_the_misfit_input(signature, feed, exc) from None


def prepare_predict(
    signature: Signature, inputs: Mapping[str, np.ndarray], output_filter: Sequence[str] = ()
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The tensors to feed and the outputs to fetch for a predict request, or TF Serving's error."""
    inputs = _columns_as_matrix(signature, inputs)
    expected = signature.inputs
    sent = list(inputs)
    if len(sent) > len(expected) or (len(sent) < len(expected) and not signature.defaults):
        extra = [a for a in sent if a not in expected]
        missing = [a for a in expected if a not in inputs]
        raise invalid_argument(
            f"input size does not match signature: {len(sent)}!={len(expected)} "
            f"len({{{_join(sent)}}}) != len({{{_join(list(expected))}}}). "
            f"Sent extra: {{{_join(extra)}}}. Missing but required: {{{_join(missing)}}}. "
            f"Signature inputs: {describe_inputs(expected)}."
        )
    feed: dict[str, np.ndarray] = {}
    for alias in sent:
        if alias not in expected:
            raise invalid_argument(
                f"input tensor alias not found in signature: {alias}. "
                f"Inputs expected to be in the set {{{_join(list(expected))}}}. "
                f"Signature inputs: {describe_inputs(expected)}."
            )
        feed[alias] = _check_dtype(expected[alias], inputs[alias])
    for alias in expected:
        if alias not in feed:
            if alias not in signature.defaults:
                raise invalid_argument(
                    f"Missing input: {alias} is neither in the request nor in the defaults. "
                    f"Signature inputs: {describe_inputs(expected)}."
                )
            feed[alias] = signature.defaults[alias]

    outputs: list[str] = []
    for alias in output_filter:
        if alias not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} "
                f"Outputs expected to be in the set {{{_join(list(signature.outputs))}}}."
            )
        if alias in outputs:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        outputs.append(alias)
    if not outputs:
        outputs = list(signature.outputs)
    return feed, outputs


def _columns_as_matrix(signature: Signature, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """A request that sends a model's features by name, as the one matrix the model takes (columns in order)."""
    if not signature.features or len(signature.inputs) != 1 or not any(a in signature.features for a in inputs):
        return inputs
    ((alias, matrix),) = signature.inputs.items()
    if alias in inputs:
        raise invalid_argument(
            f'Send either the input "{alias}" or the features {_join(list(signature.features))} by name, not both'
        )
    unknown = [a for a in inputs if a not in signature.features]
    missing = [f for f in signature.features if f not in inputs]
    if unknown or missing:
        raise invalid_argument(
            f"A request by feature name must send every feature of the model and nothing else. "
            f"Missing: {{{_join(missing)}}}. Unknown: {{{_join(unknown)}}}. Features: {', '.join(signature.features)}."
        )
    columns = [_check_dtype(dataclasses.replace(matrix, alias=f, shape=(-1,)), inputs[f]) for f in signature.features]
    if any(c.ndim != 1 for c in columns) or len({len(c) for c in columns}) != 1:
        shapes = ", ".join(f"{f} {describe_array(c)}" for f, c in zip(signature.features, columns, strict=True))
        raise invalid_argument(f"Each feature must be a column of the same length; received {shapes}")
    return {alias: np.stack(columns, axis=1)}


def _check_dtype(spec: TensorSpec, value: np.ndarray) -> np.ndarray:
    """Fail clearly when a tensor's type is not the one its graph tensor takes (TensorFlow's own check)."""
    if spec.dtype == value.dtype:
        return value
    if spec.dtype.kind == "O" and value.dtype.kind in "OSU":
        return value
    sent = type_name(value.dtype)
    raise input_error(
        spec, describe_array(value), f"Expects arg[{spec.alias}] to be {spec.dtype_name} but {sent} is provided"
    )


def name_the_misfit_input(signature: Signature, feed: Mapping[str, np.ndarray], error: ServingError) -> ServingError:
    """The error of a failed run, leading with the input whose shape the signature does not declare.

    Shapes are not checked before running, as in TF Serving: graphs take more than their signatures say
    (half_plus_two declares x as [-1,1] and serves [3]). When TensorFlow refuses a request, though, an input
    of another shape than declared is the likely cause, and TensorFlow's message names a node, never the
    input; so the error names it, with what was expected and received, and keeps TensorFlow's words.
    """
    if error.code is not Code.INVALID_ARGUMENT:
        return error
    for alias, value in feed.items():
        spec = signature.inputs.get(alias)
        if spec is not None and not spec.admits_shape(value.shape):
            return input_error(spec, describe_array(value), error.message)
    return error


# --------------------------------------------------------------------------------- classify / regress
# What TF Serving's classifier.cc / regressor.cc validate (PreProcessClassification / PreProcessRegression):
# the signature's method_name only under --enable_signature_method_name_check, which is off by default (so TF2
# exports, whose signatures all say "predict", serve :classify and :regress); one input; the outputs by alias.
# The input's declared dtype is never looked at: the serialized examples are fed to the tensor the input
# names, and only that tensor's real type matters (TensorSpec.dtype is the graph's).
def _example_signature(servable: Servable, name: str, method: str) -> Signature:
    key = signature_name_or_default(name)
    if not name:
        # A model whose serving_default is a predict (every non-TensorFlow platform) but which also has a signature
        # of the method asked for, named after it ("classify", "regress"): that one, rather than TF Serving's error.
        default, named = servable.signatures.get(key), servable.signatures.get(method.rsplit("/", 1)[-1])
        if named is not None and named.method_name == method and (default is None or default.method_name != method):
            key = named.name
    sig = servable.signatures.get(key)
    if sig is None:
        raise invalid_argument(f"No signature was found with the name: {key}")
    if len(sig.inputs) != 1:
        raise invalid_argument(f"Expected one input Tensor. Signature {key} has: {describe_inputs(sig.inputs)}")
    return sig


def _signature_outputs(sig: Signature) -> str:
    return f"{_join(list(sig.outputs))} (signature {sig.name}, method {sig.method_name})"


@dataclasses.dataclass(frozen=True)
class ExamplesCall:
    """A classify or regress request ready to run: the signature, its feed, and what to fetch."""

    signature: Signature
    feed: dict[str, np.ndarray]
    outputs: list[str]
    count: int


def _examples_feed(sig: Signature, examples: Sequence[bytes]) -> dict[str, np.ndarray]:
    if not examples:
        raise invalid_argument("Input is empty.")
    ((alias, spec),) = sig.inputs.items()
    if spec.dtype.kind != "O":
        raise input_error(
            spec,
            f"{len(examples)} serialized tf.Example(s)",
            f"signature {sig.name} does not read tf.Examples; send its input to :predict",
        )
    batch = np.empty(len(examples), dtype=object)
    batch[:] = list(examples)
    return {alias: batch}


def _shape(a: np.ndarray) -> str:
    return shape_text(a.shape)


Classifications = list[list[tuple[str, float]]]


def classify_call(servable: Servable, signature_name: str, examples: Sequence[bytes]) -> ExamplesCall:
    sig = _example_signature(servable, signature_name, CLASSIFY_METHOD)
    wanted = [o for o in (CLASSES, SCORES) if o in sig.outputs]
    # TF Serving refuses more than two outputs; workbench lets a TF2 export's extra outputs go unfetched.
    if len(sig.outputs) not in (1, 2) and sig.method_name == CLASSIFY_METHOD:
        raise invalid_argument(f"Expected one or two output Tensors, found {len(sig.outputs)}")
    if not wanted:
        raise invalid_argument(
            'Expected classification signature outputs to contain at least one of "classes" or "scores". '
            f"Found: {_signature_outputs(sig)}"
        )
    return ExamplesCall(sig, _examples_feed(sig, examples), wanted, len(examples))


def classify_results(call: ExamplesCall, result: Mapping[str, np.ndarray]) -> Classifications:
    """Per example, a list of (label, score), with TF Serving's checks of the outputs' shapes and types."""
    n = call.count
    classes, scores = result.get(CLASSES), result.get(SCORES)
    num_classes = None
    for label, tensor in ((CLASSES, classes), (SCORES, scores)):
        if tensor is None:
            continue
        if tensor.ndim != 2:
            raise invalid_argument(f"Expected Tensor shape: [batch_size num_classes] but got {_shape(tensor)}")
        if tensor.shape[0] != n:
            raise invalid_argument(f"Input batch size did not match output batch size: {n} vs. {tensor.shape[0]}")
        if num_classes is not None and tensor.shape[1] != num_classes and classes is not None and scores is not None:
            raise invalid_argument(
                f"Tensors class and score should match in shape, but got {_shape(classes)} vs. {_shape(scores)}"
            )
        num_classes = tensor.shape[1]
        if label == CLASSES and tensor.dtype.kind not in "OSU":
            raise invalid_argument(f"Expected classes Tensor of DT_STRING. Got: {tensor.dtype}")
        if label == SCORES and tensor.dtype != np.float32:
            raise invalid_argument(f"Expected scores Tensor of DT_FLOAT. Got: {tensor.dtype}")
    assert num_classes is not None
    out: Classifications = []
    for i in range(n):
        row = []
        for j in range(num_classes):
            raw = classes[i, j] if classes is not None else b""
            label = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            score = float(scores[i, j]) if scores is not None else 0.0
            row.append((label, score))
        out.append(row)
    return out


def classify(servable: Servable, signature_name: str, examples: Sequence[bytes]) -> tuple[str, Classifications]:
    """Run a classification signature; per example, a list of (label, score)."""
    call = classify_call(servable, signature_name, examples)
    return call.signature.name, classify_results(call, servable.run(call.signature, call.feed, call.outputs))


def regress_call(servable: Servable, signature_name: str, examples: Sequence[bytes]) -> ExamplesCall:
    sig = _example_signature(servable, signature_name, REGRESS_METHOD)
    if len(sig.outputs) != 1:
        raise invalid_argument(f"Expected one output Tensor. Found: {_signature_outputs(sig)}")
    if REGRESS_OUTPUTS not in sig.outputs:
        raise invalid_argument(
            f'No regression outputs found: expected "{REGRESS_OUTPUTS}". Found: {_signature_outputs(sig)}'
        )
    return ExamplesCall(sig, _examples_feed(sig, examples), [REGRESS_OUTPUTS], len(examples))


def regress_results(call: ExamplesCall, result: Mapping[str, np.ndarray]) -> list[float]:
    tensor = result[REGRESS_OUTPUTS]
    n = call.count
    if not (tensor.ndim == 1 or (tensor.ndim == 2 and tensor.shape[1] == 1)):
        raise invalid_argument(
            f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got {_shape(tensor)}"
        )
    if tensor.shape[0] != n:
        raise invalid_argument(f"Input batch size did not match output batch size: {n} vs. {tensor.shape[0]}")
    if tensor.dtype != np.float32:
        raise invalid_argument(f"Expected output Tensor of DT_FLOAT.  Got: {tensor.dtype}")
    return [float(v) for v in tensor.reshape(-1)]


def regress(servable: Servable, signature_name: str, examples: Sequence[bytes]) -> tuple[str, list[float]]:
    """Run a regression signature; one float per example."""
    call = regress_call(servable, signature_name, examples)
    return call.signature.name, regress_results(call, servable.run(call.signature, call.feed, call.outputs))


@dataclasses.dataclass(frozen=True)
class InferenceTask:
    signature_name: str
    method_name: str


def multi_inference(
    servable: Servable, tasks: Sequence[InferenceTask], examples: Sequence[bytes]
) -> list[tuple[str, Classifications | list[float]]]:
    """Several classify/regress tasks on the same examples and model (TF Serving's MultiInference)."""
    if not tasks:
        raise invalid_argument("Tasks are empty")
    seen: set[str] = set()
    results: list[tuple[str, Classifications | list[float]]] = []
    for task in tasks:
        key = signature_name_or_default(task.signature_name)
        if key in seen:
            raise invalid_argument("Duplicate evaluation of signature: " + key)
        seen.add(key)
        if task.method_name == CLASSIFY_METHOD:
            results.append(classify(servable, key, examples))
        elif task.method_name == REGRESS_METHOD:
            results.append(regress(servable, key, examples))
        else:
            raise ServingError(Code.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}")
    return results
