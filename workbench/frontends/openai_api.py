"""OpenAI-compatible endpoints: ``GET /v1/models``, ``GET /v1/models/{model}``, ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/embeddings``, for every model that follows the text conventions
(:mod:`workbench.core.text_generation`), whichever platform loaded it.

Every request goes through the data plane as ``:predict`` does (``admit``, then ``stream`` for a generator and
``predict`` for an embedder, which batches): routing (labels, canary shares, the ``X-Workbench-Key`` sticky key),
shadows, request logs, traces and metrics, counted under the protocol ``openai``. ``model`` names ``m`` (its
default routing), ``m:2`` (a version) or ``m:canary`` (a label); answers name the version that answered, as
``m:2``, and say it in the ``X-Model-Name`` / ``X-Model-Version`` headers too.

On the REST port the endpoints are served under ``/v1`` and KServe's ``/openai/v1``; there ``GET /v1/models/{m}``
stays TF Serving's model status, so retrieving one model is ``/openai/v1/models/{m}``. On a port of their own
(``--openai_port``) all of them are served under both prefixes. With a management token, the endpoints take it as
their API key (``Authorization: Bearer``, which OpenAI's clients send as ``api_key``). Request parsing and answer
building are :mod:`workbench.protocol.openai_requests` and :mod:`~workbench.protocol.openai_responses`; one choice's
generation is :mod:`workbench.frontends.openai_generation`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from workbench.core import text_generation as tg
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.core.sticky import STICKY_HEADER
from workbench.core.text_generation import SamplingParameters
from workbench.frontends import rest_asgi
from workbench.frontends.admitted_events import AdmittedEvents, Outcome
from workbench.frontends.auth import bearer_matches
from workbench.frontends.hot_routes import Answer, Arrival, StarletteArrival, answer_of, as_response, route_pattern
from workbench.frontends.openai_generation import (
    Event,
    Finished,
    Piece,
    chat_prompt,
    count_tokens,
    generate,
    generator_signature,
    offers_logprobs,
)
from workbench.frontends.rest import answered_by
from workbench.observability import tracing
from workbench.planes.dataplane import Dataplane, ModelSpec, RequestInFlight
from workbench.planes.decoupled import Begun
from workbench.protocol import openai_responses as answers
from workbench.protocol.openai_requests import (
    MAX_N,
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    InvalidParameter,
    model_id,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_model_name,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
PROTOCOL = "openai"  # the metrics' protocol label
PREFIXES = ("/v1", "/openai/v1")  # OpenAI's own, and KServe's (its huggingface runtime's) on a shared port


@dataclasses.dataclass(frozen=True)
class OpenAISettings:
    timeout_ms: int = 30000  # a request's whole run, a generation's every token included (--rest_api_timeout_in_ms)
    max_request_bytes: int = 256 * 1024 * 1024
    api_key: str = ""  # the management token: "" takes any key

    @property
    def timeout(self) -> float | None:
        return self.timeout_ms / 1000 if self.timeout_ms > 0 else None


_EMBEDDINGS = tuple(route_pattern(f"{prefix}/embeddings") for prefix in PREFIXES)
_STICKY = STICKY_HEADER.lower()  # hot routes read header names in lower case


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(answers.json_bytes(doc), status_code=status, media_type="application/json", headers=headers)


def error_response(error: ServingError) -> Response:
    status, doc = answers.error_answer(error)
    return _json(doc, status)


def _error_answer(error: ServingError) -> Answer:
    """:func:`error_response`'s answer, as a hot route gives it."""
    status, doc = answers.error_answer(error)
    return answer_of(answers.json_bytes(doc), status)


