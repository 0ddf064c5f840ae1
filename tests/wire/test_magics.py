"""``%serve`` through IPython's shell against one real server: start, export, promote/rollback/canary, predict,
bench, help texts and one-line errors. Also measures start-to-first-answer (printed; run with ``-s`` to see it), and
checks that the kernel answers cells while a full load runs in it."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from waiting import wait_until

from workbench.client import Prediction
from workbench.client.bench import BenchResult, run_load_async
from workbench.notebook import magics
from workbench.notebook.handle import ServerHandle, models_table_text, running_servers
from workbench.runtime.loop import new_event_loop

SUBCOMMANDS = [
    "start", "stop", "restart", "status", "export", "promote", "rollback", "canary", "shadow", "predict", "chat",
    "bench", "batch", "analyze", "dashboard", "logs", "profile", "manifests",
]  # fmt: skip
V1, V2 = 3.0, 10.0  # answers to x=1 of model_v1 (2x + 1) and model_v2 (10x)


def linear(weight: float, bias: float) -> Any:
    """A Keras 3 functional model y = weight * x + bias with a named input ``x`` and output ``y``."""
    import keras

    x = keras.Input((1,), name="x")
    model = keras.Model(x, keras.layers.Dense(1, name="y")(x))
    model.get_layer("y").set_weights([np.array([[weight]], "float32"), np.array([bias], "float32")])
    return model


@pytest.fixture(scope="module")
def ip(ipython_shell: InteractiveShell) -> InteractiveShell:
    return ipython_shell


def serve(ip: InteractiveShell, line: str) -> Any:
    return ip.run_line_magic("serve", line)


@pytest.fixture(scope="module")
def served(ip: InteractiveShell, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A server started with ``%serve start`` on a fresh repository, with ``lin`` v1 and v2 exported by magics."""
    repo = tmp_path_factory.mktemp("magics-repo")
    ip.user_ns["model_v1"], ip.user_ns["model_v2"] = linear(2.0, 1.0), linear(10.0, 0.0)
    started = time.perf_counter()
    handle = serve(ip, f"start --repo {repo}")
    try:
        up = time.perf_counter()
        first = serve(ip, "export model_v1 lin")
        exported = time.perf_counter()
        answer = serve(ip, "predict lin [[1.0]]")
        answered = time.perf_counter()
        print(
            f"\n%serve start → first answer: {answered - started:.2f} s "
            f"(start {up - started:.2f} s, export {exported - up:.2f} s, first predict {answered - exported:.3f} s)"
        )
        second = serve(ip, "export model_v2 lin")
        handle.client.load("lin", 1)  # pin v1, so tests may ask either version whatever order they run in
        yield SimpleNamespace(handle=handle, repo=repo, exports=(first, second), first_answer=answer)
    finally:
        serve(ip, "stop --all")
    assert not handle.running


def lin(handle: ServerHandle) -> dict[str, Any]:
    return handle.client.model("lin")


def one_line_error(ip: InteractiveShell, line: str) -> str:
    with pytest.raises(UsageError) as info:
        serve(ip, line)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


# ---------------------------------------------------------------------------------------------------- help
@pytest.mark.parametrize("line", ["", "--help"])
def test_serve_alone_lists_every_subcommand(ip: InteractiveShell, line: str, capsys: pytest.CaptureFixture) -> None:
    assert serve(ip, line) is None
    out = capsys.readouterr().out
    listed = [row.split()[0] for row in out.splitlines() if row.startswith("  ")]
    assert listed == SUBCOMMANDS


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_has_help(ip: InteractiveShell, sub: str, capsys: pytest.CaptureFixture) -> None:
    assert serve(ip, f"{sub} --help") is None
    out = capsys.readouterr().out
    assert out.startswith(f"usage: %serve {sub}")
    assert "::" not in out and "%%" not in out  # plain text, not IPython's reST docstring format


