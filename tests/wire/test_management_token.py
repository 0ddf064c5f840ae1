"""The management token: required off loopback, taken from the environment, compared in constant time, never shown.

A server others can reach changes what it serves only for whoever holds its token: binding anything but loopback
without one refuses to start unless ``--management_token=none`` says so. The token never appears in the server's
log, its health or status, its Jupyter record, or the options' repr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
from test_cli import workbench_env

from tests.waiting import wait_until
from workbench import demo
from workbench.config.serve_options import FlagError, is_loopback, serve_options
from workbench.config.server_flags import MANAGEMENT_TOKEN_ENV
from workbench.frontends.auth import bearer_matches
from workbench.jupyter import server_records as registry

# Loads TF Serving's protos without running tensorflow/__init__: see workbench/runtime/tensorflow_protos.py.
import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

TOKEN = "mgmt-5f1d0c7e9a"


@pytest.fixture
def no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MANAGEMENT_TOKEN_ENV, raising=False)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.8.7", "::1", "[::1]", "localhost"])
def test_loopback_addresses_need_no_token(host: str, no_token_in_env: None) -> None:
    assert is_loopback(host)
    assert serve_options(["--model_repository=models", f"--host={host}"]).management_token == ""


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "serving.example.com"])
def test_any_other_address_refuses_to_start_without_a_token(host: str, no_token_in_env: None) -> None:
    assert not is_loopback(host)
    with pytest.raises(FlagError) as refused:
        serve_options(["--model_repository=models", f"--host={host}"])
    message = str(refused.value)
    assert f"--host={host}" in message
    assert "--management_token=TOKEN" in message and MANAGEMENT_TOKEN_ENV in message
    assert "--management_token=none" in message


def test_none_serves_without_a_token_on_purpose(no_token_in_env: None) -> None:
    options = serve_options(["--model_repository=models", "--host=0.0.0.0", "--management_token=none"])
    assert options.management_token == ""


def test_the_token_comes_from_the_environment_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MANAGEMENT_TOKEN_ENV, TOKEN)
    assert serve_options(["--model_repository=models", "--host=0.0.0.0"]).management_token == TOKEN
    flagged = serve_options(["--model_repository=models", "--host=0.0.0.0", "--management_token=other"])
    assert flagged.management_token == "other"


def test_the_options_repr_never_shows_the_token(no_token_in_env: None) -> None:
    options = serve_options(["--model_repository=models", f"--management_token={TOKEN}"])
    assert options.management_token == TOKEN
    assert TOKEN not in repr(options) and TOKEN not in str(options)


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),  # the scheme is case-insensitive (RFC 9110)
        (f"Bearer  {TOKEN} ", True),
        (f"Bearer {TOKEN}x", False),
        (f"Bearer {TOKEN[:-1]}", False),
        (f"Basic {TOKEN}", False),
        (TOKEN, False),
        ("", False),
    ],
)
def test_only_the_exact_bearer_token_matches(header: str, matches: bool) -> None:
    assert bearer_matches(header, TOKEN) is matches


def test_a_real_server_refuses_a_wildcard_address_without_a_token(tmp_path: Path, no_token_in_env: None) -> None:
    env = {k: v for k, v in workbench_env().items() if k != MANAGEMENT_TOKEN_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "serve", f"--model_repository={tmp_path}", "--host=0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "--management_token" in done.stderr and "Traceback" not in done.stderr


def test_the_token_from_the_environment_guards_changes_and_never_shows(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    demo.save_half_plus_two(repository / "half_plus_two" / "1")
    ready_file, log = tmp_path / "ready.json", tmp_path / "server.log"
    runtime = tmp_path / "runtime"
    env = dict(workbench_env(), **{MANAGEMENT_TOKEN_ENV: TOKEN, registry.RUNTIME_DIR_ENV: str(runtime)})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workbench",
                "serve",
                f"--model_repository={repository}",
                "--port=0",
                "--rest_api_port=-1",
                f"--ready_file={ready_file}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        wait_until(lambda: ready_file.exists() or proc.poll() is not None, timeout=120, what="the ready file")
        assert proc.poll() is None, log.read_text()
        base = f"http://127.0.0.1:{json.loads(ready_file.read_text())['rest_port']}/workbench/v1"
        load = f"{base}/models/half_plus_two/versions/1:load"
        assert requests.post(load, timeout=30).status_code == 401
        assert requests.post(load, headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
        allowed = requests.post(load, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        assert allowed.status_code == 200, allowed.text
        shown = [requests.get(f"{base}/{view}", timeout=30).text for view in ("health", "stats", "models")]
        records = [path.read_text() for path in runtime.rglob("*.json")]
        assert records and json.loads(records[0])["token_required"] is True
        for text in [*shown, *records, ready_file.read_text()]:
            assert TOKEN not in text
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert TOKEN not in log.read_text()


def test_the_grpc_config_reload_needs_the_token_too(serve: Any, tmp_path: Path) -> None:
    """A reload points models at any path: with a token, it is a management change like REST's."""
    for name in ("first", "second"):
        demo.save_half_plus_two(tmp_path / name / "1")
    server = serve(model_base_path=str(tmp_path / "first"), model_name="first", management_token=TOKEN)
    reload = model_management_pb2.ReloadConfigRequest()
    reload.config.model_config_list.config.add(
        name="second", base_path=str(tmp_path / "second"), model_platform="tensorflow"
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc_port}") as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as refused:
                models.HandleReloadConfigRequest(reload, 60.0, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert server.server.manager.served.model_names() == ["first"]
        answered = models.HandleReloadConfigRequest(reload, 60.0, metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert answered.status.error_code == 0
        assert server.server.manager.served.model_names() == ["second"]