@functools.lru_cache(maxsize=1024)  # once per version, not once per request
def _model_headers(name: str, version: int) -> tuple[tuple[bytes, bytes], ...]:
    """:func:`answered_by`'s headers as a Response given them sends them (lower-case names, before its own)."""
    return tuple((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answered_by(name, version).items())


Handler = Callable[[Request], Awaitable[Response]]


def _answering(handler: Handler) -> Handler:
    """Every failure answered in OpenAI's error shape; a bug is a 500 there too, and logged."""

    @functools.wraps(handler)
    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except ServingError as exc:
            return error_response(exc)
        except Exception as exc:
            log.exception("OpenAI %s %s failed", request.method, request.url.path)
            return error_response(from_exception(exc))

    return answer


async def _closed(streams: Sequence[Begun[Event]]) -> None:
    """Every choice's stream closed, whether its answer read it or not (closing twice is harmless)."""
    for stream in streams:
        await stream.aclose()


async def merged(streams: Sequence[Begun[Event]]) -> AsyncGenerator[Event, None]:
    """The events of several choices as they come; one failure ends them all. Leaving closes every stream."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for item in only:
                yield item
        return
    queue: asyncio.Queue[tuple[Event | None, BaseException | None]] = asyncio.Queue(maxsize=1)

    async def pump(stream: Begun[Event]) -> None:
        try:
            async with contextlib.aclosing(stream) as events:
                async for item in events:
                    await queue.put((item, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put((None, exc))
            return
        await queue.put((None, None))  # this choice is over

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        left = len(tasks)
        while left:
            got, error = await queue.get()
            if error is not None:
                raise error
            if got is None:
                left -= 1
            else:
                yield got
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclasses.dataclass
class _Collected:
    """One choice, whole."""

    text: list[str] = dataclasses.field(default_factory=list)
    logprobs: list[Any] = dataclasses.field(default_factory=list)
    finish_reason: str = tg.FINISHED_BY_STOP


class OpenAIApi:
    """The handlers, on the data plane."""

    def __init__(self, dataplane: Dataplane, settings: OpenAISettings) -> None:
        self.dataplane = dataplane
        self.settings = settings

    def routes(self, retrieve: bool = True) -> list[Route]:
        """The endpoints under both prefixes; ``retrieve=False`` leaves ``GET {prefix}/models/{model}`` to TF Serving's
        model status under ``/v1`` (the REST port's)."""
        routes = []
        for prefix in PREFIXES:
            routes += [
                Route(f"{prefix}/models", _answering(self.list_models), methods=["GET"]),
                Route(f"{prefix}/chat/completions", _answering(self.chat), methods=["POST"]),
                Route(f"{prefix}/completions", _answering(self.completions), methods=["POST"]),
                Route(f"{prefix}/embeddings", _answering(self.embeddings), methods=["POST"]),
            ]
            if retrieve or prefix != "/v1":
                routes.append(Route(f"{prefix}/models/{{model:path}}", _answering(self.retrieve), methods=["GET"]))
        return routes

    # ------------------------------------------------------------------------------------------ requests
    def _authorize(self, request: Request) -> None:
        self._authorize_header(request.headers.get("authorization"))

    def _authorize_header(self, authorization: str | None) -> None:
        key = self.settings.api_key
        if key and not bearer_matches(authorization or "", key):
            raise ServingError(
                Code.UNAUTHENTICATED, "This server's OpenAI endpoints need its management token as the API key"
            )

    async def _body(self, request: Request) -> bytes:
        self._authorize(request)
        return await rest_asgi.read_body(request.scope, request.receive, self.settings.max_request_bytes)

    def _spec(self, text: str, request: Request) -> ModelSpec:
        return self._spec_keyed(text, request.headers.get(STICKY_HEADER))

    def _spec_keyed(self, text: str, key: str | None) -> ModelSpec:
        name = parse_model_name(text, self.dataplane.knows)
        return ModelSpec(name.model, name.version, name.label, key=key)

    async def _admit(self, spec: ModelSpec, api: str, requested: str) -> RequestInFlight:
        """The request admitted on the data plane; a model, version or label that does not exist is OpenAI's 404."""
        dataplane = self.dataplane
        if spec.label is not None and dataplane.knows(spec.name) and spec.label not in dataplane.labels(spec.name):
            error = ServingError(Code.NOT_FOUND, f"The model '{requested}' does not exist: no label {spec.label}")
            dataplane.refused(spec.name, api, PROTOCOL, error)
            raise error
        try:
            return await dataplane.admit(spec, api, PROTOCOL, self.settings.timeout)
        except ServingError as exc:
            if exc.code == Code.NOT_FOUND:
                raise ServingError(
                    Code.NOT_FOUND, f"The model '{requested}' does not exist on this server ({exc.message})"
                ) from None
            raise

    # -------------------------------------------------------------------------------------------- models
    async def list_models(self, request: Request) -> Response:
        self._authorize(request)
        entries = []
        for name in self.dataplane.model_names():
            entries += self._model_entries(name)
        return _json(answers.model_list(entries))

    async def retrieve(self, request: Request) -> Response:
        self._authorize(request)
        text = request.path_params["model"]
        spec = self._spec(text, request)
        with contextlib.suppress(ServingError):
            if spec.version is None and spec.label is None:
                entries = self._model_entries(spec.name)[:1]
            else:
                wanted = model_id(spec.name, spec.version, spec.label)
                entries = [e for e in self._model_entries(spec.name) if e["id"] == wanted]
            if entries:
                return _json(entries[0])
        raise ServingError(Code.NOT_FOUND, f"The model '{text}' does not exist on this server")

    def _model_entries(self, name: str) -> list[dict[str, Any]]:
        """``name``'s ids that follow a convention: the model (its default version's), its labels, its versions.
        Versions are resolved by number, so reading the list never moves a canary's share."""
        dataplane = self.dataplane
        created: dict[int, int] = {}
        try:
            versions = dataplane.available_versions(name)
        except ServingError:
            return []
        for version in versions:
            with contextlib.suppress(ServingError), dataplane.handle(ModelSpec(name, version)) as servable:
                signature = servable.signatures.get(DEFAULT_SIGNATURE)
                if tg.is_text_generator(signature, servable.decoupled) or tg.is_text_embedder(
                    signature, servable.decoupled
                ):
                    created[version] = _created(servable.path)
        default = dataplane.default_version(name)
        entries = []
        if default in created:
            entries.append(answers.model_entry(name, created[default]))
        for label, version in sorted(dataplane.labels(name).items()):
            if version in created:
                entries.append(answers.model_entry(model_id(name, label=label), created[version]))
        entries += [answers.model_entry(model_id(name, version), created[version]) for version in sorted(created)]
        return entries

    # ------------------------------------------------------------------------------------------ generation
    async def chat(self, request: Request) -> Response:
        arrived = time.perf_counter()
        parsed = parse_chat(await self._body(request))
        return await self._generate(request, parsed, "chat", arrived)

    async def completions(self, request: Request) -> Response:
        arrived = time.perf_counter()
        parsed = parse_completion(await self._body(request))
        return await self._generate(request, parsed, "completions", arrived)

    async def _generate(self, request: Request, parsed: GenerationRequest, api: str, arrived: float) -> Response:
        """Every choice's generation admitted and submitted here, before the answer starts (a burst's first prompt
        is prefilled while the rest of the burst is still arriving), then answered whole or as server-sent
        events."""
        calls, prompts = await self._admit_choices(request, parsed, api)
        streams: list[Begun[Event]] = []
        timeout = self.settings.timeout
        try:
            for index, call in enumerate(calls):
                sampling = _sampling_of(parsed, index)
                prompt = prompts[index // parsed.n]
                streams.append(
                    generate(self.dataplane, call, index, prompt, sampling, parsed.logprobs, timeout, arrived)
                )
        except BaseException as exc:
            await _closed(streams)
            for call in calls:
                call.__exit__(type(exc), exc, None)
            raise
        first = calls[0]
        answered = model_id(first.model, first.version)
        headers = answered_by(first.model, first.version)
        chat = isinstance(parsed, ChatRequest)
        echo = prompts if isinstance(parsed, CompletionRequest) and parsed.echo else None
        if parsed.stream:
            outcome = Outcome()
            chunks = answers.Chunks(_answer_id(chat), int(time.time()), answered, chat, parsed.include_usage)
            sse = _stream_events(merged(streams), chunks, parsed.n, len(prompts), echo, outcome)
            return AdmittedEvents(Begun(sse, functools.partial(_closed, streams)), calls, outcome, headers)
        failure: BaseException | None = None
        try:
            collecting = _collect(merged(streams), parsed.n, len(prompts))
            collected, usage = await _unless_the_client_leaves(request, collecting)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await _closed(streams)
            for call in calls:
                call.__exit__(type(failure) if failure is not None else None, failure, None)
        choices = [_whole_choice(parsed, index, choice, echo) for index, choice in enumerate(collected)]
        build = answers.chat_completion if chat else answers.completion
        return _json(build(_answer_id(chat), int(time.time()), answered, choices, usage), headers=headers)

    async def _admit_choices(
        self, request: Request, parsed: GenerationRequest, api: str
    ) -> tuple[list[RequestInFlight], list[str]]:
        """One admitted request per choice (choice ``i`` of prompt ``p`` is ``p * n + i``), all on the version the
        first resolved to (one answer, one version), and the prompts; a refusal ends those already admitted."""
        count = (len(parsed.prompts) if isinstance(parsed, CompletionRequest) else 1) * parsed.n
        if count > MAX_N:
            raise InvalidParameter(f"At most {MAX_N} choices a request (prompts times n)", "n")
        spec = self._spec(parsed.model, request)
        first = await self._admit(spec, api, parsed.model)
        calls = [first]
        try:
            signature = generator_signature(first.servable, parsed.model)
            if parsed.logprobs and not offers_logprobs(signature):
                raise InvalidParameter(f"The model '{parsed.model}' does not offer log-probabilities", "logprobs")
            if isinstance(parsed, ChatRequest):
                prompts = [chat_prompt(first.servable, parsed.messages)]
            else:
                assert isinstance(parsed, CompletionRequest)
                prompts = list(parsed.prompts)
            pinned = ModelSpec(spec.name, version=first.version, key=spec.key)
            for _ in range(count - 1):
                calls.append(await self._admit(pinned, api, parsed.model))
        except BaseException as exc:
            for call in calls:
                call.__exit__(type(exc), exc, None)
            raise
        return calls, prompts

    # ------------------------------------------------------------------------------------------ embeddings
    async def embeddings(self, request: Request) -> Response:
        """``POST …/embeddings`` through Starlette (with CORS on, under a root path, or on the OpenAI port);
        :meth:`answer` takes it otherwise, with the same bytes."""
        return as_response(await self._embed(StarletteArrival(request)))

    def match(self, method: str, path: str) -> re.Match[str] | None:
        """A :class:`~workbench.frontends.hot_routes.HotRoute`: ``POST /v1/embeddings`` (and KServe's
        ``/openai/v1/embeddings``), answered before Starlette: an embedding request is small and many come at once,
        so Starlette's layers are a good part of what each costs the event loop its forward pass shares the GIL with.
        Generation's routes stay Starlette's: a generation's own work dwarfs them."""
        if method != "POST" or not path.endswith("/embeddings"):
            return None
        for pattern in _EMBEDDINGS:
            found = pattern.match(path)
            if found is not None:
                return found
        return None

    async def answer(self, match: re.Match[str], request: Arrival) -> Answer:
        """The answer to an embedding request :meth:`match` matched, in OpenAI's error shape when it fails (a bug is
        a 500 there too, and logged, as :func:`_answering` does)."""
        try:
            return await self._embed(request)
        except ServingError as exc:
            return _error_answer(exc)
        except Exception as exc:
            log.exception("OpenAI POST %s failed", match.string)
            return _error_answer(from_exception(exc))

    async def _embed(self, request: Arrival) -> Answer:
        self._authorize_header(request.header("authorization"))
        parsed = parse_embedding(await request.body(self.settings.max_request_bytes))
        spec = self._spec_keyed(parsed.model, request.header(_STICKY))
        with await self._admit(spec, "embeddings", parsed.model) as call:
            servable = call.servable
            signature = servable.signatures.get(DEFAULT_SIGNATURE)
            if not tg.is_text_embedder(signature, servable.decoupled):
                raise InvalidParameter(
                    f"The model '{parsed.model}' is not a text embedder: embeddings need a model taking "
                    f"'{tg.EMBED_INPUT}' and answering '{tg.EMBEDDING}'",
                    "model",
                )
            assert signature is not None
            texts = np.array([t.encode() for t in parsed.inputs], dtype=object)
            outputs = [tg.EMBEDDING] + ([tg.EMBED_TOKENS] if tg.EMBED_TOKENS in signature.outputs else [])
            _, result = await self.dataplane.predict(
                call, DEFAULT_SIGNATURE, {tg.EMBED_INPUT: texts}, outputs, self.settings.timeout
            )
            if tg.EMBED_TOKENS in result:
                tokens = int(np.asarray(result[tg.EMBED_TOKENS]).sum())
            else:
                tokens = sum(count_tokens(servable, text) for text in parsed.inputs)
            self.dataplane.metrics.generation.observe_embedded(servable.name, servable.version, tokens)
            vectors = np.asarray(result[tg.EMBEDDING])
            if vectors.ndim != 2 or len(vectors) != len(parsed.inputs):
                raise ServingError(
                    Code.INTERNAL,
                    f"The model '{parsed.model}' answered {list(vectors.shape)} embeddings for {len(parsed.inputs)} "
                    "texts; the convention is one row per text",
                )
            answered = model_id(call.model, call.version)
            doc = answers.embedding_list(answered, vectors, parsed.encoding_format, tokens)
            status, headers, body = answer_of(answers.json_bytes(doc))
            return status, [*_model_headers(call.model, call.version), *headers], body


def _sampling_of(parsed: GenerationRequest, index: int) -> SamplingParameters:
    """Choice ``index``'s sampling: with a seed, choice ``i`` of a prompt samples with ``seed + i``, so that ``n``
    seeded choices differ and each is reproducible."""
    sampling, offset = parsed.sampling, index % parsed.n
    if sampling.seed is None or not offset:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + offset)


def _whole_choice(
    parsed: GenerationRequest, index: int, choice: _Collected, echo: Sequence[str] | None
) -> answers.Choice:
    """A choice of a whole answer: its text (after its prompt with ``echo``) and its log-probabilities if asked."""
    prompt = echo[index // parsed.n] if echo else ""
    logprobs = None
    if parsed.logprobs:
        if isinstance(parsed, ChatRequest):
            logprobs = answers.chat_logprobs(choice.logprobs)
        else:
            logprobs = answers.completion_logprobs(choice.logprobs, len(prompt))
    return answers.Choice(index, prompt + "".join(choice.text), choice.finish_reason, logprobs)


def _answer_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def _created(path: str) -> int:
    """A version's creation time, OpenAI's ``created``: its folder's, where it is a local folder (else 0)."""
    try:
        return int(os.stat(path).st_mtime)
    except (OSError, ValueError, TypeError):
        return 0


async def _unless_the_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; a client that disconnects first cancels it (the models' streams close) and the request
    ends CANCELLED. Once its body is read, a request's ``receive`` answers only when its client leaves."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait([task, left], return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ServingError(Code.CANCELLED, "The client left before the answer was ready")
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _collect(events: AsyncGenerator[Event, None], n: int, prompts: int) -> tuple[list[_Collected], answers.Usage]:
    """Every choice whole, and the usage (each prompt's tokens counted once, however many choices it has);
    ``events`` are closed when this ends, however it ends."""
    collected = [_Collected() for _ in range(n * prompts)]
    prompt_tokens = completion_tokens = 0
    async with contextlib.aclosing(events):
        async for item in events:
            choice = collected[item.index]
            if isinstance(item, Piece):
                choice.text.append(item.text)
                choice.logprobs.extend(item.logprobs)
            else:
                choice.finish_reason = item.finish_reason
                completion_tokens += item.completion_tokens
                if item.index % n == 0:
                    prompt_tokens += item.prompt_tokens
    return collected, answers.Usage(prompt_tokens, completion_tokens)


async def _stream_events(
    events: AsyncGenerator[Event, None],
    chunks: answers.Chunks,
    n: int,
    prompts: int,
    echo: Sequence[str] | None,
    outcome: Outcome,
) -> AsyncGenerator[bytes, None]:
    """The chunks of a streamed answer, OpenAI's way: chat's role first, the text as it comes, each choice's
    finish_reason, the usage if asked, then ``[DONE]``. An error once the stream began is an error event."""
    prompt_tokens = completion_tokens = 0
    offsets = [len(echo[i // n]) if echo else 0 for i in range(n * prompts)]
    try:
        async with contextlib.aclosing(events):
            for index in range(n * prompts):
                if chunks.chat:
                    yield chunks.role(index)
                elif echo:
                    yield chunks.text(index, echo[index // n])
            async for item in events:
                if isinstance(item, Piece):
                    logprobs = None
                    if item.logprobs:
                        logprobs = (
                            answers.chat_logprobs(item.logprobs)
                            if chunks.chat
                            else answers.completion_logprobs(item.logprobs, offsets[item.index])
                        )
                    offsets[item.index] += len(item.text)
                    yield chunks.text(item.index, item.text, logprobs)
                else:
                    assert isinstance(item, Finished)
                    completion_tokens += item.completion_tokens
                    if item.index % n == 0:
                        prompt_tokens += item.prompt_tokens
                    yield chunks.finish(item.index, item.finish_reason)
        if chunks.include_usage:
            yield chunks.usage(answers.Usage(prompt_tokens, completion_tokens))
    except ServingError as exc:
        outcome.error = exc
        yield answers.error_event(exc)
    except Exception as exc:  # the status is sent: a bug can only be an error event, and logged
        log.exception("An OpenAI stream failed")
        outcome.error = exc
        yield answers.error_event(from_exception(exc))
    outcome.finished = True
    yield answers.DONE


# ------------------------------------------------------------------------------------------------ its own port
class OpenAIApp(Starlette):
    """The endpoints on a port of their own (``--openai_port``): everything under ``/v1`` and ``/openai/v1``, every
    other path OpenAI's 404, and a request's traceparent read as the REST port reads it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if tracing.active is not None and scope["type"] == "http":
            tracing.active.http_arrived(scope)
        await super().__call__(scope, receive, send)


def openai_app(api: OpenAIApi) -> OpenAIApp:
    async def not_found(request: Request, exc: Exception) -> Response:
        return _json(answers.unknown_url(request.method, request.url.path), 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(ServingError(Code.INVALID_ARGUMENT, message))

    handlers: dict[int, Callable[[Request, Exception], Awaitable[Response]]] = {404: not_found, 405: not_allowed}
    app = OpenAIApp(routes=api.routes(retrieve=True), exception_handlers=handlers)  # type: ignore[arg-type]
    app.router.redirect_slashes = False
    return app
