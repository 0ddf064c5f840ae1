"""PyTorch on a CUDA GPU: answers equal the CPU's, a server on the GPU batches concurrent clients, and a GPU memory
budget is charged each version's GPU bytes, evicts the least recently used and frees its memory.

Every test here needs a GPU that PyTorch sees, and skips where there is none (CI; ``make test`` on a laptop). The
module imports no TensorFlow, so it runs as it is on a GPU machine that has PyTorch but no TensorFlow:
``benchmarks/gpu_device.sh`` runs it there (``PYTEST=tests/wire/test_pytorch_cuda.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch

import workbench
from tests.torch_models import DigitsMLP, Pair, pair_inputs
from tests.waiting import version_states, wait_until
from workbench.config.options import ServerOptions
from workbench.platforms import pytorch as pytorch_platform
from workbench.platforms.base import LoadPolicy
from workbench.server import ServerThread

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU that PyTorch sees (torch.cuda.is_available)"
)

MiB = 2**20
WIDE = 4096  # a Linear(4096, 4096): 64 MiB of float32 weights, one version's GPU charge in the budget tests
GPU_BUDGET = 160 * MiB  # holds two such versions, not three


def constant(value: float, width: int = WIDE) -> torch.nn.Linear:
    """A wide layer that answers ``value`` everywhere (zero weights, a constant bias): its answer names it."""
    layer = torch.nn.Linear(width, width)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.fill_(value)
    return layer.eval()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("cuda-models")
    mlp, pair = DigitsMLP().eval(), Pair().eval()
    pixels = (torch.rand(2, 64),)
    workbench.export(mlp, "mlp", root, example_inputs=pixels)
    workbench.export(mlp, "mlp_ts", root, example_inputs=pixels, format="torchscript")
    two = tuple(torch.from_numpy(a) for a in pair_inputs(2))
    workbench.export(pair, "pair", root, example_inputs=two)
    workbench.export(pair, "pair_ts", root, example_inputs=two, format="torchscript")
    return root


def wait_available(server: ServerThread, *models: str) -> None:
    for model in models:
        wait_until(lambda m=model: version_states(server.rest_url, m).get("1") == "AVAILABLE", what=model)


@pytest.mark.parametrize("model", ["mlp", "mlp_ts", "pair", "pair_ts"])
def test_on_the_gpu_answers_equal_the_cpus(repository: Path, model: str) -> None:
    path = str(repository / model / "1")
    on_cpu = pytorch_platform.load(model, 1, path, LoadPolicy(pytorch_device="cpu"))
    on_gpu = pytorch_platform.load(model, 1, path, LoadPolicy(pytorch_device="cuda"))
    assert on_gpu.device.type == "cuda"  # type: ignore[attr-defined]
    assert next(on_gpu._module.parameters()).device.type == "cuda"  # type: ignore[attr-defined]
    signature = on_cpu.signatures["serving_default"]
    rows = np.random.default_rng(0).random((17, 64), dtype=np.float32)
    inputs = {"pixels": rows} if "mlp" in model else dict(zip(["features", "counts"], pair_inputs(17), strict=True))
    expected = on_cpu.run(signature, inputs, list(signature.outputs))
    got = on_gpu.run(on_gpu.signatures["serving_default"], inputs, list(signature.outputs))
    for name, value in expected.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def on_gpu(repository: Path) -> Iterator[ServerThread]:
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
        pytorch_device="cuda",
    )
    with ServerThread(options) as running:
        wait_available(running, "mlp", "pair_ts")
        yield running


def test_a_server_on_the_gpu_batches_concurrent_clients_and_answers_as_the_cpu(repository: Path, on_gpu) -> None:
    on_cpu = pytorch_platform.load("mlp", 1, str(repository / "mlp" / "1"), LoadPolicy(pytorch_device="cpu"))
    signature = on_cpu.signatures["serving_default"]
    rows = np.random.default_rng(1).random((256, 64), dtype=np.float32)
    expected = on_cpu.run(signature, {"pixels": rows}, list(signature.outputs))["output_0"]
    url = f"{on_gpu.rest_url}/v1/models/mlp:predict"

    def send(start: int) -> list[tuple[int, list[float]]]:
        answers = []
        with requests.Session() as session:
            for row in range(start, len(rows), 16):
                r = session.post(url, json={"instances": rows[row : row + 1].tolist()}, timeout=60)
                assert r.status_code == 200, r.text
                answers.append((row, r.json()["predictions"][0]))
        return answers

    with ThreadPoolExecutor(16) as pool:
        answered = [item for part in pool.map(send, range(16)) for item in part]
    assert len(answered) == len(rows)
    for row, got in answered:
        np.testing.assert_allclose(np.array(got, np.float32), expected[row], rtol=1e-4, atol=1e-5)
    stats = requests.get(f"{on_gpu.rest_url}/workbench/v1/stats", timeout=10).json()
    mean_batch = stats["models"]["mlp"]["1"]["mean_batch_size"]
    assert mean_batch is not None and mean_batch > 1, stats["models"]["mlp"]  # 16 clients: calls held several rows

    features, counts = pair_inputs(5)
    r = requests.post(
        f"{on_gpu.rest_url}/v1/models/pair_ts:predict",
        json={"inputs": {"features": features.tolist(), "counts": counts.tolist()}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    on_cpu_pair = pytorch_platform.load("pair_ts", 1, str(repository / "pair_ts" / "1"), LoadPolicy())
    want = on_cpu_pair.run(
        on_cpu_pair.signatures["serving_default"], {"features": features, "counts": counts}, ["scores", "best"]
    )
    np.testing.assert_allclose(np.array(r.json()["outputs"]["scores"], np.float32), want["scores"], rtol=1e-4)
    assert r.json()["outputs"]["best"] == want["best"].tolist()


# ================================================================================================ GPU budget
@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("gpu-budget")
    example = (torch.zeros(1, WIDE),)
    for index in range(3):
        workbench.export(constant(float(index + 1)), f"w{index}", root, example_inputs=example)
    huge = 2 * WIDE  # 256 MiB of weights: more than the whole GPU budget
    workbench.export(constant(9.0, huge), "huge", root, example_inputs=(torch.zeros(1, huge),))
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(root),
        pytorch_device="cuda",
        memory_budget=f"gpu:{GPU_BUDGET}",
        load_on_demand=True,
    )
    with ServerThread(options) as running:
        yield running


def answer(server: ServerThread, model: str, width: int = WIDE) -> requests.Response:
    return requests.post(
        f"{server.rest_url}/v1/models/{model}:predict", json={"instances": [[0.5] * width]}, timeout=120
    )


def memory(server: ServerThread, model: str) -> dict[str, Any]:
    doc = requests.get(f"{server.rest_url}/workbench/v1/models/{model}", timeout=10).json()
    return doc["versions"][0]["memory"]  # type: ignore[no-any-return]


def test_a_gpu_budget_charges_gpu_bytes_evicts_the_least_recent_and_frees_the_gpu(budgeted) -> None:
    weights = WIDE * WIDE * 4
    for index in (0, 1):
        r = answer(budgeted, f"w{index}")
        assert r.status_code == 200, r.text
        assert set(r.json()["predictions"][0]) == {float(index + 1)}
    for index in (0, 1):
        charged = memory(budgeted, f"w{index}")
        assert charged["residency"] == "resident", charged
        # Its weights, on the GPU, measured by PyTorch's allocator (not the CUDA context, not the host's copy).
        assert weights <= charged["charged_gpu_bytes"] < weights + 8 * MiB, charged
    held = torch.cuda.memory_allocated()
    assert held >= 2 * weights

    r = answer(budgeted, "w2")  # a third does not fit: w0, the least recently used, goes
    assert r.status_code == 200, r.text
    assert set(r.json()["predictions"][0]) == {3.0}
    assert memory(budgeted, "w0")["residency"] == "evicted"
    assert memory(budgeted, "w1")["residency"] == "resident"
    # The evicted version's tensors are gone from the GPU, not only from the ledger: w2's weights took w0's place.
    # (The slack is for what PyTorch allocates beside the models: cuBLAS takes a workspace per thread on its first
    # product, 64 MiB on an H100, which is the process's, charged to no version.)
    wait_until(lambda: torch.cuda.memory_allocated() < held + weights // 2, what="w0's GPU memory freed")
    stats = requests.get(f"{budgeted.rest_url}/workbench/v1/stats", timeout=10).json()["memory"]
    assert stats["budget_gpu_bytes"] == GPU_BUDGET
    assert 2 * weights <= stats["charged_gpu_bytes"] <= GPU_BUDGET, stats

    r = answer(budgeted, "w0")  # asked for again: reloaded onto the GPU, w1 goes
    assert r.status_code == 200, r.text
    assert set(r.json()["predictions"][0]) == {1.0}
    assert memory(budgeted, "w1")["residency"] == "evicted"
    assert memory(budgeted, "w0")["loads"] == 2


def test_a_version_bigger_than_the_whole_gpu_budget_is_refused_and_the_rest_keep_serving(budgeted) -> None:
    before = torch.cuda.memory_allocated()
    r = answer(budgeted, "huge", 2 * WIDE)
    assert r.status_code == 429, r.text
    assert "Insufficient resources" in r.json()["error"]
    r = answer(budgeted, "w2")
    assert r.status_code == 200, r.text
    # Refused before it loaded (its files, counted on the GPU, are more than the budget): nothing went to the GPU.
    assert memory(budgeted, "huge")["loads"] == 0
    assert torch.cuda.memory_allocated() < before + 64 * MiB  # its 256 MiB of weights never came
