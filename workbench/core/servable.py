"""What the manager loads: a model version that runs its signatures on numpy batches.

The manager, the batcher, the dataplane and the frontends know only :class:`Servable` and :class:`Loader`;
each framework is one module under :mod:`workbench.platforms` behind them (TF Serving's Source → Loader →
Manager split). Holding a servable for a request and draining it before it closes is not the servable's
business: the manager's :class:`~workbench.models.harness.Harness` does that for every platform alike.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import numpy as np

from workbench.core.errors import Code, ServingError
from workbench.core.footprint import Footprint
from workbench.core.sequence_contract import SequenceSettings
from workbench.core.signatures import Signature

T = TypeVar("T")


class Servable(abc.ABC):
    """A loaded model version.

    ``run`` may be called from several threads at once (the batcher's and the dataplane's); a platform whose
    library is not thread-safe serialises inside. ``close`` is called once, after the last request finished.
    """

    name: str
    version: int
    path: str
    signatures: Mapping[str, Signature]
    platform: str = ""  # the platform that loaded it (set by workbench.platforms.Loader), for metadata
    # A model that came with its own Triton config (config.pbtxt), as JSON: the v2 config answer is that config.
    model_config: Mapping[str, Any] | None = None
    # A stateful model's sequence batching: its requests run through the sequence batcher, one step of a sequence
    # at a time with that sequence's state (it then implements run_step: workbench.batching.sequence_batcher).
    sequence: SequenceSettings | None = None
    # A decoupled model (Triton's decoupled transaction policy) answers a request with 0..n responses: it implements
    # run_decoupled, is never batched across requests, and is served over streams only (ModelStreamInfer, generate).
    decoupled: bool = False
    # Class labels of outputs (output alias → one label per index), for Triton's classification extension.
    labels: Mapping[str, Sequence[str]] = MappingProxyType({})
    # What its load found that did not stop it serving and that the operator must see (an MLflow model logged with
    # other packages than the server runs): the version's status says it (the model's description, v2's repository
    # index reason and its REST metadata's parameters), beside the load's log line.
    load_warnings: tuple[str, ...] = ()

    @abc.abstractmethod
    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run ``signature`` on ``inputs`` (keyed by alias) and return the ``outputs`` asked for (by alias)."""

    def run_decoupled(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        """A decoupled model's responses to one request, each produced when the caller asks for the next.

        Called on the event loop, so it must return at once (a generator does: its body runs on the first
        ``next``); iterated on worker threads, one ``next`` at a time; ``close()`` on it stops it between responses.
        An iterator that also has ``cancel()`` is told from the event loop, at once, when the request ends early
        (the client left, the deadline passed), even while a ``next`` still waits.
        """
        raise ServingError(Code.UNIMPLEMENTED, f"Model {self.name} version {self.version} is not decoupled")

    def close(self) -> None:  # noqa: B027 - optional: most platforms hold nothing to free by hand
        """Free what the model holds (sessions, native handles, GPU memory)."""

    def memory_held(self) -> Footprint | None:
        """The host and GPU bytes this version knows it holds (its tensors), asked once it has loaded; None where it
        does not say. A memory budget charges at least this (:func:`~workbench.models.memory_policy.charge_of`),
        beside what the load was measured to add, so a version counts for its weights also where the measurement
        cannot see them (another process, an allocator that reuses freed memory, other GPU work meanwhile)."""
        return None


class PerRequestServable(Servable):
    """A servable that takes a batch as the list of its requests and answers each on its own (Triton's Python
    backend: ``execute(requests)``). The batcher hands it the requests it grouped instead of concatenating them, and
    an answer may be an error for that request alone."""

    @abc.abstractmethod
    def run_requests(
        self, signature: Signature, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
    ) -> list[dict[str, np.ndarray] | ServingError]:
        """One answer per feed, in order: its outputs, or the error of that request."""

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        (answer,) = self.run_requests(signature, [inputs], outputs)
        if isinstance(answer, ServingError):
            raise answer
        return answer


class Loader(Protocol):
    """Loads the version folder ``path`` of model ``name``; ``platform`` is the model config's, or "" to detect."""

    def __call__(self, name: str, version: int, path: str, platform: str = "") -> Servable: ...


class Members(Protocol):
    """How a composite servable reaches the other models of its server, through their own batchers."""

    async def predict(
        self, model: str, version: int | None, label: str | None, signature_name: str, inputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Run a predict on another model, resolved as a request for it would be."""

    async def run(
        self, servable: Servable, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run ``servable`` (already held by the caller) through its batcher."""

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking Python (a handler's preprocess) on the serving threads, off the event loop."""


class Composite(Servable):
    """A servable whose answer is made of other servables' answers: a handler around a model, a pipeline.

    The dataplane runs it with :meth:`run_with`, which reaches the members through their batchers; ``run`` is
    the same without a server (warmup and in-process checks), member by member.
    """

    @abc.abstractmethod
    async def run_with(
        self,
        members: Members,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
    ) -> dict[str, np.ndarray]: ...

    def members(self) -> Sequence[str]:
        """The names of the other models this one needs serving (none for a handler around its own model)."""
        return ()


def streams_only(label: str) -> ServingError:
    """A decoupled model's refusal of a caller that wants one answer (the dataplane streams such a model; this is
    the backstop for any other caller)."""
    return ServingError(
        Code.UNIMPLEMENTED,
        f"{label} is decoupled (it answers 0..n responses per request): stream it with gRPC ModelStreamInfer or "
        "REST /generate_stream",
    )


class FinalResponse(dict[str, np.ndarray]):
    """A decoupled model's response that is also its request's last (Triton's response sent together with the final
    flag): a stream marks it final instead of sending an empty final response after it."""
