"""Shared fixtures: real SavedModels built once per session, and servers on 127.0.0.1 ephemeral ports."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))

from workbench.config.options import ServerOptions  # noqa: E402
from workbench.jupyter import server_records as registry  # noqa: E402
from workbench.server import ServerThread  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def private_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Servers started by tests register in a folder of the test session's, not the user's Jupyter runtime."""
    folder = tmp_path_factory.mktemp("jupyter-runtime")
    previous = os.environ.get("WORKBENCH_RUNTIME_DIR")
    os.environ["WORKBENCH_RUNTIME_DIR"] = str(folder)  # inherited by the server processes tests start
    yield folder
    if previous is None:
        os.environ.pop("WORKBENCH_RUNTIME_DIR", None)
    else:
        os.environ["WORKBENCH_RUNTIME_DIR"] = previous


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


# ------------------------------------------------------------------------------------------------ exit
# TensorFlow, PyTorch and numba (shap's) in one process can crash in their native destructors at interpreter exit,
# after every test has passed and been reported (a segmentation fault turned a green suite red once). The run's own
# outcome is decided by then: leave with it, skipping the native teardown.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _EXIT_STATUS and not hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
