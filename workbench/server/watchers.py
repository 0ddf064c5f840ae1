"""What a server watches besides its ports: its model config file (re-applied when it changes) and the process that
started it (a notebook kernel: the server stops when it is gone).

Each runs on a daemon thread until the server's ``stopping`` event is set.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from workbench.config.options import ModelConfig
from workbench.core.errors import ServingError
from workbench.models.configs import parse_model_config_file
from workbench.runtime.process import parent_gone

log = logging.getLogger("workbench.server")  # the server's log lines, whichever of its modules writes them


class ConfigFileWatcher:
    """``--model_config_file`` with ``--model_config_file_poll_wait_seconds``: a changed file is applied; a broken
    one is logged once and the last good config keeps serving."""

    def __init__(
        self, path: str, wait: float, apply: Callable[[list[ModelConfig]], None], stopping: threading.Event
    ) -> None:
        self._path, self._wait, self._apply, self._stopping = path, wait, apply, stopping
        self._text: str | None = Path(path).read_text()  # the config the server starts with
        self._thread = threading.Thread(target=self._watch, name="workbench-config", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        path = self._path
        while not self._stopping.wait(self._wait):
            try:
                text = Path(path).read_text()
            except OSError as exc:
                log.error("Could not read model config file %s: %s", path, exc)
                continue
            if text == self._text:
                continue
            try:
                models = parse_model_config_file(path)
                self._apply(models)
                self._text = text
                log.info("Applied new model config from %s", path)
            except ServingError as exc:
                log.error("Model config %s not applied: %s", path, exc.message)
                self._text = text  # do not retry the same broken text every poll


def watch_parent(parent_pid: int, stopping: threading.Event, on_exit: Callable[[], None] | None = None) -> None:
    """Serve only as long as the process that started us lives (a notebook kernel, even one killed -9): when it is
    gone, ``on_exit()`` (default: SIGTERM to this process, which drains). Starts a daemon thread."""

    def watch() -> None:
        while not stopping.wait(0.5):
            if parent_gone(parent_pid):
                log.warning("Parent process %d is gone: stopping", parent_pid)
                (on_exit or _terminate_self)()
                return

    threading.Thread(target=watch, name="workbench-parent", daemon=True).start()


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
