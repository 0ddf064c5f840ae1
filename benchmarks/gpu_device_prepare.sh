#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI, with workbench's development venv), not on the device machine: fills .whl/
# (git-ignored) with what benchmarks/gpu_device.sh installs there, where nothing can be fetched.
#
# The device machine's image has Python 3.12 with PyTorch, numpy, prometheus-client, PyYAML, requests, uvloop,
# anyio, h11, click, fsspec and psutil, and no TensorFlow. `workbench serve` with a Python model, and the gRPC load
# generator, also need what is downloaded below (wheels for CPython 3.12 on x86-64 Linux, at the versions of this
# venv), none of them TensorFlow: tensorflow-serving-api goes without its dependencies, and TF Serving's protos
# import only TensorFlow's generated *_pb2 modules, which tensorflow-protos.zip holds (taken from this venv's
# TensorFlow; its tensorflow/__init__.py raises ImportError, so that `import tensorflow` there fails as where
# TensorFlow is not installed, and workbench/runtime/tensorflow_protos.py imports the protos past it). grpcio and
# protobuf are carried too: the generated modules check the runtime's version against their own.
#
# Usage: benchmarks/gpu_device_prepare.sh [VENV_PYTHON]   (default: /work/main/.venv/bin/python, else .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-/work/main/.venv/bin/python}
[ -x "$PY" ] || PY=.venv/bin/python
git check-ignore -q .whl/ || { echo ".whl/ is not ignored by git: add /.whl/ to .gitignore" >&2; exit 1; }
rm -rf .whl && mkdir -p .whl

# Installed by the device's `pip install --no-deps`: everything workbench serve and the client import, beyond the
# image's own packages. Versions: those of this venv.
PACKAGES="grpcio protobuf grpcio-health-checking starlette anyio uvicorn h11 httptools orjson google-crc32c
  tensorflow-serving-api tritonclient python-rapidjson googleapis-common-protos"
pins=$("$PY" - $PACKAGES <<'EOF'
import importlib.metadata as md, sys
print(" ".join(f"{name}=={md.version(name)}" for name in sys.argv[1:]))
EOF
)
echo "downloading: $pins"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl $pins

# TensorFlow's generated protos that TF Serving's import (and workbench reads), without TensorFlow.
"$PY" - <<'EOF'
import os, sys, zipfile
import workbench.runtime.tensorflow_protos  # noqa: F401  imports them, past tensorflow/__init__
assert "tensorflow" not in sys.modules, "TensorFlow itself was imported"
names = sorted(m for m in sys.modules if m.startswith("tensorflow."))
with zipfile.ZipFile(".whl/tensorflow-protos.zip", "w", zipfile.ZIP_DEFLATED) as out:
    out.writestr(
        "tensorflow/__init__.py",
        'raise ImportError("TensorFlow is not installed here: only its generated protos (benchmarks/gpu_device.sh)")\n',
    )
    for name in names:
        module = sys.modules[name]
        path = name.replace(".", "/")
        if hasattr(module, "__path__"):
            out.writestr(f"{path}/__init__.py", "")
        else:
            out.write(module.__file__, f"{path}.py")
print(f"tensorflow-protos.zip: {len(names)} modules")
EOF
ls -la .whl
du -sh .whl
