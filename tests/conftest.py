"""Shared fixtures: real SavedModels built once per session, and servers on 127.0.0.1 ephemeral ports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import nbval.kernel
import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))

import notebook_kernels  # tests/notebook_kernels.py, found through the path just set

from workbench.config.options import HTTP_SERVER_ENV, HTTP_SERVERS, ServerOptions
from workbench.jupyter import server_records as registry
from workbench.server import ServerThread


@pytest.fixture(scope="session")
def private_runtime_dir() -> Path:
    """Servers started by tests register in a folder of this test process's, not the user's Jupyter runtime
    (``pytest_configure`` below sets ``WORKBENCH_RUNTIME_DIR`` before anything runs, notebooks' kernels included)."""
    return Path(os.environ["WORKBENCH_RUNTIME_DIR"])


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of every test model; tests copy versions from here into their own repositories."""
    # TensorFlow is imported here, by the first test that needs a model, not by every run: the unit tier has none.
    import models  # tests/models.py

    from workbench import demo

    root = tmp_path_factory.mktemp("store")
    demo.save_half_plus_two(root / "hp2_tf2")
    demo.save_half_plus_two(root / "hp3_tf2", offset=3.0)
    demo.save_half_plus_two_tf1(root / "hp2_tf1")
    models.save_multi_io(root / "multi_io")
    return root


@pytest.fixture
def make_repo(tmp_path: Path, model_store: Path) -> Callable[..., Path]:
    """``make_repo("name", {1: "hp2_tf1", 2: "hp2_tf2"})`` → a base path with those versions."""

    def make(name: str, versions: dict[int, str]) -> Path:
        base = tmp_path / "models" / name
        base.mkdir(parents=True, exist_ok=True)
        for version, stored in versions.items():
            shutil.copytree(model_store / stored, base / str(version))
        return base

    return make


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    """Start servers with the given ServerOptions fields (REST on a free port); all stop after the test."""
    started: list[ServerThread] = []

    def start(**fields: object) -> ServerThread:
        fields.setdefault("rest_api_port", -1)
        fields.setdefault("port", 0)
        server = ServerThread(ServerOptions(**fields)).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


@pytest.fixture(scope="session")
def ipython_shell():  # type: ignore[no-untyped-def]
    """One IPython shell for every test that drives magics (IPython allows one shell instance per process)."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # a test shell must not write the user's history database
    shell = InteractiveShell.instance(config=config)
    shell.run_line_magic("load_ext", "workbench")
    return shell


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Server records go to a folder of this test (set before any server starts: servers read it when they
    record), where Jupyter's extension reads them too."""
    folder = tmp_path / "runtime" / "workbench-servers"
    monkeypatch.setenv(registry.RUNTIME_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    """pytest-jupyter's Jupyter server, with workbench's server extension (the listing and the proxy)."""
    return {"ServerApp": {"jpserver_extensions": {"workbench.jupyter": True}}}


# ------------------------------------------------------------------------------------------------ the run
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("workbench")
    group.addoption(
        "--busy", action="store_true", default=False,
        help="run on a busy machine: CPU-burning processes at normal priority (one a core, or --busy-processes) "
        "for the whole run, as a shared CI machine's other work; `make test-busy`",
    )  # fmt: skip
    group.addoption("--busy-processes", type=int, default=None, metavar="N", help="how many burners --busy starts")
    group.addoption(
        "--http-server", choices=HTTP_SERVERS, default=None,
        help="the HTTP server of every server the run starts (in process, `workbench serve`, notebooks' kernels) "
        "where a test does not choose one: sets $WORKBENCH_HTTP_SERVER; `make test-granian`",
    )  # fmt: skip


_RUNTIME_DIRS: list[tuple[str, str | None]] = []  # (this process's folder, the variable's value before it)
_BURNERS: list[subprocess.Popen[bytes]] = []
# A burner spins at normal priority until stopped, or until the run that started it is gone (its parent changes).
BURNER = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(200_000):\n        pass\n"


def pytest_configure(config: pytest.Config) -> None:
    # nbval's kernels start past jupyter_client's port race (tests/notebook_kernels.py says how it was lost).
    nbval.kernel.start_new_kernel = notebook_kernels.start_kernel
    # Servers started by tests register in a folder of this process's, not the user's Jupyter runtime: set before
    # anything runs (a notebook's kernel, started by nbval, inherits it), and one for each pytest-xdist worker.
    folder = tempfile.mkdtemp(prefix="workbench-test-runtime-")
    _RUNTIME_DIRS.append((folder, os.environ.get(registry.RUNTIME_DIR_ENV)))
    os.environ[registry.RUNTIME_DIR_ENV] = folder  # inherited by the server processes tests start
    if config.getoption("http_server"):  # every server of the run, and the processes it starts (xdist's workers too)
        os.environ[HTTP_SERVER_ENV] = config.getoption("http_server")
    if config.getoption("busy") and not hasattr(config, "workerinput"):  # the run's own process, once
        count = config.getoption("busy_processes") or len(os.sched_getaffinity(0))
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        _BURNERS.extend(subprocess.Popen([sys.executable, "-c", BURNER], **quiet) for _ in range(count))


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if os.environ.get(HTTP_SERVER_ENV):
        lines.append(f"HTTP server: {os.environ[HTTP_SERVER_ENV]} (${HTTP_SERVER_ENV})")
    if _BURNERS:
        pids = ", ".join(str(burner.pid) for burner in _BURNERS)
        lines.append(f"busy: {len(_BURNERS)} CPU-burning processes at normal priority (pids {pids})")
    return lines


def _stop_burners() -> None:
    for burner in _BURNERS:
        burner.kill()
    for burner in _BURNERS:
        burner.wait(30)
    _BURNERS.clear()


def _remove_runtime_dir() -> None:
    while _RUNTIME_DIRS:
        folder, previous = _RUNTIME_DIRS.pop()
        shutil.rmtree(folder, ignore_errors=True)
        if previous is None:
            os.environ.pop(registry.RUNTIME_DIR_ENV, None)
        else:
            os.environ[registry.RUNTIME_DIR_ENV] = previous


# `make test` runs the suite on pytest-xdist's workers (`-n`, `--dist loadfile`): each test file on one worker, so
# that a module's server is started once. These files share one worker as well, as they share something outside
# the test's own folders and ports: the first three build or serve workbench/labextension (`make wheel` rebuilds it
# in place, with the whole checkout's make state), the Ray tests start clusters that share /tmp/ray.
SHARED_WORKER = {
    "tests/system/test_make.py": "checkout",
    "tests/system/test_labextension.py": "checkout",
    "tests/system/test_dashboard_browser.py": "checkout",
    "tests/system/test_deciding_browser.py": "checkout",
    "tests/system/test_sidebar_browser.py": "checkout",
    "tests/system/test_ray.py": "ray",
    "tests/system/test_ray_batch.py": "ray",
}
# The longest files and groups first (seconds of a `make test` on 2 cores, slowest first), so that no long one starts
# last while the other workers idle; the rest follow in the order collected.
LONGEST_FIRST = [
    "ray",  # 650: a local cluster, Serve's deployments, the command line's own Ray, a batch job on Ray Data
    "checkout",  # 500: the wheel built and installed, the browsers, make lab/serve/test-fast, npm ci
    "tests/wire/test_async_inference.py",
    "tests/system/test_readme.py",
    "tests/system/test_guide_pages.py",  # the guide's pages, a server each where its blocks run against one
    "tests/wire/test_overload.py",
    "notebooks/03-batching-and-latency.ipynb",
    "tests/wire/test_startup.py",
    "tests/wire/test_object_store.py",
    "tests/wire/test_mlflow_registry.py",  # a real `mlflow server`, two replicas following its aliases
    "tests/wire/test_mlflow_scoring.py",  # `mlflow models serve` beside workbench, answer for answer
    "tests/wire/test_mlflow_pyfunc.py",
    "tests/wire/test_export_mlflow.py",
    "tests/wire/test_mlflow_boosters.py",
    "notebooks/11-mlflow-registry.ipynb",
    "notebooks/12-language-models.ipynb",
    "notebooks/09-deciding.ipynb",
    "tests/wire/test_drain_connections.py",
    "tests/wire/test_perf_load.py",
    "notebooks/10-production-models.ipynb",
    "tests/wire/test_analyzer.py",
    "tests/wire/test_workers.py",
    "tests/wire/test_demo.py",
    "tests/wire/test_sklearn_estimators.py",
    "notebooks/02-versions.ipynb",
    "notebooks/06-beyond-tensorflow.ipynb",
    "notebooks/04-end-to-end.ipynb",
]


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED_WORKER.get(path, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the files of ``SHARED_WORKER`` kept together."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False  # the order below, not the number of tests
    return FilesAndGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # a plain run keeps the order of the files
    rank = {scope: i for i, scope in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_scope(item.nodeid), len(rank)))  # stable: a file's tests keep their order


# TensorFlow, PyTorch and numba (shap's) in one process can crash in their native destructors at interpreter exit,
# after every test has passed and been reported (a segmentation fault turned a green suite red once). The run's own
# outcome is decided by then: leave with it, skipping the native teardown. A pytest-xdist worker does the same: it
# has sent its results (the `workerfinished` event, at the end of pytest_sessionfinish) by the time this runs, and
# the run's status is the controller's, which ends the same way.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_burners()
    _remove_runtime_dir()
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
