"""Servables that answer an Open Inference Protocol (v2) request as a whole, parameters and all.

Most servables take numpy inputs by alias and give numpy outputs (:class:`~workbench.core.servable.Servable`), which
the batcher can merge and split. Some model APIs are written against the request itself: MLServer's ``MLModel``
reads the request's and each input's ``parameters`` (``content_type`` chooses how an input decodes), may take inputs
of any name, and answers outputs it chooses, each with parameters of its own. Such a servable is a
:class:`WholeRequestServable`: the v2 frontends hand it a :class:`WholeRequest` and write back the
:class:`WholeResponse` it gives, through the data plane (held, counted, bounded by the deadline), never batched
across requests.

A tensor keeps what the wire said: its datatype, its shape as sent and its elements flat, row-major, because such
APIs accept what v2 clients send and the stricter path refuses (MLServer's examples send one BYTES element of shape
``[11]``: eleven bytes of text).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import numpy as np

from workbench.core.servable import Servable


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One input or output as v2 carries it: ``data`` holds the elements flat (BYTES in an object array: ``bytes``,
    or ``str`` where the wire carried text, REST's JSON), ``shape`` the shape the sender gave, ``parameters`` its own
    (``content_type``...)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RequestedOutput:
    name: str
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WholeRequest:
    inputs: tuple[Tensor, ...]
    outputs: tuple[RequestedOutput, ...] = ()
    id: str | None = None
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WholeResponse:
    outputs: tuple[Tensor, ...]
    id: str | None = None
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model_version: str | None = None  # what the model says of itself; the frontends answer the served version


class WholeRequestServable(Servable):
    """A servable answering whole v2 requests (see the module's docstring).

    Both methods are called on the server's event loop and may await (the servable runs its model's code where it
    chooses). ``answer_stream`` takes the requests of one stream (one, over REST) and yields the responses as the
    model makes them; closing the iterator it returns stops the model. ``streams_as_responses`` says how its gRPC
    streams are written: MLServer's ``ModelStreamInfer`` sends bare ``ModelInferResponse`` messages, Triton's wraps
    each in a ``ModelStreamInferResponse``.
    """

    streams_as_responses: bool = False

    @abc.abstractmethod
    async def answer(self, request: WholeRequest) -> WholeResponse: ...

    @abc.abstractmethod
    def answer_stream(self, requests: AsyncIterator[WholeRequest]) -> AsyncGenerator[WholeResponse, None]: ...
