"""How much memory this process, a model version's files and this machine have: read from the system and frameworks.

- Host memory: the process's resident set, from ``/proc/self/statm`` (Linux). Elsewhere (macOS, Windows) there is
  no cheap reading of the current resident set in the standard library (``resource`` gives only the peak), so no
  growth is measured and a version is counted for its files' size alone (:mod:`workbench.models.memory_policy`).
- GPU memory: what the frameworks already imported here report as allocated, over every device: PyTorch
  (``torch.cuda.memory_allocated``, once CUDA is initialized) and TensorFlow (``get_memory_info``, once a GPU is
  set up). A framework not imported is not imported for it; none: 0.
- The machine's memory, for ``--memory_budget=0.5``: ``/proc/meminfo``'s MemTotal, or the cgroup's limit when lower
  (a container); the GPUs' memory, for ``gpu:0.5``: PyTorch's, TensorFlow's or ``nvidia-smi``'s total.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from workbench.runtime.storage import bytes_under, is_remote

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """The process's resident set (None where the system does not tell it cheaply)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def return_freed_memory() -> None:
    """Hand the memory malloc keeps after a servable closes back to the system (``malloc_trim(0)``).

    A closed model's tensors go back to malloc, which keeps them in its arenas; later loads allocate beside them
    rather than in them, so a server that reloads grows (TF Serving's users report it: tensorflow/serving#1664,
    #1346). Measured on 100 load/unload cycles of a TensorFlow model with 16 MiB of weights, with TensorFlow's
    plain CPU allocator (``TF_ENABLE_ONEDNN_OPTS=0``): without this, resident memory ended 90 to 140 MB above where
    it started (up to eight versions' weights kept) and peaked up to 180 MB above; with it, within one or two
    versions' weights. oneDNN's allocator, TensorFlow's default on x86, keeps a freed version's memory in its own
    pool for the next load to reuse: no growth, and nothing here to return. A call takes well under a millisecond,
    once per unload, and around each load measured for a memory budget (what a load leaves behind in malloc's
    free lists is not the version's, :class:`~workbench.models.residency.LoadMeter`).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def gpu_bytes() -> int:
    """GPU memory the imported frameworks hold allocated, over every device (0: none imported, or no GPU)."""
    used = 0
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):  # a CPU build, or CUDA in a bad state: nothing to count
            cuda = torch.cuda
            if cuda.is_available() and cuda.is_initialized():
                used += sum(int(cuda.memory_allocated(i)) for i in range(cuda.device_count()))
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        with contextlib.suppress(Exception):  # no GPU, or not set up yet
            from tensorflow.python.eager import context

            if context.context()._context_handle is None:  # not set up: asking would set it up (and take the GPU)  # noqa: SLF001
                return used
            for index, _ in enumerate(tf.config.list_logical_devices("GPU")):
                used += int(tf.config.experimental.get_memory_info(f"GPU:{index}")["current"])
    return used


def folder_bytes(path: str) -> int:
    """The size of a version's files (0 for a folder in an object store: it is downloaded only to load)."""
    return 0 if is_remote(path) else bytes_under(path, follow_symlinks=True)


def machine_memory() -> int | None:
    """This machine's memory, or the cgroup's limit when lower (None: unknown)."""
    total: int | None = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            limit = int(Path(limit_file).read_text().strip())  # "max" (no limit) is a ValueError
            if total is None or limit < total:
                total = limit
    if total is None and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total


@functools.cache
def gpu_seen() -> bool:
    """Whether this machine has a GPU (PyTorch's or nvidia-smi's word, asked once): where ``auto`` places models."""
    return gpu_memory() is not None


def gpu_memory() -> int | None:
    """The GPUs' memory, all devices together (None: no GPU found)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                count = torch.cuda.device_count()
                return sum(int(torch.cuda.get_device_properties(i).total_memory) for i in range(count)) or None
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
            out = subprocess.run(
                [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            return sum(int(line.strip()) for line in out.splitlines() if line.strip()) * 2**20 or None
    return None
