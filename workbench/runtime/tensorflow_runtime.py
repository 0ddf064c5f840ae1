"""TensorFlow, quietly, while workbench itself calls it in the user's notebook kernel.

A cell shows what workbench says and nothing else. TensorFlow talks on two channels, and both reach the cell:

- its Python loggers (``tensorflow``, and ``absl`` that Keras uses): ``INFO:tensorflow:Assets written to ...`` for
  every SavedModel written, ``WARNING:tensorflow:...`` for deprecations and untraced functions;
- its C++ log lines (``I0000 00:00:1712345678.123456 5164 file.cc:45] MLIR V1 optimization pass is not
  enabled``, the oneDNN and CPU-feature notices when TensorFlow is first imported), written straight to file
  descriptor 2, which ipykernel forwards into the running cell as stderr. ``TF_CPP_MIN_LOG_LEVEL`` cannot help once
  TensorFlow is imported (it is read once), and setting it would change the user's process for good.

:func:`quiet_tensorflow` covers both only for the duration of workbench's own call: the loggers are raised to
ERROR and restored afterwards, and file descriptor 2 goes to a temporary file whose content is written back when
the call ends, less TensorFlow's INFO and WARNING lines. Errors, and anything else written there, still show.

:func:`saved_model_runtime` gives the platform what running a SavedModel in a session takes (graphs, sessions, the
TF1 loader, dtypes) without ``tensorflow/__init__`` where TensorFlow is not imported yet: that imports all of
TensorFlow's Python API and Keras, about three quarters of the seconds ``import tensorflow`` takes, which a server
of SavedModels never calls. Only in workbench's own server processes (:func:`mark_server_process`): there
workbench decides what runs, and completes the import (:func:`import_all_of_tensorflow`) before user code that may
import Keras. In anyone else's process (a notebook kernel running a batch job in-process, a script) all of
TensorFlow is imported: ``import keras`` after the light import would find TensorFlow's modules half set up (Keras
imports ``tensorflow.python...`` modules directly, and those do not run ``tensorflow/__init__`` first).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["SavedModelRuntime", "quiet_tensorflow", "saved_model_runtime", "without_tensorflow_notices"]

log = logging.getLogger(__name__)

_LOGGERS = ("tensorflow", "absl")
# TensorFlow's C++ log line (absl's format): severity letter, MMDD, time, thread id, file:line] message.
_CPP_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ [^\s\]]+:\d+\] ")
# Printed once, before absl's logging is set up; says nothing to a notebook user.
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"

_lock = threading.Lock()
_depth = 0  # nested and concurrent workbench calls share one redirection: the outermost sets it up and ends it
_saved_levels: dict[str, int] = {}
_saved_stderr_fd: int | None = None
_capture: IO[bytes] | None = None


def without_tensorflow_notices(text: str) -> str:
    """``text`` less TensorFlow's C++ INFO and WARNING lines (with their continuation lines) and absl's preamble."""
    kept: list[str] = []
    dropping = False
    for line in text.splitlines(keepends=True):
        match = _CPP_LOG_LINE.match(line)
        if match:
            dropping = match.group(1) in "IW"  # errors and fatals stay
        elif line.rstrip("\r\n") == _ABSL_PREAMBLE:
            dropping = True
        # Any other line continues the log message before it ("To enable the following instructions: AVX2 ..."),
        # and shares its fate; before the first log line, it is kept.
        if not dropping:
            kept.append(line)
    return "".join(kept)


def _enter() -> None:
    global _depth, _saved_stderr_fd, _capture
    with _lock:
        _depth += 1
        if _depth > 1:
            return
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            _saved_levels[name] = logger.level
            logger.setLevel(logging.ERROR)
        try:
            saved = os.dup(2)
        except OSError:  # no file descriptor 2 (a windowed app): nothing reaches a cell through it anyway
            return
        try:
            capture = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _exit
        except OSError:  # nowhere to hold the lines back: let them through rather than fail workbench's call
            os.close(saved)
            return
        os.dup2(capture.fileno(), 2)
        _saved_stderr_fd, _capture = saved, capture


def _exit() -> None:
    global _depth, _saved_stderr_fd, _capture
    with _lock:
        _depth -= 1
        if _depth > 0:
            return
        for name, level in _saved_levels.items():
            logging.getLogger(name).setLevel(level)
        _saved_levels.clear()
        saved, capture = _saved_stderr_fd, _capture
        _saved_stderr_fd = _capture = None
        if saved is None or capture is None:
            return
        os.dup2(saved, 2)
        os.close(saved)
        with capture:
            capture.seek(0)
            written = capture.read().decode("utf-8", errors="replace")
        kept = without_tensorflow_notices(written).encode("utf-8")
        while kept:  # os.write may write less than asked
            kept = kept[os.write(2, kept) :]


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Keep TensorFlow's INFO and WARNING output (Python and C++) out of the cell while the block runs."""
    _enter()
    try:
        yield
    finally:
        _exit()


