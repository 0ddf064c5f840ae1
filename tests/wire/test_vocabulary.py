"""One vocabulary: the same names (and the earlier ones as aliases, meaning the same thing) in ``workbench serve`` /
``workbench bench``, the ``%serve`` magics and the Python API; help that shows defaults, groups and examples and
hides internal flags; "did you mean" for a mistyped option; the same bench defaults on the command line and in a
notebook."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from waiting import free_port

import workbench
from workbench import cli
from workbench.client import Client, bench, perf
from workbench.client.bench import DEFAULT_CONCURRENCY, DEFAULT_DURATION_S, DEFAULT_PROTOCOL, resolve_load, run_load
from workbench.config.vocabulary import SERVER_KEYWORD_ALIASES
from workbench.notebook.handle import ServerHandle
from workbench.notebook.magics import parse_arguments

BENCH_REQUIRED = ["--target=127.0.0.1:1", "--model=m", '--inputs={"x": [[1.0]]}']


def parse_cli(*words: str) -> dict[str, Any]:
    return vars(cli.build_parser().parse_args(list(words)))


def cli_fails(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """Run the command line, expecting a usage error (exit 2); returns what it printed on stderr."""
    with pytest.raises(SystemExit) as info:
        cli.main(list(words))
    assert info.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------------------ command line
@pytest.mark.parametrize(
    ("alias", "name"),
    [
        (["--rest_port=8501"], ["--rest_api_port=8501"]),
        (["--rest-api-port", "8501"], ["--rest_api_port", "8501"]),
        (["--grpc_port=9000"], ["--port=9000"]),
        (["--grpc-port=9000"], ["--port=9000"]),
        (["--repo=/models"], ["--model_repository=/models"]),
        (["--repository=/models"], ["--model_repository=/models"]),
        (["--model-repository=/models"], ["--model_repository=/models"]),
        (["--server=experiments"], ["--server_name=experiments"]),
        (["--batching"], ["--enable_batching"]),
        (["--batching=1"], ["--enable_batching=true"]),
        (["--enable-batching", "true"], ["--enable_batching"]),
        (["--batching_parameters=/b.config"], ["--batching_parameters_file=/b.config"]),
        (["--model-name=hp", "--model-base-path=/m/hp"], ["--model_name=hp", "--model_base_path=/m/hp"]),
    ],
)
def test_serve_aliases_mean_the_same(alias: list[str], name: list[str]) -> None:
    assert parse_cli("serve", *alias) == parse_cli("serve", *name)
    assert parse_cli("serve", *alias) != parse_cli("serve")  # the alias did something


def test_serve_keeps_tf_servings_model_name() -> None:
    # --model_name is bench's alias of --model, but serve has a --model_name of its own: that one wins.
    assert parse_cli("serve", "--model_name=hp")["model_name"] == "hp"


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        (["--clients=4"], ["--concurrency=4"]),
        (["--signature=s"], ["--signature_name=s"]),
        (["--signature-name=s"], ["--signature_name=s"]),
        (["--grpc"], ["--protocol=grpc"]),
        (["--model_name=other"], ["--model=other"]),
    ],
)
def test_bench_aliases_mean_the_same(alias: list[str], name: list[str]) -> None:
    assert parse_cli("bench", *BENCH_REQUIRED, *alias) == parse_cli("bench", *BENCH_REQUIRED, *name)
    assert parse_cli("bench", *BENCH_REQUIRED, *alias) != parse_cli("bench", *BENCH_REQUIRED)


@pytest.mark.parametrize(
    ("words", "suggestion"),
    [
        (["serve", "--rest_api_prot=8501"], "did you mean --rest_api_port?"),
        (["serve", "--rest-api-prot=8501"], "did you mean --rest_api_port?"),
        (["serve", "--enable_batchng"], "did you mean --enable_batching?"),
        (["serve", "--rest"], "did you mean --rest_api_port?"),  # no abbreviations: TF Serving takes none either
        (["bench", "--concurency=2", *BENCH_REQUIRED], "did you mean --concurrency?"),
        (["bench", "--clinets=2", *BENCH_REQUIRED], "did you mean --concurrency?"),  # near an alias: the name
        (["bench", "--targte=x", "--model=m", "--inputs={}"], "did you mean --target?"),
        (["serv", "--rest_api_port=8501"], "did you mean serve?"),
    ],
)
def test_cli_suggests_the_nearest_flag(capsys: pytest.CaptureFixture[str], words: list[str], suggestion: str) -> None:
    err = cli_fails(capsys, *words)
    assert suggestion in err
    assert "Traceback" not in err


def test_cli_suggests_nothing_for_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    err = cli_fails(capsys, "serve", "--zzzzzz=1")
    assert "unrecognized option --zzzzzz" in err and "did you mean" not in err


def help_of(*words: str) -> str:
    """What ``python -m workbench WORDS --help`` prints, as a user sees it (and names itself)."""
    done = subprocess.run(
        [sys.executable, "-m", "workbench", *words, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, COLUMNS="120", PYTHONPATH=str(Path(__file__).resolve().parents[2])),
        check=True,
    )
    return done.stdout


@pytest.fixture(scope="module")
def serve_help() -> str:
    return help_of("serve")


def test_internal_flags_work_but_are_hidden(serve_help: str) -> None:
    args = parse_cli("serve", "--ready_file=/tmp/ready.json", "--parent_pid=42")
    assert (args["ready_file"], args["parent_pid"]) == ("/tmp/ready.json", 42)
    assert "--parent_pid" not in serve_help and "--worker_of" not in serve_help
    # --ready_file is for people too (tutorial 05's replicas): how a script learns the free ports a server bound.
    assert "bound" in flag_help(serve_help, "--ready_file")
    assert "--tensorflow_intra_op_parallelism" not in serve_help  # refused flags are not advertised either


def test_help_names_the_program_as_typed_by_a_user(serve_help: str) -> None:
    assert serve_help.startswith("usage: workbench serve ")
    assert help_of().startswith("usage: workbench ")
    assert help_of("bench").startswith("usage: workbench bench ")
    assert "__main__" not in serve_help


def flag_help(text: str, flag: str) -> str:
    """The help entry of ``flag``: its line and the wrapped lines under it, joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [flag])
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 10) or line.strip().startswith("--"):
            break
        entry.append(line)
    return " ".join(" ".join(entry).split())


