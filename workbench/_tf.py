"""TensorFlow, quietly: its Python logger announces every SavedModel it writes ("Assets written to ..."),
which would land in the user's notebook cells."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
