#!/usr/bin/env bash
# Run ON the lent GPU machine, from the repository's root, with .whl/ carried (benchmarks/gpu_device_prepare.sh
# fills it here first): installs what `workbench serve` and the load generator need beside the image's PyTorch
# (no TensorFlow), checks that everything imports and the GPU is seen, then runs benchmarks/gpu.py (or $BENCH, e.g.
# benchmarks/batch_gpu.py) with its results and full log under $OUT (gpu.json, gpu.log). Arguments go to it.
#
#   run(command="bash benchmarks/gpu_device.sh", carry=[".whl"], timeout_s=570)
#
# gpu.py starts no server past 480 s (--deadline), and a full run takes about 3-4 minutes on 16 cores.
#
# Exit status: gpu.py's (else the tests' where PYTEST names some); 2 .whl/ missing, 3 the install failed, 4 an import or the GPU check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=/tmp/workbench-site

if ! ls .whl/*.whl >/dev/null 2>&1 || [ ! -f .whl/tensorflow-protos.zip ]; then
  echo "no .whl/ here: run benchmarks/gpu_device_prepare.sh where pip reaches PyPI, and carry .whl" >&2
  exit 2
fi
started=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  || exit 3
"$PY" -m zipfile -e .whl/tensorflow-protos.zip "$SITE" || exit 3
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"  # inherited by every server the benchmark starts
export PATH="$SITE/bin:$PATH"  # py-spy (--profile)
export PYTHONUNBUFFERED=1
echo "installed in $(( $(date +%s) - started )) s"

# --cpu-only / --numpy-stand-in (checking this script where there is no GPU, or no PyTorch): no GPU check.
gpu=1
for arg in "$@"; do case $arg in --cpu-only | --numpy-stand-in) gpu=0 ;; esac; done
GPU=$gpu "$PY" - <<'EOF' || exit 4
import os, sys
import numpy
import workbench.server, workbench.runners.runner, workbench.client.bench, workbench.deploy.workers  # noqa: F401
from tensorflow_serving.apis import predict_pb2  # noqa: F401
assert "tensorflow" not in sys.modules  # TF Serving's protos came without TensorFlow
print(f"python {sys.version.split()[0]} ({sys.executable}), numpy {numpy.__version__}, cores {os.cpu_count()}")
if os.environ["GPU"] == "1":
    import torch
    print(f"torch {torch.__version__}, cuda {torch.cuda.is_available()}")
    sys.exit(0 if torch.cuda.is_available() else 1)
EOF
if [ "$gpu" = 1 ]; then nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv || exit 4; fi

# PYTEST=tests/wire/test_pytorch_cuda.py: first the tests that need a GPU and no TensorFlow (the project's addopts
# name nbval, which is not installed there); their log is $OUT/pytest.log.
tests=0
if [ -n "${PYTEST:-}" ]; then
  # shellcheck disable=SC2086 # PYTEST may name several test files
  "$PY" -m pytest -o addopts="" -p no:cacheprovider -q -rs $PYTEST 2>&1 | tee "$OUT/pytest.log"
  tests=${PIPESTATUS[0]}
  echo "gpu_device.sh: pytest exited $tests after $(( $(date +%s) - started )) s"
fi

BENCH=${BENCH:-benchmarks/gpu.py}  # or benchmarks/batch_gpu.py: the same set-up, another benchmark; none: tests only
[ "$BENCH" = none ] && exit "$tests"
name=$(basename "$BENCH" .py)
"$PY" "$BENCH" --out "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log"
status=${PIPESTATUS[0]}
echo "gpu_device.sh: $name.py exited $status after $(( $(date +%s) - started )) s; results in $OUT/$name.json"
[ "$status" = 0 ] && exit "$tests"
exit "$status"
