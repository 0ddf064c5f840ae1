"""Notebook server handles (``workbench.serve``): real ``workbench serve`` child processes on free ports, their
display, models appearing in the repository, stop/crash/restart, and no server outliving its "kernel".

Every start costs a few seconds (a fresh Python importing TensorFlow), so two module-scoped handles carry most
tests; the tests that need a separate "kernel" process start one server each.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from waiting import place_atomically, port_is_free, process_gone, remove_atomically, wait_until

import workbench
from workbench.notebook.handle import ServerDied, ServerHandle, models_table_text, running_servers

ROOT = Path(__file__).resolve().parents[2]


def make_repository(root: Path, model_store: Path, versions: dict[int, str]) -> Path:
    for version, stored in versions.items():
        shutil.copytree(model_store / stored, root / "m" / str(version))
    return root


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerHandle]:
    """A server on a repository with ``m`` v1 (y = 0.5x + 2)."""
    repo = make_repository(tmp_path_factory.mktemp("first") / "repo", model_store, {1: "hp2_tf2"})
    handle = workbench.serve(repo, name="first")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerHandle]:
    """Another server, on its own repository: ``m`` v1 (0.5x + 2) and v2 (0.5x + 3, the default)."""
    repo = make_repository(tmp_path_factory.mktemp("second") / "repo", model_store, {1: "hp2_tf2", 2: "hp3_tf2"})
    handle = workbench.serve(repo, name="second")
    yield handle
    handle.stop()


def y(handle: ServerHandle, **routing: Any) -> float:
    return handle.client.predict("m", [[1.0]], **routing)["y"].item()


# --------------------------------------------------------------------------------------------------- start
def test_starts_on_free_ports_and_writes_a_ready_file(first):
    assert first.running and first.pid is not None
    assert first.rest_port and first.grpc_port and first.rest_port != first.grpc_port
    assert first.started_seconds is not None and first.started_seconds > 0
    ready = json.loads(first._ready_path.read_text())
    assert (ready["rest_port"], ready["grpc_port"], ready["pid"]) == (first.rest_port, first.grpc_port, first.pid)
    assert ready["models"] == ["m"]
    health = first.client.health()
    assert health["pid"] == first.pid and health["status"] == "ok"
    assert f"--parent_pid={os.getpid()}" in first.command()
    assert first in running_servers()
    assert first.log_path.exists()
    assert y(first) == 2.5


def test_repr_and_html_show_the_server_and_its_models(first):
    assert repr(first) == (
        f"<workbench server 'first': running, REST http://127.0.0.1:{first.rest_port}, "
        f"gRPC 127.0.0.1:{first.grpc_port}, repository {first.repository}>"
    )
    html = first._repr_html_()
    assert "<table>" in html
    assert f"http://127.0.0.1:{first.rest_port}" in html
    assert "<td>m</td><td>1</td><td>AVAILABLE</td>" in html
    text = models_table_text(first.models())
    assert text.split() == ["m", "v1", "AVAILABLE", "labels=-", "traffic=100%"]


def test_exported_and_copied_models_appear(first, model_store):
    import tensorflow as tf

    place_atomically(model_store / "hp3_tf2", first.repository / "m" / "2")
    assert first.wait_for_version("m", 2, timeout=60) == 2
    wait_until(lambda: y(first) == 3.5, what="the latest version as the default")

    class Triple(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"tripled": 3.0 * x}

    from workbench.publishing import export

    exported = export(Triple(), "triple", first.repository)
    assert exported.version == 1
    assert first.wait_for_version("triple", timeout=60) == 1
    assert first.client.predict("triple", [1.0, 2.0])["tripled"].tolist() == [3.0, 6.0]
    assert "<td>triple</td><td>1</td><td>AVAILABLE</td>" in first._repr_html_()


def test_workbench_export_stays_the_function_once_its_module_is_imported():
    import importlib

    module = importlib.import_module("workbench.publishing")  # as `from workbench.publishing import ExportError` does
    assert callable(workbench.export), workbench.export
    assert workbench.export is module.export


def test_two_servers_in_one_process_work_at_once(first, second):
    assert {first, second} <= set(running_servers())
    assert first.repository != second.repository
    assert len({first.rest_port, first.grpc_port, second.rest_port, second.grpc_port}) == 4
    assert first.client.health()["pid"] == first.pid != second.pid == second.client.health()["pid"]
    expected = {first: y(first), second: y(second)}  # each answers from its own repository
    assert expected[second] == 3.5
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda handle: (handle, y(handle)), [first, second] * 20))
    assert all(got == expected[handle] for handle, got in answers), answers


def test_a_server_that_cannot_start_raises_server_died_with_its_log(first, tmp_path):
    busy = first.rest_port  # taken by the first server
    with pytest.raises(ServerDied) as died:
        workbench.serve(first.repository, name="clash", rest_port=busy, timeout=120)
    assert "could not start" in str(died.value)
    assert f"Could not bind the REST port 127.0.0.1:{busy}" in str(died.value)
    assert all(handle.name != "clash" for handle in running_servers())
    assert y(first) in (2.5, 3.5)  # the first server is unharmed


# ---------------------------------------------------------------------------------------- crash / restart
def test_a_crashed_server_raises_server_died_and_restarts_with_its_routing(second):
    assert second.client.promote("m", 1)["stable"] == 1
    assert y(second) == 2.5
    old_pid, repository = second.pid, second.repository

    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not second.running, timeout=30, what="the killed server to exit")
    tail = second.log_tail()
    assert tail.strip(), "the server wrote nothing to its log"
    with pytest.raises(ServerDied) as died:
        second.check()
    assert f"exited with code {-signal.SIGKILL}" in str(died.value)
    assert str(died.value).endswith(tail)
    assert tail.splitlines()[-1] in str(died.value)
    with pytest.raises(ServerDied):
        second.client  # noqa: B018 - the property checks
    with pytest.raises(ServerDied):
        second.rest_url  # noqa: B018

    second.restart()
    assert second.running and second.pid != old_pid
    assert second.repository == repository
    assert second.client.model("m")["stable"] == 1
    assert y(second) == 2.5
    assert y(second, label="stable") == 2.5
    assert second.client.health()["pid"] == second.pid


def test_stop_ends_the_process_and_frees_its_ports(second):
    if not second.running:
        second.start()
    pid, ports = second.pid, (second.rest_port, second.grpc_port)
    second.stop()
    assert process_gone(pid)
    assert all(port_is_free(port) for port in ports), ports
    assert not second.running
    assert second not in running_servers()
    assert "stopped" in repr(second) and "stopped" in second._repr_html_()
    with pytest.raises(ServerDied, match="not started"):
        second.check()
    second.stop()  # twice is fine


# ------------------------------------------------------------------------------------------ the "kernel"
def run_kernel(code: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


SERVE_AND_REPORT = """
    import json, os, sys
    import workbench

    handle = workbench.serve(sys.argv[1], name="kernel")
    info = {"pid": handle.pid, "ports": [handle.rest_port, handle.grpc_port], "log": str(handle.log_path)}
    with open(sys.argv[2] + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
"""


def test_a_killed_kernel_takes_its_server_along(tmp_path, model_store):
    repo = make_repository(tmp_path / "repo", model_store, {1: "hp2_tf2"})
    info_path = tmp_path / "server.json"
    kernel = run_kernel(SERVE_AND_REPORT + "\n    import signal\n    signal.pause()\n", str(repo), str(info_path))
    server_pid = None
    try:
        wait_until(lambda: info_path.exists() or kernel.poll() is not None, timeout=180, what="the kernel's server")
        assert info_path.exists(), kernel.communicate()[0].decode(errors="replace")
        info = json.loads(info_path.read_text())
        server_pid = info["pid"]
        rest_port, grpc_port = info["ports"]
        r = requests.post(f"http://127.0.0.1:{rest_port}/v1/models/m:predict", json={"instances": [[1.0]]}, timeout=30)
        assert r.text == '{"predictions":[[2.5]]}'

        kernel.kill()  # kill -9: no atexit, no stop()
        kernel.wait(30)
        wait_until(lambda: process_gone(server_pid), timeout=15, what="the orphaned server to exit")
        assert port_is_free(rest_port) and port_is_free(grpc_port)
        assert "Parent process" in Path(info["log"]).read_text()  # the --parent_pid watchdog stopped it
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait(30)
        if server_pid is not None and not process_gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def test_a_kernel_exiting_normally_stops_its_server_at_exit(tmp_path, model_store):
    repo = make_repository(tmp_path / "repo", model_store, {1: "hp2_tf2"})
    info_path = tmp_path / "server.json"
    kernel = run_kernel(SERVE_AND_REPORT, str(repo), str(info_path))  # and then the interpreter exits
    output, _ = kernel.communicate(timeout=180)
    assert kernel.returncode == 0, output.decode(errors="replace")
    info = json.loads(info_path.read_text())
    try:
        # atexit stopped it, and waited for it, before the kernel's process ended: gone already, no polling
        assert process_gone(info["pid"])
        assert all(port_is_free(port) for port in info["ports"])
        assert not Path(info["log"]).parent.exists()  # the handle's folder (log, ready file) went with it
    finally:
        if not process_gone(info["pid"]):
            os.kill(info["pid"], signal.SIGKILL)


def test_proxy_url_behind_a_hub(first, monkeypatch, tmp_path):
    """On Binder/JupyterHub the browser reaches the REST API through jupyter-server-proxy at <prefix>proxy/<port>/."""
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    assert first.proxy_url is None  # no hub
    assert ServerHandle(tmp_path / "repo").proxy_url is None  # not started
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
    assert first.proxy_url == f"/user/ada/proxy/{first.rest_port}/"
    assert f"browser /user/ada/proxy/{first.rest_port}/" in repr(first)


def test_wait_for_state_follows_a_version_in_and_out(first, model_store):
    """Loaded, replaced (latest policy: the old one unloads), removed: each state is waited for, never slept on."""
    base = first.repository / "w"
    place_atomically(model_store / "hp2_tf2", base / "1")
    first.wait_for_state("w", 1)  # AVAILABLE
    assert [(s["version"], s["state"]) for s in first.client.status("w")] == [(1, "AVAILABLE")]

    place_atomically(model_store / "hp3_tf2", base / "2")
    first.wait_for_state("w", 1, "END")
    assert [(s["version"], s["state"]) for s in first.client.status("w")] == [(2, "AVAILABLE"), (1, "END")]

    remove_atomically(base / "2")  # v1 is the latest on disk again: v2 unloads and v1 loads
    first.wait_for_state("w", 2, "END")
    first.wait_for_state("w", 1)
    assert first.client.predict("w", [[1.0]])["y"].item() == 2.5

    with pytest.raises(TimeoutError, match="w v1 not UNLOADING after 0.3s"):
        first.wait_for_state("w", 1, "UNLOADING", timeout=0.3)


def test_wait_for_state_reports_a_failed_load_at_once(first, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    place_atomically(broken, first.repository / "broken" / "1")
    with pytest.raises(RuntimeError, match="version 1 of broken failed to load: "):
        first.wait_for_state("broken", 1, timeout=60)
    first.wait_for_state("broken", 1, "END", timeout=1)  # END is where it ended, so waiting for END is done


def test_wait_for_state_works_with_any_client_and_stops_when_told(first):
    """The module-level function serves a server this kernel did not start (here: through a plain Client)."""
    from workbench.notebook.handle import wait_for_state

    with workbench.Client(first.rest_url, first.grpc_target) as client:
        # Whichever version serves now (an earlier test of this module may have replaced v1 by v2).
        serving = max(int(s["version"]) for s in first.client.status("m") if s["state"] == "AVAILABLE")
        wait_for_state(client, "m", serving, timeout=60)

        def server_gone() -> None:
            raise ServerDied("stop waiting")

        with pytest.raises(ServerDied, match="stop waiting"):
            wait_for_state(client, "m", 99, alive=server_gone)


def test_a_store_url_is_passed_on_as_it_is_and_a_local_folder_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the server's working folder differs: a relative folder must not reach it
    in_store, local = ServerHandle("s3://bucket/models"), ServerHandle("models")
    try:
        assert in_store.model_repository == "s3://bucket/models"
        assert "--model_repository=s3://bucket/models" in in_store.command()
        assert local.model_repository == tmp_path.resolve() / "models"
        assert f"--model_repository={tmp_path.resolve() / 'models'}" in local.command()
        assert not any(tmp_path.iterdir())  # neither made a folder before it starts
    finally:
        for handle in (in_store, local):
            shutil.rmtree(handle.log_path.parent, ignore_errors=True)  # the log folder each handle makes
