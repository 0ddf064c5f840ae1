"""The JupyterLab extension as installed: JupyterLab finds it enabled, and the wheel carries it prebuilt.

`make install` (behind both `make lab` and `make test`) builds extension/ into workbench/labextension and links it
into the environment's JupyterLab; the wheel installs the same folder as shared data, so `pip install` is all a
user does. The panel's own logic is tested with jest (extension/src/__tests__), its behaviour in a browser by
test_sidebar_browser.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "workbench-serving-jupyterlab"
BUILT = ROOT / "workbench" / "labextension"


def test_jupyterlab_lists_the_extension_enabled() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, timeout=120
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)  # colours off
    version = json.loads((ROOT / "extension" / "package.json").read_text())["version"]
    assert re.search(rf"^\s*{NAME} v{re.escape(version)} enabled OK", text, re.MULTILINE), text


def test_the_build_is_a_federated_extension_whose_entry_exists() -> None:
    built = json.loads((BUILT / "package.json").read_text())
    assert built["name"] == NAME
    entry = built["jupyterlab"]["_build"]["load"]
    assert (BUILT / entry).is_file()
    # JupyterLab's packages and React come from the application (shared singletons), not bundled a second time:
    # the extension's own code is small.
    remote = (BUILT / entry).read_text()
    for package in ("@jupyterlab/application", "@jupyterlab/apputils", "react"):
        # (a development build spells it `singleton: true`, a minified one `singleton:!0`)
        assert re.search(rf'"{re.escape(package)}",\s*import:\s*null,[^}}]*singleton:\s*(true|!0)', remote), package
    # The extension's own chunks: `lib_index_js.*.js` in a development build, numbered ones in a production build
    # (`make wheel`), beside the container's remoteEntry and the style entry.
    chunks = [f for f in (BUILT / "static").glob("*.js") if not f.name.startswith(("remoteEntry.", "style."))]
    code = sum(f.stat().st_size for f in chunks)
    assert chunks and 0 < code < 200_000


def test_the_wheel_ships_the_prebuilt_extension_and_enables_the_server_extension(tmp_path: Path) -> None:
    # hatchling with the project's build hook, as `pip wheel` runs it (the prebuilt folder exists: no npm run).
    built = subprocess.run(
        [sys.executable, "-c", "import sys, hatchling.build as b; print(b.build_wheel(sys.argv[1]))", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = tmp_path / built.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    data = f"workbench_serving-{wheel.name.split('-')[1]}.data/data/"
    labext = f"{data}share/jupyter/labextensions/{NAME}/"
    assert f"{labext}package.json" in names and f"{labext}install.json" in names
    assert any(re.fullmatch(rf"{re.escape(labext)}static/remoteEntry\.[0-9a-f]+\.js", n) for n in names)
    assert f"{data}etc/jupyter/jupyter_server_config.d/workbench.json" in names
    # Only there: the build output is not a second time inside the package.
    assert not [n for n in names if n.startswith("workbench/labextension/")]
