"""A scikit-learn model's first load imports what it needs, not PyTorch: the notebook's first answer stays quick.

Importing ``skops.io`` builds skops's table of trusted types from every scikit-learn estimator, which walks all of
scikit-learn's packages, ``sklearn.externals.array_api_compat.torch`` among them; that one imports PyTorch wherever it
is installed (seconds, and most of a first load). workbench imports skops without going through it
(:func:`workbench.platforms.sklearn.import_skops`). These tests check what a fresh process imported after loading a
``model.skops``, and after a whole ``workbench serve`` answered one; that skops's table of trusted types is the one
it builds when imported plainly (the trust checks are the same; tests/wire/test_platform_sklearn.py and
tests/unit/test_sklearn_trust.py hold what is refused); and that nothing stays blocked. A process that only serves
builds no table at all (no load there consults it: tests/unit/test_sklearn_trust.py checks that workbench trusts
every type in it), so it imports none of scikit-learn's modules that its models do not need. How long it takes is
benchmarks/first_answer.py's business.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests
import tabular_models as tm
from replica import REPO_ROOT, START_TIMEOUT_S, stop_process
from sklearn.linear_model import LogisticRegression
from waiting import wait_until

from workbench.platforms import sklearn as sklearn_platform

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="PyTorch is not installed: nothing could import it"
)

# Loads argv[1] (a version folder) as the server does, runs it, and reports what was imported, in a fresh process.
LOAD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from workbench.platforms import sklearn
    from workbench.platforms.base import LoadPolicy

    if sys.argv[2:] == ["serving"]:  # as `workbench serve`, its workers and runners say
        sklearn.serving_process()
    servable = sklearn.load("digits", 1, sys.argv[1], LoadPolicy())
    after_load = sorted(sys.modules)
    from skops.io._trusted_types import SKLEARN_ESTIMATOR_TYPE_NAMES, SKLEARN_INTERNAL_TYPE_NAMES
    import sklearn.utils, sklearn.utils.discovery
    blocked = [name for name, module in sys.modules.items() if module is None and "array_api_compat" in name]
    # Nothing stays blocked: scikit-learn's PyTorch namespace imports as it would have (and PyTorch with it).
    from sklearn.externals.array_api_compat import torch as torch_namespace
    print(json.dumps({
        "modules": after_load,
        "trusted": sorted(SKLEARN_ESTIMATOR_TYPE_NAMES + SKLEARN_INTERNAL_TYPE_NAMES),
        "estimators_trusted": len(SKLEARN_ESTIMATOR_TYPE_NAMES),
        # scikit-learn's own function again, once skops is imported
        "walk_restored": sklearn.utils.all_estimators is sklearn.utils.discovery.all_estimators,
        "blocked": blocked,
        "torch_after": "torch" in sys.modules and torch_namespace.__name__,
        "signatures": sorted(servable.signatures),
    }))
    """
)
# skops imported plainly: its table of trusted types as skops builds it.
PLAIN = (
    "import json, skops.io\n"
    "from skops.io._trusted_types import SKLEARN_ESTIMATOR_TYPE_NAMES, SKLEARN_INTERNAL_TYPE_NAMES\n"
    "print(json.dumps(sorted(SKLEARN_ESTIMATOR_TYPE_NAMES + SKLEARN_INTERNAL_TYPE_NAMES)))\n"
)
# `workbench serve` that writes the names of its imported modules (JSON) to argv[1] whenever stdin gets a line.
SERVE = textwrap.dedent(
    """
    import json, os, sys, threading
    from workbench.cli import main

    def report() -> None:
        for _ in sys.stdin:
            names = sorted(list(sys.modules))
            with open(sys.argv[1] + ".tmp", "w") as f:
                json.dump(names, f)
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])

    threading.Thread(target=report, daemon=True).start()
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.fixture(scope="module")
def digits_version(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LogisticRegression]:
    x, y = tm.digits()
    classifier = LogisticRegression(max_iter=300).fit(x, y)
    version = tmp_path_factory.mktemp("sklearn-imports") / "models" / "digits" / "1"
    version.mkdir(parents=True)
    sklearn_platform.write(classifier, version)
    return version, classifier


def _run(code: str, *args: str) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_loading_a_skops_model_imports_no_pytorch_and_skops_trusts_what_it_always_trusts(digits_version):
    version, _ = digits_version
    loaded = json.loads(_run(LOAD, str(version)))
    imported = set(loaded["modules"])
    assert "torch" not in imported, "loading a scikit-learn model imported PyTorch"
    assert "tensorflow" not in imported
    assert {"sklearn", "skops.io"} <= imported
    assert {"serving_default", "predict_proba"} <= set(loaded["signatures"])
    # skops's own trusted types, as a plain `import skops.io` builds them: nothing more, nothing less.
    assert loaded["trusted"] == json.loads(_run(PLAIN))
    assert loaded["blocked"] == []
    assert loaded["torch_after"] == "sklearn.externals.array_api_compat.torch"


# Packages of scikit-learn that only the walk for skops's table imports, for a LogisticRegression's load.
ONLY_THE_TABLE_IMPORTS = ("sklearn.semi_supervised", "sklearn.cross_decomposition", "sklearn.gaussian_process")


def test_a_serving_process_builds_no_table_of_estimators_and_loads_the_same(digits_version):
    version, _ = digits_version
    plain = json.loads(_run(LOAD, str(version)))
    serving = json.loads(_run(LOAD, str(version), "serving"))
    assert plain["estimators_trusted"] > 100 and set(ONLY_THE_TABLE_IMPORTS) <= set(plain["modules"])
    assert serving["estimators_trusted"] == 0
    assert not set(ONLY_THE_TABLE_IMPORTS) & set(serving["modules"]), "the serving process walked scikit-learn"
    assert serving["walk_restored"] and plain["walk_restored"]
    assert serving["signatures"] == plain["signatures"]
    assert "torch" not in serving["modules"] and serving["blocked"] == []


def test_a_server_of_one_scikit_learn_model_answers_without_importing_pytorch(tmp_path, digits_version):
    version, classifier = digits_version
    ready, report, log_path = tmp_path / "ready.json", tmp_path / "modules.json", tmp_path / "server.log"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(report), "serve", "--port=0", "--rest_api_port=-1",
             f"--ready_file={ready}", f"--model_repository={version.parent.parent}"],
            cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def answering() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"workbench serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            return ready.exists()

        wait_until(answering, timeout=START_TIMEOUT_S, interval=0.05, what="workbench serve to answer")
        rest_url = f"http://127.0.0.1:{json.loads(ready.read_text())['rest_port']}"
        x, _ = tm.digits()
        answer = requests.post(f"{rest_url}/v1/models/digits:predict", json={"instances": x[:5].tolist()}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": classifier.predict(x[:5]).tolist()}

        assert proc.stdin is not None
        proc.stdin.write(b"report\n")
        proc.stdin.flush()
        wait_until(report.exists, timeout=30, what="the server's module report")
        imported = set(json.loads(report.read_text()))
        assert "torch" not in imported, "a server of one scikit-learn model imported PyTorch"
        # (TF Serving's protos come in without tensorflow/__init__: tests/wire/test_startup.py)
        assert "tensorflow" not in imported, "a server of one scikit-learn model imported TensorFlow"
        assert {"sklearn", "skops.io"} <= imported
        assert not set(ONLY_THE_TABLE_IMPORTS) & imported, "workbench serve built skops's table of estimators"
    finally:
        stop_process(proc)
