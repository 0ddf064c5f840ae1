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
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

__all__ = ["quiet_tensorflow", "without_tensorflow_notices"]

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
