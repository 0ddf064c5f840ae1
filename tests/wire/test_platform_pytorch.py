"""The PyTorch platform: nn.Modules exported by workbench.export (torch.export's model.pt2 and TorchScript's model.pt),
a TorchScript model in a Triton repository, served over TF Serving's REST and gRPC and v2 (tritonclient) exactly as
the modules answer in-process, with batching, and with bad models and bad requests refused precisely."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from sklearn.datasets import load_digits
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

import workbench
from tests.torch_models import DigitsMLP, Pair, pair_inputs
from tests.waiting import version_states, wait_until
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.platforms import pytorch as pytorch_platform
from workbench.platforms.base import LoadPolicy
from workbench.publishing import ExportError
from workbench.server import ServerThread

MODELS = ("mlp", "mlp_ts", "pair", "pair_ts", "triton_ts")


# ============================================================================================= models and servers
@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    data = load_digits()
    return (data.data / 16).astype(np.float32), data.target


@pytest.fixture(scope="module")
def mlp(digits) -> DigitsMLP:
    """Trained a little on digits (full batch, a few dozen steps: well under a second)."""
    torch.manual_seed(0)
    model = DigitsMLP()
    x, y = torch.from_numpy(digits[0]), torch.from_numpy(digits[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(40):
        optimizer.zero_grad()
        torch.nn.functional.nll_loss(torch.log(model(x)), y).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def pair() -> Pair:
    torch.manual_seed(1)
    return Pair().eval()


def module_answer(module: torch.nn.Module, *inputs: np.ndarray) -> dict[str, np.ndarray]:
    """The module's own answer, named as the platform names it."""
    with torch.no_grad():
        result = module(*(torch.from_numpy(np.array(i)) for i in inputs))
    return {name: value.numpy() for name, value in pytorch_platform.named_leaves(result)}


def assert_served(got: np.ndarray, expected: np.ndarray) -> None:
    """A served answer equals the module's own, up to the last bits: a row computed in a batch of another size, or
    on a GPU (--pytorch_device=auto puts the server's models there), may differ in them."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def triton_folder(root: Path, pair: Pair) -> None:
    """Pair as Triton's libtorch backend takes it: model.pt traced by the test, config.pbtxt with INPUT__0 names."""
    folder = root / "triton_ts"
    (folder / "1").mkdir(parents=True)
    features, counts = pair_inputs(2)
    traced = torch.jit.trace(pair, (torch.from_numpy(features), torch.from_numpy(counts)), strict=False)
    torch.jit.save(traced, str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "INPUT__1" data_type: TYPE_INT64 dims: [ ] } ]\n'
        'output [ { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] }, '
        '{ name: "best" data_type: TYPE_INT64 dims: [ ] } ]\n'
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory, digits, mlp, pair) -> Path:
    root = tmp_path_factory.mktemp("pytorch-models")
    x = digits[0]
    workbench.export(mlp, "mlp", root, example_inputs=(x[:3],))
    workbench.export(mlp, "mlp_ts", root, examples=x[:3], format="torchscript")
    features, counts = pair_inputs(1)  # a batch of one: doubled by the exporter, so the batch stays dynamic
    workbench.export(pair, "pair", root, example_inputs={"features": features, "counts": counts})
    workbench.export(pair, "pair_ts", root, example_inputs=(features, counts), format="torchscript")
    triton_folder(root, pair)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.pt2").write_bytes(b"PK\x03\x04 not really a zip archive")
    return root


@pytest.fixture(scope="module")
def server(repository) -> Iterator[ServerThread]:
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(repository))
    with ServerThread(options) as running:
        for model in MODELS:
            wait_until(lambda m=model: version_states(running.rest_url, m).get("1") == "AVAILABLE", what=model)
        yield running


@pytest.fixture(scope="module")
def batched(repository) -> Iterator[ServerThread]:
    params = repository.parent / "batching.config"
    params.write_text(
        "max_batch_size { value: 64 } batch_timeout_micros { value: 2000 } "
        "max_enqueued_batches { value: 1000 } num_batch_threads { value: 2 }\n"
    )
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(repository),
        enable_batching=True,
        batching_parameters_file=str(params),
    )
    with ServerThread(options) as running:
        for model in ("mlp", "pair_ts"):
            wait_until(lambda m=model: version_states(running.rest_url, m).get("1") == "AVAILABLE", what=model)
        yield running


def predict(server: ServerThread, model: str, body: Any) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=60)


