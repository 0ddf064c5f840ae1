"""The README's first install line installs nothing that crashes beside TensorFlow; PyTorch comes on its own terms.

``pip install "workbench-serving[notebook]"`` on Linux would take PyPI's build of PyTorch if anything it installs asked
for torch: the CUDA build (4 GB of ``nvidia-*`` libraries) with OpenAI's ``triton``, which crashed a process that had
loaded TensorFlow (docs/pytorch.md). These checks follow the notebook extra's requirements through pyproject.toml
(the project's own extras, recursively) and then through the installed distributions' metadata (each one's
``Requires-Dist``, markers evaluated for this machine and the extras asked for), without downloading anything; and
check that the places a user reads say how PyTorch's CPU build is installed, and that ``make install`` still installs
that build for the tests.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "workbench-serving"
CPU_INDEX = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def crashes_beside_tensorflow(name: str) -> bool:
    """PyTorch, its triton (PyPI's, or PyTorch's own index's name for it), and the CUDA libraries PyPI's build needs."""
    return name in ("torch", "triton", "pytorch-triton") or name.startswith("nvidia-")


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def _applies(marker: Marker | None, asked: set[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({"extra": extra}) for extra in asked or {""})


def closure(extra: str) -> tuple[dict[str, list[str]], set[str]]:
    """Every distribution ``pip install "workbench-serving[extra]"`` installs, with the chain of requirements that
    brings it (``{name: [requirement, ...]}``), and the names not installed here (whose own requirements cannot be
    read without downloading them)."""
    declared = extras()
    found: dict[str, list[str]] = {}
    missing: set[str] = set()
    done: set[tuple[str, frozenset[str]]] = set()
    queue: list[tuple[Requirement, list[str]]] = [
        (Requirement(line), [f"{PROJECT}[{extra}]"]) for line in declared[""] + declared[extra]
    ]
    while queue:
        requirement, chain = queue.pop()
        name = canonical(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in done:
            continue
        done.add(key)
        path = [*chain, str(requirement)]
        if name == PROJECT:  # the project's own extras: from pyproject.toml, as they are now
            for asked in requirement.extras:
                queue.extend((Requirement(line), path) for line in declared[asked])
            continue
        found.setdefault(name, path)
        try:
            requires = metadata.distribution(requirement.name).requires or []
        except metadata.PackageNotFoundError:
            missing.add(name)
            continue
        for line in requires:
            needed = Requirement(line)
            if _applies(needed.marker, set(requirement.extras)):
                queue.append((needed, path))
    return found, missing


def test_the_notebook_extra_installs_nothing_that_crashes_beside_tensorflow() -> None:
    found, missing = closure("notebook")
    if missing:  # every distribution of the extra is installed by `make install` (the dev extra holds notebook)
        pytest.skip(f"not installed here, so their requirements cannot be read: {sorted(missing)}")
    bad = {name: chain for name, chain in found.items() if crashes_beside_tensorflow(name)}
    assert not bad, "the notebook extra installs " + "; ".join(
        f"{name} (through {' -> '.join(chain)})" for name, chain in sorted(bad.items())
    )
    # It still installs what the tutorials use besides PyTorch: JupyterLab, the frameworks of tutorial 06, SHAP and
    # OpenTelemetry for tutorial 10.
    assert {"jupyterlab", "scikit-learn", "skops", "xgboost-cpu", "onnxruntime", "shap", "opentelemetry-sdk"} <= set(
        found
    )


def test_pytorch_comes_from_the_pytorch_extra_and_the_tests_pin_the_build_make_installs() -> None:
    declared = extras()
    assert any(canonical(Requirement(line).name) == "torch" for line in declared["pytorch"])
    # The tests' torch is pinned, and `make install` installs that release's CPU build before the dev extra (which
    # holds the notebook and test extras): pip then keeps it.
    (pin,) = [Requirement(line) for line in declared["test"] if canonical(Requirement(line).name) == "torch"]
    (version,) = re.findall(r"==([\w.]+)", str(pin.specifier))
    makefile = (ROOT / "Makefile").read_text()
    assert f"TORCH_CPU := {version}+cpu" in makefile
    install = makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert install.index('"torch==$(TORCH_CPU)"') < install.index("-e '.[dev]'")
    assert "--index-url https://download.pytorch.org/whl/cpu" in install


def test_the_readme_the_pytorch_page_and_tutorial_10_say_how_to_install_pytorch() -> None:
    readme = (ROOT / "README.md").read_text()
    install = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    assert CPU_INDEX in install
    assert 'pip install "workbench-serving[notebook,pytorch]"' in install
    assert CPU_INDEX in (ROOT / "docs" / "pytorch.md").read_text()
    notebook = json.loads((ROOT / "notebooks" / "10-production-models.ipynb").read_text())
    first = notebook["cells"][0]
    assert first["cell_type"] == "markdown"
    text = "".join(first["source"])
    assert CPU_INDEX in text
    assert "workbench-serving[notebook,pytorch]" in text