@pytest.mark.parametrize(
    ("flag", "shows"),
    [
        ("--port", "(default: 8500)"),
        ("--rest_api_port", "(default: 0)"),
        ("--rest_api_timeout_in_ms", "(default: 30000)"),
        ("--model_name", "(default: default)"),
        ("--file_system_poll_wait_seconds", "(default: 1.0)"),
        ("--enable_model_warmup", "(default: true)"),
        ("--enable_batching", "(default: false)"),
        ("--num_load_threads", "(default: 2)"),
        ("--host", "(default: 127.0.0.1)"),
    ],
)
def test_serve_help_shows_defaults(serve_help: str, flag: str, shows: str) -> None:
    assert shows in flag_help(serve_help, flag)


def test_serve_help_says_rest_port_0_is_off(serve_help: str) -> None:
    assert "0 turns REST off, as in TF Serving" in flag_help(serve_help, "--rest_api_port")


def test_serve_help_shows_booleans_as_flags(serve_help: str) -> None:
    entry = flag_help(serve_help, "--enable_batching")
    assert entry.startswith("--enable_batching merge")
    assert "ENABLE_BATCHING" not in serve_help and "[true|false]" not in serve_help
    assert "--flag=false" in serve_help  # ... and says how to turn one off


def test_serve_help_groups_flags(serve_help: str) -> None:
    groups = ["models:", "network and ports:", "batching:", "monitoring:", "workbench's own flags:"]
    at = [serve_help.index(f"\n{title}\n") for title in groups]
    assert at == sorted(at)
    members = {
        "models:": ["--model_name", "--model_base_path", "--model_config_file", "--enable_model_warmup"],
        "network and ports:": ["--port", "--rest_api_port", "--rest_api_enable_cors_support"],
        "batching:": ["--enable_batching", "--batching_parameters_file"],
        "monitoring:": ["--monitoring_config_file"],
        "workbench's own flags:": ["--model_repository", "--server_name", "--host", "--management_token"],
    }
    ends = [*at[1:], serve_help.index("\nexamples:")]
    for (title, flags), start, end in zip(members.items(), at, ends, strict=True):
        section = serve_help[start:end]
        for flag in flags:
            assert f"\n  {flag} " in section or f"\n  {flag}\n" in section, (title, flag)