def grpc_predict(server: ServerThread, model: str, **inputs: np.ndarray) -> predict_pb2.PredictResponse:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for alias, value in inputs.items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(server.grpc_target) as channel:
        return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)


# ================================================================================================ signatures
def test_an_exported_program_carries_names_dtypes_and_the_dynamic_batch(repository):
    servable = pytorch_platform.load("pair", 1, str(repository / "pair" / "1"), LoadPolicy())
    signature = servable.signatures["serving_default"]
    assert {a: (s.dtype, s.shape) for a, s in signature.inputs.items()} == {
        "features": (np.float32, (-1, 4)),
        "counts": (np.int64, (-1,)),
    }
    assert {a: (s.dtype, s.shape) for a, s in signature.outputs.items()} == {
        "scores": (np.float32, (-1, 3)),
        "best": (np.int64, (-1,)),
    }
    assert signature.batchable
    assert sorted(p.name for p in (repository / "pair" / "1").iterdir()) == ["model.pt2"]  # no sidecar
    with zipfile.ZipFile(repository / "pair" / "1" / "model.pt2") as archive:  # and no pickle inside
        assert not [i.filename for i in archive.infolist() if i.filename.endswith((".pt", ".pkl")) and i.file_size]


def test_torchscript_is_declared_beside_it_in_workbench_json(repository):
    folder = repository / "mlp_ts" / "1"
    assert json.loads((folder / "workbench.json").read_text()) == {
        "platform": "pytorch",
        "inputs": [{"name": "pixels", "dtype": "float32", "shape": [-1, 64]}],
        "outputs": [{"name": "output_0", "dtype": "float32", "shape": [-1, 10]}],
    }
    signature = pytorch_platform.load("m", 1, str(folder), LoadPolicy()).signatures["serving_default"]
    assert signature.inputs["pixels"].shape == (-1, 64) and signature.batchable


def test_torchscript_without_a_declaration_fails_naming_the_fix(tmp_path, repository):
    (tmp_path / "model.pt").write_bytes((repository / "mlp_ts" / "1" / "model.pt").read_bytes())
    with pytest.raises(ServingError) as info:
        pytorch_platform.load("m", 1, str(tmp_path), LoadPolicy())
    assert info.value.code is Code.FAILED_PRECONDITION
    assert "does not record its inputs' types and shapes" in info.value.message
    assert '"inputs": [{"name": "x", "dtype": "float32"' in info.value.message


@pytest.mark.parametrize(
    ("content", "code", "fragment"),
    [
        (b"garbage", Code.DATA_LOSS, "is not a PyTorch archive"),
        (b"PK\x03\x04 truncated", Code.DATA_LOSS, "is not a PyTorch archive"),
    ],
)
def test_corrupt_archives_fail_with_precise_codes(tmp_path, content, code, fragment):
    (tmp_path / "model.pt2").write_bytes(content)
    with pytest.raises(ServingError) as info:
        pytorch_platform.load("m", 1, str(tmp_path), LoadPolicy())
    assert info.value.code is code and fragment in info.value.message


