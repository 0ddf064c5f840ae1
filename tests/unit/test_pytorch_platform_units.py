"""The PyTorch platform's logic that needs no torch: naming what forward() returns, pairing a Triton config's tensors
with forward()'s parameters and results, reading a TorchScript declaration, and the --pytorch_* flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workbench.config.serve_options import FlagError, serve_options
from workbench.config.triton_model_config import TritonTensor
from workbench.core.errors import Code, ServingError
from workbench.platforms import pytorch


def test_named_leaves_names_a_tensor_a_tuple_a_dict_and_nested_results() -> None:
    assert pytorch.named_leaves("t") == [("output_0", "t")]
    assert pytorch.named_leaves(("a", "b")) == [("output_0", "a"), ("output_1", "b")]
    assert pytorch.named_leaves({"scores": "s", "best": "b"}) == [("scores", "s"), ("best", "b")]
    assert pytorch.named_leaves({"pair": ("x", "y"), "z": "z"}) == [("pair_0", "x"), ("pair_1", "y"), ("z", "z")]
    assert pytorch.named_leaves(("a", {"k": "v"})) == [("output_0", "a"), ("output_1_k", "v")]


def tensor(name: str, dtype: str, dims: tuple[int, ...]) -> TritonTensor:
    return TritonTensor(name, np.dtype(dtype), "TYPE_X", dims)


def test_triton_inputs_pair_by_index_suffix_then_by_parameter_name_then_by_order() -> None:
    by_index = pytorch.triton_declaration(
        [tensor("B__1", "int64", ()), tensor("A__0", "float32", (4,))], [tensor("OUTPUT__0", "float32", (3,))], True,
        ["features", "counts"],
    )  # fmt: skip
    assert [(s.alias, s.name, s.shape) for s in by_index.inputs] == [
        ("A__0", "features", (-1, 4)),
        ("B__1", "counts", (-1,)),
    ]
    by_name = pytorch.triton_declaration(
        [tensor("counts", "int64", ()), tensor("features", "float32", (4,))], [tensor("y", "float32", ())], False,
        ["features", "counts"],
    )  # fmt: skip
    assert [(s.alias, s.name, s.shape) for s in by_name.inputs] == [
        ("features", "features", (4,)),
        ("counts", "counts", ()),
    ]
    by_order = pytorch.triton_declaration(
        [tensor("p", "float32", ()), tensor("q", "float32", ())], [tensor("y", "float32", ())], False, ["a", "b"]
    )
    assert [(s.alias, s.name) for s in by_order.inputs] == [("p", "a"), ("q", "b")]


def test_triton_outputs_are_found_by_index_suffix_by_key_or_by_order() -> None:
    declared = pytorch.triton_declaration(
        [tensor("INPUT__0", "float32", (4,))],
        [tensor("OUTPUT__1", "float32", ()), tensor("scores", "float32", (3,))],
        True,
        ["x"],
    )
    assert [(s.alias, s.name) for s in declared.outputs] == [("OUTPUT__1", "output_1"), ("scores", "scores")]
    assert declared.positions == {"output_1": 1, "scores": 1}


def test_a_triton_config_without_tensors_is_refused() -> None:
    with pytest.raises(ServingError) as info:
        pytorch.triton_declaration([], [], True, ["x"])
    assert info.value.code is Code.INVALID_ARGUMENT and "declares its inputs and outputs" in info.value.message


def test_a_torchscript_declaration_is_read_and_checked(tmp_path: Path) -> None:
    document = {
        "platform": "pytorch",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4]}],
        "outputs": [{"name": "output_0", "dtype": "int64", "shape": [-1]}],
    }
    (tmp_path / "workbench.json").write_text(json.dumps(document))
    signature = pytorch.declared_signature(pytorch.declared_in_folder(tmp_path))
    assert signature.inputs["x"].dtype == np.float32 and signature.outputs["output_0"].shape == (-1,)
    assert signature.batchable
    document["inputs"] = [{"name": "x", "dtype": "bfloat16"}]
    (tmp_path / "workbench.json").write_text(json.dumps(document))
    with pytest.raises(ServingError, match="needs a name and a dtype of float32"):
        pytorch.declared_in_folder(tmp_path)


def test_pytorch_flags_are_parsed_and_checked() -> None:
    options = serve_options(["--model_repository=m", "--pytorch_device=cuda:1", "--pytorch_threads=4"])
    assert (options.pytorch_device, options.pytorch_threads) == ("cuda:1", 4)
    assert serve_options(["--model_repository=m"]).pytorch_device == "auto"
    with pytest.raises(FlagError, match="expected auto, cpu, cuda or cuda:N"):
        serve_options(["--model_repository=m", "--pytorch_device=tpu"])
    with pytest.raises(FlagError, match="--pytorch_threads cannot be negative"):
        serve_options(["--model_repository=m", "--pytorch_threads=-1"])
