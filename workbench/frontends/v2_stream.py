"""Streaming inference, as Triton streams it: gRPC ``ModelStreamInfer`` and the REST generate extension.

**ModelStreamInfer** (bidirectional, on ``inference.GRPCInferenceService``): each ``ModelInferRequest`` of the stream
runs through the dataplane as a ``ModelInfer`` does (versions, labels, batching, metrics). Requests of one stream run
concurrently, at most :data:`MAX_IN_FLIGHT` at once: at that bound the stream reads no further request until one
finishes, so gRPC's flow control pushes back on the client, and responses wait for the client in a queue of
:data:`MAX_QUEUED`, beyond which the requests producing them wait too. A slow reader therefore holds a bounded amount
of work and memory, never a growing one. Responses are ``ModelStreamInferResponse`` carrying ``infer_response``
(whose ``id`` is the request's, to match them); a request that fails gets ``error_message`` in the stream, as Triton
sends it, and the stream goes on. Each response carries Triton's ``triton_final_response`` parameter: true on the
last response of its request (for a decoupled model, on a response the model sent with the final flag).

A **decoupled** model answers each request with 0..n responses (``Servable.run_decoupled``). As in Triton, the end of
such a request, when the model sent its final flag alone, is sent as an empty final response
(``triton_final_response`` true, no outputs) when the request asks for it with the
``triton_enable_empty_final_response`` parameter (``tritonclient``'s ``enable_empty_final_response=True``); without it
the client is sent the responses only. ``ModelInfer`` and ``/infer`` refuse a decoupled model in Triton's words
(UNIMPLEMENTED).

**Generate** (``POST /v2/models/{m}[/versions/{v}]/generate`` and ``…/generate_stream``, see
:mod:`workbench.protocol.v2_generate` for the JSON): ``/generate`` answers one JSON response. Triton's documentation
says only that it "returns exactly 1 response", so for a decoupled model workbench answers the single response it
yields and refuses one that yields none or several (FAILED_PRECONDITION, 400, pointing to ``/generate_stream``)
rather than keep or drop responses silently. ``/generate_stream`` answers server-sent events, one per response;
an error before inference begins is a JSON error with its HTTP status (as Triton does), one after is an
``{"error"}`` event that ends the stream. A decoupled model's run begins in the handler (a text generation joins
its batch there), so its refusal (a full queue) is a status too. The model is asked for its next response only
once the previous event was handed to the connection, so a client that reads slowly slows the model down.

The requests of one **sequence** (``sequence_id``) on a stream run one after another, in the order they were sent,
as Triton's sequence batcher takes them; requests of other sequences, or of none, run alongside. With
``--num_workers``, a sequence request reaches the worker that holds the sequence, as ``ModelInfer``'s do. Inputs
and outputs may live in **shared memory** as in ``ModelInfer`` (a decoupled model's responses each write the same
output region: read each one before the next arrives, as with Triton).

A stream's requests are bounded by the stream's deadline (gRPC) or the server's REST timeout
(``--rest_api_timeout_in_ms``), each request's whole run, all its responses, included.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from tritonclient.grpc import service_pb2

from workbench.core.classification import classify
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.sequence_contract import SequenceId, SequenceRequest, sequence_request
from workbench.core.servable import FinalResponse
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.core.whole_requests import WholeRequest, WholeRequestServable
from workbench.frontends.admitted_events import AdmittedEvents, Outcome
from workbench.frontends.grpc import time_remaining
from workbench.frontends.rest import json_response
from workbench.frontends.sequence_routing import SequenceRouter
from workbench.frontends.v2_repository import V2Repository
from workbench.planes.dataplane import Dataplane, ModelSpec, RequestInFlight
from workbench.planes.decoupled import Begun
from workbench.protocol import v2_generate, v2_grpc_messages, v2_whole
from workbench.protocol.json_tensor import dumps, input_specs, parse_body
from workbench.protocol.shared_memory_parameters import SharedMemory

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64  # requests of one ModelStreamInfer running at once
MAX_QUEUED = 16  # responses of one ModelStreamInfer waiting for the client
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
_END = object()  # the last item of a stream's response queue

Outputs = dict[str, Any]


def refuse_decoupled(call: RequestInFlight, endpoint: str) -> None:
    """Triton's refusal of a decoupled model by an endpoint that answers one response (``ModelInfer RPC``,
    ``HTTP end point``): UNIMPLEMENTED, as Triton's TRITONSERVER_ERROR_UNSUPPORTED is."""
    if call.servable.decoupled:
        raise ServingError(Code.UNIMPLEMENTED, f"{endpoint} doesn't support models with decoupled transaction policy")


