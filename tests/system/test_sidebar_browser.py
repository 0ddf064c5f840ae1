"""The "Model serving" sidebar in a real browser: JupyterLab in headless Chromium, a server started from a notebook
shows up in the sidebar, and Promote there changes the `stable` label on the server; a cell run afterwards shows
the notebook agreeing with the sidebar. The screenshot then is docs/sidebar.png. The launcher item and the palette
entry open a notebook ready to serve."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import requests
from browser import lab_page, open_notebook, run_all_cells, stderr_outputs
from waiting import wait_until

from workbench.jupyter.server_records import list_servers

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "sidebar.png"

CELLS = [
    "from workbench.demo import save_half_plus_two\n"
    "save_half_plus_two('models/half_plus_two/1')\n"
    "save_half_plus_two('models/half_plus_two/2', offset=3.0);",
    # The response cache on for the model: the load below repeats one request, so the card shows its hits.
    "%load_ext workbench\nserver = %serve start --model_repository models --server_name sidebar-demo "
    "--response_cache_bytes 1048576 --response_cache_models half_plus_two\nserver",
    # Version 1 is the stable one to begin with (loaded for it: the repository's policy serves the newest only).
    "%serve promote half_plus_two 1",
    # A little traffic, so that the sparklines have something to draw.
    "import threading, numpy as np\n"
    "from workbench.client.bench import run_load\n"
    "threading.Thread(target=run_load, args=(server.grpc_target, 'grpc', 'half_plus_two',\n"
    "    {'x': np.ones((1, 1), np.float32)}), kwargs={'concurrency': 1, 'duration': 90}, daemon=True).start()",
    # Run only after Promote in the sidebar: the notebook sees the version the sidebar made stable.
    "# promoted in the sidebar\n%serve status half_plus_two",
]


def test_sidebar_lists_a_notebook_server_and_promotes(tmp_path: Path) -> None:
    with lab_page(tmp_path, {"serving.ipynb": CELLS}, (1400, 1000), "sidebar") as (page, lab):
        _promote_from_the_sidebar(page, lab, tmp_path)
        _open_a_serving_notebook(page)


def _promote_from_the_sidebar(page, lab: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    open_notebook(page, lab, "serving.ipynb")
    run_all_cells(page, count=len(CELLS) - 1)
    page.locator(".jp-SideBar [data-id='workbench-serving']").click()  # the tab opens the sidebar
    page.locator(".jp-WorkbenchPanel").wait_for(timeout=10_000)
    server = page.locator(".jp-WorkbenchServer[data-server-name='sidebar-demo']")
    model = server.locator(".jp-WorkbenchModel[data-model='half_plus_two']")
    # The server the notebook started is listed with both versions, version 1 stable.
    v1 = model.locator(".jp-WorkbenchVersion[data-version='1']")
    v2 = model.locator(".jp-WorkbenchVersion[data-version='2']")
    v1.locator(".jp-WorkbenchLabel.jp-mod-stable").wait_for(timeout=180_000)
    model.locator(".jp-WorkbenchVersion.jp-mod-serving[data-version='2']").wait_for(timeout=60_000)
    # Traffic reaches the figures beside the sparklines (the load cell runs after the promotion).
    rate = model.locator("[data-figure='rps']")
    wait_until(lambda: rate.inner_text() not in ("", "no requests yet", "0 req/s"), timeout=60, what="traffic")
    # The same request again and again: the response cache answers it, and the card says how often.
    cache = model.locator("[data-figure='cache']")
    wait_until(lambda: re.fullmatch(r"cache (9\d|100)% hits", cache.inner_text().strip()), timeout=60, what="hits")

    v2.locator("button[data-action='promote']").click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator(".jp-Dialog-header:has-text('Promote half_plus_two v2?')").wait_for(timeout=10_000)
    dialog.locator("button.jp-mod-accept:has-text('Promote')").click()
    v2.locator(".jp-WorkbenchLabel.jp-mod-stable").wait_for(timeout=60_000)
    model.locator("button[data-action='rollback']:has-text('Roll back to v1')").wait_for(timeout=10_000)

    # The promotion happened on the server itself, not only on the page.
    (record,) = [r for r in list_servers() if r.name == "sidebar-demo"]
    described = requests.get(f"http://127.0.0.1:{record.rest_port}/workbench/v1/models/half_plus_two", timeout=10)
    assert described.json()["stable"] == 2
    assert described.json()["labels"]["stable"] == 2
    # And the notebook, asked again, says so too: v2 stable with all the traffic, as the sidebar shows.
    run_all_cells(page, count=1)
    last = page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
    rows = last.locator(".jp-OutputArea-output tr")
    v2_row = rows.filter(has=page.locator("td:nth-child(2)", has_text=re.compile(r"^\s*2\s*$")))
    v2_row.locator("td:nth-child(4)", has_text="stable").wait_for(timeout=60_000)
    assert v2_row.locator("td:nth-child(5)").inner_text().strip() == "100%"
    assert stderr_outputs(page) == [], "log lines reached the cells"

    update_docs = bool(os.environ.get("WORKBENCH_UPDATE_SCREENSHOTS"))
    # The rate sparkline has drawn several points (the docs' picture: its full half minute).
    points = 30 if update_docs else 3
    model.locator(".jp-mod-rate path").wait_for(timeout=10_000)
    wait_until(
        lambda: (model.locator(".jp-mod-rate path").get_attribute("d") or "").count("L") >= points - 1,
        timeout=points + 30,
        interval=0.5,
        what=f"{points} points on the rate sparkline",
    )
    shot = tmp_path / "sidebar.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 20_000
    if update_docs:
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copy(shot, SCREENSHOT)


def _open_a_serving_notebook(page) -> None:  # type: ignore[no-untyped-def]
    # The palette lists the command...
    page.keyboard.press("Control+Shift+C")
    page.keyboard.type("serving notebook")
    page.locator(".lm-CommandPalette-item:has-text('New Serving Notebook')").wait_for(timeout=10_000)
    page.keyboard.press("Escape")
    # ...and the launcher's item opens a notebook with the serving cell ready (not run).
    page.keyboard.press("Control+Shift+L")  # a new launcher
    page.locator(".jp-LauncherCard:has-text('New Serving Notebook')").click()
    cell = page.locator(".jp-NotebookPanel:visible .jp-CodeCell .jp-InputArea-editor").first
    cell.wait_for(timeout=60_000)
    wait_until(lambda: "%serve start" in cell.inner_text(), timeout=30)
    assert "%load_ext workbench" in cell.inner_text()
