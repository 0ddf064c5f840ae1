"""Processes and the files they leave for each other: one home for "is it alive" and "written all at once"."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


GIL_SWITCH_SECONDS = 0.0005


def hand_over_the_gil_quickly() -> None:
    """Let a thread waiting for the GIL have it after 0.5 ms instead of Python's 5 ms.

    A serving process hands work between its event loop and its inference threads thousands of times a second. A
    thread whose call returns from native code (a GPU kernel, a TensorFlow session) needs the GIL back to deliver its
    batch; while the loop runs Python, it waits for the loop's switch interval, 5 ms by default: a GPU batch of 0.3 ms
    then takes 5, and the device idles. A shorter interval costs a busy thread a few more switches.
    """
    seconds = float(os.environ.get("WORKBENCH_GIL_SWITCH_SECONDS", GIL_SWITCH_SECONDS))
    sys.setswitchinterval(seconds)


def visible_gpus() -> list[str]:
    """The NVIDIA GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (without importing a CUDA library):
    that variable's entries where it is set, else every GPU the driver lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        names = []
        for name in (part.strip() for part in listed.split(",")):
            if not name or name.startswith("-"):  # CUDA stops at the first invalid entry
                break
            names.append(name)
        return names
    try:
        return [str(index) for index in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (someone else's counts: it exists, we may not signal it)."""
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process on Windows
        try:
            import psutil
        except ImportError:
            return True
        return bool(psutil.pid_exists(pid))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def parent_gone(parent_pid: int) -> bool:
    """Whether the process that started this one (``parent_pid``) has exited: once it has, this process is
    re-parented (to init or a subreaper), so ``getppid`` no longer names it, even if the pid is reused."""
    return os.getppid() != parent_pid or not pid_exists(parent_pid)


def write_json_atomically(
    path: str | os.PathLike[str], content: Any, *, mode: int = 0o644, indent: int | None = None
) -> None:
    """Write ``content`` as JSON to ``path`` so that a reader sees the old file or the whole new one, never a part:
    into ``<path>.tmp`` beside it (created with ``mode``), then one rename(2). Raises OSError as ``open`` does."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(content, f, indent=indent)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