def run_request(
    dataplane: Dataplane,
    call: RequestInFlight,
    inputs: dict[str, Any],
    requested: list[str],
    timeout: float | None,
    parameters: dict[str, Any],
) -> Begun[Outputs]:
    """The responses of one request on ``call``: a decoupled model's as it yields them, its run begun now (see
    :func:`workbench.planes.decoupled.stream`: a refusal is raised here); another model's one answer (through its
    batcher, its sequence when it is stateful), asked for when first read. Read under ``contextlib.aclosing``."""
    if call.servable.decoupled:
        return dataplane.stream(call, "", inputs, requested, timeout)
    sequence = sequence_request(parameters) if parameters else None
    return Begun(_one_answer(dataplane, call, inputs, requested, timeout, sequence))


async def _one_answer(
    dataplane: Dataplane,
    call: RequestInFlight,
    inputs: dict[str, Any],
    requested: list[str],
    timeout: float | None,
    sequence: SequenceRequest | None,
) -> AsyncGenerator[Outputs, None]:
    _, outputs = await dataplane.predict(call, "", inputs, requested, timeout=timeout, sequence=sequence)
    yield outputs


# ============================================================================================= gRPC
class StreamInfer:
    """``ModelStreamInfer``: one instance per service; :meth:`serve` answers one stream."""

    def __init__(
        self,
        dataplane: Dataplane,
        models: V2Repository,
        protocol: str,
        memory: Callable[[grpc.aio.ServicerContext], SharedMemory | None] = lambda _: None,
        router: SequenceRouter | None = None,
    ) -> None:
        """``memory``: the shared-memory regions a call may name (ModelInfer's); ``router``: where a sequence's
        requests go with --num_workers."""
        self.dataplane = dataplane
        self.models = models
        self.protocol = protocol  # the metrics' protocol label, as ModelInfer's
        self.memory = memory
        self.router = router

    async def serve(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        """Answer one stream: its responses are written as its requests are answered (in the order they finish).
        A stream whose first request names a model answering whole requests (MLServer's runtimes) is that model's
        alone, as MLServer streams: :meth:`_serve_whole`."""
        try:
            first = await anext(requests, None)
        except Exception as exc:  # noqa: BLE001 - unreadable from its first message: as _read answers a later one
            message = f"Reading the request stream failed: {type(exc).__name__}: {exc}"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        if first is None:
            return
        spec = await self._whole_spec(first, context)
        if spec is not None:
            await self._serve_whole(spec, first, requests, context)
            return
        await self._serve(_chained(first, requests), context)

    async def _whole_spec(self, first: Any, context: grpc.aio.ServicerContext) -> ModelSpec | None:
        """The model of the stream's first request if it answers whole requests; None for any other (or one that
        does not resolve: that request's own answer says why, in the stream)."""
        try:
            spec = await self.models.loaded_spec(first.model_name, first.model_version, time_remaining(context))
            with self.dataplane.handle(spec) as servable:
                return spec if isinstance(servable, WholeRequestServable) else None
        except ServingError:
            return None

    async def _serve_whole(
        self, spec: ModelSpec, first: Any, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> None:
        """MLServer's ``ModelStreamInfer``: the stream's requests are one call of the model's ``predict_stream``, its
        responses bare ``ModelInferResponse`` messages (MLServer's proto declares the RPC so), and an error ends the
        stream with its status."""

        async def whole_requests() -> AsyncIterator[WholeRequest]:
            yield v2_whole.grpc_request(first)
            async for request in requests:
                yield v2_whole.grpc_request(request)

        try:
            with await self.dataplane.admit(spec, "predict", self.protocol, time_remaining(context)) as call:
                servable = call.servable
                assert isinstance(servable, WholeRequestServable)
                async with contextlib.aclosing(servable.answer_stream(whole_requests())) as responses:
                    async for response in responses:
                        await context.write(v2_whole.grpc_response(call.model, call.version, response, first.id))
        except ServingError as exc:
            await context.abort(grpc.StatusCode[exc.code.name], exc.message)

    async def _serve(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        queue: asyncio.Queue[Any] = asyncio.Queue(MAX_QUEUED)
        reader = asyncio.ensure_future(self._read(requests, context, queue))
        # The client went away: stop reading and stop its requests, whatever this coroutine awaits.
        context.add_done_callback(lambda _: reader.cancel())
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, ServingError):
                    await context.abort(grpc.StatusCode[item.code.name], item.message)
                try:
                    await context.write(item)  # returns once gRPC's flow control took it: the client's pace
                except Exception as exc:  # noqa: BLE001 - a write fails only on a call that is over (the client
                    # left mid-write: gRPC's ExecuteBatchError, before context.done() says so); no one is left to tell
                    log.debug("ModelStreamInfer: the stream ended while writing: %r", exc)
                    return
        finally:
            reader.cancel()

    async def _read(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, queue: asyncio.Queue[Any]
    ) -> None:
        """Read the stream's requests, each answered by a task of its own, at most MAX_IN_FLIGHT at once; then put
        the stream's end on the queue."""
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()
        last_of: dict[SequenceId, asyncio.Task[None]] = {}  # each sequence's latest request on this stream

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            slots.release()

        try:
            try:
                async for request in requests:
                    await slots.acquire()  # at the bound: read nothing more until a request finishes (back-pressure)
                    sequence = _sequence_of(request)
                    before = last_of.get(sequence) if sequence is not None else None
                    task = asyncio.ensure_future(self._answer(request, context, queue, before))
                    running.add(task)
                    task.add_done_callback(finished)
                    if sequence is not None:
                        last_of[sequence] = task
                        task.add_done_callback(functools.partial(_forget, last_of, sequence))
            except Exception as exc:  # noqa: BLE001 - the stream is unreadable (a message that does not parse): its
                # status says so, as a unary call's would; the requests still running end with it
                message = f"Reading the request stream failed: {type(exc).__name__}: {exc}"
                await queue.put(ServingError(Code.INVALID_ARGUMENT, message))
                return
            if running:  # the client sent its last request: answer the ones still running, then end the stream
                await asyncio.wait(set(running))
            await queue.put(_END)
        finally:
            for task in list(running):
                task.cancel()

    async def _answer(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        queue: asyncio.Queue[Any],
        before: asyncio.Task[None] | None,
    ) -> None:
        """Put one request's responses on the stream's queue (waiting while it is full), or its error; ``before``:
        the request of the same sequence sent before this one, which runs first."""
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own to answer: this one only waits its turn
        try:
            async with contextlib.aclosing(self._responses(request, context)) as responses:
                async for response in responses:
                    await queue.put(service_pb2.ModelStreamInferResponse(infer_response=response))
        except ServingError as exc:
            await queue.put(_error(request, exc.message))
        except Exception as exc:  # a bug answers this request only; the stream goes on
            log.exception("ModelStreamInfer: a request of model %r failed", request.model_name)
            await queue.put(_error(request, from_exception(exc).message))

    async def _responses(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncGenerator[Any, None]:
        dataplane = self.dataplane
        parameters = v2_grpc_messages.parameter_values(request.parameters)
        sequence = sequence_request(parameters) if parameters else None
        router = self.router
        owner = router.owner(sequence.id) if sequence is not None and router is not None else None
        if router is not None and owner is not None:  # another worker holds this sequence: it answers (once)
            response = await router.infer(owner, request, time_remaining(context))
            response.parameters[FINAL].bool_param = True
            yield response
            return
        spec = await self._spec(request, context)
        with await dataplane.admit(spec, "predict", self.protocol, time_remaining(context)) as call:
            memory = self.memory(context)
            inputs = v2_grpc_messages.decode_inputs(request, memory)
            requested = v2_grpc_messages.requested_outputs(request, memory)
            shared = v2_grpc_messages.output_regions(request)
            counts = v2_grpc_messages.classification_counts(request)
            version = str(call.version)
            answers = run_request(dataplane, call, inputs, requested, time_remaining(context), parameters)
            ended = False  # a decoupled model's last response came with the final flag
            async with contextlib.aclosing(answers) as outputs_of:
                async for answer in outputs_of:
                    outputs = classify(answer, counts, call.servable)
                    response = v2_grpc_messages.infer_response(
                        call.model, version, request.id, outputs, requested or list(outputs), shared, memory
                    )
                    # A model that is not decoupled answers once: that answer is its request's last.
                    ended = isinstance(answer, FinalResponse)
                    response.parameters[FINAL].bool_param = ended or not call.servable.decoupled
                    yield response
            if call.servable.decoupled and not ended and parameters.get(EMPTY_FINAL) is True:
                final = service_pb2.ModelInferResponse(model_name=call.model, model_version=version, id=request.id)
                final.parameters[FINAL].bool_param = True
                yield final

    async def _spec(self, request: Any, context: grpc.aio.ServicerContext) -> ModelSpec:
        try:
            return await self.models.loaded_spec(request.model_name, request.model_version, time_remaining(context))
        except ServingError as exc:
            self.dataplane.refused(request.model_name, "predict", self.protocol, exc)
            raise


async def _chained(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def _sequence_of(request: Any) -> SequenceId | None:
    """The sequence a stream's request continues, to keep its requests in order; None for none, or for parameters
    that do not parse (the request's own answer says what is wrong with them)."""
    if "sequence_id" not in request.parameters:
        return None
    try:
        sequence = sequence_request(v2_grpc_messages.parameter_values(request.parameters))
    except ServingError:
        return None
    return sequence.id if sequence is not None else None


def _forget(last_of: dict[SequenceId, asyncio.Task[None]], sequence: SequenceId, done: asyncio.Task[None]) -> None:
    """Drop a sequence's entry once its latest request finished, so a long stream keeps no finished tasks."""
    if last_of.get(sequence) is done:  # no later request of the sequence came meanwhile
        del last_of[sequence]


def _error(request: Any, message: str) -> Any:
    """Triton's in-stream error: ``error_message``, and the request's model and id to match it by."""
    answer = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    return service_pb2.ModelStreamInferResponse(error_message=message, infer_response=answer)


# ============================================================================================= REST
class Generate:
    """The generate extension's two handlers (mounted by :func:`workbench.frontends.v2_rest.v2_routes`)."""

    def __init__(
        self,
        dataplane: Dataplane,
        models: V2Repository,
        read_body: Callable[[Request], Awaitable[bytes]],
        timeout: float | None,
        protocol: str,
    ) -> None:
        self.dataplane = dataplane
        self.models = models
        self.read_body = read_body  # the REST frontend's, with its size limit
        self.timeout = timeout
        self.protocol = protocol

    async def _prepare(self, request: Request) -> tuple[ModelSpec, dict[str, Any], dict[str, Any], str | None]:
        """The request, read and typed by the model's serving_default signature: every mistake a client can make is
        found here, before any response begins."""
        body = await self.read_body(request)
        params = request.path_params
        try:
            spec = await self.models.loaded_spec(params["model"], params.get("version"), self.timeout)
        except ServingError as exc:
            self.dataplane.refused(params["model"], "predict", self.protocol, exc)
            raise
        doc = parse_body(body)
        with self.dataplane.handle(spec) as servable:
            # The names sent, so a tabular model's features may be sent as columns, as /infer allows.
            specs = input_specs(servable.signatures, DEFAULT_SIGNATURE, tuple(doc))
            inputs, parameters, request_id = v2_generate.decode_request(doc, specs)
        return spec, inputs, parameters, request_id

    async def generate(self, request: Request) -> Response:
        spec, inputs, parameters, request_id = await self._prepare(request)
        with await self.dataplane.admit(spec, "predict", self.protocol, self.timeout) as call:
            answers: list[Outputs] = []
            async with contextlib.aclosing(
                run_request(self.dataplane, call, inputs, [], self.timeout, parameters)
            ) as responses:
                async for outputs in responses:
                    answers.append(outputs)
                    if len(answers) > 1:  # closing the stream stops the model: no need to see how many more
                        raise _not_one(call.model, "several responses")
            if not answers:
                raise _not_one(call.model, "no response")
            doc = v2_generate.encode_response(call.model, call.version, answers[0], request_id)
        return json_response(dumps(doc))

    async def generate_stream(self, request: Request) -> Response:
        whole = await self._whole(request)
        if whole is not None:  # MLServer's runtimes take a v2 request on /generate_stream, as on /infer_stream
            return whole
        spec, inputs, parameters, request_id = await self._prepare(request)
        call = await self.dataplane.admit(spec, "predict", self.protocol, self.timeout)
        try:  # a decoupled model's run begins here: a refusal is this answer's status, not an event
            answers = run_request(self.dataplane, call, inputs, [], self.timeout, parameters)
        except BaseException as exc:
            call.__exit__(type(exc), exc, None)
            raise
        outcome = Outcome()
        return AdmittedEvents(answers.passed_through(self._events(call, answers, request_id, outcome)), [call], outcome)

    async def _events(
        self, call: RequestInFlight, answers: Begun[Outputs], request_id: str | None, outcome: Outcome
    ) -> AsyncGenerator[bytes, None]:
        """One event per response. Starlette asks for the next event only once it sent the last one, and only then
        is the model asked for its next response: the client's pace is the model's."""
        try:
            async with contextlib.aclosing(answers) as responses:
                async for outputs in responses:
                    yield v2_generate.event(v2_generate.encode_response(call.model, call.version, outputs, request_id))
        except ServingError as exc:
            outcome.error = exc
            yield v2_generate.error_event(exc.message)
        except Exception as exc:  # the status is sent: a bug can only be an error event, and logged
            log.exception("generate_stream of model %r failed", call.model)
            outcome.error = exc
            yield v2_generate.error_event(from_exception(exc).message)
        outcome.finished = True

    async def infer_stream(self, request: Request) -> Response:
        """MLServer's ``/infer_stream``: a v2 request, answered by server-sent events of v2 responses. Served for
        models that answer whole requests (MLServer's runtimes); others stream on ``/generate_stream``."""
        whole = await self._whole(request)
        if whole is None:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                f"Model {request.path_params['model']} streams on /generate_stream and gRPC ModelStreamInfer; "
                "/infer_stream serves MLServer's runtimes",
            )
        return whole

    async def _whole(self, request: Request) -> Response | None:
        """The event stream of a model answering whole requests, or None for any other model. Every mistake in the
        request is found before the stream begins (a JSON error with its status)."""
        params = request.path_params
        try:
            spec = await self.models.loaded_spec(params["model"], params.get("version"), self.timeout)
        except ServingError as exc:
            self.dataplane.refused(params["model"], "predict", self.protocol, exc)
            raise
        with self.dataplane.handle(spec) as servable:
            if not isinstance(servable, WholeRequestServable):
                return None
        whole = v2_whole.rest_request(parse_body(await self.read_body(request)))
        return StreamingResponse(self._whole_events(spec, whole), media_type="text/event-stream; charset=utf-8")

    async def _whole_events(self, spec: ModelSpec, whole: WholeRequest) -> AsyncIterator[bytes]:
        """One event per response of the model's ``predict_stream``, asked for as the client reads."""

        async def one() -> AsyncIterator[WholeRequest]:
            yield whole

        try:
            with await self.dataplane.admit(spec, "predict", self.protocol, self.timeout) as call:
                servable = call.servable
                assert isinstance(servable, WholeRequestServable)
                async with contextlib.aclosing(servable.answer_stream(one())) as responses:
                    async for response in responses:
                        yield v2_generate.event(v2_whole.rest_response(call.model, call.version, response))
        except ServingError as exc:
            yield v2_generate.error_event(exc.message)
        except Exception as exc:  # the status is sent: a bug can only be an error event, and logged
            log.exception("infer_stream of model %r failed", spec.name)
            yield v2_generate.error_event(from_exception(exc).message)


def _not_one(model: str, what: str) -> ServingError:
    return ServingError(
        Code.FAILED_PRECONDITION,
        f"Model {model} answered {what}: /generate returns exactly one response; use /generate_stream",
    )
