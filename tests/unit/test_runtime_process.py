"""The runtime floor's process helpers: whether a process lives, whether our parent left, atomic JSON files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.runtime.process import parent_gone, pid_exists, write_json_atomically


def test_a_process_exists_while_it_runs_and_not_once_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_exists(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pid_exists(child.pid)
    assert pid_exists(os.getpid())


def test_our_parent_is_there_and_another_pid_is_not_our_parent() -> None:
    assert not parent_gone(os.getppid())
    assert parent_gone(os.getpid())  # alive, but not the process that started us


def test_a_json_file_is_replaced_whole_with_the_mode_asked_and_no_temporary_left(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    write_json_atomically(path, {"port": 1})
    write_json_atomically(path, {"port": 2, "pid": 7}, mode=0o600, indent=1)
    assert json.loads(path.read_text()) == {"port": 2, "pid": 7}
    assert path.read_text().startswith("{\n")  # indented as asked
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]


def test_content_that_cannot_be_written_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    write_json_atomically(path, {"ok": True})
    with pytest.raises(TypeError):
        write_json_atomically(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_a_new_file_gets_the_mode_asked(tmp_path: Path) -> None:
    path = tmp_path / "private.json"
    write_json_atomically(path, [], mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
