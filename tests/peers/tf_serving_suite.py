"""TF Serving's own ``tensorflow_model_server_test.py``, run unchanged against ``workbench serve``.

Run: ``.venv/bin/python tests/peers/tf_serving_suite.py --serving SERVING_CHECKOUT [--out F] [-- TEST_FILTER...]``
with a checkout of github.com/tensorflow/serving. It needs what the test imports beside TensorFlow:
``pip install portpicker six``. Not part of ``make test`` (the suite is TF Serving's code, which this project does
not ship). About three minutes on 2 cores. Prints each test's outcome and a summary; ``--out`` writes them as JSON.

The test starts ``$TEST_SRCDIR/tf_serving/tensorflow_serving/model_servers/tensorflow_model_server`` with TF
Serving's flags and reads its models from ``$TEST_SRCDIR/tf_serving/tensorflow_serving/servables/tensorflow/
testdata``, as Bazel lays them out. This script lays out the same: the server is a two-line shell script that runs
``python -m workbench serve`` with the flags it is given, the test data is the checkout's. The test's own modules
(``tensorflow_serving.model_servers.test_util``) are found in the checkout, beside the installed
``tensorflow_serving.apis``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

TEST = "tensorflow_serving/model_servers/tensorflow_model_server_test.py"
# Runs the test module as __main__ with the checkout's tensorflow_serving packages beside the installed ones.
BOOTSTRAP = """
import runpy, sys
import tensorflow_serving
tensorflow_serving.__path__.append({package!r})
sys.argv = [{test!r}, *sys.argv[1:]]
runpy.run_path({test!r}, run_name="__main__")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serving", type=Path, required=True, help="a checkout of tensorflow/serving")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("filters", nargs="*", help="the tests to run, by name (testPredictOnTfLite); default: all")
    args = parser.parse_args()
    checkout = args.serving.resolve()
    with tempfile.TemporaryDirectory(prefix="tf-serving-suite-") as scratch:
        srcdir = Path(scratch) / "srcdir"
        package = srcdir / "tf_serving" / "tensorflow_serving"
        (package / "model_servers").mkdir(parents=True)
        (package / "servables" / "tensorflow").mkdir(parents=True)
        (package / "servables" / "tensorflow" / "testdata").symlink_to(
            checkout / "tensorflow_serving" / "servables" / "tensorflow" / "testdata"
        )
        server = package / "model_servers" / "tensorflow_model_server"
        server.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m workbench serve "$@"\n')
        server.chmod(server.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        bootstrap = Path(scratch) / "run_suite.py"
        bootstrap.write_text(BOOTSTRAP.format(package=str(checkout / "tensorflow_serving"), test=str(checkout / TEST)))
        command = [sys.executable, str(bootstrap), *(f"TensorflowModelServerTest.{name}" for name in args.filters)]
        environment = {**os.environ, "TEST_SRCDIR": str(srcdir), "TEST_TMPDIR": scratch, "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=scratch, timeout=1800)
    # absltest's lines: "[ RUN      ] Class.test", then "[       OK ] Class.test" or "[  FAILED  ] ..." (an error
    # too) or "[  SKIPPED ] ...".
    outcomes = {
        name: {"OK": "ok", "FAILED": "FAIL", "SKIPPED": "skipped"}[word]
        for word, name in re.findall(r"^\[ +(OK|FAILED|SKIPPED) +\] \w+\.(\w+)", done.stderr, re.M)
    }
    if not outcomes:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
    for name, outcome in sorted(outcomes.items()):
        print(f"{outcome:8} {name}")
    passed = sum(1 for outcome in outcomes.values() if outcome == "ok")
    print(f"{passed} of {len(outcomes)} tests passed")
    if args.out:
        failures = re.split(r"^={70}$", done.stderr, flags=re.M)[1:]
        args.out.write_text(
            json.dumps({"passed": passed, "ran": len(outcomes), "tests": outcomes, "failures": failures}, indent=2)
        )
    return 0 if outcomes and passed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