def test_an_archive_saved_by_torch_export_save_itself_loads_with_its_tensor_pickles(tmp_path):
    linear = torch.nn.Linear(4, 2).eval()
    batch = torch.export.Dim("batch")
    program = torch.export.export(linear, (torch.ones(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "model.pt2"))  # with its example inputs, pickled by torch.save
    servable = pytorch_platform.load("m", 1, str(tmp_path), LoadPolicy())
    signature = servable.signatures["serving_default"]
    assert list(signature.inputs) == ["input"] and list(signature.outputs) == ["output_0"]
    x = np.ones((3, 4), np.float32)
    with torch.no_grad():
        expected = linear(torch.from_numpy(x)).numpy()
    assert_served(servable.run(signature, {"input": x}, ["output_0"])["output_0"], expected)


class _Touch:
    """Unpickling this creates a file: the proof that a refused archive ran nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_an_archive_holding_more_than_tensors_loads_only_with_allow_pickle(tmp_path, repository):
    source = repository / "pair" / "1" / "model.pt2"
    marker = tmp_path / "ran"
    payload = io.BytesIO()
    torch.save({"weight": _Touch(marker)}, payload, pickle_protocol=2)
    (tmp_path / "v").mkdir()
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(tmp_path / "v" / "model.pt2", "w") as crafted:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                for entry in config["config"].values():
                    entry["use_pickle"] = True
                    entry["path_name"] = "evil"
                data = json.dumps(config).encode()
            crafted.writestr(item, data)
        folder = next(n for n in original.namelist() if n.endswith("model_weights_config.json")).rpartition("/")[0]
        crafted.writestr(f"{folder}/evil", payload.getvalue())
    with pytest.raises(ServingError) as info:
        pytorch_platform.load("m", 1, str(tmp_path / "v"), LoadPolicy())
    assert info.value.code is Code.FAILED_PRECONDITION
    assert "holds pickled objects" in info.value.message and "--allow_pickle" in info.value.message
    assert not marker.exists()


def test_a_gpu_the_process_cannot_use_is_refused_by_name():
    if torch.cuda.is_available():
        with pytest.raises(ServingError, match="sees .* CUDA GPU"):
            pytorch_platform.resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ServingError) as info:
            pytorch_platform.resolve_device("cuda")
        assert info.value.code is Code.FAILED_PRECONDITION and "sees no CUDA GPU" in info.value.message
        assert pytorch_platform.resolve_device("auto").type == "cpu"


# ==================================================================================================== serving
@pytest.mark.parametrize("model", ["mlp", "mlp_ts"])
def test_rest_answers_as_the_module_does(server, digits, mlp, model):
    x = digits[0][:5]
    expected = module_answer(mlp, x)["output_0"]
    r = predict(server, model, {"instances": x.tolist()})
    assert r.status_code == 200, r.text
    assert_served(np.array(r.json()["predictions"], np.float32), expected)
    r = predict(server, model, {"inputs": {"pixels": x.tolist()}})
    assert_served(np.array(r.json()["outputs"], np.float32), expected)


def test_each_call_runs_with_the_servers_thread_count(repository, digits):
    servable = pytorch_platform.load("mlp", 1, str(repository / "mlp" / "1"), LoadPolicy(pytorch_threads=1))
    signature = servable.signatures["serving_default"]

    def call() -> int:
        torch.set_num_threads(2)  # a thread that ran PyTorch before, with a count of its own
        servable.run(signature, {"pixels": digits[0][:2]}, ["output_0"])
        return torch.get_num_threads()

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(call).result() == 1


@pytest.mark.parametrize("model", ["pair", "pair_ts"])
def test_grpc_answers_two_inputs_with_a_dict_of_outputs(server, pair, model):
    features, counts = pair_inputs(4)
    expected = module_answer(pair, features, counts)
    response = grpc_predict(server, model, features=features, counts=counts)
    assert sorted(response.outputs) == ["best", "scores"]
    assert_served(tf.make_ndarray(response.outputs["scores"]), expected["scores"])
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["best"]), expected["best"])


@pytest.mark.parametrize("model", ["pair", "triton_ts"])
def test_v2_rest_and_grpc_answer_as_the_module_does(server, pair, model):
    features, counts = pair_inputs(3, start=5)
    expected = module_answer(pair, features, counts)
    names = ("features", "counts") if model == "pair" else ("INPUT__0", "INPUT__1")
    for module, url in [
        (httpclient, server.rest_url.removeprefix("http://")),
        (grpcclient, server.grpc_target),
    ]:
        client = module.InferenceServerClient(url)
        inputs = [module.InferInput(names[0], [3, 4], "FP32"), module.InferInput(names[1], [3], "INT64")]
        inputs[0].set_data_from_numpy(features)
        inputs[1].set_data_from_numpy(counts)
        result = client.infer(model, inputs)
        assert_served(result.as_numpy("scores"), expected["scores"])
        np.testing.assert_array_equal(result.as_numpy("best"), expected["best"])
        client.close()
    metadata = httpclient.InferenceServerClient(server.rest_url.removeprefix("http://")).get_model_metadata(model)
    assert metadata["platform"] == "pytorch_libtorch"
    assert {i["name"]: (i["datatype"], i["shape"]) for i in metadata["inputs"]} == {
        names[0]: ("FP32", [-1, 4]),
        names[1]: ("INT64", [-1]),
    }


@pytest.mark.parametrize(
    ("model", "body", "fragment"),
    [
        ("mlp", {"instances": [[0.5] * 63]}, 'Input "pixels" expects float [-1,64] but received float [1,63]'),
        ("mlp_ts", {"instances": [[0.5] * 63]}, 'Input "pixels" expects float [-1,64] but received float [1,63]'),
        ("pair", {"inputs": {"features": [[1.0] * 4], "counts": [1.5]}}, 'Input "counts" expects int64 [-1]'),
    ],
)
def test_bad_rest_inputs_are_400_naming_the_input(server, model, body, fragment):
    r = predict(server, model, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(fragment)


@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        ({"pixels": np.zeros((2, 63), np.float32)}, 'Input "pixels" expects float [-1,64] but received float [2,63]'),
        ({"pixels": np.zeros((2, 64), np.float64)}, 'Input "pixels" expects float [-1,64] but received double [2,64]'),
    ],
)
def test_bad_grpc_inputs_are_invalid_argument(server, inputs, fragment):
    with pytest.raises(grpc.RpcError) as info:
        grpc_predict(server, "mlp", **inputs)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(fragment)


def test_a_corrupt_archive_fails_its_own_version_while_the_others_serve(server, digits):
    wait_until(lambda: version_states(server.rest_url, "broken").get("1") == "END", what="the broken version")
    status = requests.get(f"{server.rest_url}/v1/models/broken", timeout=30).json()["model_version_status"][0]
    assert status["status"]["error_code"] == "DATA_LOSS"
    assert "model.pt2 is not a PyTorch archive" in status["status"]["error_message"]
    assert predict(server, "mlp", {"instances": digits[0][:1].tolist()}).status_code == 200


# =================================================================================================== batching
def test_concurrent_clients_with_batching_get_the_modules_answers(batched, digits, mlp, pair):
    x = digits[0]

    def call(i: int) -> tuple[str, Any, dict[str, np.ndarray]]:
        rows = 1 + i % 3
        if i % 2 == 0:
            pixels = x[i * 5 :][:rows]
            r = predict(batched, "mlp", {"instances": pixels.tolist()})
            assert r.status_code == 200, r.text
            return "mlp", (pixels,), {"output_0": np.array(r.json()["predictions"], np.float32)}
        features, counts = pair_inputs(rows, start=i)
        response = grpc_predict(batched, "pair_ts", features=features, counts=counts)
        return "pair", (features, counts), {k: tf.make_ndarray(v) for k, v in response.outputs.items()}

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(call, range(48)))
    for model, inputs, got in answers:
        expected = module_answer(mlp if model == "mlp" else pair, *inputs)
        for name, value in expected.items():
            assert_served(got[name], value)
    health = requests.get(batched.rest_url + "/workbench/v1/health", timeout=30).json()
    assert health["batching"]["mlp"] is True and health["batching"]["pair_ts"] is True


# ================================================================================================ export side
def test_export_needs_example_inputs_and_refuses_what_it_cannot_write(tmp_path, mlp, digits):
    with pytest.raises(ExportError, match="exported with example_inputs="):
        workbench.export(mlp, "m", tmp_path)
    with pytest.raises(ExportError, match="'pt2' \\(the default\\) or 'torchscript', not 'onnx'"):
        workbench.export(mlp, "m", tmp_path, example_inputs=(digits[0][:2],), format="onnx")
    with pytest.raises(ExportError, match="example_inputs= is for PyTorch modules"):
        workbench.export(torch.nn.Linear(2, 2).weight.detach().numpy(), "m", tmp_path, example_inputs=(1,))
    assert not (tmp_path / "m").exists()


def test_export_leaves_the_notebooks_module_in_its_mode_and_writes_warmup(tmp_path, digits):
    module = DigitsMLP().train()
    result = workbench.export(module, "m", tmp_path, examples={"pixels": digits[0][:2]}, format="torchscript")
    assert module.training
    assert result.warmup_records == 1
    assert result.signatures == {"serving_default": "(pixels: float32[?, 64]) -> (output_0: float32[?, 10])"}


@pytest.mark.parametrize("model", ["mlp", "mlp_ts"])
def test_an_unloaded_version_lets_go_of_its_tensors_at_once(repository, model):
    """An exported program's module is a reference cycle (a GraphModule and its graph): closing the servable frees
    its weights at once, not at the next run of the cyclic collector (a memory budget counts them free then)."""
    import gc
    import weakref

    servable = pytorch_platform.load(model, 1, str(repository / model / "1"), LoadPolicy(pytorch_device="cpu"))
    weights = [weakref.ref(p) for p in servable._module.parameters()]  # type: ignore[attr-defined]
    assert weights and all(ref() is not None for ref in weights)
    gc.disable()
    try:
        servable.close()
        assert all(ref() is None for ref in weights)
    finally:
        gc.enable()
