"""MLServer's custom runtimes (``class M(MLModel)`` named by a ``model-settings.json``), run unchanged: loaded by
``workbench.platforms.mlserver_runtime.load`` and served from a folder laid out for MLServer on v2 REST and gRPC, with
the requests and answers of MLServer's examples (custom, custom-json, content-type, streaming). The runtimes are
written here with the examples' shapes and imports; MLServer itself is not installed (workbench's layer answers
``import mlserver``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
from tritonclient.grpc import service_pb2, service_pb2_grpc

from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.core.whole_requests import Tensor, WholeRequest
from workbench.mlserver_api import mlserver_imports
from workbench.platforms import mlserver_runtime
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

# docs/examples/custom's shape: decode_args, get_model_uri, samples read from parameters.uri (numpy, not numpyro).
CUSTOM = """
import json
import numpy as np

from mlserver import MLModel
from mlserver.codecs import decode_args
from mlserver.utils import get_model_uri
from typing import Optional


class LinearModel(MLModel):
    async def load(self) -> bool:
        model_uri = await get_model_uri(self._settings)
        with open(model_uri) as model_file:
            raw_samples = json.load(model_file)
        self._samples = {k: np.array(v) for k, v in raw_samples.items()}
        return True

    @decode_args
    async def predict(
        self,
        marriage: Optional[np.ndarray] = None,
        age: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        mu = self._samples["a"] + self._samples["bM"] * marriage.mean() + self._samples["bA"] * age.mean()
        return np.asarray(mu.mean())
"""

# docs/examples/custom-json/jsonmodels.py
JSON_MODEL = """
import json

from typing import Dict, Any
from mlserver import MLModel, types
from mlserver.codecs import StringCodec


class JsonHelloWorldModel(MLModel):
    async def load(self) -> bool:
        print("Initialize model")
        return await super().load()

    async def predict(self, payload: types.InferenceRequest) -> types.InferenceResponse:
        request = self._extract_json(payload)
        response = {
            "request": request,
            "server_response": "Got your request. Hello from the server.",
        }
        response_bytes = json.dumps(response).encode("UTF-8")

        return types.InferenceResponse(
            id=payload.id,
            model_name=self.name,
            model_version=self.version,
            outputs=[
                types.ResponseOutput(
                    name="echo_response",
                    shape=[len(response_bytes)],
                    datatype="BYTES",
                    data=[response_bytes],
                    parameters=types.Parameters(content_type="str"),
                )
            ],
        )

    def _extract_json(self, payload: types.InferenceRequest) -> Dict[str, Any]:
        inputs = {}
        for inp in payload.inputs:
            inputs[inp.name] = json.loads("".join(self.decode(inp, default_codec=StringCodec)))
        return inputs
"""

# docs/examples/content-type/runtime.py's shape: a registered input codec, and a runtime echoing what it decoded.
CONTENT_TYPE = """
import json

from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput
from mlserver.codecs import InputCodec, register_input_codec, DecodedParameterName
from mlserver.codecs.utils import InputOrOutput

_to_exclude = {
    "parameters": {DecodedParameterName},
    "inputs": {"__all__": {"parameters": {DecodedParameterName}}},
}


@register_input_codec
class ReversedCodec(InputCodec):
    ContentType = "reversed"

    @classmethod
    def can_encode(cls, payload) -> bool:
        return False

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> str:
        return "".join(request_input.data)[::-1]


class EchoRuntime(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        outputs = []
        for request_input in payload.inputs:
            decoded_input = self.decode(request_input)
            as_dict = request_input.dict(exclude=_to_exclude)
            json.dumps(as_dict)
            outputs.append(
                ResponseOutput(
                    name=request_input.name,
                    datatype="BYTES",
                    shape=[1],
                    data=[repr(decoded_input)],
                    parameters={"content_type": "str", "decoded_as": type(decoded_input).__name__},
                )
            )
        request_as = type(self.decode_request(payload)).__name__
        return InferenceResponse(model_name=self.name, outputs=outputs, parameters={"request_as": request_as})
"""
CONTENT_TYPE_SETTINGS = {
    "name": "content-type-example",
    "implementation": "runtime.EchoRuntime",
    "inputs": [
        {"name": "metadata-np", "datatype": "INT32", "shape": [2, 2], "parameters": {"content_type": "np"}},
        {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "parameters": {"content_type": "str"}},
    ],
}

# docs/examples/streaming/text_model.py (a shorter sleep between words).
STREAMING = """
import asyncio
from typing import AsyncIterator
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.codecs import StringCodec


class TextModel(MLModel):

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        payload = [_ async for _ in payloads][0]
        text = StringCodec.decode_input(payload.inputs[0])[0]
        words = text.split(" ")

        split_text = []
        for i, word in enumerate(words):
            split_text.append(word if i == 0 else " " + word)

        for word in split_text:
            await asyncio.sleep(0.01)
            yield InferenceResponse(
                model_name=self._settings.name,
                outputs=[
                    StringCodec.encode_output(
                        name="output",
                        payload=[word],
                        use_bytes=True,
                    ),
                ],
            )
"""

# Errors as MLServer answers them: an MLServerError with its status, a ValueError 400, anything else 500.
FAILING = """
from mlserver import MLModel
from mlserver.errors import MLServerError, ModelNotFound
from mlserver.codecs import NumpyRequestCodec


class Failing(MLModel):
    async def predict(self, payload):
        kind = self.decode_request(payload, default_codec=NumpyRequestCodec).tolist()[0]
        if kind == 1:
            raise MLServerError("one is not allowed")
        if kind == 2:
            raise ModelNotFound("elsewhere")
        if kind == 3:
            raise ValueError("three is a bad value")
        if kind == 4:
            raise RuntimeError("the runtime broke")
        return self.encode_response(payload.inputs[0].data.root and __import__("numpy").asarray([kind]))
"""


def write_model(root: Path, name: str, file: str, source: str, settings: dict[str, Any]) -> Path:
    """A model's folder as MLServer's examples lay a model out (its runtime's module beside its settings file), and
    that settings file."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / file).write_text(source)
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder / "model-settings.json"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlserver-models")
    custom = write_model(
        root,
        "numpyro-divorce",
        "models.py",
        CUSTOM,
        {"name": "numpyro-divorce", "implementation": "models.LinearModel", "parameters": {"uri": "./samples.json"}},
    )
    (custom.parent / "samples.json").write_text(json.dumps({"a": [0.5, 1.5], "bM": [1.0, 1.0], "bA": [2.0, 2.0]}))
    write_model(
        root,
        "json-hello-world",
        "jsonmodels.py",
        JSON_MODEL,
        {"name": "json-hello-world", "implementation": "jsonmodels.JsonHelloWorldModel"},
    )
    write_model(root, "content-type-example", "runtime.py", CONTENT_TYPE, CONTENT_TYPE_SETTINGS)
    write_model(
        root,
        "text-model",
        "text_model.py",
        STREAMING,
        {
            "name": "text-model",
            "implementation": "text_model.TextModel",
            "inputs": [{"datatype": "BYTES", "name": "prompt", "shape": [1]}],
            "outputs": [{"datatype": "BYTES", "name": "output", "shape": [1]}],
        },
    )
    write_model(root, "failing", "failing.py", FAILING, {"name": "failing", "implementation": "failing.Failing"})
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    """The folder served as MLServer's layout (each model-settings.json a model, found under the repository), as
    ``workbench serve DIR --allow_python_models`` and ``workbench mlserver start DIR`` serve it."""
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository), allow_python_models=True)
    with ServerThread(options) as running:
        yield running


def infer(server: ServerThread, model: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{server.rest_url}/v2/models/{model}/infer", json=body, timeout=30)


JSON_INPUT = json.dumps({"name": "Foo Bar", "message": "Hello from Client (REST)!"})


# ------------------------------------------------------------------------------------------- load
def test_load_runs_the_runtime_load_and_predict_in_process(repository: Path) -> None:
    settings = repository / "numpyro-divorce" / "model-settings.json"
    servable = mlserver_runtime.load("numpyro-divorce", 1, settings, LoadPolicy(allow_python=True))
    try:
        marriage = Tensor("marriage", "FP32", (2,), np.array([1.0, 3.0], dtype=np.float32))
        age = Tensor("age", "FP32", (2,), np.array([0.0, 1.0], dtype=np.float32))
        answer = asyncio.run(servable.answer(WholeRequest((marriage, age))))
        (output,) = answer.outputs
        # mean over samples of a + bM * mean(marriage) + bA * mean(age) = 1.0 + 2.0 + 1.0
        assert (output.name, output.datatype, output.shape) == ("output-0", "FP64", (1,))
        assert output.data.tolist() == [4.0]
        assert output.parameters == {"content_type": "np"}
    finally:
        servable.close()


def test_a_runtime_loads_only_where_repository_python_may_run(repository: Path) -> None:
    settings = repository / "json-hello-world" / "model-settings.json"
    with pytest.raises(ServingError) as refused:
        mlserver_runtime.load("json-hello-world", 1, settings, LoadPolicy())
    assert refused.value.code is Code.FAILED_PRECONDITION
    assert "allow_python_models" in refused.value.message


def test_settings_naming_a_missing_class_or_file_fail_the_load_clearly(tmp_path: Path) -> None:
    missing_file = write_model(tmp_path, "a", "models.py", "x = 1\n", {"implementation": "nowhere.Model"})
    with pytest.raises(ServingError, match="nowhere.py beside the settings file"):
        mlserver_runtime.load("a", 1, missing_file, LoadPolicy(allow_python=True))
    not_a_model = write_model(
        tmp_path, "b", "models.py", "class Model:\n    pass\n", {"implementation": "models.Model"}
    )
    with pytest.raises(ServingError, match="not an MLModel class"):
        mlserver_runtime.load("b", 1, not_a_model, LoadPolicy(allow_python=True))
    no_implementation = write_model(tmp_path, "c", "models.py", "", {"name": "c"})
    with pytest.raises(ServingError, match='needs "implementation"'):
        mlserver_runtime.load("c", 1, no_implementation, LoadPolicy(allow_python=True))


def test_a_load_that_fails_in_the_runtime_is_the_load_error(tmp_path: Path) -> None:
    source = "from mlserver import MLModel\n\nclass M(MLModel):\n    async def load(self):\n        return False\n"
    settings = write_model(tmp_path, "m", "models.py", source, {"implementation": "models.M"})
    with pytest.raises(ServingError, match="returned False"):
        mlserver_runtime.load("m", 1, settings, LoadPolicy(allow_python=True))


# Where MLServer is not installed (CI: installing it would downgrade Starlette and FastAPI) workbench's layer answers
# ``import mlserver``. Run with the real package importable (docs/mlserver.md, "With MLServer installed"), this file's
# tests check that runtimes subclassing the real ``MLModel`` serve alike.
REAL_MLSERVER = mlserver_imports.real_package_installed()


@pytest.mark.skipif(REAL_MLSERVER, reason="the real mlserver package is installed: it serves, unmapped")
def test_mlserver_is_importable_only_while_a_runtime_is_loaded(repository: Path) -> None:
    import importlib.util

    assert importlib.util.find_spec("mlserver") is None
    settings = repository / "json-hello-world" / "model-settings.json"
    servable = mlserver_runtime.load("json-hello-world", 1, settings, LoadPolicy(allow_python=True))
    try:
        assert importlib.util.find_spec("mlserver") is not None
    finally:
        servable.close()
    assert importlib.util.find_spec("mlserver") is None


@pytest.mark.skipif(not REAL_MLSERVER, reason="needs the real mlserver package importable")
def test_the_real_package_serves_beside_tritons_grpc_messages(repository: Path) -> None:
    """Its runtimes subclass the real MLModel, and its gRPC messages (the v2 messages in package ``inference``, as
    Triton's, already imported here) import in a pool of their own; both sets stay usable."""
    settings = next((repository / "json-hello-world").rglob("model-settings.json"))
    servable = mlserver_runtime.load("json-hello-world", 1, settings, LoadPolicy(allow_python=True))
    try:
        import mlserver
        from mlserver.grpc import dataplane_pb2

        assert mlserver.__file__ is not None and "workbench" not in mlserver.__file__
        assert isinstance(servable._model, mlserver.MLModel)
        theirs = dataplane_pb2.ModelInferRequest(model_name="m")
        ours = service_pb2.ModelInferRequest.FromString(theirs.SerializeToString())
        assert ours.model_name == "m"
    finally:
        servable.close()


# ------------------------------------------------------------------------------------------- REST
def test_custom_example_over_rest(server: ServerThread) -> None:
    body = {
        "inputs": [
            {"name": "marriage", "datatype": "FP32", "shape": [1], "data": [1.0]},
            {"name": "age", "datatype": "FP32", "shape": [1], "data": [1.0]},
        ]
    }
    answer = infer(server, "numpyro-divorce", body)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert doc["model_name"] == "numpyro-divorce"
    assert doc["outputs"] == [
        {"name": "output-0", "shape": [1], "datatype": "FP64", "parameters": {"content_type": "np"}, "data": [4.0]}
    ]


def test_custom_json_example_over_rest(server: ServerThread) -> None:
    body = {
        "id": "request-1",
        "inputs": [
            {
                "name": "echo_request",
                "shape": [len(JSON_INPUT)],
                "datatype": "BYTES",
                "data": [JSON_INPUT],
                "parameters": {"content_type": "str"},
            }
        ],
    }
    answer = infer(server, "json-hello-world", body)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert doc["id"] == "request-1"
    (output,) = doc["outputs"]
    assert (output["name"], output["datatype"], output["parameters"]) == (
        "echo_response",
        "BYTES",
        {"content_type": "str"},
    )
    echoed = json.loads(output["data"][0])
    assert echoed == {
        "request": {"echo_request": json.loads(JSON_INPUT)},
        "server_response": "Got your request. Hello from the server.",
    }
    assert output["shape"] == [len(output["data"][0].encode())]


def test_content_types_choose_the_codecs(server: ServerThread) -> None:
    body = {
        "inputs": [
            {"name": "metadata-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
            {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "data": "hello world 😁"},
            {
                "name": "custom",
                "datatype": "BYTES",
                "shape": [1],
                "data": ["abc"],
                "parameters": {"content_type": "reversed"},
            },
        ],
    }
    answer = infer(server, "content-type-example", body)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    decoded = {o["name"]: (o["parameters"]["decoded_as"], o["data"][0]) for o in doc["outputs"]}
    assert decoded == {
        "metadata-np": ("ndarray", repr(np.array([[1, 2], [3, 4]], dtype=np.int32))),  # the settings' content type
        "metadata-str": ("list", repr(["hello world 😁"])),
        "custom": ("str", repr("cba")),  # the request's content type, a codec the runtime registered
    }
    assert doc["parameters"] == {"request_as": "InferenceRequest"}  # no content type for the whole request


def test_a_request_content_type_decodes_the_whole_request(server: ServerThread) -> None:
    body = {
        "parameters": {"content_type": "pd"},
        "inputs": [
            # One column each: MLServer's PandasCodec cannot make a column of [2, 2] ("cannot reshape").
            {"name": "metadata-np", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]},
            {"name": "names", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b"]},
        ],
    }
    answer = infer(server, "content-type-example", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["parameters"] == {"request_as": "DataFrame"}


def test_errors_answer_as_mlserver_answers_them(server: ServerThread) -> None:
    def status(kind: int) -> tuple[int, str]:
        body = {"inputs": [{"name": "kind", "datatype": "INT64", "shape": [1], "data": [kind]}]}
        answer = infer(server, "failing", body)
        return answer.status_code, answer.json()["error"]

    assert status(1)[0] == 400 and "one is not allowed" in status(1)[1]
    assert status(2)[0] == 404
    assert status(3)[0] == 400 and "three is a bad value" in status(3)[1]
    assert status(4)[0] == 500 and "the runtime broke" in status(4)[1]
    bad = infer(server, "failing", {"inputs": [{"name": "kind", "datatype": "INT64", "shape": [1], "data": ["x"]}]})
    assert bad.status_code == 400 and "INT64" in bad.json()["error"]
    unknown = infer(server, "failing", {"inputs": [{"name": "k", "datatype": "FP99", "shape": [1], "data": [1]}]})
    assert unknown.status_code == 400


# ------------------------------------------------------------------------------------------- gRPC
@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_custom_json_example_over_grpc(stub: Any) -> None:
    """As MLServer's converters send it: the text in bytes_contents, the content type as a string parameter."""
    request = service_pb2.ModelInferRequest(model_name="json-hello-world", id="g-1")
    tensor = request.inputs.add(name="echo_request", datatype="BYTES", shape=[len(JSON_INPUT)])
    tensor.parameters["content_type"].string_param = "str"
    tensor.contents.bytes_contents.append(JSON_INPUT.encode())
    response = stub.ModelInfer(request, timeout=30)
    # The runtime's own model_version (self.version: none in these settings), as MLServer answers it.
    assert (response.model_name, response.model_version, response.id) == ("json-hello-world", "", "g-1")
    (output,) = response.outputs
    assert (output.name, output.datatype) == ("echo_response", "BYTES")
    assert output.parameters["content_type"].string_param == "str"
    echoed = json.loads(output.contents.bytes_contents[0])
    assert echoed["request"] == {"echo_request": json.loads(JSON_INPUT)}


def test_errors_over_grpc_are_precise_codes(stub: Any) -> None:
    def code(kind: int) -> grpc.StatusCode:
        request = service_pb2.ModelInferRequest(model_name="failing")
        request.inputs.add(name="kind", datatype="INT64", shape=[1]).contents.int64_contents.append(kind)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(request, timeout=30)
        return failed.value.code()

    assert code(1) is grpc.StatusCode.INVALID_ARGUMENT
    assert code(2) is grpc.StatusCode.NOT_FOUND
    assert code(4) is grpc.StatusCode.INTERNAL


# ------------------------------------------------------------------------------------------- streams
PROMPT = "What is the capital of France?"
WORDS = ["What", " is", " the", " capital", " of", " France?"]


@pytest.mark.parametrize("route", ["infer_stream", "generate_stream"])
def test_streaming_example_over_rest_server_sent_events(server: ServerThread, route: str) -> None:
    body = {
        "inputs": [
            {
                "name": "prompt",
                "shape": [1],
                "datatype": "BYTES",
                "data": [PROMPT],
                "parameters": {"content_type": "str"},
            }
        ],
        "outputs": [{"name": "output"}],
    }
    with requests.post(f"{server.rest_url}/v2/models/text-model/{route}", json=body, stream=True, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line[len(b"data: ") :] for line in answer.iter_lines() if line.startswith(b"data: ")]
    responses = [json.loads(event) for event in events]
    assert [r["outputs"][0]["data"][0] for r in responses] == WORDS
    assert all(r["outputs"][0]["parameters"] == {"content_type": "str"} for r in responses)


def test_streaming_example_over_grpc_in_mlserver_message_shape(server: ServerThread) -> None:
    """MLServer's dataplane.proto declares ModelStreamInfer as ``returns (stream ModelInferResponse)``: its clients
    read bare responses, as this stub (built as MLServer's generated one is) does."""

    async def run() -> list[Any]:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            stream = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )

            async def requests_of_stream() -> AsyncIterator[Any]:
                request = service_pb2.ModelInferRequest(model_name="text-model")
                tensor = request.inputs.add(name="prompt", datatype="BYTES", shape=[1])
                tensor.parameters["content_type"].string_param = "str"
                tensor.contents.bytes_contents.append(PROMPT.encode())
                yield request

            return [response async for response in stream(requests_of_stream(), timeout=30)]

    responses = asyncio.run(run())
    assert [r.outputs[0].contents.bytes_contents[0].decode() for r in responses] == WORDS
    assert {r.model_name for r in responses} == {"text-model"}


def test_infer_stream_refuses_other_models_before_streaming(server: ServerThread, tmp_path: Path) -> None:
    answer = requests.post(f"{server.rest_url}/v2/models/nothing/infer_stream", json={"inputs": []}, timeout=30)
    assert answer.status_code == 404
