"""A client for TF Serving's and the Open Inference Protocol's (v2) REST and gRPC APIs with numpy in and out, and for
workbench's management API.

The same call works over four protocols: TF Serving's (``protocol="rest"`` or ``"grpc"``) and v2's (``"v2"``, also
spelled ``"v2-rest"``, or ``"v2-grpc"``), against workbench, a real TF Serving (TF Serving's protocols) or any v2
server such as Triton (v2's). The management methods are workbench's own. Input dtypes come from the model's
metadata, fetched once per model, so ``client.predict("m", [[1.0]])`` sends float32 when the signature says so.
Every answer carries its latency; errors are :class:`~workbench.core.errors.ServingError` with the server's
code and message. :meth:`Client.stream` iterates one request's responses (a decoupled model's 0..n) as they arrive,
over v2 gRPC's ``ModelStreamInfer``.

v2 goes over REST with ``requests`` (JSON, and Triton's binary tensor extension for large tensors: see
:mod:`workbench.protocol.v2_client`), and over gRPC with the stubs tritonclient generates
(``tritonclient.grpc.service_pb2_grpc``) on the client's one channel, which also carries TF Serving's services:
tritonclient's own ``InferenceServerClient`` objects would open channels of their own and turn status codes into
strings, where this client keeps the server's code in every :class:`ServingError`.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import ssl
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import requests

from workbench.config.vocabulary import renamed_keywords
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.protocol import v2_client as v2
from workbench.protocol.signature_defs import signature_from_proto, signatures_from_json

# The protocols, by the names every front end uses (``--protocol`` of ``workbench bench`` and ``%serve``);
# "v2" is short for "v2-rest".
PROTOCOLS = ("rest", "grpc", "v2-rest", "v2-grpc")
_PROTOCOL_ALIASES = {"v2": "v2-rest"}
GRPC_PROTOCOLS = ("grpc", "v2-grpc")
V2_PROTOCOLS = ("v2-rest", "v2-grpc")

# The model repository extension's states (Triton's), in TF Serving's words.
_V2_STATES = {"READY": "AVAILABLE", "LOADING": "LOADING", "UNLOADING": "UNLOADING", "UNAVAILABLE": "END"}

_HTTP_CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.ABORTED,
    429: Code.RESOURCE_EXHAUSTED,
    499: Code.CANCELLED,
    501: Code.UNIMPLEMENTED,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}


def canonical_protocol(protocol: str) -> str:
    """A protocol's name as :data:`PROTOCOLS` spells it ("v2" is "v2-rest"); a ValueError for an unknown one."""
    chosen = _PROTOCOL_ALIASES.get(protocol, protocol)
    if chosen not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)} or v2, not {protocol!r}")
    return chosen


# gRPC connections a Client opens: several, so calls from several threads spread over a multi-worker server.
GRPC_CHANNELS = 4


@dataclasses.dataclass(frozen=True)
class ClientTLS:
    """How a client checks a TLS server, and proves itself to one that checks clients (mutual TLS).

    ``ca_file``: the PEM certificates the server's must chain to; None trusts what each library trusts by default
    (the system's store for asyncio, certifi's or ``$REQUESTS_CA_BUNDLE`` for requests, gRPC's bundled roots or
    ``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` for gRPC). ``cert_file`` and ``key_file`` (PEM): the client's certificate
    and key, for servers that require one (``client_verify``, ``--rest_api_ssl_client_ca_file``); the key may be in
    ``cert_file``.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if self.key_file and not self.cert_file:
            raise ValueError("a client key_file needs its cert_file")

    def requests_options(self) -> dict[str, Any]:
        """``verify=`` and ``cert=`` for requests."""
        options: dict[str, Any] = {"verify": self.ca_file or True}
        if self.cert_file:
            options["cert"] = (self.cert_file, self.key_file) if self.key_file else self.cert_file
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """A client SSL context (asyncio streams, tornado): the server's certificate and name are checked."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def grpc_credentials(self) -> Any:
        """``grpc.ChannelCredentials`` for ``grpc.secure_channel``."""
        import grpc

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        key = read(self.key_file) or read(self.cert_file)  # a key in the certificate's file: gRPC finds it there
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=key if self.cert_file else None,
            certificate_chain=read(self.cert_file),
        )


