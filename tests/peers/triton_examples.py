"""Triton's own Python example clients, run unchanged against ``workbench serve`` as Triton's QA runs them.

Run: ``.venv/bin/python tests/peers/triton_examples.py --client CLIENT_CHECKOUT --server SERVER_CHECKOUT [--out F]``
with checkouts of github.com/triton-inference-server/client (its ``src/python/examples``) and
github.com/triton-inference-server/server (its ``docs/examples/model_repository``). Not part of ``make test``: the
clients are Triton's code, which this project does not ship. About a minute on 2 cores. Prints one line per client
and a summary; ``--out`` writes them as JSON. Exit status 0 when every client that was run passed.

As in Triton's qa/L0_grpc and qa/L0_http:

- one server (``--model_repository``, ``--allow_python_models`` for ``simple_identity``) on the clients' default
  ports, 8000 (HTTP) and 8001 (gRPC); each client runs with no arguments and passes when it exits 0. The repository
  is the example repository plus the models Triton's QA adds for these clients: ``simple_string_dyna_sequence``
  (made from ``simple_dyna_sequence`` as qa/L0_grpc makes it: the ``dyna_sequence`` test backend, a STRING
  CORRID), ``repeat_int32`` (src/test/models, the ``repeat`` backend) and ``custom_identity_int32``
  (qa/L0_client_memory_growth, the ``identity`` backend). ``densenet_onnx``'s weights are a download (Triton's
  ``fetch_models.sh``): a stand-in of its signature with made-up weights is built here, for ``grpc_client.py`` and
  the image clients (run as QA runs them, on qa/images/vulture.jpeg, through the classification extension; QA also
  checks that the answer is VULTURE, which only the real weights give); ``inception_onnx`` is left out;
- the sequence clients again with ``-d`` (the dynamic sequence models), as qa/L0_grpc's second server runs them;
- the model-control examples each on a server of their own in explicit mode, with the example repository at the
  size the example checks in the index (the gRPC example counts 8 models, the HTTP one 7: without
  ``inception_onnx``).

Clients that need what no CPU-only machine has (CUDA shared memory) are run too and reported as they end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HTTP_PORT, GRPC_PORT = 8000, 8001  # the examples' defaults
NOT_RUN = {  # client → why it is not run here
    "ensemble_image_client.py": "needs a DALI ensemble; Triton's own QA leaves it out (commented out in L0_grpc)",
}
# The image clients as qa/L0_grpc runs them (QA also greps VULTURE, which needs densenet's real weights).
IMAGE_RUNS = {
    "image_client.py": ("-i", "grpc", "-u", f"localhost:{GRPC_PORT}"),
    "grpc_image_client.py": (),
}
MODEL_CONTROL = {"simple_grpc_model_control.py": (), "simple_http_model_control.py": ("inception_onnx",)}
DYNA = ("simple_grpc_sequence_stream_infer_client.py", "simple_grpc_sequence_sync_infer_client.py")
# Triton's QA models for the example clients: (where in the server checkout, the name in the repository).
QA_MODELS = (
    ("src/test/models/repeat_int32", "repeat_int32"),
    ("qa/L0_client_memory_growth/models/custom_identity_int32", "custom_identity_int32"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", type=Path, required=True, help="a checkout of triton-inference-server/client")
    parser.add_argument("--server", type=Path, required=True, help="a checkout of triton-inference-server/server")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one client may take")
    args = parser.parse_args()
    examples = args.client / "src" / "python" / "examples"
    models = args.server / "docs" / "examples" / "model_repository"
    clients = sorted(path for path in examples.glob("*.py"))
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="triton-examples-") as scratch:
        repository = Path(scratch) / "models"
        shutil.copytree(models, repository)
        served = _served_repository(repository, args.server, Path(scratch) / "served")
        with _server(served, Path(scratch) / "server.log"):
            for client in clients:
                if client.name in NOT_RUN:
                    results[client.name] = {"passed": None, "why": NOT_RUN[client.name]}
                elif client.name in IMAGE_RUNS:
                    image = str(args.server / "qa" / "images" / "vulture.jpeg")
                    for mode in ((), ("-a",), ("--streaming",)):
                        flags = ("-m", "densenet_onnx", "-s", "INCEPTION", *mode, "-c", "1", "-b", "1")
                        key = " ".join([client.name, *mode])
                        results[key] = _run(client, args.timeout, *flags, *IMAGE_RUNS[client.name], image)
                elif client.name not in MODEL_CONTROL:
                    results[client.name] = _run(client, args.timeout)
            for name in DYNA:
                results[f"{name} -d"] = _run(examples / name, args.timeout, "-d")
        for name, left_out in MODEL_CONTROL.items():
            own = Path(scratch) / f"models-{name}"
            shutil.copytree(repository, own, ignore=lambda folder, names, out=left_out: [n for n in names if n in out])
            with _server(own, Path(scratch) / f"{name}.log", "--model_control_mode=explicit"):
                results[name] = _run(examples / name, args.timeout)
    for name, result in results.items():
        mark = {True: "PASS", False: "FAIL", None: "not run"}[result["passed"]]  # type: ignore[index]
        print(f"{mark:8} {name}  {result.get('why') or result.get('tail', '')}")
    ran = [r for r in results.values() if r["passed"] is not None]
    passed = sum(1 for r in ran if r["passed"])
    print(f"{passed} of {len(ran)} clients passed ({len(results) - len(ran)} not run)")
    if args.out:
        args.out.write_text(json.dumps({"passed": passed, "ran": len(ran), "clients": results}, indent=2))
    return 0 if passed == len(ran) else 1


class _server:  # noqa: N801 - read as a call: with _server(...)
    """``workbench serve`` on the examples' ports for the ``with`` block."""

    def __init__(self, repository: Path, log: Path, *flags: str) -> None:
        self.command = [
            sys.executable,
            "-m",
            "workbench",
            "serve",
            f"--model_repository={repository}",
            f"--port={GRPC_PORT}",
            f"--rest_api_port={HTTP_PORT}",
            "--allow_python_models",
            *flags,
        ]
        self.log = log

    def __enter__(self) -> _server:
        for port in (HTTP_PORT, GRPC_PORT):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise SystemExit(f"port {port} is taken: the examples need 8000 and 8001")
        self.process = subprocess.Popen(self.command, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"workbench serve exited: {self.log.read_text()[-2000:]}")
            try:
                import urllib.request

                with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}/v2/health/live", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        time.sleep(1.0)  # the first loads settle (the live probe answers before them)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _served_repository(examples: Path, server: Path, folder: Path) -> Path:
    """The example repository with the QA's models for these clients, and densenet_onnx's stand-in."""
    shutil.copytree(examples, folder, ignore=lambda _, names: [n for n in names if n == "inception_onnx"])
    dyna = folder / "simple_string_dyna_sequence"
    shutil.copytree(folder / "simple_dyna_sequence", dyna)
    (dyna / "1" / "model.onnx").unlink()
    config = (dyna / "config.pbtxt").read_text().replace("simple_dyna_sequence", "simple_string_dyna_sequence")
    config = re.sub(r"(?m)^platform: .*", 'backend: "dyna_sequence"', config)
    config = re.sub(r"(CONTROL_SEQUENCE_CORRID\s*data_type:\s*)TYPE_UINT64", r"\1TYPE_STRING", config)
    (dyna / "config.pbtxt").write_text(config)
    for source, name in QA_MODELS:
        shutil.copytree(server / source, folder / name)
        (folder / name / "1").mkdir(exist_ok=True)  # Triton's QA puts the backend's library there; none is read
    _densenet_stand_in(folder / "densenet_onnx" / "1" / "model.onnx")
    return folder


def _densenet_stand_in(path: Path) -> None:
    """densenet_onnx's signature (data_0 [1, 3, 224, 224] → fc6_1 [1, 1000, 1, 1]) with made-up weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((1000, 3, 1, 1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["data_0"], ["means"], axes=[2, 3], keepdims=1),
            helper.make_node("Conv", ["means", "weights"], ["fc6_1"]),
        ],
        "densenet_stand_in",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 1000, 1, 1])],
        initializer=[numpy_helper.from_array(weights, "weights")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def _run(client: Path, timeout: float, *flags: str) -> dict[str, object]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, client.name, *flags],
            cwd=client.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    except subprocess.TimeoutExpired:
        return {"passed": False, "tail": f"timed out after {timeout:.0f} s", "seconds": timeout}
    output = (done.stdout + done.stderr).strip().splitlines()
    return {
        "passed": done.returncode == 0,
        "rc": done.returncode,
        "tail": " | ".join(output[-2:])[-300:],
        "seconds": round(time.monotonic() - started, 2),
    }


if __name__ == "__main__":
    sys.exit(main())
