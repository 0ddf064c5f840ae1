"""The floors hold: each package imports only the floors below it, transitively, and no import cycle exists, also
through a package's ``__init__``.

Checked on the source (every import, also those inside functions), and by running a client in a fresh interpreter:
a notebook that only talks REST must not pay TensorFlow's import (seconds) for its first prediction. The floors are
drawn in docs/design.md; this file is the one place they are written as data.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from replica import REPO_ROOT, Replica

PACKAGE = REPO_ROOT / "workbench"

# Bottom up. A module may import its own floor and the floors below, never one above: followed transitively, so an
# upward path through a third module fails too.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime", ("workbench.runtime",)),
    ("core", ("workbench.core",)),
    ("protocol", ("workbench.protocol",)),
    ("config", ("workbench.config",)),
    ("platforms", ("workbench.platforms", "workbench.mlserver_api")),
    (
        "engine",
        (
            "workbench.batching",
            "workbench.models",
            "workbench.observability",
            "workbench.runners",
            "workbench.explain",
        ),
    ),
    ("planes", ("workbench.planes",)),
    (
        "frontends",
        (
            "workbench.frontends",
            "workbench.asynchronous",
            # a batch job runs on a data plane (in a server, as its frontends do); batch.standalone is a floor up
            "workbench.batch_prediction.job",
            "workbench.batch_prediction.feeding",
            "workbench.batch_prediction.formats",
            "workbench.batch_prediction.plan",
        ),
    ),
    ("server", ("workbench.server",)),
    (
        "cli and deploy",
        (
            "workbench.cli",
            "workbench.deploy",
            "workbench.ray",
            "workbench.publishing",
            "workbench.demo",
            "workbench.batch_prediction",
        ),
    ),
]
# Beside the floors, for people and their tools: they stand on runtime, core, protocol and config, on each other, and
# on the public API (PUBLIC), never on the engine's floors, also not through a module they import.
SIDE = ("workbench.client", "workbench.notebook", "workbench.jupyter", "workbench.request_log", "workbench.analyzer")
PUBLIC = (
    "workbench.publishing",
    "workbench.server",
    "workbench.ray",
    "workbench.demo",
    "workbench.deploy.manifests",
    "workbench.batch_prediction",
)
GROUND = ("runtime", "core", "protocol", "config")
ENTRY = ("workbench", "workbench.__main__")  # the package's face and `python -m workbench`: import anything
# The top floor (the CLI) may use the side packages too: `workbench bench` runs the load generator.
# Where a floor reads what a side package writes, named with the reason. The Jupyter record of a running server is
# written by the server (and Ray deployments) and read by the Jupyter extension: jupyter.server_records imports only the
# runtime floor and the package version.
SIDE_READ_BY_FLOORS = {"workbench.jupyter.server_records"}
# Import cycles being taken apart in issue 29's next steps; this list only shrinks.
KNOWN_CYCLES: list[set[str]] = []


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module an imported name lives in (``workbench.core.errors.Code`` → ``workbench.core.errors``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported_workbench_modules(path: Path) -> set[str]:
    """The workbench modules ``path`` imports: ``from pkg import mod`` names ``pkg.mod`` (not ``pkg``, whose
    ``__init__`` binds lazily where it matters), ``from mod import name`` names ``mod``."""
    modules: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(_resolve(alias.name) for alias in node.names if alias.name.startswith("workbench"))
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("workbench")
        ):
            modules.update(_resolve(f"{node.module}.{alias.name}") for alias in node.names)
    return {module for module in modules if module}


def import_graph() -> dict[str, set[str]]:
    return {module: imported_workbench_modules(path) - {module} for module, path in MODULES.items()}


GRAPH = import_graph()


def _packages_passed(module: str) -> set[str]:
    """The packages whose ``__init__`` Python runs on the way to ``module`` (``a.b.c`` → ``a.b``), but for the top
    face ``workbench``: it imports nothing until a name is read from it, so only naming it makes an edge."""
    parts = module.split(".")
    return {".".join(parts[:end]) for end in range(2, len(parts))} & MODULES.keys()


def faces_imported(path: Path) -> set[str]:
    """The workbench modules ``path`` imports, package faces included, every import counted (also those inside
    functions, which run when called): ``import a.b.c`` names ``a.b.c`` and ``a.b``, whose ``__init__`` runs first;
    ``from a.b import c`` names ``a.b`` (its ``__init__`` runs, and ``c`` is read from it, through its lazy
    ``__getattr__`` where ``c`` is no module) and ``a.b.c`` where that is a module."""
    modules: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("workbench") and (module := _resolve(alias.name)):
                    modules.update({module, *_packages_passed(module)})
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("workbench")
        ):
            modules.add(_resolve(node.module))
            modules.update(_resolve(f"{node.module}.{alias.name}") for alias in node.names)
    return {module for module in modules if module}


# The graph the cycle check walks: GRAPH, plus the package faces each import runs.
FACE_GRAPH = {module: faces_imported(path) - {module} for module, path in MODULES.items()}


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def floor_of(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(FLOORS):
        if _within(module, prefixes):
            return index
    return None


def reachable(graph: Mapping[str, set[str]], start: str, stop: Iterable[str] = ()) -> dict[str, list[str]]:
    """Every module ``start`` imports, directly or not, with one import path to each; ``stop`` modules are entered
    but not followed (the public API a side package may use)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        if module != start and (module in ENTRY or _within(module, stop)):
            continue  # the package's face binds its names lazily: importing its version pulls in nothing
        for target in sorted(graph.get(module, ())):
            if target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    return paths


