"""``workbench serve``: tensorflow_model_server's flags, refusals, and a real server process end to end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from waiting import free_port

from workbench.cli import build_parser, main
from workbench.config.server_flags import UNSUPPORTED_TF_SERVING_FLAGS

START_DEADLINE_S = 120
STOP_DEADLINE_S = 30


def parse(*flags: str):
    return build_parser().parse_args(["serve", *flags])


# ------------------------------------------------------------------------------------------------ parsing
def test_defaults_are_tf_servings():
    args = parse()
    assert args.port == 8500
    assert args.rest_api_port == 0
    assert args.rest_api_timeout_in_ms == 30000
    assert args.model_name == "default"
    assert args.model_base_path == ""
    assert args.model_config_file == ""
    assert args.model_config_file_poll_wait_seconds == 0
    assert args.file_system_poll_wait_seconds == 1
    assert args.enable_model_warmup is True
    assert args.rest_api_enable_cors_support is False
    assert args.allow_version_labels_for_unavailable_models is False
    assert args.monitoring_config_file == ""
    assert args.drain_seconds == 30  # Kubernetes' default termination grace period
    assert args.drain_delay_seconds == 0


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--enable_model_warmup=false"], False),
        (["--enable_model_warmup=False"], False),
        (["--enable_model_warmup=0"], False),
        (["--enable_model_warmup", "false"], False),
        (["--enable_model_warmup=true"], True),
        (["--enable_model_warmup=1"], True),
        (["--enable_model_warmup"], True),
    ],
)
def test_boolean_forms(flags, expected):
    assert parse(*flags).enable_model_warmup is expected


def test_boolean_flag_alone_turns_it_on():
    args = parse("--rest_api_enable_cors_support", "--allow_version_labels_for_unavailable_models")
    assert args.rest_api_enable_cors_support is True
    assert args.allow_version_labels_for_unavailable_models is True


def test_values_with_equals_and_space():
    args = parse(
        "--port=9000",
        "--rest_api_port",
        "8501",
        "--model_name=hp",
        "--model_base_path=/models/hp",
        "--file_system_poll_wait_seconds=0",
        "--rest_api_timeout_in_ms=500",
    )
    assert (args.port, args.rest_api_port, args.model_name) == (9000, 8501, "hp")
    assert args.model_base_path == "/models/hp"
    assert args.file_system_poll_wait_seconds == 0
    assert args.rest_api_timeout_in_ms == 500


def test_bad_boolean_value_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--enable_model_warmup=maybe")
    assert info.value.code == 2
    assert "enable_model_warmup" in capsys.readouterr().err


def test_bad_integer_value_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--rest_api_port=http")
    assert info.value.code == 2
    assert "rest_api_port" in capsys.readouterr().err


def test_unknown_flag_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--model_base_path=/x", "--no_such_flag=1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--no_such_flag" in err
    assert "Traceback" not in err


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "flags",
    [
        ["--tensorflow_intra_op_parallelism=4"],
        ["--xla_cpu_compilation_enabled"],
        ["--platform_config_file=/tmp/platform.config"],
    ],
)
def test_unsupported_tf_serving_flag_is_refused_by_name(capsys, flags):
    # No model is given, so a regression here cannot start a server that never returns.
    assert main(["serve", *flags]) == 2
    captured = capsys.readouterr()
    name = flags[0].split("=")[0]
    assert name in captured.err
    assert "not supported" in captured.err
    assert "Traceback" not in captured.err


def test_every_unsupported_flag_is_refused(capsys):
    for name in UNSUPPORTED_TF_SERVING_FLAGS:
        assert main(["serve", f"--{name}=1"]) == 2, name
        assert f"--{name}" in capsys.readouterr().err, name


def test_batching_parameters_file_without_enable_batching_is_an_error(capsys, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 8 }")
    assert main(["serve", f"--model_base_path={model}", f"--batching_parameters_file={batching}"]) == 1
    assert "--batching_parameters_file was given without --enable_batching" in capsys.readouterr().err


def test_enable_batching_false_is_not_refused(capsys):
    # --enable_batching=false is what TF Serving does by default: scripts that spell it out must keep working.
    # (Nothing to serve here, so main still stops with 2, but for that reason, not for the flag.)
    assert main(["serve", "--enable_batching=false"]) == 2
    err = capsys.readouterr().err
    assert "nothing to serve" in err
    assert "enable_batching" not in err


def test_a_drain_delay_as_long_as_the_drain_is_refused(capsys, tmp_path):
    code = main(["serve", f"--model_base_path={tmp_path}", "--drain_seconds=10", "--drain_delay_seconds=10"])
    assert code == 1
    err = capsys.readouterr().err
    assert "--drain_delay_seconds (10) must be shorter than --drain_seconds (10)" in err, err


def test_both_config_file_and_base_path_is_refused(capsys, tmp_path):
    assert main(["serve", f"--model_config_file={tmp_path / 'm.config'}", f"--model_base_path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "--model_config_file" in err and "--model_base_path" in err and "not several" in err


def test_nothing_to_serve_is_refused(capsys):
    assert main(["serve", "--rest_api_port=8501"]) == 2
    err = capsys.readouterr().err
    assert "nothing to serve" in err
    assert "--model_base_path" in err and "--model_config_file" in err


# -------------------------------------------------------------------------------------- a real process


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As any server would: connections the old server closed may linger in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def workbench_env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    # The child must import this checkout's workbench whatever the current directory is.
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


class Workbench:
    """``python -m workbench serve ...`` in a temporary working directory, output captured to files."""

    def __init__(self, cwd: Path, *flags: str) -> None:
        self.cwd = cwd
        self.stdout_path, self.stderr_path = cwd / "stdout.txt", cwd / "stderr.txt"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workbench", "serve", *flags],
                cwd=cwd,
                env=workbench_env(),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"workbench did not exit within {timeout} s; stderr:\n{self.stderr[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def run_workbench(tmp_path):
    started: list[Workbench] = []

    def start(*flags: str) -> Workbench:
        cwd = tmp_path / f"cwd{len(started)}"
        cwd.mkdir()
        wb = Workbench(cwd, *flags)
        started.append(wb)
        return wb

    yield start
    for wb in started:
        wb.kill()


def wait_until_available(wb: Workbench, url: str) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if wb.proc.poll() is not None:
            pytest.fail(f"workbench exited with {wb.proc.returncode} while starting; stderr:\n{wb.stderr[-3000:]}")
        with contextlib.suppress(requests.ConnectionError, requests.Timeout):
            r = requests.get(url, timeout=5)
            if r.status_code == 200 and any(s["state"] == "AVAILABLE" for s in r.json()["model_version_status"]):
                return
        time.sleep(0.05)  # poll interval, not a readiness assumption
    pytest.fail(f"model not AVAILABLE within {START_DEADLINE_S} s; stderr:\n{wb.stderr[-3000:]}")


def test_serve_predict_and_sigterm(run_workbench, make_repo):
    base = make_repo("hp", {1: "hp2_tf1"})
    rest_port, grpc_port = free_port(), free_port()
    wb = run_workbench(
        f"--rest_api_port={rest_port}", f"--port={grpc_port}", "--model_name=hp", f"--model_base_path={base}"
    )
    url = f"http://127.0.0.1:{rest_port}/v1/models/hp"
    wait_until_available(wb, url)
    r = requests.post(url + ":predict", data=json.dumps({"instances": [2.0, 3.0, 4.0]}), timeout=30)
    first_answer_s = time.monotonic() - wb.started
    print(f"\nworkbench serve: start-up to first predict answer: {first_answer_s:.2f} s")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"predictions": [3.0, 3.5, 4.0]}
    assert r.text == '{"predictions":[3.0,3.5,4.0]}'

    status = requests.get(url, timeout=10).json()
    assert status == {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }

    wb.proc.send_signal(signal.SIGTERM)
    assert wb.wait(STOP_DEADLINE_S) == 0, wb.stderr[-3000:]
    assert "Traceback" not in wb.stderr
    assert port_is_free(rest_port)
    assert port_is_free(grpc_port)
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=5)


def test_malformed_model_config_fails_start_up(run_workbench, tmp_path):
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "hp" base_path: \n')
    wb = run_workbench(f"--rest_api_port={free_port()}", f"--port={free_port()}", f"--model_config_file={config}")
    code = wb.wait(START_DEADLINE_S)
    assert code != 0
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in wb.stderr
    assert "Traceback" not in wb.stderr


def test_rest_port_in_use_fails_clearly(run_workbench, make_repo):
    base = make_repo("hp", {1: "hp2_tf1"})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        wb = run_workbench(f"--rest_api_port={port}", f"--port={free_port()}", f"--model_base_path={base}")
        code = wb.wait(START_DEADLINE_S)
    stderr = wb.stderr
    assert code != 0
    assert "Traceback" not in stderr
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("workbench serve:"), stderr[-3000:]
    assert "in use" in last_line
    # Two ports are opened (REST and gRPC): the message must say which one is taken.
    assert str(port) in last_line, last_line