class Prediction(dict):  # type: ignore[type-arg]
    """Output name → numpy array, with where it ran and how long the call took."""

    def __init__(
        self, outputs: Mapping[str, np.ndarray], *, model: str, version: int | None, protocol: str, latency_ms: float
    ) -> None:
        super().__init__(outputs)
        self.model, self.version, self.protocol, self.latency_ms = model, version, protocol, latency_ms

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in sorted(self.items()))
        where = f"{self.model}" + (f" v{self.version}" if self.version is not None else "")
        return f"Prediction({where} over {self.protocol}, {self.latency_ms:.2f} ms; {shapes})"


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
        self.timeout = timeout
        self.binary_data = binary_data
        files = ClientTLS(ca_file, cert_file, key_file)
        if tls is None:
            tls = bool((self.url or "").startswith("https://") or ca_file or cert_file)
        #: How gRPC and https are secured (None: gRPC is plaintext; https URLs still use the default trust store).
        self.tls: ClientTLS | None = files if tls else None
        # Passed with each request, not set on the session: requests lets $REQUESTS_CA_BUNDLE override a session's.
        self._tls_options = files.requests_options()
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._grpc_channels = grpc_channels
        self._channels: list[Any] = []
        self._stubs: dict[str, list[Any]] = {}
        self._turn = itertools.count()
        self._signatures: dict[tuple[str, int | None, str | None, bool], dict[str, Signature]] = {}
        self.last_latency_ms: float | None = None

    def __repr__(self) -> str:
        tls = f", tls={self.tls!r}" if self.tls is not None else ""
        return f"Client(url={self.url!r}, grpc={self.grpc_target!r}, protocol={self.protocol!r}{tls})"

    def open_stream(self, path: str, params: Mapping[str, Any], timeout: tuple[float, float]) -> requests.Response:
        """``GET path`` as a stream (server-sent events), with this client's TLS settings and token."""
        assert self.url is not None
        return self._session.get(self.url + path, params=params, stream=True, timeout=timeout, **self._tls_options)

    def close(self) -> None:
        self._session.close()
        for channel in self._channels:
            channel.close()
        self._channels, self._stubs = [], {}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- plumbing
    def _protocol(self, protocol: str | None) -> str:
        chosen = canonical_protocol(protocol) if protocol else self.protocol
        if chosen in GRPC_PROTOCOLS and not self.grpc_target:
            raise ValueError("this client has no gRPC target")
        if chosen not in GRPC_PROTOCOLS and not self.url:
            raise ValueError("this client has no REST url")
        return chosen

    def _path(self, model: str, version: int | None, label: str | None) -> str:
        if version is not None and label is not None:
            raise ValueError("give a version or a label, not both")
        path = f"/v1/models/{model}"
        if version is not None:
            path += f"/versions/{int(version)}"
        elif label is not None:
            path += f"/labels/{label}"
        return path

    def _rest(self, method: str, path: str, body: Any = None) -> Any:
        return self._rest_answer(method, path, body)[0]

    def _rest_answer(self, method: str, path: str, body: Any = None) -> tuple[Any, Mapping[str, str]]:
        """The JSON document and the headers of a successful answer (a ServingError otherwise)."""
        response = self._send(method, path, json=body)
        try:
            return response.json(), response.headers
        except ValueError:
            raise ServingError(Code.DATA_LOSS, f"{method} {path} answered no JSON: {response.text[:200]!r}") from None

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """A successful answer to ``method path`` (``json=``, or ``data=`` and ``headers=``); a ServingError else."""
        assert self.url is not None
        try:
            response = self._session.request(
                method, self.url + path, timeout=self.timeout, **self._tls_options, **kwargs
            )
        except requests.RequestException as exc:
            raise ServingError(Code.UNAVAILABLE, f"Could not reach {self.url}: {exc}") from None
        if response.status_code != 200:
            try:
                doc = response.json()
            except ValueError:
                doc = {"error": response.text[:500]}
            code = _HTTP_CODES.get(response.status_code, Code.INTERNAL if response.status_code >= 500 else Code.UNKNOWN)
            raise ServingError(code, doc.get("error", response.reason) if isinstance(doc, dict) else response.reason)
        return response

    def _stub(self, service: str) -> Any:
        """A stub of ``service`` ("predict", "model": TF Serving's; "v2": the v2 service), the channels in turn."""
        if service not in self._stubs:
            import grpc

            if not self._channels:
                options = [
                    ("grpc.max_receive_message_length", -1),
                    ("grpc.max_send_message_length", -1),
                    # Channels of one process share a connection unless told not to: each its own connection.
                    ("grpc.use_local_subchannel_pool", 1),
                    # A server restarted from the notebook (handle.restart()) is back in seconds: reconnect within
                    # 2 s of it rather than after gRPC's default backoff, which grows to 120 s during an outage.
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ]
                credentials = self.tls.grpc_credentials() if self.tls is not None else None
                self._channels = [
                    grpc.secure_channel(self.grpc_target, credentials, options=options)
                    if credentials is not None
                    else grpc.insecure_channel(self.grpc_target, options=options)
                    for _ in range(self._grpc_channels)
                ]
            if service == "v2":
                from tritonclient.grpc import service_pb2_grpc

                stub = service_pb2_grpc.GRPCInferenceServiceStub
            else:
                import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
                from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

                module = prediction_service_pb2_grpc if service == "predict" else model_service_pb2_grpc
                stub = module.PredictionServiceStub if service == "predict" else module.ModelServiceStub
            self._stubs[service] = [stub(channel) for channel in self._channels]
        stubs = self._stubs[service]
        return stubs[next(self._turn) % len(stubs)]

    def _grpc_call(self, service: str, method: str, request: Any) -> Any:
        import grpc

        try:
            return getattr(self._stub(service), method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise ServingError(Code[exc.code().name], exc.details() or "") from None

    @staticmethod
    def _spec(spec: Any, model: str, version: int | None, label: str | None, signature_name: str = "") -> None:
        if version is not None and label is not None:
            raise ValueError("give a version or a label, not both")
        spec.name = model
        if version is not None:
            spec.version.value = int(version)
        elif label is not None:
            spec.version_label = label
        if signature_name:
            spec.signature_name = signature_name

    # ----------------------------------------------------------------------------------- TF Serving
    def signatures(
        self, model: str, *, version: int | None = None, label: str | None = None, protocol: str | None = None
    ) -> dict[str, Signature]:
        """A model's signatures by name: inputs and outputs with numpy dtypes and shapes (-1: any size).

        Over REST this reads the metadata's JSON directly, so a client that only talks REST never imports
        TensorFlow (whose protos the gRPC path needs). Over v2, a model has one signature, ``serving_default``,
        read from its v2 metadata.
        """
        chosen = self._protocol(protocol)
        if chosen in V2_PROTOCOLS:
            doc = self.metadata(model, version=version, label=label, protocol=chosen)
            return {DEFAULT_SIGNATURE: v2.signature_from_metadata(doc)}
        if chosen == "rest":
            doc = self._rest("GET", self._path(model, version, label) + "/metadata")
            return signatures_from_json(doc["metadata"]["signature_def"])
        defs = self.metadata(model, version=version, label=label, protocol="grpc").signature_def
        found = {}
        for name, proto in defs.items():
            try:
                found[name] = signature_from_proto(name, proto)
            except ServingError:  # sparse tensors: listed in the metadata, not callable from here
                continue
        return found

    def signature(
        self,
        model: str,
        signature_name: str = "",
        version: int | None = None,
        label: str | None = None,
        protocol: str | None = None,
    ) -> Signature:
        """One of a model's signatures (cached per model, version or label, and protocol family: TF Serving's or v2)."""
        chosen = self._protocol(protocol)
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
        from google.protobuf import json_format

        chosen = self._protocol(protocol)
        if chosen == "v2-rest":
            return self._rest("GET", v2.version_path(model, version, label))
        if chosen == "v2-grpc":
            from tritonclient.grpc import service_pb2

            request = service_pb2.ModelMetadataRequest(name=model, version=v2.version_string(version, label))
            response = self._grpc_call("v2", "ModelMetadata", request)
            doc = json_format.MessageToDict(response, preserving_proto_field_name=True)
            for tensor in (*doc.get("inputs", []), *doc.get("outputs", [])):
                tensor["shape"] = [int(d) for d in tensor.get("shape", [])]  # proto3 JSON writes int64 as strings
            return doc
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import get_model_metadata_pb2

        if chosen == "rest":
            doc = self._rest("GET", self._path(model, version, label) + "/metadata")
            return json_format.ParseDict(doc["metadata"]["signature_def"], get_model_metadata_pb2.SignatureDefMap())
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(request.model_spec, model, version, label)
        request.metadata_field.append("signature_def")
        response = self._grpc_call("predict", "GetModelMetadata", request)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        return signatures

    def status(
        self, model: str, *, version: int | None = None, label: str | None = None, protocol: str | None = None
    ) -> list[dict[str, Any]]:
        """``[{"version": 2, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}, ...]``.

        Over v2 this reads the model repository extension's index (Triton's states in TF Serving's words).
        """
        chosen = self._protocol(protocol)
        if chosen in V2_PROTOCOLS:
            return self._v2_status(model, version, label, chosen)
        if chosen == "rest":
            doc = self._rest("GET", self._path(model, version, label))
            return [
                {
                    "version": int(s["version"]),
                    "state": s["state"],
                    "error_code": s["status"]["error_code"],
                    "error_message": s["status"]["error_message"],
                }
                for s in doc["model_version_status"]
            ]
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        self._spec(request.model_spec, model, version, label)
        response = self._grpc_call("model", "GetModelStatus", request)
        return [
            {
                "version": s.version,
                "state": get_model_status_pb2.ModelVersionStatus.State.Name(s.state),
                "error_code": Code(s.status.error_code).name,
                "error_message": s.status.error_message,
            }
            for s in response.model_version_status
        ]

    def _v2_status(self, model: str, version: int | None, label: str | None, protocol: str) -> list[dict[str, Any]]:
        if protocol == "v2-rest":
            index = self._rest("POST", "/v2/repository/index", {})
            rows = index["models"] if isinstance(index, dict) else index  # Triton answers the bare list
        else:
            from google.protobuf import json_format
            from tritonclient.grpc import service_pb2

            response = self._grpc_call("v2", "RepositoryIndex", service_pb2.RepositoryIndexRequest())
            rows = json_format.MessageToDict(response, preserving_proto_field_name=True).get("models", [])
        versions = {int(r["version"]): r for r in rows if r.get("name") == model and str(r.get("version")).isdigit()}
        if not versions:
            raise ServingError(Code.NOT_FOUND, f"Model {model!r} is not in the server's repository")
        wanted = sorted(versions, reverse=True)
        if version is not None:
            wanted = [int(version)]
        elif label is not None:
            wanted = [self._v2_label_version(model, label, protocol)]
        if not set(wanted) & set(versions):
            raise ServingError(Code.NOT_FOUND, f"Model {model!r} has no version {wanted[0]}")
        return [
            {
                "version": v,
                "state": _V2_STATES.get(versions[v].get("state", ""), "UNKNOWN"),
                "error_code": "UNKNOWN" if versions[v].get("reason") else "OK",
                "error_message": versions[v].get("reason", ""),
            }
            for v in wanted
            if v in versions
        ]

    def _v2_label_version(self, model: str, label: str, protocol: str) -> int:
        """The version a label names: v2 says it only in the statistics of ``…/versions/<label>`` (workbench's)."""
        if protocol == "v2-rest":
            doc = self._rest("GET", v2.version_path(model, None, label) + "/stats")
        else:
            from google.protobuf import json_format
            from tritonclient.grpc import service_pb2

            request = service_pb2.ModelStatisticsRequest(name=model, version=v2.version_string(None, label))
            response = self._grpc_call("v2", "ModelStatistics", request)
            doc = json_format.MessageToDict(response, preserving_proto_field_name=True)
        (row,) = doc["model_stats"]
        return int(row["version"])

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
    ) -> Prediction:
        """Run a predict; ``inputs`` maps input names to arrays (or is one array for a one-input signature).

        Over v2, ``output_filter`` names the requested outputs, and there is one signature (``serving_default``);
        ``parameters`` are the request's v2 parameters, e.g. a stateful model's ``{"sequence_id": 7,
        "sequence_start": True}`` (TF Serving's API has none).
        """
        chosen = self._protocol(protocol)
        if parameters and chosen not in V2_PROTOCOLS:
            raise ValueError("request parameters travel over the v2 protocol: pass protocol='v2' or 'v2-grpc'")
        if chosen in V2_PROTOCOLS and signature_name not in ("", DEFAULT_SIGNATURE):
            raise ValueError(f"the v2 protocol runs a model's {DEFAULT_SIGNATURE} signature, not {signature_name!r}")
        signature = self.signature(model, signature_name, version, label, protocol=chosen)
        feeds = self.encode_inputs(signature, inputs)
        started = time.perf_counter()
        if chosen in V2_PROTOCOLS:
            answer = self._v2_infer(chosen, model, feeds, output_filter, version, label, parameters)
            latency = (time.perf_counter() - started) * 1000
            outputs, served_version = answer.outputs, answer.model_version
        elif chosen == "rest":
            body: dict[str, Any] = {"inputs": {k: _to_json(v) for k, v in feeds.items()}}
            if signature_name:
                body["signature_name"] = signature_name
            doc, headers = self._rest_answer("POST", self._path(model, version, label) + ":predict", body)
            latency = (time.perf_counter() - started) * 1000
            names = list(signature.outputs)
            # Columnar answers hold the one output's value directly, or an object of several.
            raw = {names[0]: doc["outputs"]} if len(names) == 1 else doc["outputs"]
            outputs = {  # REST has no output_filter: filter here, so both protocols answer alike
                k: _from_json(v, signature.outputs[k].dtype)
                for k, v in raw.items()
                if not output_filter or k in output_filter
            }
            # workbench says which version answered (after labels and canaries); TF Serving does not.
            answered = headers.get("X-Model-Version", "")
            served_version = int(answered) if answered.isdigit() else version
        else:
            import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
            from tensorflow_serving.apis import predict_pb2

            from workbench.protocol.tensor_proto import from_numpy, to_numpy

            request = predict_pb2.PredictRequest()
            self._spec(request.model_spec, model, version, label, signature_name)
            for alias, value in feeds.items():
                from_numpy(value, request.inputs[alias])
            request.output_filter.extend(output_filter)
            response = self._grpc_call("predict", "Predict", request)
            latency = (time.perf_counter() - started) * 1000
            outputs = {alias: to_numpy(proto, alias) for alias, proto in response.outputs.items()}
            served_version = response.model_spec.version.value if response.model_spec.HasField("version") else None
        self.last_latency_ms = latency
        return Prediction(outputs, model=model, version=served_version, protocol=chosen, latency_ms=latency)

    def _v2_infer(
        self,
        protocol: str,
        model: str,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        version: int | None,
        label: str | None,
        parameters: Mapping[str, bool | int | str] | None = None,
    ) -> v2.InferAnswer:
        if protocol == "v2-rest":
            request = v2.rest_infer_request(feeds, outputs, binary_data=self.binary_data, parameters=parameters)
            path = v2.version_path(model, version, label) + "/infer"
            response = self._send("POST", path, data=request.body, headers=request.headers)
            return v2.rest_infer_answer(response.content, response.headers.get(v2.HEADER_LENGTH))
        message = v2.grpc_infer_request(
            model, feeds, outputs, version=v2.version_string(version, label), parameters=parameters
        )
        return v2.grpc_infer_answer(self._grpc_call("v2", "ModelInfer", message))

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
        import grpc

        signature = self.signature(model, "", version, label, protocol="v2-grpc")
        feeds = self.encode_inputs(signature, inputs)
        message = v2.grpc_infer_request(
            model,
            feeds,
            output_filter,
            version=v2.version_string(version, label),
            parameters={**(parameters or {}), "triton_enable_empty_final_response": True},
        )
        responses = self._stub("v2").ModelStreamInfer(iter([message]), timeout=self.timeout)
        started = time.perf_counter()
        try:
            for response in responses:
                if response.error_message:
                    raise ServingError(Code.UNKNOWN, response.error_message)
                answer = response.infer_response
                if answer.outputs:
                    read = v2.grpc_infer_answer(answer)
                    latency = (time.perf_counter() - started) * 1000  # since the request, as predict's
                    yield Prediction(
                        read.outputs, model=model, version=read.model_version, protocol="v2-grpc", latency_ms=latency
                    )
                final = answer.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.RpcError as exc:
            raise ServingError(Code[exc.code().name], exc.details() or "") from None
        finally:
            responses.cancel()  # a no-op once the stream ended; stops the server's work when the caller left early

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

    def _examples_request(
        self,
        kind: str,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        version: int | None,
        label: str | None,
        signature_name: str,
        protocol: str | None,
    ) -> tuple[Any, float]:
        chosen = self._protocol(protocol)
        if chosen in V2_PROTOCOLS:
            raise ValueError(f"the v2 protocol has no {kind} API: use TF Serving's (protocol 'rest' or 'grpc')")
        started = time.perf_counter()
        if chosen == "rest":
            body: dict[str, Any] = {"examples": [_example_json(e) for e in examples]}
            if signature_name:
                body["signature_name"] = signature_name
            doc = self._rest("POST", self._path(model, version, label) + f":{kind}", body)
            return doc["results"], (time.perf_counter() - started) * 1000
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import classification_pb2, regression_pb2

        request = (
            classification_pb2.ClassificationRequest if kind == "classify" else regression_pb2.RegressionRequest
        )()
        self._spec(request.model_spec, model, version, label, signature_name)
        for example in examples:
            _example_proto(example, request.input.example_list.examples.add())
        response = self._grpc_call("predict", "Classify" if kind == "classify" else "Regress", request)
        latency = (time.perf_counter() - started) * 1000
        if kind == "classify":
            results = [[[c.label, c.score] for c in row.classes] for row in response.result.classifications]
        else:
            results = [r.value for r in response.result.regressions]
        return results, latency

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
        results, self.last_latency_ms = self._examples_request(
            "classify", model, examples, version, label, signature_name, protocol
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
        results, self.last_latency_ms = self._examples_request(
            "regress", model, examples, version, label, signature_name, protocol
        )
        return [float(v) for v in results]

    # ----------------------------------------------------------------------------- workbench only
    def models(self) -> list[dict[str, Any]]:
        """Every model with versions, states, labels and traffic shares (workbench's management API)."""
        return self._rest("GET", "/workbench/v1/models")["models"]

    def model(self, name: str) -> dict[str, Any]:
        return self._rest("GET", f"/workbench/v1/models/{name}")

    def promote(self, model: str, version: int) -> dict[str, Any]:
        """Point ``stable`` at ``version`` and make it the default for requests that name no version."""
        return self._rest("POST", f"/workbench/v1/models/{model}:promote", {"version": int(version)})

    def rollback(self, model: str) -> dict[str, Any]:
        return self._rest("POST", f"/workbench/v1/models/{model}:rollback", {})

    def canary(self, model: str, version: int, weight: float) -> dict[str, Any]:
        """Send ``weight`` (0–1) of the default traffic to ``version``; 0 ends the canary."""
        return self._rest("POST", f"/workbench/v1/models/{model}:canary", {"version": int(version), "weight": weight})

    def load(self, model: str, version: int) -> dict[str, Any]:
        return self._rest("POST", f"/workbench/v1/models/{model}/versions/{int(version)}:load", {})

    def unload(self, model: str, version: int) -> dict[str, Any]:
        return self._rest("POST", f"/workbench/v1/models/{model}/versions/{int(version)}:unload", {})

    def stats(self) -> dict[str, Any]:
        return self._rest("GET", "/workbench/v1/stats")

    def health(self) -> dict[str, Any]:
        return self._rest("GET", "/workbench/v1/health")


def _to_json(array: np.ndarray) -> Any:
    if array.dtype.kind == "O":
        return _bytes_to_json(array.tolist())
    return array.tolist()


def _bytes_to_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_bytes_to_json(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return value


def _from_json(value: Any, dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind == "O":  # DT_STRING: text or {"b64": ...}
        return np.array(_json_to_bytes(value), dtype=object)
    return np.asarray(value, dtype=dtype)


def _json_to_bytes(value: Any) -> Any:
    if isinstance(value, list):
        return [_json_to_bytes(v) for v in value]
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    return value.encode("utf-8") if isinstance(value, str) else value


def _example_json(example: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in example.items():
        values = np.asarray(value).reshape(-1).tolist() if not isinstance(value, (str, bytes)) else [value]
        out[name] = [_bytes_to_json(v) if isinstance(v, bytes) else v for v in values]
    return out


def _example_proto(example: Mapping[str, Any], proto: Any) -> None:
    for name, value in example.items():
        values = [value] if isinstance(value, (str, bytes)) else np.asarray(value).reshape(-1).tolist()
        feature = proto.features.feature[name]
        for v in values:
            if isinstance(v, (str, bytes)):
                feature.bytes_list.value.append(v.encode() if isinstance(v, str) else v)
            elif isinstance(v, float):
                feature.float_list.value.append(v)
            else:
                feature.int64_list.value.append(int(v))