def cycles(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_path(graph: Mapping[str, set[str]], cycle: set[str]) -> list[str]:
    """One import path round ``cycle`` (a strongly connected component), from its first module back to it: the
    shortest, so the message names a path to break."""
    start = min(cycle)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph.get(module, set()) & cycle):
            if target == start:
                return [*paths[module], start]
            if target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    raise ValueError(f"{sorted(cycle)} is no cycle")


def test_every_module_has_a_place() -> None:
    homeless = [m for m in MODULES if floor_of(m) is None and not _within(m, SIDE) and m not in ENTRY]
    assert not homeless, f"modules on no floor and not beside them: {homeless} (add them to FLOORS or SIDE)"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if floor_of(m) is not None))
def test_no_path_leads_to_a_higher_floor(module: str) -> None:
    floor = floor_of(module)
    assert floor is not None
    upward = {
        target: " → ".join(path)
        for target, path in reachable(GRAPH, module).items()
        if target not in SIDE_READ_BY_FLOORS
        and ((floor_of(target) or -1) > floor or (_within(target, SIDE) and floor < len(FLOORS) - 1))
    }
    assert not upward, f"{module} (floor {FLOORS[floor][0]}) reaches above itself: {sorted(upward.values())}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, SIDE)))
def test_side_packages_stand_on_the_ground_and_the_public_api(module: str) -> None:
    allowed = {index for index, (name, _) in enumerate(FLOORS) if name in GROUND}
    engine = {
        target: " → ".join(path)
        for target, path in reachable(GRAPH, module, stop=PUBLIC).items()
        if not _within(target, PUBLIC) and (floor := floor_of(target)) is not None and floor not in allowed
    }
    assert not engine, f"{module} reaches the engine's floors: {sorted(engine.values())}"


def test_no_two_modules_share_a_file_name() -> None:
    """A traceback names files, not packages: each module's file name says which room it is in (``__init__`` aside)."""
    by_name: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(module)
    shared = {name: modules for name, modules in by_name.items() if len(modules) > 1}
    assert not shared, f"modules sharing a file name: {shared}"


def test_no_import_cycle() -> None:
    """Package faces count: a cycle through an ``__init__`` runs its modules half imported as surely as any other."""
    found = cycles(FACE_GRAPH)
    new = [
        f"{' → '.join(cycle_path(FACE_GRAPH, cycle))} ({len(cycle)} modules: {sorted(cycle)})"
        for cycle in found
        if cycle not in KNOWN_CYCLES
    ]
    assert not new, "import cycles:\n" + "\n".join(new)
    gone = [sorted(cycle) for cycle in KNOWN_CYCLES if cycle not in found]
    assert not gone, f"these cycles are gone: take them out of KNOWN_CYCLES: {gone}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "runtime").glob("*.py")), ids=lambda p: p.name)
