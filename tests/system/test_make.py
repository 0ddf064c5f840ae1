"""The README's commands as a user types them: ``make lab``, ``make serve``, and the wheel ``make wheel`` builds,
installed with pip into a new virtualenv.

They run as whoever runs the tests: root in CI and in most containers, where JupyterLab refuses to start
unless told ``--allow-root``. Each server gets free ports on 127.0.0.1 and is stopped (its whole process group)
at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from waiting import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")

pytestmark = pytest.mark.skipif(MAKE is None, reason="GNU make is not installed")


@contextlib.contextmanager
def running(
    command: list[str], log: Path, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A command in a session of its own (make and what it starts), stopped with SIGTERM (then SIGKILL) after."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield process
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def answers(url: str, process: subprocess.Popen[bytes], log: Path, **kwargs: object) -> requests.Response | None:
    """The answer of ``url`` once it comes; an exited process fails at once with its log."""
    if process.poll() is not None:
        raise AssertionError(f"exited with {process.returncode} before answering:\n{log.read_text()[-4000:]}")
    try:
        return requests.get(url, timeout=5, **kwargs)  # type: ignore[arg-type]
    except requests.ConnectionError:
        return None


def ready_answer(base: str, process: subprocess.Popen[bytes], log: Path) -> requests.Response | None:
    """``/readyz``'s 200 once every model serves (the ports open before the models have loaded)."""
    answer = answers(f"{base}/readyz", process, log)
    return answer if answer is not None and answer.status_code == 200 else None


def make_env() -> dict[str, str]:
    # A make run by `make test` passes its flags down; this one is a user's own command line.
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def test_make_lab_as_written_runs_as_this_user_and_opens_a_browser() -> None:
    dry = subprocess.run([MAKE, "-n", "lab"], cwd=ROOT, capture_output=True, text=True, env=make_env(), timeout=60)
    assert dry.returncode == 0, dry.stderr
    (command,) = [line for line in dry.stdout.splitlines() if "jupyter lab" in line]
    assert "--no-browser" not in command  # a person at a desktop gets JupyterLab in their browser
    assert ("--allow-root" in command) == (os.geteuid() == 0), command
    assert command.rstrip().endswith("notebooks/")