# ------------------------------------------------------------------------------------------ start / status
def test_start_again_returns_the_running_server(
    ip: InteractiveShell, served: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    handle = served.handle
    assert handle.running and handle.repository == served.repo.resolve()
    assert serve(ip, "start") is handle
    assert serve(ip, f"start --repo {tmp_path}") is handle  # no second server; it says where the running one is
    assert "already runs on" in capsys.readouterr().out
    assert handle.running and handle.repository == served.repo.resolve()
    assert "<table>" in handle._repr_html_()
    ip.run_line_magic("reload_ext", "workbench")  # new code, same servers
    assert serve(ip, "start") is handle


def test_status_shows_models_as_stable_text_and_html(ip: InteractiveShell, served: SimpleNamespace) -> None:
    everything = serve(ip, "status")
    assert repr(everything) == models_table_text(served.handle.models())
    one = serve(ip, "status lin --server default")
    assert repr(one) == models_table_text([lin(served.handle)])
    assert "127.0.0.1" not in repr(one) and str(served.repo) not in repr(one)  # nothing that changes per run
    assert "<table>" in one._repr_html_() and "lin" in one._repr_html_()


# ---------------------------------------------------------------------------------------------------- export
def test_export_waits_until_the_version_serves(served: SimpleNamespace) -> None:
    first, second = served.exports
    assert (first.export.version, second.export.version) == (1, 2)
    assert first.export.path == served.repo / "lin" / "1"
    assert repr(second).splitlines()[0] == "exported lin v2 (x: float32[?, 1]) -> (y: float32[?, 1])"
    assert "v2    AVAILABLE" in repr(second)
    assert isinstance(served.first_answer, Prediction)
    assert served.first_answer["y"].tolist() == [[V1]]
    assert [v["state"] for v in lin(served.handle)["versions"]] == ["AVAILABLE", "AVAILABLE"]


def test_export_with_examples_and_explicit_version(ip: InteractiveShell, served: SimpleNamespace) -> None:
    ip.user_ns["warm"] = {"x": np.array([[1.0], [2.0]], "float32")}
    shown = serve(ip, "export model_v1 other --version 7 --examples warm")
    assert shown.export.version == 7 and shown.export.warmup_records == 1
    assert (served.repo / "other" / "7" / "assets.extra" / "tf_serving_warmup_requests").is_file()
    assert serve(ip, "predict other [[1.0]] --server default")["y"].tolist() == [[V1]]


# --------------------------------------------------------------------------------- promote / rollback / canary
def test_promote_rollback_canary_change_the_server(ip: InteractiveShell, served: SimpleNamespace) -> None:
    handle = served.handle

    def labels(model: dict[str, Any]) -> dict[int, list[str]]:
        return {v["version"]: v["labels"] for v in model["versions"]}

    def shares(model: dict[str, Any]) -> dict[int, float]:
        return {v["version"]: v["traffic_share"] for v in model["versions"]}

    shown = serve(ip, "promote lin 1")
    model = lin(handle)
    assert model["stable"] == 1 and model["default_version"] == 1 and labels(model)[1] == ["stable"]
    assert repr(shown).startswith("promoted lin v1 to stable\n") and "labels=stable" in repr(shown)
    assert serve(ip, "predict lin [[1.0]]")["y"].tolist() == [[V1]]
    assert serve(ip, "predict lin [[1.0]] --label stable --grpc")["y"].tolist() == [[V1]]

    serve(ip, "promote lin 2")
    assert lin(handle)["default_version"] == 2
    assert serve(ip, "predict lin [[1.0]]")["y"].tolist() == [[V2]]

    shown = serve(ip, "rollback lin")
    model = lin(handle)
    assert model["stable"] == 1 and model["default_version"] == 1 and labels(model)[1] == ["stable"]
    assert repr(shown).startswith("rolled lin back to v1\n")
    assert serve(ip, "predict lin [[1.0]]")["y"].tolist() == [[V1]]

    shown = serve(ip, "canary lin 2 0.25")
    model = lin(handle)
    assert model["canary"] == {"version": 2, "weight": 0.25}
    assert shares(model) == {1: 0.75, 2: 0.25} and labels(model)[2] == ["canary"]
    assert "traffic=25%" in repr(shown) and "traffic=75%" in repr(shown)

    shown = serve(ip, "canary lin 2 0")
    model = lin(handle)
    assert model["canary"] is None and shares(model) == {1: 1.0, 2: 0.0}
    assert repr(shown).startswith("canary of lin ended\n")

    # Nothing left to roll back to: the server says so, in one line.
    assert "no previous stable version" in one_line_error(ip, "rollback lin")


# ---------------------------------------------------------------------------------------------------- predict
@pytest.mark.parametrize("protocol", ["", "--grpc", "--protocol v2-rest", "--protocol v2-grpc"])
def test_predict_from_variables_and_json(
    ip: InteractiveShell, served: SimpleNamespace, protocol: str, capsys: pytest.CaptureFixture
) -> None:
    ip.user_ns["batch"] = np.array([[1.0], [2.0]])  # float64: the client casts to the signature's float32
    ip.user_ns["feeds"] = {"x": [[1.0]]}
    want = protocol.split()[-1].removeprefix("--") if protocol else "rest"
    cases = {
        "batch --version 1": [[3.0], [5.0]],
        "feeds --version 2": [[V2]],
        """'{"x": [[1.0]]}' --version 1""": [[V1]],
        '{"x":[[2.0]]} --version 2': [[20.0]],  # unquoted JSON stays intact (no {expression} expansion)
        "[[1.0]] --version 2": [[V2]],
        "[[1.0], [2.0]] --version 1": [[3.0], [5.0]],  # spaces without quotes: the words are one DATA
    }
    for data, expected in cases.items():
        answer = serve(ip, f"predict lin {data} {protocol}")
        assert isinstance(answer, Prediction) and answer.protocol == want
        assert answer["y"].dtype == np.float32 and answer["y"].tolist() == expected, data
        assert answer.latency_ms > 0
    assert capsys.readouterr() == ("", "")  # the server never prints into the cell


# ------------------------------------------------------------------------------------------------------ bench
@pytest.mark.parametrize(
    ("protocol", "want"),
    [("", "rest"), ("--grpc", "grpc"), ("--protocol v2-rest", "v2-rest"), ("--protocol v2-grpc", "v2-grpc")],
)
def test_bench_a_number_of_requests(
    ip: InteractiveShell, served: SimpleNamespace, protocol: str, want: str, capsys: pytest.CaptureFixture
) -> None:
    result = serve(ip, f"bench lin [[1.0]] --requests 50 --clients 2 {protocol}")
    assert isinstance(result, BenchResult)
    assert (result.requests, result.errors, result.protocol) == (50, 0, want)
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == list(result.summary()) and len(table) == 2


def test_batch_scores_a_file_with_the_servers_models_by_version(
    ip: InteractiveShell, served: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from workbench.batch_prediction import formats

    np.save(tmp_path / "x.npy", np.array([[1.0], [2.0], [3.0]], dtype=np.float32))
    latest = serve(ip, f"batch lin --input {tmp_path / 'x.npy'} --output {tmp_path / 'latest'} --model_version 2")
    pinned = serve(ip, f"batch lin --input {tmp_path / 'x.npy'} --output {tmp_path / 'v1'} --model_version 1")
    assert (latest.version, pinned.version, latest.rows_out) == (2, 1, 3)
    assert "3 rows scored, 0 failed, by lin version 2" in capsys.readouterr().out
    # Without a version: the one the server's routing sends requests naming none to (its promotions hold).
    default = serve(ip, f"batch lin --input {tmp_path / 'x.npy'} --output {tmp_path / 'default'}")
    assert default.version == served.handle.client.predict("lin", [[1.0]]).version
    for folder, (weight, bias) in (("latest", (10.0, 0.0)), ("v1", (2.0, 1.0))):
        answers = formats.read_rows(str(tmp_path / folder / "part-00000.npz"), "npz", 0, 3)
        assert answers["row"].tolist() == [0, 1, 2]
        assert answers["y"].ravel().tolist() == [weight * x + bias for x in (1.0, 2.0, 3.0)]


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("frobnicate", "unknown subcommand 'frobnicate'"),
        ("stat", "did you mean 'start' or 'status'"),
        ("predict lin", "the following arguments are required: DATA"),
        ("promote lin two", "invalid int value: 'two'"),
        ("predict lin no_such_var", "no variable 'no_such_var'"),
        ("predict lin {not json", "neither a variable nor JSON"),
        ("predict lin 'unclosed", "cannot split the line"),
        ("predict lin [[1.0]] --server nope", "no workbench server named 'nope'"),
        ("predict nosuch [[1.0]]", "NOT_FOUND"),
        ("predict lin [[1.0]] --version 99", "NOT_FOUND"),
        ("""predict lin '{"z": [[1.0]]}'""", "has no input 'z'"),
        ("predict lin [[1.0]] --version 1 --label stable", "not both"),
        ("status nosuch", "NOT_FOUND"),
        ("promote lin 99", "NOT_FOUND: Model lin has no version 99"),
        ("canary lin 2 1.5", "WEIGHT must be from 0 to 1"),
        ("export no_such_var lin", "no variable 'no_such_var'"),
        ("export not_a_model broken", "%serve export: Cannot export a builtins.int"),
        ("export model_v1 lin --version 1", "Version 1 of model 'lin' already exists"),
        ("bench lin [[1.0]] --duration 1 --requests 5", "not both"),
        ("bench lin [[1.0]] --clients 0", "at least 1"),
        ("bench lin [[1.0]] --duration 0", "must be positive"),
        ("batch lin --input /no/such/file.csv --output /tmp/x", "/no/such/file.csv"),
        ("batch lin --input x.csv --output o --columns x", "--columns takes column=input pairs, not 'x'"),
        ("start --batching-parameters /no/such/file", "no batching parameters file"),
        ("stop nope", "no workbench server named 'nope'"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(
    ip: InteractiveShell, served: SimpleNamespace, line: str, says: str
) -> None:
    ip.user_ns["not_a_model"] = 42
    assert says in one_line_error(ip, line)
    assert served.handle.running


def test_without_a_server_start_is_suggested(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    lonely: Any = magics.ServeMagics(ip)  # a shell of its own that sees no server of this kernel
    monkeypatch.setattr(magics, "running_servers", list)
    for line in ("status", "predict lin [[1.0]]", "stop"):
        with pytest.raises(UsageError, match="no workbench server is running") as info:
            lonely.serve(line)
        assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="%serve start"):
        lonely.serve("status")
    assert lonely.serve("stop --all") is None


def fake_server(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """Make handles run ``script`` (with the ready file's path as ``READY``) instead of a real server."""
    real = ServerHandle.command

    def command(self: ServerHandle) -> list[str]:
        ready = next(a.split("=", 1)[1] for a in real(self) if a.startswith("--ready_file="))
        return [sys.executable, "-c", f"READY = {ready!r}\n{script}"]

    monkeypatch.setattr(ServerHandle, "command", command)


def test_a_server_that_cannot_start(ip: InteractiveShell, served: SimpleNamespace, monkeypatch) -> None:
    fake_server(monkeypatch, "print('workbench serve: port 1 is taken'); raise SystemExit(2)")
    message = one_line_error(ip, "start --name doomed")
    assert "could not start: workbench serve: port 1 is taken (log: " in message
    assert "doomed" not in {h.name for h in running_servers()} and served.handle.running


def test_start_may_allow_python_models(ip: InteractiveShell, served: SimpleNamespace, tmp_path: Path) -> None:
    # model.py is code from the repository: served only by a server started with --allow-python-models.
    (tmp_path / "double" / "1").mkdir(parents=True)
    (tmp_path / "double" / "1" / "model.py").write_text(
        "import workbench\n\n\nclass Double(workbench.PythonModel):\n"
        '    inputs = {"x": ("float32", [-1])}\n    outputs = {"y": ("float32", [-1])}\n\n'
        "    def predict(self, inputs):\n        return {'y': inputs['x'] * 2}\n"
    )
    handle = serve(ip, f"start --name py --repo {tmp_path} --allow-python-models")
    try:
        assert "--allow_python_models" in handle.command() and "--allow_pickle" not in handle.command()
        handle.wait_for_version("double", 1)
        assert serve(ip, "predict double [1.0, 2.5] --server py")["y"].tolist() == [2.0, 5.0]
    finally:
        serve(ip, "stop py")
    assert magics.parse_arguments("start", ["--allow_pickle"]).allow_pickle is True
    assert magics.parse_arguments("start", []).allow_python_models is False


def test_start_may_turn_the_response_cache_on(
    ip: InteractiveShell, served: SimpleNamespace, tmp_path: Path, model_store: Path
) -> None:
    for name in ("cached", "plain"):
        shutil.copytree(model_store / "hp2_tf2", tmp_path / name / "1")  # y = x / 2 + 2
    line = f"start --name cache --repo {tmp_path} --response_cache_bytes 1048576 --response_cache_models cached"
    handle = serve(ip, line)
    try:
        assert {"--response_cache_bytes=1048576", "--response_cache_models=cached"} <= set(handle.command())
        for model in ("cached", "plain"):
            handle.wait_for_version(model, 1)
            for _ in range(2):  # the same request twice: the second is the cache's, for the model that opted in
                assert serve(ip, f"predict {model} [1.0] --server cache")["y"].tolist() == [2.5]
        stats = handle.client.stats()["models"]
        assert (stats["cached"]["1"]["cache_hits"], stats["cached"]["1"]["cache_misses"]) == (1, 1)
        assert "cache_hits" not in stats["plain"]["1"]
    finally:
        serve(ip, "stop cache")
    assert magics.parse_arguments("start", []).response_cache_bytes == 0
    assert "--response_cache_bytes" not in " ".join(ServerHandle("repo").command())


def test_start_takes_a_number_of_workers() -> None:
    assert magics.parse_arguments("start", []).num_workers == "1"
    assert magics.parse_arguments("start", ["--num_workers", "auto"]).num_workers == "auto"
    handle = ServerHandle("repo", num_workers=magics.parse_arguments("start", ["--num_workers", "3"]).num_workers)
    assert "--num_workers=3" in handle.command()


def test_a_server_that_died(ip: InteractiveShell, served: SimpleNamespace, monkeypatch) -> None:
    # It says it is ready, then exits: as a server killed by the OOM killer would look.
    fake_server(
        monkeypatch,
        "import json, time\nopen(READY, 'w').write(json.dumps({'rest_port': 1, 'grpc_port': 2}))\ntime.sleep(1)",
    )
    handle = serve(ip, "start --name doomed")
    try:
        wait_until(lambda: not handle.running, what="the fake server to exit")
        message = one_line_error(ip, "status --server doomed")
        assert message.startswith("workbench server 'doomed' exited with code 0;")
        assert "handle.log_tail()" in message and "%serve start --name doomed" in message
        assert repr(serve(ip, "status lin")).startswith("lin")  # unnamed: the one server that still runs
        assert serve(ip, "start --name doomed") is handle and handle.running  # the same handle, started again
    finally:
        serve(ip, "stop doomed")
    assert not handle.running and served.handle.running


# ------------------------------------------------------------------------------------------- responsiveness
CELL_ROUND_TRIP_BOUND_S = 2.0  # far above the milliseconds a cell takes, and within what a person waits for


def lin_requests(handle: ServerHandle) -> tuple[int, int]:
    """(requests, errors) the server has answered for ``lin``, all versions together, since it started."""
    versions = handle.client.stats()["models"].get("lin", {}).values()
    return sum(v["total_requests"] for v in versions), sum(v["total_errors"] for v in versions)


def test_kernel_answers_every_cell_while_a_full_load_runs(ip: InteractiveShell, served: SimpleNamespace) -> None:
    """16 closed-loop clients run on a thread of the kernel (as a background bench would), with no end of their
    own, until 20 cells have run. Every cell answers within a bound a busy 2-core machine keeps (a kernel the
    load blocked would answer none while it runs), and the server answers load requests between each cell and
    the next and after the last, so the load really ran all along. Round trips are printed (run with ``-s``)."""
    handle = served.handle
    answered_before, errors_before = lin_requests(handle)
    loop = new_event_loop()
    load = loop.create_task(
        run_load_async(
            handle.rest_url, "rest", "lin", {"x": np.array([[1.0]], "float32")}, concurrency=16, requests=10**9
        )
    )

    def drive() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(load)

    thread = threading.Thread(target=drive, name="test-load", daemon=True)
    thread.start()
    try:
        answered = wait_until(
            lambda: (n := lin_requests(handle)[0]) > answered_before + 200 and n, what="the load past its warm-up"
        )
        round_trips: list[float] = []
        for _ in range(20):
            started = time.perf_counter()
            assert ip.run_cell("1+1", store_history=False).result == 2
            round_trips.append(time.perf_counter() - started)
            answered = wait_until(
                lambda last=answered: (n := lin_requests(handle)[0]) > last and n, what="load answered after a cell"
            )
        assert thread.is_alive() and not load.done()
        assert lin_requests(handle)[1] == errors_before
    finally:
        loop.call_soon_threadsafe(load.cancel)
        thread.join(30)
        loop.close()
    print(
        f"\nkernel round trips under load (16 clients, {answered - answered_before} requests answered): "
        f"median {statistics.median(round_trips) * 1000:.2f} ms, max {max(round_trips) * 1000:.2f} ms"
    )
    assert max(round_trips) < CELL_ROUND_TRIP_BOUND_S, f"a cell took {max(round_trips):.2f} s under load"


@pytest.mark.timeout(300)
def test_analyze_measures_the_served_model_and_draws_its_frontier(
    ip: InteractiveShell, served: SimpleNamespace, tmp_path: Path
) -> None:
    """``%serve analyze`` on the running server's model: each candidate served on its own, the chart drawn as the
    points come, the analysis returned, its files written; the running server is left as it was."""
    from workbench.analyzer import Analysis

    before = lin(served.handle)
    analysis = serve(
        ip,
        f"analyze lin [[1.0]] --max_batch_size 1,4 --batch_timeout_micros 0 --concurrency 1,4 "
        f"--measurement_interval 300 --output {tmp_path}",
    )
    assert isinstance(analysis, Analysis)
    assert len(analysis.points) == 4 and analysis.winner is not None
    assert {(p.candidate.max_batch_size, p.concurrency) for p in analysis.points} == {(1, 1), (1, 4), (4, 1), (4, 4)}
    assert (tmp_path / "report.html").is_file() and (tmp_path / "results.json").is_file()
    assert "<table" in analysis._repr_html_()
    assert lin(served.handle)["versions"] == before["versions"]


# ------------------------------------------------------------------------------------------------- profile
def test_profile_traces_the_server_for_tensorboard(
    ip: InteractiveShell, served: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """%serve profile takes a trace through the server's gRPC port while requests run; TensorBoard reads it."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    stop = threading.Event()

    def predict_meanwhile() -> None:
        while not stop.is_set():
            served.handle.client.predict("lin", [[1.0]], version=1)
            stop.wait(0.05)

    sender = threading.Thread(target=predict_meanwhile)
    sender.start()
    try:
        trace = serve(ip, f"profile --duration_ms 1000 --logdir {tmp_path / 'trace'}")
    finally:
        stop.set()
        sender.join()
    assert trace.name.endswith(".xplane.pb") and trace.is_relative_to(tmp_path / "trace" / "plugins" / "profile")
    assert xplane_pb2.XSpace.FromString(trace.read_bytes()).planes
    assert f"%tensorboard --logdir {tmp_path / 'trace'}" in capsys.readouterr().out
    assert "--duration_ms must be positive" in one_line_error(ip, "profile --duration_ms 0")