# ------------------------------------------------------------------------------------ the SavedModel runtime
class SavedModelRuntime:
    """The parts of TensorFlow that load a SavedModel's MetaGraph into a session and run it (see the module)."""

    def __init__(self) -> None:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.client import session
        from tensorflow.python.framework import dtypes, ops
        from tensorflow.python.saved_model import loader_impl
        from tensorflow.python.util import deprecation

        self.Graph: Any = ops.Graph  # tf.Graph
        self.ConfigProto: Any = config_pb2.ConfigProto  # tf.compat.v1.ConfigProto
        self.CallableOptions: Any = config_pb2.CallableOptions
        self.Session: Any = session.Session  # tf.compat.v1.Session
        self.load: Any = loader_impl.load  # tf.compat.v1.saved_model.loader.load
        self.silence_deprecation: Any = deprecation.silence
        self.as_dtype: Any = dtypes.as_dtype  # tf.dtypes.as_dtype


# What SavedModelRuntime imports, and what registers how a MetaGraph's collections are read back (variables,
# savers, control-flow contexts, queue runners): the same set ``import tensorflow`` registers.
_RUNTIME_MODULES = (
    "tensorflow.python.framework.ops",
    "tensorflow.python.framework.dtypes",
    "tensorflow.python.client.session",
    "tensorflow.python.saved_model.loader_impl",
    "tensorflow.python.training.queue_runner_impl",
    "tensorflow.python.util.deprecation",
)

_runtime_lock = threading.Lock()
_runtime: SavedModelRuntime | None = None
_server_process = False  # set by workbench's own process entry points: the light import is allowed
_imported_lightly = False


def mark_server_process() -> None:
    """Say that this process is one of workbench's own (``workbench serve``, its workers, batch job workers): its
    SavedModel runtime may be imported without ``tensorflow/__init__``."""
    global _server_process
    _server_process = True


def import_all_of_tensorflow() -> None:
    """Run the genuine ``tensorflow/__init__`` where the SavedModel runtime was imported without it, before code
    workbench does not control runs (a Python model, a handler, an MLflow pyfunc): ``import keras`` first would
    otherwise find TensorFlow half set up. Nothing where TensorFlow is whole or not imported at all."""
    if _imported_lightly and "tensorflow" not in sys.modules:
        with _runtime_lock:
            importlib.import_module("tensorflow")