def test_make_test_fast_runs_the_unit_tier_alone_and_passes() -> None:
    run = subprocess.run([MAKE, "test-fast"], cwd=ROOT, capture_output=True, text=True, env=make_env(), timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", run.stdout), run.stdout[-2000:]
    ran = set(re.findall(r"^(tests/\S+\.py)", run.stdout, re.MULTILINE))
    assert ran and all(path.startswith("tests/unit/") for path in ran), ran


def _probe_wheel(folder: Path) -> str:
    """A wheel of one module and no requirements, ``wbprobe`` 1.0, written into ``folder``: an install from it needs
    no index (nor a network)."""
    import base64
    import hashlib
    import zipfile

    files = {
        "wbprobe.py": "ANSWER = 42\n",
        "wbprobe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: wbprobe\nVersion: 1.0\n",
        "wbprobe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: workbench-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for name, text in files.items()
    ]
    files["wbprobe-1.0.dist-info/RECORD"] = "\n".join([*record, "wbprobe-1.0.dist-info/RECORD,,"]) + "\n"
    folder.mkdir()
    with zipfile.ZipFile(folder / "wbprobe-1.0-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return "wbprobe==1.0"


@pytest.mark.timeout(300)
def test_make_install_installs_with_uv_where_it_is_there_and_with_pip_elsewhere(tmp_path: Path) -> None:
    """``make install``'s installs go through the Makefile's ``venv_install``: uv (four times faster) when the venv
    has it, pip otherwise; uv reads no pip.conf, so pip's find-links (where this machine keeps PyTorch's CPU build)
    are handed to it. Installed here from a find-links folder alone (no index), by each in turn."""
    requirement = _probe_wheel(tmp_path / "wheels")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    (tmp_path / "Makefile").write_text(f"include {ROOT / 'Makefile'}\nprobe:\n\t$(call venv_install,{requirement})\n")
    env = {**make_env(), "PIP_FIND_LINKS": str(tmp_path / "wheels"), "PIP_NO_INDEX": "1", "UV_OFFLINE": "1"}
    env.pop("UV_FIND_LINKS", None)
    site = Path(
        subprocess.run(
            [env_dir / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip

    def install() -> str:
        """Installs the probe with the Makefile's venv_install; which installer did (its dist-info's INSTALLER)."""
        run = subprocess.run(
            [MAKE, "-f", str(tmp_path / "Makefile"), f"VENV={env_dir}", "probe"], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return (site / "wbprobe-1.0.dist-info" / "INSTALLER").read_text().strip()

    assert install() == "pip"
    uv = ROOT / ".venv" / "bin" / "uv"
    assert uv.is_file(), f"{uv} missing: make install puts uv into the venv"
    shutil.rmtree(site / "wbprobe-1.0.dist-info")
    (site / "wbprobe.py").unlink()
    shutil.copy(uv, env_dir / "bin" / "uv")
    assert install() == "uv"


def test_ci_entry_point_parses_and_ends_in_make_test(tmp_path: Path) -> None:
    """``.ci/run`` as CI runs it, with the system tools it looks for already present (stand-ins on PATH, so
    nothing is installed) and ``make`` recording its arguments instead of running the whole suite again."""
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci/run")], capture_output=True, text=True).returncode == 0
    tools = tmp_path / "bin"
    tools.mkdir()
    called = tmp_path / "make-called"
    for name in ("npm", "chromium", "redis-server", "apt-get"):
        (tools / name).write_text(f'#!/bin/sh\necho {name} "$@" >> {tmp_path}/others\n')
    (tools / "make").write_text(f'#!/bin/sh\necho "$@" > {called}\n')
    for tool in tools.iterdir():
        tool.chmod(0o755)
    env = {**make_env(), "PATH": f"{tools}:/usr/bin:/bin"}
    run = subprocess.run(["bash", str(ROOT / ".ci/run")], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert called.read_text().split() == ["test"]
    assert not (tmp_path / "others").exists()  # present tools are not reinstalled, nor run


def test_ci_entry_point_fails_a_run_that_changes_the_checkout(tmp_path: Path) -> None:
    """``.ci/run`` compares ``git status`` before and after ``make test``: a tracked file rewritten or a file left in
    the tree (as ``npm install`` once rewrote extension/package-lock.json) fails CI; what .gitignore covers does not."""
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    (checkout / ".gitignore").write_text(".venv/\n")
    (checkout / "tracked.txt").write_text("as committed\n")
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "checkout"]):
        subprocess.run([*git, *command], cwd=checkout, check=True, capture_output=True, timeout=60)
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("npm", "chromium", "redis-server"):
        (tools / name).write_text("#!/bin/sh\n")
    make = tools / "make"
    for tool in tools.iterdir():
        tool.chmod(0o755)
    env = {**make_env(), "PATH": f"{tools}:/usr/bin:/bin"}

    def ci_with(make_does: str) -> subprocess.CompletedProcess[str]:
        make.write_text(f"#!/bin/sh\n{make_does}\n")
        make.chmod(0o755)
        return subprocess.run(
            ["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True, env=env, timeout=60
        )

    ignored = ci_with("mkdir -p .venv && touch .venv/installed")
    assert ignored.returncode == 0, ignored.stderr
    rewritten = ci_with("echo rewritten > tracked.txt")
    assert rewritten.returncode != 0 and "M tracked.txt" in rewritten.stderr, rewritten.stderr
    subprocess.run([*git, "checkout", "-q", "tracked.txt"], cwd=checkout, check=True, timeout=60)
    left = ci_with("touch left-behind.json")
    assert left.returncode != 0 and "?? left-behind.json" in left.stderr, left.stderr


NPM = shutil.which("npm")


@pytest.mark.skipif(NPM is None, reason="npm is not installed")
@pytest.mark.timeout(600)
def test_the_extensions_node_modules_install_from_the_lock_file_as_committed(tmp_path: Path) -> None:
    """What ``make install`` runs in extension/: the Makefile's ``npm ci`` (only when package.json or the lock file
    changed), then hatch-jupyter-builder's ``npm install`` as pyproject.toml configures it. Neither rewrites
    extension/package-lock.json: ``npm ci`` refuses a lock file that package.json has outgrown, where ``npm install``
    rewrote it (473 lines more) and left every ``make test`` with a changed checkout."""
    import tomllib

    extension = tmp_path / "extension"
    extension.mkdir()
    for name in ("package.json", "package-lock.json", ".npmrc"):
        shutil.copy(ROOT / "extension" / name, extension / name)
    committed = (extension / "package-lock.json").read_bytes()
    stamp = "extension/node_modules/.installed-from-lock"
    installed = subprocess.run(
        [MAKE, "-f", str(ROOT / "Makefile"), stamp], cwd=tmp_path, env=make_env(), capture_output=True, text=True,
        timeout=540,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert "npm ci" in installed.stdout and "npm install" not in installed.stdout, installed.stdout
    assert (tmp_path / stamp).is_file() and (extension / "node_modules" / "typescript").is_dir()
    assert (extension / "package-lock.json").read_bytes() == committed
    # Up to date: a second make installs nothing (npm ci empties node_modules first, so it must not run each time).
    again = subprocess.run(
        [MAKE, "-f", str(ROOT / "Makefile"), stamp], cwd=tmp_path, env=make_env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert again.returncode == 0 and "npm" not in again.stdout, again.stdout

    # The editable install's build hook runs `<npm> install` before building (hatch_jupyter_builder.npm_builder).
    hook = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
    for kwargs in ("build-kwargs", "editable-build-kwargs"):
        npm = hook[kwargs]["npm"]
        done = subprocess.run(
            [*npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=extension, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert (extension / "package-lock.json").read_bytes() == committed, f"{kwargs}: {npm} install rewrote it"


@pytest.mark.timeout(600)
def test_make_lab_serves_jupyterlab_on_the_tutorials(tmp_path: Path) -> None:
    port, token = free_port(), secrets.token_hex(16)
    lab_args = (
        f"--ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    )
    # As at a desktop: JupyterLab opens "the browser", here `true`, which is what a machine without one gets.
    env = make_env() | {"JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "BROWSER": "true"}
    log = tmp_path / "lab.log"
    with running([MAKE, "lab", f"LAB_ARGS={lab_args}"], log, env=env) as process:
        base = f"http://127.0.0.1:{port}"
        lab = wait_until(
            lambda: answers(f"{base}/lab", process, log, params={"token": token}), timeout=300, what="JupyterLab"
        )
        assert lab.status_code == 200, lab.text[:500]
        assert "JupyterLab" in lab.text
        # It opened on the tutorials: the root of its file browser is notebooks/.
        listing = requests.get(f"{base}/api/contents", params={"token": token}, timeout=10).json()
        assert "01-quickstart.ipynb" in {item["name"] for item in listing["content"]}
    assert "Running as root is not recommended" not in log.read_text()


@pytest.mark.timeout(600)
def test_make_serve_serves_the_demo_models(tmp_path: Path) -> None:
    port = free_port()
    demo = tmp_path / "demo-models"
    log = tmp_path / "serve.log"
    with running([MAKE, "serve", f"DEMO={demo}", "GRPC_PORT=0", f"REST_PORT={port}"], log, env=make_env()) as process:
        base = f"http://127.0.0.1:{port}"
        ready = wait_until(lambda: ready_answer(base, process, log), timeout=300, what="make serve ready")
        assert ready.json() == {"status": "ready"}
        url = f"{base}/v1/models/half_plus_two"
        answer = requests.post(f"{url}:predict", json={"instances": [1.0, 2.0]}, timeout=10)
        assert answer.json() == {"predictions": [2.5, 3.0]}
    assert (demo / "models.config").is_file()


@pytest.mark.timeout(900)
def test_the_wheel_make_builds_installs_with_pip_into_a_new_virtualenv_and_serves(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [MAKE, "wheel", f"WHEEL_DIR={dist}"], cwd=ROOT, env=make_env(), capture_output=True, text=True, timeout=600
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("*.whl")
    assert re.fullmatch(r"workbench_serving-[\w.]+-py3-none-any\.whl", wheel.name), wheel.name

    # A new virtualenv that sees the test environment's packages (a path in a .pth file: no package of this checkout
    # comes with them, its editable install being a .pth of its own, which a plain path line does not run). pip
    # checks the wheel's requirements, the notebook extra's included, against them as in any environment that has
    # them, and installs the wheel alone: what is checked is the wheel (its files, its metadata, its console script,
    # the sidebar and server extension it brings), not a download of 3.5 GB of dependencies (3 minutes, 2.5 of CPU,
    # a fifth of the suite's longest worker). Which distributions the extras pull is test_install_extras.py's.
    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(fresh)
    bin_dir = fresh / "bin"
    here = sysconfig.get_path("purelib")
    (Path(_site_packages(bin_dir / "python")) / "_test_environment.pth").write_text(here + "\n")
    # What the README tells a user to type (the wheel's path where they would type the name).
    installed = subprocess.run(
        [bin_dir / "python", "-m", "pip", "install", f"{wheel}[notebook]"], capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    assert re.search(r"Successfully installed workbench-serving-[\w.]+\s*$", installed.stdout), installed.stdout[-3000:]

    # The sidebar came prebuilt in the wheel (no Node.js here), and the Jupyter server extension is enabled: both
    # found under the new environment's prefix, where the wheel put them (the test environment's own links to the
    # checkout's build are under its prefix, which the new one's Jupyter does not read). The commands' modules, run
    # by the new environment's Python: `jupyter labextension` looks for `jupyter-labextension` on PATH, whose script
    # the test environment has.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    listed = subprocess.run(
        [bin_dir / "python", "-m", "jupyterlab.labextensions", "list"], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert re.search(rf"{re.escape(str(fresh))}/share/jupyter/labextensions\s", text), text
    assert re.search(r"workbench-serving-jupyterlab v[\w.]+ enabled OK \(python, workbench-serving\)", text), text
    servers = subprocess.run(
        [bin_dir / "python", "-m", "jupyter_server.extension.serverextension", "list"], capture_output=True,
        text=True, env=env, timeout=120,
    )  # fmt: skip
    text = re.sub(r"\x1b\[[0-9;]*m", "", servers.stderr + servers.stdout)
    assert re.search(rf"Config dir: {re.escape(str(fresh))}/etc/jupyter\n\s+workbench\.jupyter enabled", text), text

    # It serves: the console script of the new environment, on its own demo models.
    demo = subprocess.run(
        [bin_dir / "workbench", "demo", tmp_path / "models"], capture_output=True, text=True, env=env, timeout=300
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    port = free_port()
    command = [
        str(bin_dir / "workbench"), "serve", "--port=0", f"--rest_api_port={port}",
        f"--model_config_file={tmp_path / 'models' / 'models.config'}",
    ]  # fmt: skip
    log = tmp_path / "serve.log"
    with running(command, log, cwd=tmp_path, env=env) as process:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: ready_answer(base, process, log), timeout=300, what="the installed server ready")
        url = f"{base}/v1/models/half_plus_two"
        answer = requests.post(f"{url}:predict", json={"instances": [1.0, 2.0]}, timeout=10)
        assert answer.json() == {"predictions": [2.5, 3.0]}
    # The package came from the wheel, not from this checkout.
    where = subprocess.run(
        [bin_dir / "python", "-c", "import workbench; print(workbench.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert str(fresh) in where.stdout and str(ROOT) not in where.stdout


def _site_packages(python: Path) -> str:
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout.strip()  # fmt: skip


def test_the_project_is_installed_under_its_distribution_name() -> None:
    from importlib.metadata import distribution

    # `pip install workbench` installs somebody else's project: this one is workbench-serving on PyPI.
    metadata = distribution("workbench-serving").metadata
    assert metadata["Name"] == "workbench-serving"
    assert metadata["Requires-Python"] == ">=3.10"
