"""The README's code runs as written and does what its comments promise.

The notebook tour runs in a real Jupyter kernel (nbclient), one cell per magic line as a user would type them,
with a check after each line whose comment promises something (which version is stable, who gets the
traffic). The headless blocks run against `workbench serve` started with the README's own command line (ports
swapped for free ones). A Python line followed by ``# <value>`` comment lines must evaluate to that value.
If the README changes, these tests fail until they are told what the new text promises.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
import requests
from guide_blocks import EXPECT_HELPER, with_expectations
from nbclient import NotebookClient
from waiting import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@dataclass(frozen=True)
class Block:
    section: str  # the "## " heading it is under
    language: str
    code: str


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    section = ""
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.fullmatch(r"```(\w*)", line)
        if fence:
            end = lines.index("```", i + 1)
            blocks.append(Block(section, fence.group(1), "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def blocks_in(section: str, language: str) -> list[Block]:
    found = [b for b in readme_blocks() if b.section.startswith(section) and b.language == language]
    assert found, f"the README has no {language} block under '## {section}'"
    return found


def test_expectations_are_read_from_comment_lines() -> None:
    code = "x = 2\nx + 1   # a note\n# 3\ny = 1"
    namespace: dict[str, object] = {}
    exec(EXPECT_HELPER + with_expectations(code), namespace)  # noqa: S102 - the helper under test
    assert namespace["_readme_value"] == 3
    with pytest.raises(AssertionError, match="README promises '4'"):
        exec(EXPECT_HELPER + with_expectations("1 + 2\n# 4"), {})  # noqa: S102


# ------------------------------------------------------------------------------------------ the tour
# What each magic line of the tour promises, in the order the lines come. A check runs in the kernel right after
# its line; ``_`` is that line's result and ``routing()`` is (stable version, {version: traffic share}).
TOUR_CHECKS: list[tuple[str, str]] = [
    ("%serve start", "assert _.running"),
    ("%serve export model digits", "assert routing() == (None, {1: 1.0})"),
    ("%serve promote digits 1", "assert routing() == (1, {1: 1.0})"),
    (
        "%serve predict digits x",
        "assert _['output_0'].shape == (3, 10) and _.protocol == 'rest' and _.latency_ms > 0\n"
        "assert get_ipython().run_line_magic('serve', 'predict digits x --grpc').protocol == 'grpc'",
    ),
    ("%serve export model digits", "assert routing() == (1, {1: 1.0, 2: 0.0}), 'v2 must load beside v1'"),
    ("%serve canary digits 2 0.1", "assert routing() == (1, {1: 0.9, 2: 0.1})"),
    ("%serve promote digits 2", "assert routing() == (2, {1: 0.0, 2: 1.0})"),
    ("%serve rollback digits", "assert routing() == (1, {1: 1.0, 2: 0.0}), 'back to v1'"),
    ("%serve dashboard", "assert type(_).__name__ == 'Dashboard'"),
]

ROUTING_HELPER = """
def routing():
    doc = get_ipython().run_line_magic("serve", "status digits").models[0]
    shares = {v["version"]: round(v["traffic_share"], 3) for v in doc["versions"] if v["state"] == "AVAILABLE"}
    return doc["stable"], shares
"""


def tour_cells(code: str) -> tuple[list[str], list[str]]:
    """The tour as cells: each magic line alone (so ``_`` is its result), Python lines together; checks after."""
    cells: list[str] = []
    kinds: list[str] = []  # "tour" or "check"
    checks = list(TOUR_CHECKS)
    pending: list[str] = []

    def flush() -> None:
        if any(line.strip() for line in pending):
            cells.append("\n".join(pending).strip())
            kinds.append("tour")
        pending.clear()

    for line in code.splitlines():
        if not line.startswith("%"):
            pending.append(line)
            continue
        flush()
        cells.append(line)
        kinds.append("tour")
        command = line.split("#", 1)[0].strip()
        if checks and checks[0][0] == command:
            cells.append(checks.pop(0)[1])
            kinds.append("check")
    flush()
    assert not checks, f"the README's tour no longer has these lines, or not in this order: {[c for c, _ in checks]}"
    return cells, kinds


def stream_text(cell: nbformat.NotebookNode, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == name)


@pytest.mark.timeout(600)
def test_the_notebook_tour_runs_and_keeps_its_promises(tmp_path: Path) -> None:
    tour, python_api = blocks_in("A 30-second tour", "python")  # the magics, then "the same from Python"
    assert tour.code.startswith("%load_ext workbench") and "workbench.serve(" in python_api.code
    cells, kinds = tour_cells(tour.code)
    cells = [*cells, EXPECT_HELPER + with_expectations(python_api.code), "%serve stop --all"]
    kinds = [*kinds, "tour", "tour"]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(ROUTING_HELPER)] + [nbformat.v4.new_code_cell(c) for c in cells]
    kinds = ["check", *kinds]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}  # a user sets no log levels
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with _environment(env):
        client.execute()

    # Cells show what workbench (and the user's code) says, nothing else: no stderr, no TensorFlow logs.
    for cell, kind in zip(notebook.cells, kinds, strict=True):
        if kind != "tour":
            continue
        noise = stream_text(cell, "stderr")
        assert not noise, f"cell {cell.source!r} wrote to stderr:\n{noise}"
        text = stream_text(cell, "stdout") + "".join(
            str(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", [])
        )
        assert not re.search(r"INFO:tensorflow|WARNING:tensorflow|Deprecat", text), text
    assert (tmp_path / "workbench-models" / "digits" / "2" / "saved_model.pb").is_file()
    assert (tmp_path / "more-models" / "digits" / "1" / "saved_model.pb").is_file()


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# -------------------------------------------------------------------------------------------- headless


@pytest.mark.timeout(600)
def test_the_headless_commands_and_clients_work_as_written(tmp_path: Path) -> None:
    grpc_port, rest_port = free_port(), free_port()

    def ported(text: str) -> str:  # TF Serving's default ports may be taken on a test machine
        return text.replace("8500", str(grpc_port)).replace("8501", str(rest_port))

    (shell,) = blocks_in("Headless", "bash")
    commands = [line.split("#", 1)[0].strip() for line in ported(shell.code).splitlines()]
    commands = [c for c in commands if c]
    assert [c.split()[:2] for c in commands] == [["workbench", "demo"], ["workbench", "serve"]]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    made = subprocess.run(shlex.split(commands[0]), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]

    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            shlex.split(commands[1]), cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:

        def up() -> bool:
            assert server.poll() is None, log.read_text()[-3000:]
            # Ready once every model of the config serves (the ports open before the models have loaded).
            return requests.get(f"http://127.0.0.1:{rest_port}/readyz", timeout=5).status_code == 200

        wait_until(up, timeout=300, what="the README's workbench serve")
        clients = blocks_in("Headless", "python")
        assert len(clients) == 2  # requests (REST) and the TF Serving gRPC stubs
        for block in clients:
            exec(EXPECT_HELPER + with_expectations(ported(block.code)), {})  # noqa: S102 - the README's code
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
