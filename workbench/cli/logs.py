"""The log lines of a command that serves (``workbench serve``, ``workbench ray deploy``): INFO and up, on stderr."""

from __future__ import annotations

import logging


def configure_logging(prefix: str = "") -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
    for noisy in ("tensorflow", "absl", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
