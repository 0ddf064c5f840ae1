"""Binder (repo2docker) configuration in binder/: it installs the project; its scripts are what repo2docker runs.

repo2docker itself (and Docker) are not available here, so the checks are the parts it relies on: pip resolves
``binder/requirements.txt`` from the repository root (pip's dry run, against the package indexes this machine
is configured with), ``postBuild`` and ``start`` are executable shell scripts, and ``start`` hands over to its
arguments with ``exec`` (same process, arguments intact, exit status passed through).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"


def _requirement_lines() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_requirements_install_the_project_with_its_notebook_extras() -> None:
    lines = _requirement_lines()
    # A line naming the repository itself makes repo2docker install the requirements after copying the repository.
    project = [line for line in lines if re.fullmatch(r"(-e\s+)?\.(\[[\w,\s-]+\])?", line)]
    assert project, f"binder/requirements.txt does not install the project itself: {lines}"
    assert "notebook" in project[0], "the tutorials need the project's [notebook] extras"
    # Tutorial 10 needs PyTorch, which the notebook extra leaves out: the pytorch extra, and PyTorch's CPU build
    # from PyTorch's own index (PyPI's Linux wheel is the CUDA build, whose triton must not meet TensorFlow).
    assert "pytorch" in project[0], "tutorial 10 needs the project's [pytorch] extra"
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert any(line.startswith("jupyter-server-proxy") for line in lines)


@pytest.mark.timeout(600)
def test_requirements_resolve_with_pip(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    # One retry, not pip's five with backoff: on a machine that reaches PyPI but not PyTorch's CPU index, each
    # package the editable build's isolated environment looks up waited ~8 s on that index (96 s in all, 5 s so).
    # PIP_RETRIES, not --retries: the build environment's own pip reads the variable only.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "-r", "binder/requirements.txt",
         "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=540, env=os.environ | {"PIP_RETRIES": "1"},
    )  # fmt: skip
    assert result.returncode == 0, f"pip could not resolve binder/requirements.txt:\n{result.stderr[-3000:]}"
    items = json.loads(report.read_text())["install"]
    installs = {item["metadata"]["name"].lower().replace("_", "-"): item for item in items}
    # pip always (re)installs a requirement that is a local folder: the project must be among what it would install,
    # from this repository's root, with the extras asked for.
    assert "workbench-serving" in installs, f"pip would not install the project: {sorted(installs)}"
    project = installs["workbench-serving"]
    assert project["download_info"]["url"] == ROOT.as_uri()
    assert project.get("requested_extras") == ["huggingface", "notebook", "pytorch"]
    # Installed already here, or to be installed: either way resolvable.
    assert "jupyter-server-proxy" in installs or _installed("jupyter_server_proxy")


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("name", ["postBuild", "start"])
def test_scripts_are_executable_bash(name: str) -> None:
    script = BINDER / name
    assert os.access(script, os.X_OK), f"binder/{name} must be executable (chmod +x; git keeps the mode)"
    assert script.read_text().startswith("#!/bin/bash\n")
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_start_execs_its_arguments() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_BACKEND")}
    code = (
        "import json, os, sys; "
        "print(json.dumps([os.getpid(), sys.argv[1:], os.environ['TF_CPP_MIN_LOG_LEVEL']])); sys.exit(7)"
    )
    process = subprocess.Popen(
        [str(BINDER / "start"), sys.executable, "-c", code, "two words", "$HOME"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    out, _ = process.communicate(timeout=60)
    pid, argv, level = json.loads(out)
    assert process.returncode == 7  # the command's exit status is the script's
    assert pid == process.pid  # exec: the command took over the script's process instead of running as its child
    assert argv == ["two words", "$HOME"]  # arguments passed on as they were given ("$@")
    assert level == "2"


def test_start_keeps_settings_given_by_the_environment() -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    out = subprocess.run(
        [str(BINDER / "start"), sys.executable, "-c", "import os; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"],
        capture_output=True, text=True, env=env, timeout=60,
    ).stdout  # fmt: skip
    assert out.strip() == "0"


def test_readme_links_open_existing_notebooks() -> None:
    text = (BINDER / "README.md").read_text()
    linked = set(re.findall(r"lab/tree/(notebooks/[\w.-]+\.ipynb)", text))
    assert "notebooks/01-quickstart.ipynb" in linked
    missing = [path for path in sorted(linked) if not (ROOT / path).is_file()]
    assert not missing, f"binder/README.md links to notebooks that do not exist: {missing}"
