"""An export stopped by a full disk (or an exhausted quota): telling it apart from other failures, and a message
that says where, at least how much the export needed, and how much is free."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workbench.runtime.storage import bytes_under  # what an export had written when it stopped

__all__ = ["bytes_under", "examples_bytes", "no_space_message", "out_of_space"]


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it was raised from is a full disk or an exhausted quota.

    Python raises OSError(ENOSPC); TensorFlow's file writes raise its own errors (ResourceExhaustedError from
    SaveV2, a plain error from GFile) whose only trace of the cause is the OS's message.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(current)
        if os.strerror(errno.ENOSPC) in text or os.strerror(errno.EDQUOT) in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def examples_bytes(examples: Any) -> int:
    """The raw size of the warmup examples, which their file holds at least (0 when there are none)."""
    if examples is None:
        return 0
    requests = (
        examples
        if isinstance(examples, (list, tuple)) and all(isinstance(e, Mapping) for e in examples)
        else [examples]
    )
    total = 0
    for request in requests:
        for value in request.values() if isinstance(request, Mapping) else [request]:
            with contextlib.suppress(Exception):  # not an array: the export's own check says so
                total += np.asarray(value).nbytes
    return total


def no_space_message(name: str, base: Path, needed: int) -> str:
    """Why an export stopped on a full disk: where, at least how much it needed, how much is free."""
    place = next((p for p in (base, *base.parents) if p.exists()), base)
    try:
        usage = shutil.disk_usage(place)
        free = f"{_size(usage.free)} free of {_size(usage.total)}"
    except OSError:
        free = "free space unknown"
    return (
        f"Export of {name!r} failed: no space left on the device holding {base} (the export needs at least "
        f"{_size(needed)}; {free}). Nothing was published: free some space or export to another repository"
    )


def _size(count: int) -> str:
    """``512 B``, ``4.0 MiB``: a byte count as people read it."""
    if count < 1024:
        return f"{count} B"
    amount = count / 1024
    for unit in ("KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"
