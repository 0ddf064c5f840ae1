"""The registry of running servers (workbench.jupyter.server_records), written by real servers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from waiting import wait_until

from workbench.config.options import ServerOptions
from workbench.jupyter import server_records as registry
from workbench.jupyter.server_records import ServerRecord
from workbench.server import ServerThread


def _record(**fields: object) -> ServerRecord:
    values: dict[str, object] = {
        "id": f"{os.getpid()}-1",
        "pid": os.getpid(),
        "name": "fake",
        "rest_host": "127.0.0.1",
        "rest_port": 1,
        "grpc_host": "127.0.0.1",
        "grpc_port": 2,
        "process_start": registry._process_start(os.getpid()),
    }
    values.update(fields)
    return ServerRecord(**values)  # type: ignore[arg-type]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_default_folder_is_in_jupyters_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(registry.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    assert registry.registry_dir() == tmp_path / "workbench-servers"


def test_a_server_records_itself_while_it_runs(
    runtime_dir: Path, serve: Callable[..., ServerThread], make_repo: Callable[..., Path]
) -> None:
    repository = make_repo("hp", {1: "hp2_tf2"}).parent
    server = serve(model_repository=str(repository), management_token="s3cret")
    rest_port, grpc_port = server.server.rest_port, server.server.grpc_port

    (record,) = registry.list_servers()
    assert record.id == f"{os.getpid()}-{rest_port}"
    assert (record.pid, record.rest_host, record.rest_port, record.grpc_port) == (
        os.getpid(),
        "127.0.0.1",
        rest_port,
        grpc_port,
    )
    assert record.name == repository.name == "models"
    assert record.model_repository == str(repository.resolve())
    assert record.token_required is True
    assert record.started == pytest.approx(server.server.started_at)
    assert registry.get_server(record.id) == record
    on_disk = json.loads((runtime_dir / f"{record.id}.json").read_text())
    assert on_disk["rest_port"] == rest_port and "s3cret" not in json.dumps(on_disk)
    assert (runtime_dir.stat().st_mode & 0o777, (runtime_dir / f"{record.id}.json").stat().st_mode & 0o777) == (
        0o700,
        0o600,
    )
    # The record points at the server itself.
    assert requests.get(f"http://127.0.0.1:{record.rest_port}/v1/models/hp", timeout=10).status_code == 200

    server.stop()
    assert registry.list_servers() == []
    assert list(runtime_dir.iterdir()) == []


def test_two_servers_of_one_process_have_their_own_records(
    runtime_dir: Path, serve: Callable[..., ServerThread], make_repo: Callable[..., Path]
) -> None:
    base = make_repo("hp", {1: "hp2_tf2"})
    first = serve(model_base_path=str(base), model_name="hp")
    second = serve(model_base_path=str(base), model_name="other")
    records = registry.list_servers()
    assert [r.rest_port for r in records] == [first.server.rest_port, second.server.rest_port]
    assert [r.name for r in records] == ["hp", "other"]
    assert records[0].model_base_path == str(base.resolve())
    second.stop()
    assert [r.rest_port for r in registry.list_servers()] == [first.server.rest_port]


def test_a_given_name_is_the_records_name(
    runtime_dir: Path, serve: Callable[..., ServerThread], make_repo: Callable[..., Path]
) -> None:
    serve(model_repository=str(make_repo("hp", {1: "hp2_tf2"}).parent), server_name="experiments")
    (record,) = registry.list_servers()
    assert record.name == "experiments"


def test_a_server_without_rest_is_listed(
    runtime_dir: Path, serve: Callable[..., ServerThread], make_repo: Callable[..., Path]
) -> None:
    serve(model_base_path=str(make_repo("hp", {1: "hp2_tf2"})), model_name="hp", rest_api_port=0)
    (record,) = registry.list_servers()
    assert record.rest_port is None and record.grpc_port
    assert record.id == f"{os.getpid()}-g{record.grpc_port}"


def test_a_server_that_fails_to_start_leaves_no_record(runtime_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="Could not read model config file"):
        ServerThread(
            ServerOptions(port=0, rest_api_port=-1, model_config_file=str(tmp_path / "missing.config"))
        ).start()
    assert registry.list_servers() == []
    assert not runtime_dir.exists() or list(runtime_dir.iterdir()) == []


def test_an_unwritable_runtime_dir_does_not_stop_a_server(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[..., ServerThread],
    make_repo: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a folder under a file cannot be made, even by root
    monkeypatch.setenv(registry.RUNTIME_DIR_ENV, str(blocker / "workbench-servers"))
    server = serve(model_base_path=str(make_repo("hp", {1: "hp2_tf2"})), model_name="hp")
    response = requests.post(f"{server.rest_url}/v1/models/hp:predict", json={"instances": [1.0]}, timeout=30)
    assert response.json() == {"predictions": [2.5]}
    assert "Could not record workbench server" in caplog.text
    assert registry.list_servers() == []
    server.stop()  # and stopping does not fail either


def test_records_of_dead_processes_are_ignored_and_deleted(runtime_dir: Path) -> None:
    live = _record()
    dead = _record(id="999-1", pid=_dead_pid(), process_start=None)
    for record in (live, dead):
        assert registry.register(record) is not None
    assert registry.list_servers() == [live]
    assert sorted(p.name for p in runtime_dir.iterdir()) == [f"{live.id}.json"]
    assert registry.get_server(dead.id) is None


def test_a_reused_pid_is_told_apart(runtime_dir: Path) -> None:
    # Same pid, another start time: the process that wrote the record is gone and its pid was reused.
    reused = _record(id="reused-1", process_start=(registry._process_start(os.getpid()) or 0) + 1)
    registry.register(reused)
    assert registry.get_server(reused.id) is None
    assert not (runtime_dir / "reused-1.json").exists()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_without_a_start_time_the_command_line_must_be_workbench(runtime_dir: Path) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        registry.register(_record(id="sleep-1", pid=other.pid, process_start=None))
        assert registry.list_servers() == []
        assert not (runtime_dir / "sleep-1.json").exists()
    finally:
        other.kill()
        other.wait()
    served = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "workbench", "serve"])
    try:
        kept = _record(id="serve-1", pid=served.pid, process_start=None)
        registry.register(kept)
        assert registry.list_servers() == [kept]
    finally:
        served.kill()
        served.wait()
    assert registry.list_servers() == []


def test_unreadable_records_are_skipped_and_kept(runtime_dir: Path) -> None:
    runtime_dir.mkdir(parents=True)
    (runtime_dir / "garbage.json").write_text("{not json")
    (runtime_dir / "wrong.json").write_text(json.dumps({"id": "wrong", "pid": "x"}))
    (runtime_dir / "half.json.tmp").write_text("{")
    registry.register(good := _record())
    assert registry.list_servers() == [good]
    assert (runtime_dir / "garbage.json").exists()  # maybe a newer version's: not ours to delete


@pytest.mark.parametrize("server_id", ["../x", "..", ".hidden", "a/b", "", "x" * 65])
def test_ids_that_are_not_plain_names_are_refused(runtime_dir: Path, server_id: str) -> None:
    assert registry.get_server(server_id) is None
    registry.unregister(server_id)  # a no-op, never a path outside the folder


def test_a_workbench_serve_process_records_itself_and_a_killed_one_is_cleaned(
    runtime_dir: Path, make_repo: Callable[..., Path]
) -> None:
    from workbench.notebook.handle import ServerHandle

    repository = make_repo("hp", {1: "hp2_tf2"}).parent
    handle = ServerHandle(repository, name="child").start()  # the child inherits WORKBENCH_RUNTIME_DIR
    try:
        (record,) = registry.list_servers()  # recorded before the ready file: listed once start() returns
        assert (record.pid, record.rest_port, record.grpc_port) == (handle.pid, handle.rest_port, handle.grpc_port)
        # A notebook's server is listed under the handle's name (--server_name), not its folder's.
        assert record.name == "child" and record.process_start is not None
        handle.stop()  # SIGTERM: the server removes its record on the way out
        assert registry.list_servers() == [] and list(runtime_dir.iterdir()) == []

        handle.start()
        (record,) = registry.list_servers()
        os.kill(record.pid, signal.SIGKILL)  # no chance to clean up
        assert (runtime_dir / f"{record.id}.json").exists()
        # Not reaped yet (a zombie until the handle polls it): dead all the same.
        wait_until(lambda: registry.list_servers() == [], timeout=30, what="the killed server to be unlisted")
        assert not (runtime_dir / f"{record.id}.json").exists()
    finally:
        handle.stop()
