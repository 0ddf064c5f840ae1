"""The floor plan holds: protocol modules, the notebook and the client sit on public ground, never on the engine.

Checked on the source (every import, also those inside functions), and by running a client in a fresh interpreter:
a notebook that only talks REST must not pay TensorFlow's import (seconds) for its first prediction.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from replica import REPO_ROOT, Replica

PACKAGE = REPO_ROOT / "workbench"
# Modules that speak protocols, show things in notebooks or talk to servers: they may use the error type, the
# signatures and each other, but not the engine, the dataplane, the frontends, the server or the platforms.
ABOVE_THE_ENGINE = [
    *sorted((PACKAGE / "protocol").glob("*.py")),
    *sorted((PACKAGE / "notebook").glob("*.py")),
    PACKAGE / "client.py",
    PACKAGE / "signatures.py",
    PACKAGE / "errors.py",
]
BELOW = ("workbench.engine", "workbench.planes.dataplane", "workbench.frontends", "workbench.server", "workbench.platforms")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", ABOVE_THE_ENGINE, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_protocol_notebook_and_client_modules_do_not_import_the_engine(path: Path) -> None:
    offending = sorted(name for name in imported_modules(path) if name.startswith(BELOW))
    assert not offending, f"{path.relative_to(REPO_ROOT)} imports {offending}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "runtime").glob("*.py")), ids=lambda p: p.name)
def test_the_runtime_floor_imports_nothing_else_of_workbench(path: Path) -> None:
    # The bottom floor: process helpers, the event loop, TensorFlow's import. Everything may stand on it. One
    # exception until TensorFlow's stand-in import has one home (issue 29): the SavedModel runtime loads TF Serving's
    # protos first (tf_protos, which imports nothing of workbench), as they must be loaded before TensorFlow.
    allowed = {"workbench.protocol", "workbench.protocol.tf_protos"}
    offending = sorted(
        name
        for name in imported_modules(path)
        if name.startswith("workbench") and not name.startswith("workbench.runtime") and name not in allowed
    )
    assert not offending, f"{path.relative_to(REPO_ROOT)} imports {offending}"


def test_the_check_sees_an_engine_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from workbench.models.manager import Manager\n")
    assert "workbench.models.manager" in imported_modules(module)


CLIENT_SCRIPT = """
import json, sys, time
started = time.perf_counter()
from workbench.client import Client
imported = time.perf_counter() - started
target, protocol = sys.argv[1], sys.argv[2]
client = Client(target, protocol=protocol) if protocol == "rest" else Client(None, target, protocol=protocol)
answer = client.predict("hp", [[1.0], [2.0]])
if protocol == "grpc":  # and the load generator's request, built without TensorFlow too
    from workbench.bench import run_load
    import numpy as np
    assert run_load(target, "grpc", "hp", {"x": np.ones((1, 1), np.float32)}, requests=5).errors == 0
print(json.dumps({
    "y": answer["y"].tolist(),
    "import_s": imported,
    "tensorflow": sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.python")),
}))
"""


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_a_client_predicts_without_importing_tensorflow(tmp_path: Path, model_store: Path, protocol: str) -> None:
    """Over gRPC the client uses TensorFlow's generated protos, never ``tensorflow/__init__`` (seconds, and
    hundreds of megabytes, in a process that only sends requests)."""
    repository = tmp_path / "models"
    (repository / "hp").mkdir(parents=True)
    (repository / "hp" / "1").symlink_to(model_store / "hp2_tf2")
    server = Replica(tmp_path / "server", f"--model_repository={repository}").wait_ready()
    target = server.rest_url if protocol == "rest" else server.grpc_target
    try:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT_SCRIPT, target, protocol],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["y"] == [[2.5], [3.0]]
    assert result["tensorflow"] == []
