"""What every load of a transformers model takes: one load at a time, and transformers kept quiet meanwhile."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

# from_pretrained builds a model on PyTorch's meta device and swaps the weights in, through process-wide switches (the
# default device, patched initialisers): two loads at once left a parameter of one on the meta device ("Cannot copy
# out of meta tensor"). Loads take turns (the generators' too); quiet_transformers' switches are the process's.
load_lock = threading.Lock()


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings and progress bars off while it loads or saves (a server thread prints nothing; a
    notebook's export shows its result, not "Writing model shards"), as they were afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