def example_lines(text: str) -> list[str]:
    """The command lines under "examples:" (a trailing backslash continues one)."""
    examples = text.split("\nexamples:\n", 1)[1].split("\n\n")[0]
    return [line.strip() for line in examples.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.parametrize("command", [(), ("serve",), ("bench",), ("analyze",), ("routing",)])
def test_help_examples_are_real_command_lines(command: tuple[str, ...]) -> None:
    lines = example_lines(help_of(*command))
    assert len(lines) >= 2
    for line in lines:
        words = shlex.split(line)
        assert words[0] == "workbench"
        if command:
            assert words[1] == command[0]
        cli.build_parser().parse_args(words[1:])  # exits (failing the test) on anything it does not take


# -------------------------------------------------------------------------------------------------- magics
@pytest.mark.parametrize(
    ("sub", "alias", "name"),
    [
        ("start", "--name exp", "--server_name exp"),
        ("start", "--server exp", "--server_name exp"),
        ("start", "--server-name exp", "--server_name exp"),
        ("start", "--repo /m", "--model_repository /m"),
        ("start", "--repository /m", "--model_repository /m"),
        ("start", "--model-repository /m", "--model_repository /m"),
        ("start", "--rest-port 8501", "--rest_api_port 8501"),
        ("start", "--rest_port 8501", "--rest_api_port 8501"),
        ("start", "--rest-api-port 8501", "--rest_api_port 8501"),
        ("start", "--grpc-port 8500", "--port 8500"),
        ("start", "--grpc_port 8500", "--port 8500"),
        ("start", "--batching", "--enable_batching"),
        ("start", "--enable-batching", "--enable_batching=true"),
        ("start", "--batching-parameters /b", "--batching_parameters_file /b"),
        ("stop", "--server exp", "--server_name exp"),
        ("status", "--server exp", "--server_name exp"),
        ("predict", "m [[1.0]] --signature s", "m [[1.0]] --signature_name s"),
        ("predict", "m [[1.0]] --grpc", "m [[1.0]] --protocol grpc"),
        ("predict", "m [[1.0]] --server exp", "m [[1.0]] --server_name exp"),
        ("bench", "m [[1.0]] --clients 4", "m [[1.0]] --concurrency 4"),
        ("bench", "m [[1.0]] --signature s", "m [[1.0]] --signature_name s"),
        ("bench", "m [[1.0]] --grpc", "m [[1.0]] --protocol grpc"),
        ("dashboard", "--server exp", "--server_name exp"),
    ],
)
def test_magic_aliases_mean_the_same(sub: str, alias: str, name: str) -> None:
    assert parse_arguments(sub, alias.split()) == parse_arguments(sub, name.split())
    positionals = [word for word in alias.split() if not word.startswith("-")][
        : 2 if sub in ("predict", "bench") else 0
    ]
    assert parse_arguments(sub, alias.split()) != parse_arguments(sub, positionals)  # the alias did something


def test_magic_name_alias_is_the_servers_only_in_start() -> None:
    # In `%serve export MODEL_VAR NAME`, NAME is the model's: --name must not quietly mean the server there.
    with pytest.raises(UsageError, match="unrecognized option --name"):
        parse_arguments("export", ["model_var", "lin", "--name", "exp"])


@pytest.mark.parametrize(
    ("line", "suggestion"),
    [
        ("start --rest_api_prot 8501", "did you mean --rest_api_port?"),
        ("start --rest-api-prot 8501", "did you mean --rest_api_port?"),
        ("start --reop /m", "did you mean --model_repository?"),
        ("bench lin [[1.0]] --concurency 2", "did you mean --concurrency?"),
        ("bench lin [[1.0]] --clinets 2", "did you mean --concurrency?"),
        ("predict lin [[1.0]] --signatur s", "did you mean --signature_name?"),
        ("predict lin [[1.0]] --serve exp", "did you mean --server_name?"),
    ],
)
def test_magics_suggest_the_nearest_option(ipython_shell: InteractiveShell, line: str, suggestion: str) -> None:
    with pytest.raises(UsageError) as info:
        ipython_shell.run_line_magic("serve", line)
    message = str(info.value)
    sub = line.split()[0]
    assert message.startswith(f"%serve {sub}: unrecognized option ")
    assert suggestion in message and f"(%serve {sub} --help)" in message and "\n" not in message


def magic_help(ipython_shell: InteractiveShell, sub: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert ipython_shell.run_line_magic("serve", f"{sub} --help") is None
    return capsys.readouterr().out


def test_magic_help_uses_the_vocabulary_and_shows_defaults(
    ipython_shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    start = magic_help(ipython_shell, "start", capsys)
    for flag in ("--server_name", "--model_repository", "--rest_api_port", "--port", "--batching_parameters_file"):
        assert f"  {flag} " in start, flag
    assert "--repo " not in start and "--rest-port" not in start and "--name " not in start
    assert "(default: default)" in flag_help(start, "--server_name")
    assert "(default: workbench-models)" in flag_help(start, "--model_repository")
    assert flag_help(start, "--enable_batching").startswith("--enable_batching dynamic batching")
    assert "--rest-api-port" in start  # says dashes work too
    bench_help = magic_help(ipython_shell, "bench", capsys)
    assert "(default: rest)" in flag_help(bench_help, "--protocol")
    assert "(default: 1)" in flag_help(bench_help, "--concurrency")
    assert f"(default: {DEFAULT_DURATION_S:g})" in flag_help(bench_help, "--duration")


# ------------------------------------------------------------------------------------------- bench defaults
def test_bench_defaults_are_the_same_on_the_command_line_and_in_magics() -> None:
    on_cli = parse_cli("bench", *BENCH_REQUIRED)
    in_magic = vars(parse_arguments("bench", ["m", "[[1.0]]"]))
    for options in (on_cli, in_magic):
        assert options["protocol"] == DEFAULT_PROTOCOL == "rest"
        assert perf.concurrency_levels(options["concurrency"]) == [DEFAULT_CONCURRENCY] == [1]
        clients = perf.concurrency_levels(options["concurrency"])[0]
        assert resolve_load(clients, options["duration"], options["requests"]) == (5.0, None)
    parameters = inspect.signature(bench.run_load_async).parameters
    assert parameters["concurrency"].default == DEFAULT_CONCURRENCY
    assert parameters["duration"].default == DEFAULT_DURATION_S


@pytest.mark.parametrize(
    ("cli_words", "magic_words", "says"),
    [
        (["--concurrency=0"], ["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--duration=1", "--requests=5"], ["--duration", "1", "--requests", "5"], "not both"),
        (["--duration=0"], ["--duration", "0"], "must be positive"),
    ],
)
def test_bench_refuses_the_same_mistakes_alike(
    capsys: pytest.CaptureFixture[str], ipython_shell: InteractiveShell, cli_words, magic_words, says: str
) -> None:
    assert cli.main(["bench", *BENCH_REQUIRED, *cli_words]) == 2
    assert says in capsys.readouterr().err
    with pytest.raises(UsageError, match=says):  # refused before any server is looked for
        ipython_shell.run_line_magic("serve", " ".join(["bench", "m", "[[1.0]]", *magic_words]))


def test_bench_command_line_defaults_to_rest(serve, make_repo, capsys: pytest.CaptureFixture[str]) -> None:
    server = serve(model_base_path=str(make_repo("half_plus_two", {1: "hp2_tf2"})), model_name="half_plus_two")
    # The help's example, aimed at this server's REST port: host:port with no scheme and no --protocol is REST.
    example = next(line for line in example_lines(help_of("bench")) if "--protocol" not in line)
    words = shlex.split(example.replace("localhost:8501", server.rest_url.removeprefix("http://")))
    assert cli.main([*words[1:], "--requests=20", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["protocol"], summary["requests"], summary["errors"], summary["concurrency"]) == ("rest", 20, 0, 1)


# -------------------------------------------------------------------------------------------------- Python
def test_signatures_show_the_new_names_only() -> None:
    for function in (workbench.serve, ServerHandle.__init__):
        parameters = inspect.signature(function).parameters
        for old, new in SERVER_KEYWORD_ALIASES.items():
            assert new in parameters and old not in parameters, (function, old)
    for method in (Client.predict, Client.classify, Client.regress):
        parameters = inspect.signature(method).parameters
        assert "signature_name" in parameters and "signature" not in parameters
    parameters = inspect.signature(bench.run_load_async).parameters
    assert "concurrency" in parameters and "signature_name" in parameters and "clients" not in parameters


def command_of(handle: ServerHandle) -> list[str]:
    """The server's command line without what differs per handle (its ready file)."""
    return [word for word in handle.command() if not word.startswith("--ready_file=")]


@pytest.mark.parametrize(
    ("old", "value"),
    [
        ("repository", Path("models")),
        ("name", "exp"),
        ("rest_port", 8501),
        ("grpc_port", 8500),
        ("batching", True),
        ("batching_parameters", Path("batching.config")),
        ("poll_seconds", 0.25),
    ],
)
def test_server_handle_takes_the_old_keywords(tmp_path: Path, old: str, value: Any) -> None:
    if isinstance(value, Path):
        value = tmp_path / value
    new = SERVER_KEYWORD_ALIASES[old]
    by_old, by_new, plain = ServerHandle(**{old: value}), ServerHandle(**{new: value}), ServerHandle()
    assert command_of(by_old) == command_of(by_new) != command_of(plain)
    assert getattr(by_old, new) == getattr(by_new, new)


def test_both_names_at_once_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="got both rest_api_port= and its old name rest_port="):
        ServerHandle(rest_port=1, rest_api_port=2)


def test_rest_api_port_0_is_refused_in_a_notebook() -> None:
    # 0 is "REST off" on the command line, as in TF Serving; a notebook's handle needs REST to manage its server.
    with pytest.raises(ValueError, match="rest_api_port=0 would turn REST off"):
        workbench.serve(rest_api_port=0)


@pytest.fixture(scope="module")
def old_style_server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerHandle]:
    """A server started with every earlier keyword name, on ports it was given."""
    repository = tmp_path_factory.mktemp("vocabulary") / "models"
    shutil.copytree(model_store / "hp2_tf1", repository / "hp" / "1")
    rest, grpc = free_port(), free_port()
    handle = workbench.serve(repository=repository, name="old-style", rest_port=rest, grpc_port=grpc)
    try:
        yield handle
    finally:
        handle.stop()


def test_old_keywords_start_the_same_server(old_style_server: ServerHandle) -> None:
    handle = old_style_server
    assert handle.server_name == handle.name == "old-style"
    assert handle.rest_api_port == handle.rest_port and handle.port == handle.grpc_port
    assert handle.model_repository == handle.repository and handle.model_repository.name == "models"
    assert handle.wait_for_version("hp", 1) == 1
    answer = requests.post(
        f"http://127.0.0.1:{handle.rest_api_port}/v1/models/hp:predict", json={"instances": [[2.0]]}, timeout=60
    )
    assert answer.json() == {"predictions": [[3.0]]}
    assert handle.client.predict("hp", [[2.0]], protocol="grpc")["y"].tolist() == [[3.0]]  # on the gRPC port given


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_client_takes_signature_for_signature_name(old_style_server: ServerHandle, protocol: str) -> None:
    client = old_style_server.client
    old_style_server.wait_for_version("hp", 1)
    by_old = client.regress("hp", [{"x": 2.0}], signature="regress_x_to_y2", protocol=protocol)
    by_new = client.regress("hp", [{"x": 2.0}], signature_name="regress_x_to_y2", protocol=protocol)
    default = client.regress("hp", [{"x": 2.0}], signature_name="regress_x_to_y", protocol=protocol)
    assert by_old == by_new == [4.0] != default
    predicted = client.predict("hp", np.array([[2.0]], "float32"), signature="serving_default", protocol=protocol)
    assert predicted["y"].tolist() == [[3.0]]


def test_bench_functions_take_the_magics_old_names(old_style_server: ServerHandle) -> None:
    inputs = {"x": np.array([[1.0]], "float32")}
    result = run_load(
        old_style_server.rest_url, "rest", "hp", inputs, clients=2, signature="serving_default", requests=10
    )
    assert (result.concurrency, result.requests, result.errors) == (2, 10, 0)


def test_magic_start_with_old_options_starts_that_server(
    ipython_shell: InteractiveShell, tmp_path: Path, model_store: Path
) -> None:
    repository = tmp_path / "models"
    shutil.copytree(model_store / "hp2_tf1", repository / "hp" / "1")
    rest, grpc = free_port(), free_port()
    handle = ipython_shell.run_line_magic(
        "serve", f"start --name old-magic --repo {repository} --rest-port {rest} --grpc-port {grpc}"
    )
    try:
        assert (handle.server_name, handle.rest_api_port, handle.port) == ("old-magic", rest, grpc)
        assert handle.model_repository == repository.resolve()
        handle.wait_for_version("hp", 1)
        answer = ipython_shell.run_line_magic(
            "serve", "predict hp [[2.0]] --server old-magic --signature serving_default"
        )
        assert answer["y"].tolist() == [[3.0]]
        result = ipython_shell.run_line_magic("serve", "bench hp [[1.0]] --server old-magic --clients 2 --requests 10")
        assert (result.protocol, result.concurrency, result.requests, result.errors) == ("rest", 2, 10, 0)
    finally:
        ipython_shell.run_line_magic("serve", "stop --server-name old-magic")
    assert not handle.running
