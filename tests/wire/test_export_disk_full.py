"""``workbench.export`` into a repository whose disk fills during the export.

The repository lives on a 1 MiB tmpfs that a served model already uses; the export needs more than what is
left. It must fail with one clear ExportError that says the disk is full and how much the export needs, leave
the repository exactly as it was (no numbered folder, no hidden staging folder, no empty model folder, not a byte
more used), and a server polling the repository all along must never list a version of the failed model. Once
space allows, the next export gets the next number as if nothing had happened.

Mounting a tmpfs needs root (CI runs the tests as root); elsewhere the tests skip, saying why.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from waiting import wait_until

from workbench.publishing import ExportError, export
from workbench.server import ServerThread

FILESYSTEM_SIZE = "1m"
MIB = 1024 * 1024
WIDTH = 256  # inputs of the models below


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A freshly mounted 1 MiB tmpfs, unmounted after the test."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip(f"mounting a size-limited tmpfs needs root; these tests run as uid {os.geteuid()}")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount command on this machine to mount a size-limited tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FILESYSTEM_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:  # a container without CAP_SYS_ADMIN, for one
        pytest.skip(f"cannot mount a {FILESYSTEM_SIZE} tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mount_point)], check=True)  # a file still open: detach it


@pytest.fixture
def repository(small_filesystem: Path, model_store: Path) -> Path:
    """A repository on the small file system, with ``m`` v1 (a small SavedModel) already in it."""
    root = small_filesystem / "repo"
    shutil.copytree(model_store / "hp2_tf2", root / "m" / "1")
    return root


@pytest.fixture
def server(repository: Path, serve: Callable[..., ServerThread]) -> ServerThread:
    """A server polling the repository every 50 ms, serving ``m`` v1."""
    started = serve(model_repository=str(repository), file_system_poll_wait_seconds=0.05)
    wait_until(lambda: served_versions(started) == {"m": {1: "AVAILABLE"}}, timeout=120, what="m v1 to serve")
    return started


def served_versions(server: ServerThread) -> dict[str, dict[int, str]]:
    """Every model the server lists, with its versions' states."""
    response = requests.get(f"{server.rest_url}/workbench/v1/models", timeout=30)
    response.raise_for_status()
    return {m["name"]: {v["version"]: v["state"] for v in m["versions"]} for m in response.json()["models"]}


class Watcher(threading.Thread):
    """Lists the server's models as fast as it answers, until stopped: everything it ever showed is kept."""

    def __init__(self, server: ServerThread) -> None:
        super().__init__(daemon=True, name="watcher")
        self.server = server
        self.seen: list[dict[str, dict[int, str]]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.seen.append(served_versions(self.server))

    def stop(self) -> list[dict[str, dict[int, str]]]:
        self._stopping.set()
        self.join(60)
        assert not self.is_alive()
        return self.seen


def files_of(root: Path) -> list[str]:
    """Every path under ``root``, hidden ones included, relative to it."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system has no byte left."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(descriptor, b"\0" * 65536):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(descriptor)
    assert shutil.disk_usage(path).free == 0


def used_bytes(path: Path) -> int:
    return shutil.disk_usage(path).used


# ------------------------------------------------------------------------------------------------ models
def big_variables() -> tuple[Any, Any, str]:
    """A model whose variables (4 MiB) do not fit: the disk fills while TensorFlow writes the checkpoint."""
    import tensorflow as tf

    class Big(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(np.full((WIDTH, 4 * MIB // (4 * WIDTH)), 0.5, np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": tf.reduce_sum(tf.matmul(x, self.w), axis=1)}

    return Big(), None, "4.0 MiB"


def big_warmup() -> tuple[Any, Any, str]:
    """A small model with 2 MiB of warmup examples: it saves and loads, then the disk fills writing the warmup."""
    import tensorflow as tf

    class Small(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": tf.reduce_sum(x, axis=1)}

    examples = {"x": np.ones((2 * MIB // (4 * WIDTH), WIDTH), np.float32)}
    return Small(), examples, "2.0 MiB"


@pytest.mark.parametrize("build", [big_variables, big_warmup], ids=["variables", "warmup"])
def test_an_export_that_fills_the_disk_leaves_nothing_and_says_why(
    build: Callable[[], tuple[Any, Any, str]], repository: Path, server: ServerThread
) -> None:
    model, examples, needed = build()
    before_files, before_used = files_of(repository), used_bytes(repository)

    watcher = Watcher(server)
    watcher.start()
    try:
        with pytest.raises(ExportError) as failed:
            export(model, "big", repository, examples=examples)
    finally:
        seen = watcher.stop()

    message = str(failed.value)
    assert message.startswith(f"Export of 'big' failed: no space left on the device holding {repository / 'big'} ")
    assert "the export needs at least " in message and needed in message, message
    assert "free of 1.0 MiB" in message, message
    assert "\n" not in message and "function_node" not in message, message  # one line, no TensorFlow internals
    assert isinstance(failed.value.__cause__, Exception)  # the OS's (or TensorFlow's) error, for whoever digs

    # Nothing left: no version, no hidden staging folder, no empty model folder, not a byte more used.
    assert files_of(repository) == before_files
    assert used_bytes(repository) == before_used
    # The server never listed a version of it, however briefly (a model folder without versions, at most).
    assert seen, "the watcher never got an answer"
    assert all(not listing.get("big") for listing in seen), [listing for listing in seen if listing.get("big")]

    # With room for it, the next export of the model is its version 1, and the server serves it.
    import tensorflow as tf

    class Tiny(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x + 1.0}

    assert export(Tiny(), "big", repository).version == 1
    wait_until(
        lambda: served_versions(server) == {"m": {1: "AVAILABLE"}, "big": {1: "AVAILABLE"}},
        timeout=120,
        what="big v1 to serve beside m v1",
    )
    answer = requests.post(f"{server.rest_url}/v1/models/big:predict", json={"instances": [1.0]}, timeout=30)
    assert answer.json() == {"predictions": [2.0]}


def test_a_full_disk_before_the_export_starts_is_reported_the_same(repository: Path, server: ServerThread) -> None:
    """A disk already full when the export begins: the same message, and nothing left."""
    import tensorflow as tf

    fill(repository.parent / "filler")
    before_files = files_of(repository)

    class Tiny(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x + 1.0}

    with pytest.raises(ExportError, match=r"^Export of 'tiny' failed: no space left on the device holding "):
        export(Tiny(), "tiny", repository)
    assert files_of(repository) == before_files
    # The model's folder existed while the export ran, so a poll may have listed the model without versions;
    # it is gone, so the next poll drops it.
    wait_until(lambda: "tiny" not in served_versions(server), timeout=60, what="the server to forget tiny")
    assert served_versions(server) == {"m": {1: "AVAILABLE"}}
