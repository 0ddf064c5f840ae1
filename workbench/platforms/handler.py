"""Handlers (TorchServe's pattern): ``handler.py`` beside any model runs per request around the batched model call.

A ``handler.py`` in a version folder defines any of::

    def preprocess(inputs):          # the request's tensors (dict of numpy arrays) → the model's inputs
    def postprocess(outputs):        # the model's outputs (all of them) → the answer's tensors
    signatures = {...}               # the signatures clients see, when the handler changes them

``signatures`` maps a signature name of the model to ``{"inputs": {...}, "outputs": {...}}`` in
:mod:`~workbench.platforms.python`'s form, e.g. raw bytes in and a label out around a classifier::

    signatures = {"serving_default": {"inputs": {"image": ("string", [-1])}, "outputs": {"label": ("string", [-1])}}}

It may also be a function ``signatures(model_signatures)`` given the model's own signatures (name →
:class:`~workbench.core.signatures.Signature`) and returning the same kind of mapping. Signatures it does not
declare keep the model's. preprocess and postprocess apply to every signature.

In a server, preprocess and postprocess run on the serving threads, one request at a time, and the model call
in between goes through the model's own batcher, so requests are still batched with each other. Raise
``ValueError`` for a request that cannot be handled (400 / INVALID_ARGUMENT). ``handler.py`` is Python from
the repository: it loads only when the server allows Python models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.footprint import Footprint
from workbench.core.inference import prepare_predict
from workbench.core.servable import Composite, Members, Servable
from workbench.core.signatures import Signature
from workbench.platforms._user_code import (
    call_user,
    conform_outputs,
    declared_signature,
    forget_module,
    import_file,
    require_python,
)
from workbench.platforms.base import LoadPolicy

Tensors = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class _Route:
    """How one public signature reaches the model: which signature of it, and what to fetch from it."""

    inner: Signature
    changed: bool  # the handler declares this signature: postprocess gets all of the model's outputs


class HandledServable(Composite):
    """A model wrapped in its version folder's handler.py."""

    def __init__(self, inner: Servable, module: ModuleType, file: Path) -> None:
        self.name, self.version, self.path = inner.name, inner.version, inner.path
        self.inner = inner
        self._module = module
        self._label = f"handler.py of model {inner.name} version {inner.version}"
        self._preprocess = _hook(module, "preprocess", file)
        self._postprocess = _hook(module, "postprocess", file)
        declared = _declared_signatures(module, inner.signatures, file)
        self.signatures = {**inner.signatures, **declared}
        self._routes = {name: _Route(inner.signatures[name], name in declared) for name in self.signatures}

    # ---------------------------------------------------------------------------------- the three steps
    def _before(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> tuple[Tensors, list[str]]:
        """preprocess, then the model's feed and the outputs to fetch from it."""
        route = self._routes[signature.name]
        feed: Any = dict(inputs)
        if self._preprocess is not None:
            feed = call_user(self._preprocess, f"{self._label}: preprocess", feed)
            if not isinstance(feed, Mapping):
                raise ServingError(
                    Code.INTERNAL, f"{self._label}: preprocess returned {type(feed).__name__}, not a dict of arrays"
                )
            feed = {alias: np.asarray(value) for alias, value in feed.items()}
        try:
            model_feed, _ = prepare_predict(route.inner, feed)
        except ServingError as exc:
            raise ServingError(
                exc.code, f"{self._label}: the model refused what preprocess gave it: {exc.message}"
            ) from None
        # postprocess sees every output of the model; without one, only what the client asked for is fetched.
        fetch = list(outputs) if self._postprocess is None and not route.changed else list(route.inner.outputs)
        return model_feed, fetch

    def _after(self, signature: Signature, result: Tensors, outputs: Sequence[str]) -> Tensors:
        """postprocess, then the outputs asked for, typed as the signature declares them."""
        answer: Any = result
        if self._postprocess is not None:
            answer = call_user(self._postprocess, f"{self._label}: postprocess", dict(result))
        return conform_outputs(signature, answer, outputs, f"{self._label}: postprocess")

    # ---------------------------------------------------------------------------------- running
    async def run_with(
        self, members: Members, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Tensors:
        feed, fetch = await members.call(self._before, signature, inputs, outputs)
        result = await members.run(self.inner, self._routes[signature.name].inner, feed, fetch)
        return await members.call(self._after, signature, result, outputs)

    def run(self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Tensors:
        feed, fetch = self._before(signature, inputs, outputs)
        result = self.inner.run(self._routes[signature.name].inner, feed, fetch)
        return self._after(signature, result, outputs)

    def memory_held(self) -> Footprint | None:
        return self.inner.memory_held()  # the model's tensors; the handler's own code holds nothing counted

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            forget_module(self._module)


def _hook(module: ModuleType, name: str, file: Path) -> Callable[..., Any] | None:
    hook = getattr(module, name, None)
    if hook is not None and not callable(hook):
        raise ServingError(Code.INVALID_ARGUMENT, f"{file}: {name} must be a function of one dict of arrays")
    return hook


def _declared_signatures(module: ModuleType, model: Mapping[str, Signature], file: Path) -> dict[str, Signature]:
    declared: Any = getattr(module, "signatures", None)
    if declared is None:
        return {}
    if callable(declared):
        declared = call_user(declared, f"{file}: signatures(model_signatures)", dict(model))
    if not isinstance(declared, Mapping):
        raise ServingError(Code.INVALID_ARGUMENT, f"{file}: signatures must map signature names to {{inputs, outputs}}")
    signatures = {}
    for name, spec in declared.items():
        if name not in model:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f'{file} declares signature "{name}", which the model does not have '
                f"(it has {', '.join(sorted(model)) or 'none'})",
            )
        inner = model[name]
        signatures[name] = declared_signature(
            name, spec, f"{file}: signatures[{name}]", batchable=inner.batchable, method_name=inner.method_name
        )
    return signatures


def with_handler(servable: Servable, file: Path, policy: LoadPolicy) -> Servable:
    """``servable`` wrapped in the handler ``file`` (its version folder's handler.py)."""
    require_python(policy, file)
    module = import_file(file, "handler", servable.name, servable.version)
    try:
        if not any(hasattr(module, hook) for hook in ("preprocess", "postprocess", "signatures")):
            raise ServingError(
                Code.INVALID_ARGUMENT, f"{file} defines none of preprocess(inputs), postprocess(outputs), signatures"
            )
        return HandledServable(servable, module, file)
    except BaseException:
        forget_module(module)
        raise
