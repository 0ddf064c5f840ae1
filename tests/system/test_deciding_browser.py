"""Deciding in the notebook, seen in a real browser (JupyterLab in headless Chromium): the "v1 vs v2" panel of a
shadowed model under traffic, the analyzer's answer in a cell, and the analyzer's HTML report opened on its own.
The panel must show the agreement the server computes; the report must draw its frontier without a network.
Screenshots: docs/shadow-panel.png and docs/analyzer-report.png (kept with WORKBENCH_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from browser import lab_page, open_notebook, run_all_cells, shown

DOCS = Path(__file__).resolve().parents[2] / "docs"

CELLS = [
    "import threading, numpy as np, workbench\n"
    "from sklearn.datasets import load_digits\n"
    "from sklearn.linear_model import LogisticRegression\n"
    "from sklearn.tree import DecisionTreeClassifier\n"
    "x, y = load_digits(return_X_y=True)\n"
    "workbench.export(LogisticRegression(max_iter=2000).fit(x, y), 'digits', 'models')\n"
    "workbench.export(DecisionTreeClassifier(max_depth=5, random_state=0).fit(x, y), 'digits', 'models');",
    "server = workbench.serve('models')\n"
    "server.wait_for_version('digits', 2)\n"
    "server.client.promote('digits', 1)\n"
    "server.client.shadow('digits', 2, 1.0)  # every default request copied to v2, compared\n"
    "def traffic():\n"
    "    for i in range(3000):\n"
    "        server.client.predict('digits', x[i % len(x)][None])\n"
    "threading.Thread(target=traffic, daemon=True).start()",
    "from workbench.notebook.shadow_panel import ShadowPanel\npanel = ShadowPanel(server)\npanel",
    "analysis = workbench.analyze('digits', 'models/digits', inputs={'x': x[:1]}, max_batch_size=[1, 16],\n"
    "    batch_timeout_micros=[1000], concurrency=[1, 8], measurement_interval_ms=500, output='analysis')\n"
    "analysis",
]


def test_the_shadow_panel_and_the_analyzers_answer_render(tmp_path: Path) -> None:
    with lab_page(tmp_path, {"deciding.ipynb": CELLS}, (1400, 1600), "deciding") as (page, lab):
        _drive(page, lab, tmp_path)


def _drive(page, lab: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    open_notebook(page, lab, "deciding.ipynb")
    run_all_cells(page)
    # The panel: the server's agreement, in words and drawn.
    shown(page, ".jp-OutputArea-output h4:has-text('digits: v2 (shadow) vs v1')", timeout=180_000)
    shown(page, ".jp-OutputArea-output b:has-text('%')", timeout=60_000)
    # The analyzer's answer in its cell: why, the frontier, the table. Its cell holds the kernel, so the panel's
    # draws wait for it (its readings do not: the agreement's line is drawn whole once the kernel is free).
    shown(page, ".jp-OutputArea-output p:has-text('wins for digits')", timeout=300_000)
    shown(page, ".jp-OutputArea-output table.workbench-analysis", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace path.js-line').length >= 1",
        timeout=60_000,
    )
    shot = tmp_path / "shadow-panel.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    # The report file, opened on its own: plotly is inlined, so the chart draws with no network.
    report = tmp_path / "analysis" / "report.html"
    page.goto(report.as_uri())
    shown(page, ".js-plotly-plot .scatterlayer .trace", timeout=60_000)
    assert page.locator("table.workbench-analysis tr.winner").count() == 1
    report_shot = tmp_path / "analyzer-report.png"
    page.screenshot(path=str(report_shot), full_page=True)
    if os.environ.get("WORKBENCH_UPDATE_SCREENSHOTS"):
        shutil.copy(shot, DOCS / "shadow-panel.png")
        shutil.copy(report_shot, DOCS / "analyzer-report.png")
