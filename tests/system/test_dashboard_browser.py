"""The dashboard seen in a real browser: JupyterLab in headless Chromium, a notebook that starts a server with a
stable version and a canary and shows the dashboard under load. The widgets must say what the server says (the
canary's share on the slider and in the table) and the cells nothing but their results; the screenshot after
the chart has drawn is docs/dashboard.png."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from browser import lab_page, open_notebook, run_all_cells, shown, stderr_outputs

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"

CELLS = [
    "import numpy as np, threading, workbench\n"
    "from workbench.demo import save_half_plus_two\n"
    "save_half_plus_two('models/half_plus_two/1')\n"
    "save_half_plus_two('models/half_plus_two/2', offset=3.0);",
    "server = workbench.serve('models', enable_batching=True)\n"
    "server.wait_for_version('half_plus_two', 2)\n"
    "server.client.promote('half_plus_two', 1)  # v1 is the stable version,\n"
    "server.client.canary('half_plus_two', 2, 0.3)  # and v2 the canary, with 30% of the traffic\n"
    "server",
    "from workbench.notebook.widgets import Dashboard\ndashboard = Dashboard(server, window_seconds=30)\ndashboard",
    "from workbench.client.bench import run_load\n"
    "load = threading.Thread(target=run_load, args=(server.grpc_target, 'grpc', 'half_plus_two',\n"
    "    {'x': np.ones((1, 1), np.float32)}), kwargs={'concurrency': 4, 'duration': 600}, daemon=True)\n"
    "load.start()",
]


def test_dashboard_renders_in_jupyterlab(tmp_path: Path) -> None:
    with lab_page(tmp_path, {"dashboard.ipynb": CELLS}, (1400, 1500), "dashboard") as (page, lab):
        _drive(page, lab, tmp_path)


def _drive(page, lab: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    open_notebook(page, lab, "dashboard.ipynb")
    run_all_cells(page)
    # The versions table (server state through the management API) and the canary in it.
    shown(page, ".jp-OutputArea-output td:has-text('half_plus_two')", timeout=180_000)
    shown(page, ".jp-OutputArea-output td:has-text('canary')", timeout=60_000)
    # The versions panel says what the server says: the canary's share on the slider, the canary selected.
    # (The Versions tab comes first in the page: its slider and version list are the first of their kind.)
    # The tables above are the server's own output; the dashboard is the first widget drawn, which took over a
    # minute on a CI machine busy with other work.
    panel = page.locator(".jp-OutputArea-output .widget-tab")
    panel.locator(".widget-html-content:has-text('stable v1 · canary v2 at 30%')").wait_for(timeout=180_000)
    assert panel.locator(".widget-slider .widget-readout").first.inner_text() == "30%"
    version = panel.locator(".widget-dropdown:has(label:text-is('version')) select").first
    assert version.evaluate("select => select.options[select.selectedIndex].text") == "2"
    # The live chart: plotly drew lines for both versions from the stats stream, under load.
    # (the "v1 vs v2" tab holds a chart too, hidden until its tab is picked: the live chart is the visible one)
    shown(page, ".js-plotly-plot >> visible=true", timeout=120_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot .scatterlayer .trace path.js-line')]"
        ".filter(p => (p.getAttribute('d') || '').length > 40).length >= 4",
        timeout=120_000,
    )
    # The chart is live before the picture: its lines are redrawn from a newer snapshot.
    lines = (
        "() => [...document.querySelectorAll('.js-plotly-plot .scatterlayer .trace path.js-line')]"
        ".map(p => p.getAttribute('d')).join('|')"
    )
    drawn = page.evaluate(lines)
    page.wait_for_function(f"() => ({lines})() !== {json.dumps(drawn)}", timeout=60_000)
    assert stderr_outputs(page) == [], "log lines reached the cells"
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    if os.environ.get("WORKBENCH_UPDATE_SCREENSHOTS"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copy(shot, SCREENSHOT)
