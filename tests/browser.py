"""Helpers for the browser tests: JupyterLab in a child process, and Debian's Chromium through Playwright.

The browser is the system's (``/usr/bin/chromium``, Debian's ``chromium`` package that ``.ci/run`` installs);
Playwright never downloads one. Where either is missing the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from waiting import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def require_browser() -> None:
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine (Debian package 'chromium'; .ci/run installs it)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")


def notebook(cells: list[str]) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}
            for source in cells
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@contextmanager
def jupyterlab(root: Path) -> Iterator[str]:
    """JupyterLab serving ``root`` on a free port; yields its base URL with the token."""
    port, token = free_port(), "workbench-test-token"
    # User settings of our own: no news pop-up over the screenshots, no kernel picker for python3 notebooks.
    settings = root / ".lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True, exist_ok=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True, exist_ok=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"autoStartDefaultKernel": True})
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JUPYTERLAB_SETTINGS_DIR=str(settings))
    log = open(root / "jupyterlab.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--allow-root",
         # A workspace of the test's own: the user's saved layout (an open sidebar, say) must not leak in.
         f"--LabApp.workspaces_dir={root / '.lab-workspaces'}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as response:  # noqa: S310 - the Jupyter server this test started, over http
                    json.load(response)
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log_text = (root / "jupyterlab.log").read_text()[-3000:]
                    raise RuntimeError("JupyterLab did not start:\n" + log_text) from None
                time.sleep(0.2)
        yield f"{url}?token={token}".replace("?token", "/lab?token")
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@contextmanager
def lab_page(
    root: Path, notebooks: dict[str, list[str]], size: tuple[int, int], name: str
) -> Iterator[tuple[Any, str]]:
    """A Chromium page (``size``: width, height) beside JupyterLab serving ``root``, where ``notebooks`` (file name
    to cells) are written first; yields the page and JupyterLab's URL. When what runs inside raises, the browser's
    last console lines are printed and the whole page is kept as ``$TMPDIR/workbench-<name>-failure.png``."""
    require_browser()
    from playwright.sync_api import sync_playwright

    for file, cells in notebooks.items():
        (root / file).write_text(json.dumps(notebook(cells)))
    with jupyterlab(root) as lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": size[0], "height": size[1]})
            console: list[str] = []
            page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
            try:
                yield page, lab
            except Exception:
                print("the browser's console:", *console[-60:], sep="\n")
                page.screenshot(path=str(failure_screenshot(name)), full_page=True)
                raise
        finally:
            browser.close()


def failure_screenshot(name: str) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"workbench-{name}-failure.png"


def open_notebook(page, lab_url: str, name: str) -> None:  # type: ignore[no-untyped-def]
    base, _, token = lab_url.partition("/lab?token=")
    page.goto(f"{base}/lab/tree/{name}?token={token}")
    shown(page, ".jp-NotebookPanel", timeout=120_000)
    # Older settings files or a changed default can still bring up the kernel picker: accept python3.
    picker = page.locator(".jp-Dialog button:has-text('Select')")
    with contextlib.suppress(Exception):  # no dialog: the kernel started by itself
        picker.click(timeout=5_000)
    # The status bar says "Python 3 (ipykernel) | Idle" once the kernel is up and connected.
    page.wait_for_function("() => document.body.innerText.includes('| Idle')", timeout=120_000)


def shown(page, selector: str, timeout: float) -> None:  # type: ignore[no-untyped-def]
    """Wait until the first element ``selector`` matches is visible.

    Not ``page.wait_for_selector``: that one also returns the element, adopting a handle to it into the page's own
    JavaScript world once it is found, and in CI that step hung for its whole minute after the log had said
    "locator resolved to visible" (the page was busy drawing live charts). A locator's wait returns when it sees
    the element, with nothing to adopt."""
    page.locator(selector).first.wait_for(state="visible", timeout=timeout)


def run_all_cells(page, count: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """Run every cell (or the next ``count``) as a user would: the toolbar's "run and select next", once per cell
    (they queue up)."""
    run = page.locator("[data-command='notebook:run-cell-and-select-next']").first
    for _ in range(page.locator(".jp-Notebook .jp-Cell").count() if count is None else count):
        run.click()


def stderr_outputs(page) -> list[str]:  # type: ignore[no-untyped-def]
    """The text of every stderr output in the notebook (log lines that reached a cell)."""
    selector = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
    return [text for text in page.locator(selector).all_inner_texts() if text.strip()]