def test_the_runtime_floor_imports_nothing_else_of_workbench(path: Path) -> None:
    # The bottom floor: process helpers, the event loop, file stores, TensorFlow's imports. Everything stands on it.
    offending = sorted(
        name
        for name in imported_modules(path)
        if name.startswith("workbench") and not name.startswith("workbench.runtime")
    )
    assert not offending, f"{path.relative_to(REPO_ROOT)} imports {offending}"


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from workbench.models.manager import Manager\n")
    assert "workbench.models.manager" in imported_modules(module)


def test_the_check_follows_paths_and_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert reachable(graph, "d")["c"] == ["d", "a", "b", "c"]
    assert "c" not in reachable(graph, "d", stop=("a",))
    assert cycles(graph) == [{"a", "b", "c"}]
    assert cycle_path({**graph, "b": {"a", "c"}}, {"a", "b", "c"}) == ["a", "b", "a"]


def test_the_cycle_check_counts_the_package_faces_an_import_runs(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import workbench.runtime.version\n"
        "from workbench.core.errors import Code\n"
        "def f():\n"
        "    from workbench.platforms import triton\n"
        "    from workbench.analyzer import analyze\n"
    )
    assert faces_imported(module) == {
        "workbench.runtime.version",
        "workbench.runtime",  # run before its module
        "workbench.core.errors",  # not workbench.core: a name is read from the module, not the face
        "workbench.platforms",
        "workbench.platforms.triton",
        "workbench.analyzer",  # analyze is read from the face
    }
    module.write_text("from workbench import platforms\nimport workbench.client\n")
    assert faces_imported(module) == {"workbench", "workbench.platforms", "workbench.client"}


CLIENT_SCRIPT = """
import json, sys, time
started = time.perf_counter()
from workbench.client import Client
imported = time.perf_counter() - started
target, protocol = sys.argv[1], sys.argv[2]
client = Client(target, protocol=protocol) if protocol == "rest" else Client(None, target, protocol=protocol)
answer = client.predict("hp", [[1.0], [2.0]])
if protocol == "grpc":  # and the load generator's request, built without TensorFlow too
    from workbench.client.bench import run_load
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


FACE_SCRIPT = """
import json, sys
import workbench
loaded = sorted(m for m in sys.modules if m.startswith(("workbench.", "tensorflow.")) or m == "tensorflow")
print(json.dumps({
    "loaded": loaded,
    "export": callable(workbench.export),
    "ExportError": issubclass(workbench.ExportError, Exception),
    "Client": isinstance(workbench.Client, type),
    "PythonModel": isinstance(workbench.PythonModel, type),
}))
"""


def test_the_package_face_imports_nothing_until_a_name_is_used() -> None:
    """``import workbench`` (a notebook's first line) binds every public name lazily: it loads no other workbench
    module, so neither the engine nor TensorFlow, and each name still resolves when first used."""
    done = subprocess.run(
        [sys.executable, "-c", FACE_SCRIPT], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"loaded": [], "export": True, "ExportError": True, "Client": True, "PythonModel": True}


SERVE_SCRIPT = """
import json, sys, warnings
import workbench.cli, workbench.server.model_server, workbench.platforms.sklearn
filters, requests = len(warnings.filters), "requests" in sys.modules
from workbench.client import Client
print(json.dumps({"requests": requests, "filters": filters, "Client": isinstance(Client, type)}))
"""


def test_the_serve_command_leaves_the_http_client_libraries_out() -> None:
    """`workbench serve` loads neither requests nor urllib3 (the CLI's bench command reads its options from
    workbench.client.bench, not the Client): their warning filters would be re-installed by scikit-learn for every
    tree of every ensemble call (warnings.filters is process-wide), about 1 ms of a 200-tree forest's 7 ms."""
    done = subprocess.run(
        [sys.executable, "-c", SERVE_SCRIPT], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["requests"] is False and result["Client"] is True
    assert result["filters"] <= 10, f"{result['filters']} warning filters in a serving process"