def saved_model_runtime() -> SavedModelRuntime:
    """TensorFlow's graph, session and SavedModel loader; imported on the first call (thread-safe).

    Where ``tensorflow`` is already imported (a notebook kernel), these are plain imports. Where it is not, they
    are imported as ``tensorflow/__init__`` would first set TensorFlow up (its C++ library, TF2 behaviour), without
    the rest of ``__init__``: its API modules and Keras. ``tensorflow`` itself stays out of ``sys.modules``, so a
    later ``import tensorflow`` (warm-up files, Python models) runs the genuine ``__init__``, which finds these
    modules imported and uses them. Anything unusual (an installed TensorFlow plugin, a modular filesystem, a
    layout this does not know) imports all of TensorFlow instead, as before.
    """
    global _runtime, _imported_lightly
    runtime = _runtime
    if runtime is not None:
        return runtime
    with _runtime_lock:
        if _runtime is None:
            from workbench.runtime import tensorflow_protos

            tensorflow_protos.load()  # first, with its own stand-in: TF Serving's protos share TensorFlow's, as ever
            if "tensorflow" not in sys.modules and _server_process:
                try:
                    _import_without_tensorflow_init()
                except Exception:  # whatever failed, all of TensorFlow is imported below instead
                    log.debug("TensorFlow's SavedModel runtime without tensorflow/__init__ failed", exc_info=True)
                _imported_lightly = "tensorflow" not in sys.modules
            _runtime = SavedModelRuntime()  # plain imports: done above, or all of TensorFlow first
        return _runtime


def _plain_installation(package_dir: str) -> bool:
    """No plugin, kernel library or filesystem that ``tensorflow/__init__`` would load besides the C++ library."""
    if os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"):
        return False
    if os.environ.get("TF_USE_MODULAR_FILESYSTEM", "0") in ("1", "true"):  # gs:// and the like, from tensorflow-io
        return False
    if os.path.exists(os.path.join(package_dir, "core", "kernels")):  # first-party dynamic kernels
        return False
    import site

    parents = {os.path.dirname(package_dir), *(p for p in sys.path if "site-packages" in p)}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site module lacks them
        parents.update(site.getsitepackages())
        parents.add(site.getusersitepackages())
    return not any(os.path.exists(os.path.join(p, "tensorflow-plugins")) for p in parents)


def _import_without_tensorflow_init() -> None:
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations or not spec.origin:
        return  # not a package on disk: the plain imports decide
    if not _plain_installation(os.path.dirname(spec.origin)):
        return
    from workbench.runtime import tensorflow_protos  # loads TF Serving's protos: imported when first needed

    with tensorflow_protos.stand_in(spec, "its SavedModel runtime is imported") as stood_in:
        if not stood_in:  # imported for real while this thread waited for the lock
            return
        # tensorflow/__init__'s own first steps, in its order: the C++ library, then TF2 behaviour, which
        # modules imported after it read when they are imported.
        os.environ.setdefault("ENABLE_RUNTIME_UPTIME_TELEMETRY", "1")
        importlib.import_module("tensorflow.python.pywrap_tensorflow")
        os.environ["TF2_BEHAVIOR"] = "1"
        tf2 = importlib.import_module("tensorflow.python.tf2")
        tf2.enable()
        for name in _RUNTIME_MODULES:
            importlib.import_module(name)
        importlib.import_module("tensorflow.python.compat.v2_compat").enable_v2_behavior()


# ------------------------------------------------------------------------------------------- the profiler
def start_profiler_server(port: int) -> None:
    """Start TensorFlow's profiler server in this process on ``port``. Where the SavedModel runtime was imported
    without ``tensorflow/__init__``, the profiler's module is imported the same way (a fraction of a second instead
    of the seconds ``__init__`` takes, which a profile asked for now would start late by)."""
    if "tensorflow" not in sys.modules and "tensorflow.python.pywrap_tensorflow" in sys.modules:
        spec = importlib.util.find_spec("tensorflow")
        from workbench.runtime import tensorflow_protos

        if spec is not None:
            with tensorflow_protos.stand_in(spec, "its profiler is started") as stood_in:
                if stood_in:
                    module: Any = importlib.import_module("tensorflow.python.profiler.internal._pywrap_profiler")
                    module.start_server(port)
                    return
    from tensorflow.python.profiler.internal import _pywrap_profiler

    _pywrap_profiler.start_server(port)
