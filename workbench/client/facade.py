"""The :class:`Client` users see: one object, the same calls over every protocol, delegating each call to the
transport of the protocol it goes over (:mod:`~workbench.client.tfs_rest`, :mod:`~workbench.client.tfs_grpc`,
:mod:`~workbench.client.v2_rest_transport`, :mod:`~workbench.client.v2_grpc_transport`) and the management calls to
:mod:`~workbench.client.management_transport`.

What does not depend on the protocol lives here: choosing the protocol and checking its target, the arguments'
combinations, the signature cache (per model, version or label, and protocol family), and inputs turned into arrays
of the signature's dtypes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import requests

from workbench.client.async_requests import AsyncPrediction
from workbench.client.grpc_channels import GRPC_CHANNELS, GrpcChannels
from workbench.client.http import HttpConnection
from workbench.client.management_transport import ManagementAPI
from workbench.client.openai_chat import ChatAnswer, stream_chat
from workbench.client.prediction import Prediction
from workbench.client.protocols import GRPC_PROTOCOLS, V2_PROTOCOLS, canonical_protocol
from workbench.client.tfs_grpc import TfsGrpcTransport
from workbench.client.tfs_rest import TfsRestTransport, model_path, predict_body, predict_outputs
from workbench.client.tls import ClientTLS
from workbench.client.transport import Transport
from workbench.client.v2_grpc_transport import V2GrpcTransport
from workbench.client.v2_rest_transport import V2RestTransport
from workbench.config.vocabulary import renamed_keywords
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.core.sticky import STICKY_HEADER
from workbench.protocol.attributions import Explanation


class Client:
    """Talk to one server: REST at ``url``, gRPC at ``grpc`` (``host:port``), whichever ``protocol`` picks."""

    def __init__(
        self,
        url: str | None = "http://127.0.0.1:8501",
        grpc: str | None = None,
        *,
        protocol: str = "rest",
        timeout: float = 30.0,
        token: str | None = None,
        binary_data: bool | None = None,
        grpc_channels: int = GRPC_CHANNELS,
        tls: bool | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        """``binary_data`` (v2 over REST): None sends large tensors as raw bytes and small ones as JSON, True every
        tensor raw (as tritonclient does), False only JSON (for v2 servers without Triton's binary extension).

        ``grpc_channels`` gRPC connections are opened (lazily) and used in turn: one HTTP/2 connection stays on one
        worker of a ``--num_workers`` server, so a client that calls from several threads spreads over them.

        TLS: REST is https when ``url`` says so. gRPC uses TLS when ``tls`` is True, or, left None, when ``url`` is
        https or a TLS file is given. ``ca_file`` is the PEM CA the server's certificate must chain to (None: the
        default trust store); ``cert_file`` and ``key_file``, the client's own, for servers that require one
        (mutual TLS). See :class:`ClientTLS`."""
        if grpc_channels < 1:
            raise ValueError(f"grpc_channels must be at least 1, not {grpc_channels}")
        self.url = url.rstrip("/") if url else None
        self.grpc_target = grpc
        self.protocol = canonical_protocol(protocol)
        files = ClientTLS(ca_file, cert_file, key_file)
        if tls is None:
            tls = bool((self.url or "").startswith("https://") or ca_file or cert_file)
        #: How gRPC and https are secured (None: gRPC is plaintext; https URLs still use the default trust store).
        self.tls: ClientTLS | None = files if tls else None
        self._http = HttpConnection(self.url, timeout=timeout, token=token, tls_options=files.requests_options())
        self._channels = GrpcChannels(grpc, tls=self.tls, count=grpc_channels, timeout=timeout)
        self._v2_rest = V2RestTransport(self._http, binary_data)
        self._v2_grpc = V2GrpcTransport(self._channels)
        self._transports: dict[str, Transport] = {
            "rest": TfsRestTransport(self._http),
            "grpc": TfsGrpcTransport(self._channels),
            "v2-rest": self._v2_rest,
            "v2-grpc": self._v2_grpc,
        }
        self._management = ManagementAPI(self._http)
        self._signatures: dict[tuple[str, int | None, str | None, bool], dict[str, Signature]] = {}
        self.last_latency_ms: float | None = None

    @property
    def timeout(self) -> float:
        """Seconds each call may take, over REST and gRPC."""
        return self._http.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._http.timeout = self._channels.timeout = seconds

    @property
    def binary_data(self) -> bool | None:
        """How v2 over REST sends tensors (see the constructor)."""
        return self._v2_rest.binary_data

    @binary_data.setter
    def binary_data(self, value: bool | None) -> None:
        self._v2_rest.binary_data = value

    def __repr__(self) -> str:
        tls = f", tls={self.tls!r}" if self.tls is not None else ""
        return f"Client(url={self.url!r}, grpc={self.grpc_target!r}, protocol={self.protocol!r}{tls})"

    def open_stream(self, path: str, params: Mapping[str, Any], timeout: tuple[float, float]) -> requests.Response:
        """``GET path`` as a stream (server-sent events), with this client's TLS settings and token."""
        return self._http.open_stream(path, params, timeout)

    def close(self) -> None:
        self._http.close()
        self._channels.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transport(self, protocol: str | None) -> Transport:
        """The transport of ``protocol`` (None: the client's), which this client must have a target for."""
        chosen = canonical_protocol(protocol) if protocol else self.protocol
        if chosen in GRPC_PROTOCOLS and not self.grpc_target:
            raise ValueError("this client has no gRPC target")
        if chosen not in GRPC_PROTOCOLS and not self.url:
            raise ValueError("this client has no REST url")
        return self._transports[chosen]

    # ------------------------------------------------------------------------------- models' metadata
    def signatures(
        self, model: str, *, version: int | None = None, label: str | None = None, protocol: str | None = None
    ) -> dict[str, Signature]:
        """A model's signatures by name: inputs and outputs with numpy dtypes and shapes (-1: any size).

        Over REST this reads the metadata's JSON directly, so a client that only talks REST never imports
        TensorFlow (whose protos the gRPC path needs). Over v2, a model has one signature, ``serving_default``,
        read from its v2 metadata.
        """
        return self._transport(protocol).signatures(model, version, label)

    def signature(
        self,
        model: str,
        signature_name: str = "",
        version: int | None = None,
        label: str | None = None,
        protocol: str | None = None,
    ) -> Signature:
        """One of a model's signatures (cached per model, version or label, and protocol family: TF Serving's or v2)."""
        chosen = self._transport(protocol).name
        key = (model, version, label, chosen in V2_PROTOCOLS)
        if key not in self._signatures:
            self._signatures[key] = self.signatures(model, version=version, label=label, protocol=chosen)
        name = signature_name or DEFAULT_SIGNATURE
        signatures = self._signatures[key]
        if name not in signatures:
            raise ServingError(Code.INVALID_ARGUMENT, f'Serving signature name: "{name}" not found in signature def')
        return signatures[name]

    def metadata(
        self, model: str, *, version: int | None = None, label: str | None = None, protocol: str | None = None
    ) -> Any:
        """The model's ``SignatureDefMap`` proto (``.signature_def[name].inputs`` ...).

        Over v2, the model's v2 metadata as a dict, the same over REST and gRPC: ``name``, ``versions``,
        ``platform``, and ``inputs``/``outputs`` with ``name``, ``datatype`` and ``shape`` (-1: any size).
        """
        return self._transport(protocol).metadata(model, version, label)

    def status(
        self, model: str, *, version: int | None = None, label: str | None = None, protocol: str | None = None
    ) -> list[dict[str, Any]]:
        """``[{"version": 2, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}, ...]``.

        Over v2 this reads the model repository extension's index (Triton's states in TF Serving's words).
        """
        return self._transport(protocol).status(model, version, label)

    # --------------------------------------------------------------------------------------- inference
    @renamed_keywords(signature="signature_name")  # the %serve magics' earlier --signature
    def predict(
        self,
        model: str,
        inputs: Mapping[str, Any] | Any,
        *,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = "",
        output_filter: Sequence[str] = (),
        protocol: str | None = None,
        parameters: Mapping[str, bool | int | str] | None = None,
        key: str | None = None,
    ) -> Prediction:
        """Run a predict; ``inputs`` maps input names to arrays (or is one array for a one-input signature).

        Over v2, ``output_filter`` names the requested outputs, and there is one signature (``serving_default``);
        ``parameters`` are the request's v2 parameters, e.g. a stateful model's ``{"sequence_id": 7,
        "sequence_start": True}`` (TF Serving's API has none). ``key``: a stickiness key (a user's id, a session):
        under a canary split every request with the same key gets the same version (``X-Workbench-Key``).
        """
        transport = self._transport(protocol)
        chosen = transport.name
        if parameters and chosen not in V2_PROTOCOLS:
            raise ValueError("request parameters travel over the v2 protocol: pass protocol='v2' or 'v2-grpc'")
        if chosen in V2_PROTOCOLS and signature_name not in ("", DEFAULT_SIGNATURE):
            raise ValueError(f"the v2 protocol runs a model's {DEFAULT_SIGNATURE} signature, not {signature_name!r}")
        signature = self.signature(model, signature_name, version, label, protocol=chosen)
        feeds = self.encode_inputs(signature, inputs)
        answer = transport.predict(
            model,
            signature,
            feeds,
            signature_name=signature_name,
            output_filter=output_filter,
            version=version,
            label=label,
            parameters=parameters,
            key=key,
        )
        self.last_latency_ms = answer.latency_ms
        return Prediction(
            answer.outputs, model=model, version=answer.version, protocol=chosen, latency_ms=answer.latency_ms
        )

    def chat(
        self,
        model: str,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        on_piece: Callable[[str], None] | None = None,
        key: str | None = None,
        **parameters: Any,
    ) -> ChatAnswer:
        """The next message of a chat with ``model`` over its OpenAI-compatible endpoint, streamed (REST only).

        ``messages`` is OpenAI's list (``{"role": "user", "content": "..."}``) or one user message as a string;
        ``on_piece`` gets each piece of text as it comes; ``parameters`` are OpenAI's (``max_tokens``,
        ``temperature``, ``seed``...). The answer says how fast it came (:class:`ChatAnswer`)."""
        if not self.url:
            raise ValueError("chat goes over REST (the OpenAI-compatible endpoints): this client has no REST url")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return stream_chat(self._http, model, messages, on_piece, key, **parameters)

    def predict_async(
        self,
        model: str,
        inputs: Mapping[str, Any] | Any,
        *,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = "",
        output_filter: Sequence[str] = (),
        key: str | None = None,
    ) -> AsyncPrediction:
        """Queue a predict (``:predictAsync``, over REST) and return at once: ``.result(timeout)`` waits for the
        answer, ``.done()`` and ``.state()`` ask whether it is there (see :class:`AsyncPrediction`). ``key``: a
        stickiness key, kept with the queued request (as :meth:`predict`'s)."""
        if not self.url:
            raise ValueError("asynchronous requests go over REST: this client has no REST url")
        signature = self.signature(model, signature_name, version, label, protocol="rest")
        body = predict_body(self.encode_inputs(signature, inputs), signature_name)
        path = model_path(model, version, label) + ":predictAsync"
        headers = {STICKY_HEADER: key} if key else None
        ticket, _ = self._http.json_answer("POST", path, body, ok=(202,), headers=headers)
        return AsyncPrediction(self._http, ticket["id"], ticket["url"], model, signature, output_filter)

    def explain(
        self,
        model: str,
        inputs: Mapping[str, Any] | Any,
        *,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = "",
        explainer: str = "auto",
        target: int | None = None,
        **parameters: Any,
    ) -> Explanation:
        """Explain the model's answers for ``inputs`` (``:explain``, over REST): SHAP values for tabular models,
        integrated gradients for Keras and PyTorch ones, one row of attributions per input row.

        ``explainer``: "auto", "tree", "linear", "kernel" or "integrated_gradients"; ``target``: the output column
        to explain (default: each row's predicted one); ``parameters``: the others the server takes (``nsamples``,
        ``steps``, ``baseline``, ``output``). Plot one row with :func:`workbench.notebook.explanations.plot`.
        """
        if not self.url:
            raise ValueError("explanations go over REST: this client has no REST url")
        signature = self.signature(model, signature_name, version, label, protocol="rest")
        body = predict_body(self.encode_inputs(signature, inputs), signature_name)
        options = {"explainer": explainer, **({"target": target} if target is not None else {}), **parameters}
        body["parameters"] = options
        answer, _ = self._http.json_answer("POST", model_path(model, version, label) + ":explain", body)
        explained = Explanation.from_json(answer)
        return dataclasses.replace(explained, predictions=predict_outputs(answer, signature, ()))

    def stream(
        self,
        model: str,
        inputs: Mapping[str, Any] | Any,
        *,
        version: int | None = None,
        label: str | None = None,
        output_filter: Sequence[str] = (),
        parameters: Mapping[str, bool | int | str] | None = None,
    ) -> Iterator[Prediction]:
        """Stream one request's responses as they arrive: a decoupled model's 0..n, another model's one.

        Over gRPC ``ModelStreamInfer`` (the client needs its ``grpc`` target, whatever ``protocol`` says), so numpy
        arrays travel raw and the stream is Triton's: ``for answer in client.stream("countdown", {"n": [3]}):``.
        The request asks for Triton's empty final response, which ends the iteration (it is not yielded). An error
        of the request (in the stream) or of the stream raises :class:`ServingError`; the error sent in the stream
        carries no code (Triton's in-stream errors have none), so it is UNKNOWN. Leaving the loop early cancels the
        stream, which stops the model between two responses.
        """
        if not self.grpc_target:
            raise ValueError("streaming goes over gRPC ModelStreamInfer: this client has no gRPC target")
        signature = self.signature(model, "", version, label, protocol="v2-grpc")
        feeds = self.encode_inputs(signature, inputs)
        yield from self._v2_grpc.stream(model, feeds, output_filter, version, label, parameters)

    def encode_inputs(self, signature: Signature, inputs: Mapping[str, Any] | Any) -> dict[str, np.ndarray]:
        """``inputs`` as numpy arrays of the signature's input dtypes (one array is fine for one input)."""
        spec = signature
        if not isinstance(inputs, Mapping):
            if len(spec.inputs) != 1:
                raise ValueError(f"this signature has several inputs ({', '.join(spec.inputs)}): pass a dict")
            inputs = {next(iter(spec.inputs)): inputs}
        feeds = {}
        for alias, value in inputs.items():
            if alias not in spec.inputs:
                raise ValueError(f"the signature has no input {alias!r} (it has {', '.join(spec.inputs)})")
            dtype = spec.inputs[alias].dtype
            if dtype.kind == "O":
                # Strings stay Python objects: numpy's fixed-width bytes would drop trailing NULs.
                array = np.asarray(value, dtype=object)
                array = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(array)
            else:
                array = np.asarray(value, dtype=dtype)
            feeds[alias] = array
        return feeds

    @renamed_keywords(signature="signature_name")  # the %serve magics' earlier --signature
    def classify(
        self,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        *,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = "",
        protocol: str | None = None,
    ) -> list[list[tuple[str, float]]]:
        """Classify tf.Examples given as ``{feature: value or list}``; per example, (label, score) pairs."""
        results, self.last_latency_ms = self._transport(protocol).examples(
            "classify", model, examples, version, label, signature_name
        )
        return [[(str(label_), float(score)) for label_, score in row] for row in results]

    @renamed_keywords(signature="signature_name")  # the %serve magics' earlier --signature
    def regress(
        self,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        *,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = "",
        protocol: str | None = None,
    ) -> list[float]:
        results, self.last_latency_ms = self._transport(protocol).examples(
            "regress", model, examples, version, label, signature_name
        )
        return [float(v) for v in results]

    # ----------------------------------------------------------------------------- workbench only
    def models(self) -> list[dict[str, Any]]:
        """Every model with versions, states, labels and traffic shares (workbench's management API)."""
        return self._management.models()

    def model(self, name: str) -> dict[str, Any]:
        return self._management.model(name)

    def promote(self, model: str, version: int, condition: str | None = None) -> dict[str, Any]:
        """Point ``stable`` at ``version`` and make it the default for requests that name no version. With a
        ``condition`` (``"agreement >= 0.99 and p99_ms <= 20"``), only if ``version``'s record as the model's shadow
        meets it: else a ServingError (FAILED_PRECONDITION) with the figures, and nothing changes."""
        return self._management.promote(model, version, condition)

    def rollback(self, model: str) -> dict[str, Any]:
        return self._management.rollback(model)

    def canary(self, model: str, version: int, weight: float) -> dict[str, Any]:
        """Send ``weight`` (0–1) of the default traffic to ``version``; 0 ends the canary."""
        return self._management.canary(model, version, weight)

    def shadow(self, model: str, version: int, fraction: float = 1.0) -> dict[str, Any]:
        """Copy ``fraction`` (0–1) of the default traffic to ``version``, answered to nobody and compared with the
        answers clients get (:meth:`shadow_record`); 0 ends the shadow."""
        return self._management.shadow(model, version, fraction)

    def shadow_record(self, model: str) -> dict[str, Any] | None:
        """How ``model``'s shadow compares with the version that answers (agreement, differences per output, both
        versions' latencies, the slowest inputs), over its last 1,000 copies; None without a shadow."""
        record = (self._management.stats().get("shadow") or {}).get(model)
        return record if isinstance(record, dict) else None

    def diff(
        self,
        model: str,
        a: int | str,
        b: int | str,
        inputs: Mapping[str, Any] | Any,
        *,
        signature_name: str = "",
        protocol: str | None = None,
    ) -> dict[str, Any]:
        """Versions (or labels) ``a`` and ``b`` of ``model`` on the same ``inputs``, compared as a shadow is: per
        output, the share of rows whose class (or argmax) agrees and the absolute and relative differences, with
        both answers' latencies. Inputs may be one request's, a list of requests, or logged requests replayed
        (``workbench.request_log.read_request_log(prefix, model=...)``: its predict records' inputs)."""
        from workbench.core.answer_diff import compare, output_summary

        if isinstance(inputs, list) and inputs and hasattr(inputs[0], "request"):  # logged requests: replayed
            inputs = [logged.request for logged in inputs if getattr(logged, "method", "") == "predict"]
        requests = inputs if isinstance(inputs, list) and inputs and isinstance(inputs[0], Mapping) else [inputs]
        diffs: dict[str, list[Any]] = {}
        latencies: dict[str, list[float]] = {"a": [], "b": []}
        for request in requests:
            answers = {}
            for side, chosen in (("a", a), ("b", b)):
                by = {"version": chosen} if isinstance(chosen, int) else {"label": chosen}
                answer = self.predict(model, request, signature_name=signature_name, protocol=protocol, **by)
                answers[side] = dict(answer)
                latencies[side].append(answer.latency_ms)
            for alias, diff in compare(answers["a"], answers["b"]).items():
                diffs.setdefault(alias, []).append(diff)
        return {
            "model": model,
            "a": a,
            "b": b,
            "requests": len(requests),
            "outputs": {alias: output_summary(found) for alias, found in diffs.items()},
            "a_mean_ms": round(sum(latencies["a"]) / len(requests), 3),
            "b_mean_ms": round(sum(latencies["b"]) / len(requests), 3),
        }

    def set_batching(self, model: str, batching_parameters: str | None) -> dict[str, Any]:
        """Batch ``model``'s requests with these parameters from now on (TF Serving's batching parameters text,
        e.g. what ``workbench analyze`` chose; None removes the model's own), kept beside its versions."""
        return self._management.set_batching(model, batching_parameters)

    def load(self, model: str, version: int) -> dict[str, Any]:
        return self._management.load(model, version)

    def unload(self, model: str, version: int) -> dict[str, Any]:
        return self._management.unload(model, version)

    def stats(self) -> dict[str, Any]:
        return self._management.stats()

    def health(self) -> dict[str, Any]:
        return self._management.health()
