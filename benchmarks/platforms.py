"""Every platform behind the same server: what one REST predict costs over the in-process call, and batching for ONNX.

Run: `.venv/bin/python benchmarks/platforms.py` (about 3 minutes on 2 cores). Prints two tables and writes
benchmarks/results/platforms.json. Every model is trained on scikit-learn's digits (64 features, 10 classes) here,
and all figures come from one run, side by side:

1. per platform (tensorflow, sklearn, xgboost, lightgbm, onnx; a platform whose module or library is missing is
   skipped with a note): p50 of one REST predict of 1 row, one client after another, against `workbench serve`,
   and p50 of the in-process ``servable.run`` of the same version folder, loaded by the same platform module;
2. the ONNX models (the digits logistic regression, and a 256x256 MLP where the compute starts to count) at 32
   concurrent clients: `workbench serve` with batching off and on (REST and gRPC), and a bare Starlette server on
   the same HTTP stack (uvicorn, httptools, uvloop, orjson) that runs the same ONNX Runtime session per request,
   with nothing of workbench in between: what the frontends, the dataplane and the batcher add, or save.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).parent))

from _common import ServeProcess, free_port, save_results, stop_process

from workbench.client.bench import format_table, run_load

PLATFORMS = ("tensorflow", "sklearn", "xgboost", "lightgbm", "onnx")
CONCURRENCY = 32
# TF Serving's usual CPU parameters, as benchmarks/batching.py has them: no waiting for a batch to fill (the next
# batch is whatever queued while one ran), one batch per core at a time (ONNX Runtime runs a call on one thread).
BATCHING = (
    "max_batch_size { value: 64 } batch_timeout_micros { value: 0 } max_enqueued_batches { value: 100 } "
    f"num_batch_threads {{ value: {os.cpu_count() or 1} }}\n"
)


# ============================================================================================ models on digits
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16).astype(np.float32), data.target


def save_tensorflow(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Softmax regression as a SavedModel, with the weights of a logistic regression fitted on digits."""
    import tensorflow as tf
    from sklearn.linear_model import LogisticRegression

    fitted = LogisticRegression(max_iter=300).fit(x, y)

    class Softmax(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(fitted.coef_.T.astype(np.float32))
            self.b = tf.Variable(fitted.intercept_.astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="pixels")])
        def serve(self, pixels: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"probabilities": tf.nn.softmax(pixels @ self.w + self.b)}

    module = Softmax()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


def _written_by(platform: str) -> Callable[[Any, Path], None]:
    """The platform module's own export side (``exports``/``write``), as ``workbench.export`` uses it."""
    module = importlib.import_module(f"workbench.platforms.{platform}")

    def write(model: Any, folder: Path) -> None:
        if not module.exports(model):
            raise RuntimeError(f"workbench.platforms.{platform} does not export a {type(model).__name__}")
        folder.mkdir(parents=True)
        module.write(model, folder)

    return write


