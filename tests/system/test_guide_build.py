"""The guide (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: every page in the nav, no broken link or
anchor, the API reference generated from the docstrings. A broken link or a page left out of the nav fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build(config_folder: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Into a temporary folder: the checkout stays as it was (site/ is ignored, and not written).
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's notice of its successor, printed at each build
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=config_folder, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.timeout(600)
def test_the_guide_builds_strictly_with_its_api_reference(tmp_path: Path) -> None:
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-5000:]
    assert "WARNING" not in built.stderr, built.stderr[-5000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("workbench.notebook.handle.serve", "workbench.publishing.export", "workbench.client.Client"):
        assert f'id="{name}"' in reference, f"the API reference has no entry for {name}"
    assert not (ROOT / "site").exists()


@pytest.mark.timeout(600)
def test_a_broken_link_an_unknown_anchor_or_a_page_off_the_nav_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "guide"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "docs" / "reference.md").write_text("# API reference\n")  # no package beside this copy to read
    assert build(copy, tmp_path / "site").returncode == 0
    (copy / "docs" / "orphan.md").write_text("# A page nobody put in the nav\n")
    with open(copy / "docs" / "index.md", "a") as index:
        index.write("\n[gone](no-such-page.md) and [no such part](security.md#no-such-part)\n")
    failed = build(copy, tmp_path / "site")
    assert failed.returncode != 0
    assert "orphan.md" in failed.stderr
    assert "no-such-page.md" in failed.stderr
    assert "security.md#no-such-part" in failed.stderr
