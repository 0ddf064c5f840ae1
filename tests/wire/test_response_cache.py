"""Triton's response cache: opt-in per model, bounded in bytes, keyed on the resolved version and the request.

The model under test counts its own runs and answers the count, so a cached answer shows itself: the same count
again. Requests come from Triton's and TF Serving's REST clients; hits and misses show in the stats the dashboard
charts, and a new version never gets an answer of the old one.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from workbench.config.serve_options import FlagError, serve_options
from workbench.planes.response_cache import ENTRY_OVERHEAD_BYTES, ResponseCache, request_digest
from workbench.server import ServerThread

COUNTER = """
import numpy as np
import workbench

class Counter(workbench.PythonModel):
    inputs = {"x": ("float32", [-1, 1])}
    outputs = {"y": ("float32", [-1, 1]), "runs": ("int64", [-1])}

    def load(self, path):
        self.runs = 0

    def predict(self, inputs):
        self.runs += 1
        rows = len(inputs["x"])
        return {"y": inputs["x"] * %s, "runs": np.full(rows, self.runs, np.int64)}
"""


# ------------------------------------------------------------------------------------------- the cache alone
def test_the_digest_tells_apart_contents_dtypes_shapes_and_names() -> None:
    x = np.arange(4, dtype=np.float32)
    digests = {
        request_digest({"x": x}),
        request_digest({"x": x.astype(np.float64)}),
        request_digest({"x": x.reshape(2, 2)}),
        request_digest({"z": x}),
        request_digest({"x": x + 1}),
        request_digest({"x": np.array([b"ab", b"c"], dtype=object)}),
        request_digest({"x": np.array([b"a", b"bc"], dtype=object)}),
    }
    assert len(digests) == 7
    assert request_digest({"x": x, "w": x}) == request_digest({"w": x.copy(), "x": x.copy()})


def test_it_is_bounded_in_bytes_least_recently_used_first_out() -> None:
    row = np.zeros(100, np.float32)  # 400 bytes
    entry = 400 + ENTRY_OVERHEAD_BYTES
    cache = ResponseCache(max_bytes=2 * entry, models=["m"])
    keys = [cache.key("m", 1, "serving_default", ["y"], bytes([i]) * 16) for i in range(3)]
    cache.put(keys[0], {"y": row})
    cache.put(keys[1], {"y": row})
    assert cache.get(keys[0]) is not None  # now the most recently used
    cache.put(keys[2], {"y": row})
    assert cache.get(keys[1]) is None  # the least recently used went
    assert cache.get(keys[0]) is not None and cache.get(keys[2]) is not None
    assert cache.describe()["bytes"] == 2 * entry
    cache.put(cache.key("m", 1, "s", ["y"], b"x" * 16), {"y": np.zeros(1000, np.float32)})  # alone too big
    assert cache.describe()["entries"] == 2


def test_answers_are_read_only_copies_and_go_with_their_version() -> None:
    cache = ResponseCache(max_bytes=1 << 20, models=["m"])
    answer = np.ones(3, np.float32)
    v1, v2 = (cache.key("m", v, "s", ["y"], b"k" * 16) for v in (1, 2))
    cache.put(v1, {"y": answer})
    cache.put(v2, {"y": answer * 2})
    answer[:] = 7  # the model's own array changes later: the cached answer does not
    cached = cache.get(v1)
    assert cached is not None and cached["y"].tolist() == [1, 1, 1]
    with pytest.raises(ValueError):
        cached["y"][0] = 9
    cache.evict("m", 1)
    assert cache.get(v1) is None and cache.get(v2) is not None


def test_only_models_that_opt_in_and_only_with_a_size() -> None:
    cache = ResponseCache(max_bytes=1 << 20, models=["m"])
    assert cache.enabled("m") and not cache.enabled("other")
    cache.enable("other")
    assert cache.enabled("other")
    cache.enable("m", on=False)
    assert not cache.enabled("m")
    assert not ResponseCache(max_bytes=0).enabled("m")
    off = ResponseCache(max_bytes=0)
    off.enable("m")
    assert not off.enabled("m")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--response_cache_models=m"], "--response_cache_models needs --response_cache_bytes"),
        (["--response_cache_bytes=-1"], "cannot be negative"),
    ],
)
def test_bad_flags_are_refused(tmp_path: Path, flags: list[str], words: str) -> None:
    with pytest.raises(FlagError, match=words):
        serve_options([f"--model_base_path={tmp_path}", *flags])


def test_the_flags_reach_the_options(tmp_path: Path) -> None:
    options = serve_options(
        [f"--model_base_path={tmp_path}", "--response_cache_bytes=1048576", "--response_cache_models= a, b"]
    )
    assert (options.response_cache_bytes, options.response_cache_models) == (1048576, ("a", "b"))


# ------------------------------------------------------------------------------------------ over the wire
def write_counter(folder: Path, factor: float) -> None:
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(COUNTER % factor))


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_counter(root / "cached" / "1", 2.0)
    write_counter(root / "plain" / "1", 2.0)
    return root


@pytest.fixture
def server(serve: Callable[..., ServerThread], repository: Path) -> ServerThread:
    return serve(
        model_repository=str(repository),
        allow_python_models=True,
        file_system_poll_wait_seconds=0.2,
        response_cache_bytes=1 << 20,
        response_cache_models=("cached",),
    )


def v2_infer(client: triton_http.InferenceServerClient, model: str, value: float) -> tuple[float, int, str]:
    x = triton_http.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    result = client.infer(model, [x])
    return float(result.as_numpy("y")[0, 0]), int(result.as_numpy("runs")[0]), result.get_response()["model_version"]


def test_a_repeated_request_is_answered_from_the_cache_and_counted(server: ServerThread) -> None:
    client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        first = v2_infer(client, "cached", 1.5)
        assert v2_infer(client, "cached", 1.5) == first  # the same run's answer
        assert v2_infer(client, "cached", 2.5)[1] == first[1] + 1  # other contents: run
        # TF Serving's REST API shares the cache: same model, version, signature and tensors.
        body = {"signature_name": "serving_default", "inputs": {"x": [[1.5]]}}
        tfs = requests.post(f"{server.rest_url}/v1/models/cached:predict", json=body, timeout=30).json()
        assert tfs["outputs"] == {"y": [[3.0]], "runs": [first[1]]}
        plain = [v2_infer(client, "plain", 1.5)[1] for _ in range(2)]
        assert plain == [1, 2]  # a model that did not opt in runs every time
    finally:
        client.close()
    stats = requests.get(f"{server.rest_url}/workbench/v1/stats", timeout=30).json()["models"]
    assert (stats["cached"]["1"]["cache_hits"], stats["cached"]["1"]["cache_misses"]) == (2, 2)
    assert stats["cached"]["1"]["cache_hit_rate"] == 0.5
    assert "cache_hits" not in stats["plain"]["1"]
    described = requests.get(f"{server.rest_url}/workbench/v1/health", timeout=30).json()["response_cache"]
    assert (described["entries"], described["models"]) == (2, ["cached"])

    # In Prometheus under Triton's names; cached answers are requests answered, but not inferences.
    text = requests.get(f"{server.rest_url}/metrics", timeout=30).text
    v1 = {"model": "cached", "version": "1"}
    assert prometheus_value(text, "nv_cache_num_hits_per_model", v1) == 2
    assert prometheus_value(text, "nv_cache_num_misses_per_model", v1) == 2
    assert prometheus_value(text, "nv_cache_hit_duration_per_model", v1) >= 0
    assert prometheus_value(text, "nv_cache_miss_duration_per_model", v1) > 0  # lookups and insertions
    assert prometheus_value(text, "nv_inference_request_success", v1) == 4
    assert prometheus_value(text, "nv_inference_count", v1) == 2
    assert prometheus_value(text, "nv_inference_exec_count", v1) == 2
    assert prometheus_value(text, "nv_cache_num_hits_per_model", {"model": "plain", "version": "1"}) is None
    # And in Triton's statistics extension, as tritonclient reads it.
    client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        (row,) = client.get_inference_statistics("cached")["model_stats"]
    finally:
        client.close()
    assert (row["inference_stats"]["cache_hit"]["count"], row["inference_stats"]["cache_miss"]["count"]) == (2, 2)
    assert row["inference_stats"]["cache_miss"]["ns"] > 0
    assert (row["inference_count"], row["execution_count"]) == (2, 2)


def prometheus_value(text: str, name: str, labels: dict[str, str]) -> float | None:
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.items() >= labels.items()
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_a_new_version_never_gets_the_old_versions_answer(server: ServerThread, repository: Path) -> None:
    client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        assert v2_infer(client, "cached", 1.0)[::2] == (2.0, "1")
        write_counter(repository / "cached" / "2.tmp", 10.0)
        shutil.move(repository / "cached" / "2.tmp", repository / "cached" / "2")
        wait_until(lambda: v2_infer(client, "cached", 1.0)[2] == "2", timeout=60, what="version 2 serving")
        assert v2_infer(client, "cached", 1.0)[0] == 10.0
    finally:
        client.close()


TRITON_COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.runs += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            runs = np.full((len(x), 1), self.runs, dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("RUNS", runs)]))
        return responses
"""
TRITON_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "RUNS" data_type: TYPE_INT64 dims: [ 1 ] } ]
response_cache { enable: %s }
"""


@pytest.mark.parametrize("enabled", [True, False])
def test_a_triton_config_opts_its_model_in(serve: Callable[..., ServerThread], tmp_path: Path, enabled: bool) -> None:
    folder = tmp_path / "repo" / "counter"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(TRITON_COUNTER)
    (folder / "config.pbtxt").write_text(TRITON_CONFIG % str(enabled).lower())
    server = serve(model_repository=str(tmp_path / "repo"), allow_python_models=True, response_cache_bytes=1 << 20)
    client = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
    try:
        x = triton_http.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[1.0]], np.float32))
        runs = [int(client.infer("counter", [x]).as_numpy("RUNS")[0, 0]) for _ in range(3)]
    finally:
        client.close()
    assert runs == ([1, 1, 1] if enabled else [1, 2, 3])