def save_sklearn(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    from sklearn.linear_model import LogisticRegression

    _written_by("sklearn")(LogisticRegression(max_iter=300).fit(x, y), folder)


def save_xgboost(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    from xgboost import XGBClassifier

    _written_by("xgboost")(XGBClassifier(n_estimators=20, max_depth=3).fit(x, y), folder)


def save_lightgbm(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    from lightgbm import LGBMClassifier

    _written_by("lightgbm")(LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1).fit(x, y), folder)


def save_onnx(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    from sklearn.linear_model import LogisticRegression

    from workbench.platforms import onnx

    _written_by("onnx")(onnx.convert_sklearn(LogisticRegression(max_iter=300).fit(x, y), x[:1]), folder)


def save_onnx_mlp(folder: Path, x: np.ndarray, y: np.ndarray) -> None:
    """A 64 → 256 → 256 → 10 MLP: about 0.08 M multiply-adds a row, where batching starts to pay for itself."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from workbench.platforms import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPClassifier(hidden_layer_sizes=(256, 256), max_iter=20, random_state=0).fit(x, y)
    _written_by("onnx")(onnx.convert_sklearn(mlp, x[:1]), folder)


SAVERS: dict[str, Callable[[Path, np.ndarray, np.ndarray], None]] = {
    "tensorflow": save_tensorflow,
    "sklearn": save_sklearn,
    "xgboost": save_xgboost,
    "lightgbm": save_lightgbm,
    "onnx": save_onnx,
}


def missing(platform: str) -> str:
    """Why ``platform`` cannot be measured here ("" when it can): its module, or its library, is not there."""
    from workbench import platforms

    entry = platforms.get(platform)
    if importlib.util.find_spec(entry.module) is None:
        return f"{entry.module} does not exist yet"
    try:
        importlib.import_module(entry.module)
    except ImportError as exc:
        return f"{entry.module} cannot be imported: {exc}"
    return ""


def build(root: Path, x: np.ndarray, y: np.ndarray) -> tuple[dict[str, str], dict[str, str]]:
    """Version 1 of a model per available platform under ``root``; returns (model → platform, platform → note)."""
    models: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for platform, save in SAVERS.items():
        note = missing(platform)
        if not note:
            try:
                save(root / f"digits_{platform}" / "1", x, y)
            except Exception as exc:  # noqa: BLE001 - one platform's failure is a note, not the end of the run
                note = f"could not write its model: {type(exc).__name__}: {exc}"
        if note:
            skipped[platform] = note
            print(f"skipped {platform}: {note}")
        else:
            models[f"digits_{platform}"] = platform
    return models, skipped


def write_config(path: Path, root: Path, models: dict[str, str]) -> Path:
    entries = "".join(
        f'  config {{ name: "{m}" base_path: "{root / m}" model_platform: "{p}" }}\n' for m, p in models.items()
    )
    path.write_text("model_config_list {\n" + entries + "}\n")
    return path


# ========================================================================================== the two measurements
def in_process_p50_ms(model: str, platform: str, folder: Path, row: np.ndarray, calls: int = 2000) -> float:
    """Median of ``servable.run`` on one row, the version loaded by its platform module as the server loads it."""
    from workbench import platforms
    from workbench.platforms import LoadPolicy

    servable = platforms.get(platform).load(model, 1, str(folder), LoadPolicy())
    try:
        signature = servable.signatures["serving_default"]
        ((alias, spec),) = signature.inputs.items()
        feed = {alias: row.astype(spec.dtype)}
        outputs = list(signature.outputs)
        for _ in range(50):
            servable.run(signature, feed, outputs)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            servable.run(signature, feed, outputs)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        servable.close()
    return statistics.median(times)


def input_alias(platform: str, folder: Path) -> str:
    from workbench import platforms
    from workbench.platforms import LoadPolicy

    servable = platforms.get(platform).load("m", 1, str(folder), LoadPolicy())
    try:
        (alias,) = servable.signatures["serving_default"].inputs
        return alias
    finally:
        servable.close()


def per_platform(root: Path, models: dict[str, str], row: np.ndarray, duration: float) -> list[dict[str, Any]]:
    config = write_config(root / "models.config", root, models)
    aliases = {m: input_alias(p, root / m / "1") for m, p in models.items()}
    server = ServeProcess(config)
    rows = []
    try:
        for model in models:
            server.wait_for_answer(model, {"inputs": {aliases[model]: row.tolist()}})
        for model, platform in models.items():
            rest = run_load(server.rest_url, "rest", model, {aliases[model]: row}, concurrency=1, duration=duration)
            in_process = in_process_p50_ms(model, platform, root / model / "1", row)
            rows.append(
                {
                    "platform": platform,
                    "model": model,
                    "in_process_p50_ms": round(in_process, 4),
                    "rest_p50_ms": round(rest.percentile(50), 3),
                    "rest_over_in_process_ms": round(rest.percentile(50) - in_process, 3),
                    "requests": rest.requests,
                    "errors": rest.errors,
                }
            )
    finally:
        server.stop()
    return rows


class BareServer:
    """This script's own bare Starlette server (``--bare-onnx-server``) as a child process."""

    def __init__(self, model_path: Path, log: Path) -> None:
        import subprocess

        self.port = free_port()
        self.log = log
        with log.open("wb") as stderr:  # a file, not a pipe: a full pipe would block the server's logging
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--bare-onnx-server", str(self.port), str(model_path)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, body: bytes, timeout: float = 60) -> None:
        import urllib.request

        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the bare server exited:\n" + self.log.read_text()[-3000:])
            try:
                request = urllib.request.Request(f"{self.rest_url}/v1/models/bare:predict", data=body)
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("the bare server did not answer in time:\n" + self.log.read_text()[-3000:])

    def stop(self) -> None:
        stop_process(self.proc)


def bare_onnx_server(port: int, model_path: str) -> None:
    """POST /v1/models/<any>:predict with a columnar body → the session's outputs: TF Serving's JSON, nothing more.

    The same session options as the ONNX platform, one ``session.run`` per request on Starlette's thread pool.
    """
    import onnxruntime
    import orjson
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from workbench.platforms.onnx import session_options

    session = onnxruntime.InferenceSession(model_path, sess_options=session_options())
    (graph_input,) = session.get_inputs()
    names = [o.name for o in session.get_outputs()]

    async def predict(request: Request) -> Response:
        document = orjson.loads(await request.body())
        inputs = document["inputs"]
        value = np.asarray(inputs[graph_input.name] if isinstance(inputs, dict) else inputs, dtype=np.float32)
        results = await run_in_threadpool(session.run, names, {graph_input.name: value})
        outputs = {n: r.tolist() for n, r in zip(names, results, strict=True)}
        return Response(orjson.dumps({"outputs": outputs}), media_type="application/json")

    app = Starlette(routes=[Route("/v1/models/{model}:predict", predict, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", loop="uvloop", log_level="warning")


def batching_rows(root: Path, models: list[str], inputs: dict[str, dict[str, np.ndarray]], duration: float) -> list:
    """At 32 clients: workbench with batching off and on (REST, gRPC), and the bare server (REST)."""
    config = write_config(root / "onnx.config", root, {m: "onnx" for m in models})
    (root / "batching.config").write_text(BATCHING)
    monitoring = root / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    rows: list[dict[str, Any]] = []

    def measure(server: str, targets: dict[str, str], metrics: str = "") -> None:
        """``targets``: protocol → address; ``metrics``: the REST URL whose metrics give the batch sizes."""
        for model in models:
            for protocol, target in targets.items():
                before = batch_counters(metrics, model) if metrics else (0.0, 0.0)
                result = run_load(target, protocol, model, inputs[model], concurrency=CONCURRENCY, duration=duration)
                row = {"server": server, **result.summary()}
                if metrics:
                    rows_run, calls = (a - b for a, b in zip(batch_counters(metrics, model), before, strict=True))
                    row["mean_batch_size"] = round(rows_run / calls, 2) if calls else None
                rows.append(row)

    for server_name, flags in (
        ("workbench, batching off", ()),
        ("workbench, batching on", ("--enable_batching", f"--batching_parameters_file={root / 'batching.config'}")),
    ):
        server = ServeProcess(config, f"--monitoring_config_file={monitoring}", *flags)
        try:
            for model in models:
                server.wait_for_answer(model, {"inputs": {"X": inputs[model]["X"].tolist()}})
            measure(server_name, {"rest": server.rest_url, "grpc": server.grpc_target}, metrics=server.rest_url)
        finally:
            server.stop()
    for model in models:
        bare = BareServer(root / model / "1" / "model.onnx", root / f"bare-{model}.log")
        try:
            bare.wait(orjson.dumps({"inputs": {"X": inputs[model]["X"].tolist()}}))
            result = run_load(bare.rest_url, "rest", model, inputs[model], concurrency=CONCURRENCY, duration=duration)
            rows.append({"server": "bare Starlette + ONNX Runtime", **result.summary()})
        finally:
            bare.stop()
    return rows


def batch_counters(rest_url: str, model: str) -> tuple[float, float]:
    """(rows, model calls) so far for ``model``, from the server's workbench_batch_size histogram."""
    import urllib.request

    text = urllib.request.urlopen(f"{rest_url}/metrics", timeout=10).read().decode()
    rows = calls = 0.0
    for line in text.splitlines():
        if f'model="{model}"' in line:
            if line.startswith("workbench_batch_size_sum"):
                rows += float(line.rsplit(" ", 1)[1])
            elif line.startswith("workbench_batch_size_count"):
                calls += float(line.rsplit(" ", 1)[1])
    return rows, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--bare-onnx-server", nargs=2, metavar=("PORT", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_onnx_server:
        port, model_path = args.bare_onnx_server
        bare_onnx_server(int(port), model_path)
        return

    x, y = digits()
    row = x[:1]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models, skipped = build(root, x, y)
        platform_rows = per_platform(root, models, row, args.duration)
        onnx_models = []
        if "onnx" not in skipped:
            save_onnx_mlp(root / "digits_onnx_mlp" / "1", x, y)
            onnx_models = ["digits_onnx", "digits_onnx_mlp"]
        batch_rows = batching_rows(root, onnx_models, {m: {"X": row} for m in onnx_models}, args.duration)

    print("\nOne REST predict of 1 row (1 client, sequential) against the in-process servable.run, same run:")
    print(
        format_table(
            platform_rows,
            ["platform", "in_process_p50_ms", "rest_p50_ms", "rest_over_in_process_ms", "requests", "errors"],
        )
    )
    for platform, note in skipped.items():
        print(f"  {platform}: skipped ({note})")
    print(f"\nONNX models, 1 row a request, {CONCURRENCY} concurrent clients:")
    print(
        format_table(
            batch_rows,
            ["model", "server", "protocol", "requests_per_second", "p50_ms", "p99_ms", "mean_batch_size", "errors"],
        )
    )
    path = save_results(
        "platforms",
        {
            "cpu_count": os.cpu_count(),
            "per_platform": platform_rows,
            "skipped": skipped,
            "onnx_batching": {"concurrency": CONCURRENCY, "batching_parameters": BATCHING.strip(), "rows": batch_rows},
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
