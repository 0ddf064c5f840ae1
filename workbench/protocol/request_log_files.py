"""Names of request log files: ``<filename_prefix>-<writer>-<n>.tfrecord``, and finding them again.

``<writer>`` is ``<UTC start time>-<host>-<pid>`` (``20261122T101500Z-nb1-4242``): distinct for every server
process, also for replicas writing to one shared volume (in a container the pid alone is always 1), and
sorting in start order. ``<n>`` counts that writer's files from ``00000``; a file rolls over to the next when
it is full. A prefix ending in ``/`` is a folder: the files are ``<folder>/<writer>-<n>.tfrecord``.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

FILE_SUFFIX = ".tfrecord"
_WRITER = r"\d{8}T\d{6}Z-[A-Za-z0-9_.]+-\d+"
_FILE = re.compile(rf"(?P<prefix>.*?)-?(?P<writer>{_WRITER})-(?P<number>\d{{5,}}){re.escape(FILE_SUFFIX)}")


def writer_id(started: float | None = None) -> str:
    """``<UTC start>-<host>-<pid>``: names this process's files apart from every other writer's."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started if started is not None else time.time()))
    host = re.sub(r"[^A-Za-z0-9_.]+", "_", socket.gethostname()) or "host"
    return f"{stamp}-{host}-{os.getpid()}"


def log_file_name(prefix: str, writer: str, number: int) -> str:
    """The ``number``-th file of ``writer`` under ``prefix``."""
    separator = "" if prefix.endswith(("/", os.sep)) else "-"
    return f"{prefix}{separator}{writer}-{number:05d}{FILE_SUFFIX}"


def log_files(path_or_prefix: str | os.PathLike[str]) -> list[Path]:
    """The files of a request log, oldest first: one file, a folder's log files, or those of a prefix.

    A prefix matches exactly: the files of ``logs/digits`` are not those of ``logs/digits-v2``.
    """
    path = Path(path_or_prefix).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        folder, name = path, ""
    else:
        folder, name = path.parent, path.name
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match and match["prefix"] == name and entry.is_file():
            found.append((match["writer"], int(match["number"]), entry))
    return [entry for _, _, entry in sorted(found)]
