"""A notebook cell that calls workbench shows what workbench says and nothing else: no TensorFlow INFO lines, no
deprecation warnings, no C++ log lines on stderr — with no log level set by the user.

The end-to-end test runs a real Jupyter kernel (nbclient), started without ``TF_CPP_MIN_LOG_LEVEL``, exactly as a
user's notebook runs, and reads back every output of every cell.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from workbench.runtime.tensorflow_runtime import quiet_tensorflow, without_tensorflow_notices

# What TensorFlow wrote into cells before workbench kept it out (seen in a real kernel).
IMPORT_NOTICES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795378129.847031    5164 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.\n"
    "I0000 00:00:1795378129.976068    5164 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.\n"
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate "
    "compiler flags.\n"
)
MLIR_NOTICE = "I0000 00:00:1795378135.157980    5164 mlir_graph_optimization_pass.cc:437] MLIR V1 optimization pass\n"
CUDA_ERROR = "E0000 00:00:1795378132.507542    5164 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n"
# Anything of TensorFlow's own voice in a cell's output.
NOISE = re.compile(r"INFO|WARNING:tensorflow|DeprecationWarning|deprecated|^[IW]\d{4} ", re.MULTILINE)


# ---------------------------------------------------------------------------------------- the filter and scope
def test_tensorflow_notices_are_dropped_and_errors_and_other_text_kept() -> None:
    text = "a line of the user's\n" + IMPORT_NOTICES + CUDA_ERROR + "after the error\n" + MLIR_NOTICE
    assert without_tensorflow_notices(text) == "a line of the user's\n" + CUDA_ERROR + "after the error\n"
    assert without_tensorflow_notices(IMPORT_NOTICES + MLIR_NOTICE) == ""
    assert without_tensorflow_notices("no log lines at all\n") == "no log lines at all\n"


def test_quiet_scope_filters_file_descriptor_2_and_restores_it(capfd: pytest.CaptureFixture[str]) -> None:
    with quiet_tensorflow():
        os.write(2, (MLIR_NOTICE + CUDA_ERROR).encode())
        assert capfd.readouterr().err == ""  # held back while the scope lasts
    assert capfd.readouterr().err == CUDA_ERROR
    os.write(2, MLIR_NOTICE.encode())  # after the scope, fd 2 is the user's again, untouched
    assert capfd.readouterr().err == MLIR_NOTICE


def test_quiet_scope_raises_tensorflows_loggers_only_while_it_lasts() -> None:
    tf_logger, absl_logger = logging.getLogger("tensorflow"), logging.getLogger("absl")
    before = tf_logger.level, absl_logger.level
    tf_logger.setLevel(logging.INFO)  # the user's choices
    absl_logger.setLevel(logging.NOTSET)
    try:
        with quiet_tensorflow():
            assert not tf_logger.isEnabledFor(logging.WARNING)
            assert not absl_logger.isEnabledFor(logging.WARNING)
            assert tf_logger.isEnabledFor(logging.ERROR)
        assert (tf_logger.level, absl_logger.level) == (logging.INFO, logging.NOTSET)
    finally:
        tf_logger.setLevel(before[0])
        absl_logger.setLevel(before[1])


def test_overlapping_scopes_from_two_threads_restore_once_at_the_end(capfd: pytest.CaptureFixture[str]) -> None:
    inner_entered, outer_may_leave = threading.Event(), threading.Event()
    users_level = logging.getLogger("tensorflow").level

    def other_call() -> None:
        with quiet_tensorflow():
            os.write(2, MLIR_NOTICE.encode())
            inner_entered.set()
            outer_may_leave.wait(30)

    with quiet_tensorflow():
        thread = threading.Thread(target=other_call)
        thread.start()
        assert inner_entered.wait(30)
    # The first scope ended while the other thread's still runs: fd 2 stays redirected until that one ends too.
    os.write(2, CUDA_ERROR.encode())
    assert logging.getLogger("tensorflow").level == logging.ERROR
    outer_may_leave.set()
    thread.join(30)
    assert capfd.readouterr().err == CUDA_ERROR
    assert logging.getLogger("tensorflow").level == users_level


# ------------------------------------------------------------------------------------------- in a real kernel
def run_notebook(cells: list[str], cwd: Path) -> list[list[dict]]:
    """Run ``cells`` in a fresh kernel of this environment, as a user's notebook runs; each cell's outputs."""
    spec_dir = cwd / "kernels" / "workbench-test"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "test", "language": "python"}))
    manager = KernelManager(
        kernel_name="workbench-test", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(cwd / "kernels")])
    )
    # The test session quiets TensorFlow's C++ logs through the environment; a user's kernel does not.
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    NotebookClient(notebook, km=manager, timeout=240, resources={"metadata": {"path": str(cwd)}}).execute(env=env)
    return [cell.outputs for cell in notebook.cells]


def output_text(output: dict) -> str:
    return output.get("text") or output.get("data", {}).get("text/plain", "")


def test_export_cells_show_only_what_workbench_says(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    cells = [
        # The user's own cell: importing Keras imports TensorFlow, whose start-up notices are the user's to see.
        "import logging, keras, numpy as np\n"
        "model = keras.Sequential([keras.Input((4,), name='pixels'), keras.layers.Dense(2, name='scores')])\n"
        "levels = lambda: [logging.getLogger(name).level for name in ('tensorflow', 'absl')]\n"
        "before = levels()  # TensorFlow's logger is at INFO in a kernel: INFO lines would show",
        "%load_ext workbench",
        f"server = %serve start --repo {repo}",
        "%serve export model tiny",
        # The Python API with warmup examples: writes, reads and replays a warmup file in the kernel.
        "import workbench\n"
        f"result = workbench.export(model, 'tiny', repo={str(repo)!r}, examples=np.ones((2, 4), np.float32))\n"
        "print('exported version', result.version, 'with', result.warmup_records, 'warmup request')",
        "print('logger levels unchanged:', levels() == before)",
        "%serve stop --all",
    ]
    outputs = run_notebook(cells, tmp_path)

    # Without workbench's care these cells carried "MLIR V1 optimization pass is not enabled" (stderr), and the
    # deprecation of tf_record_iterator (stdout and stderr), and "INFO:tensorflow:Assets written to: ...".
    workbench_cells = outputs[1:]
    for source, cell_outputs in zip(cells[1:], workbench_cells, strict=True):
        streams = [o.get("name") for o in cell_outputs if o["output_type"] == "stream"]
        assert "stderr" not in streams, (source, cell_outputs)
        for output in cell_outputs:
            assert output["output_type"] != "error", (source, output)
            assert not NOISE.search(output_text(output)), (source, output_text(output))

    assert outputs[1] == []  # %load_ext
    assert outputs[2] == []  # assigned, so nothing is displayed
    [export_result] = outputs[3]
    assert output_text(export_result).splitlines() == [
        "exported tiny v1 (pixels: float32[?, 4]) -> (scores: float32[?, 2])",
        "tiny             v1    AVAILABLE  labels=-              traffic=100%",
    ]
    assert [output_text(o) for o in outputs[4]] == ["exported version 2 with 1 warmup request\n"]
    assert [output_text(o) for o in outputs[5]] == ["logger levels unchanged: True\n"]
    assert [output_text(o) for o in outputs[6]] == ["stopped workbench server 'default'\n"]
