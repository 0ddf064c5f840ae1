"""The dashboard parts built headless against a real server: buttons act through the management API, the query
panel answers, the load button drives the server, the chart fills from the live stats stream, and closing
leaves no thread behind."""

from __future__ import annotations

import ast
import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from test_response_cache import write_counter
from waiting import wait_until

from workbench.client import Client
from workbench.notebook.widgets import Dashboard, LiveChart, LoadPanel, QueryPanel, VersionsPanel, example_inputs

if TYPE_CHECKING:
    from jupyter_client.blocking.client import BlockingKernelClient


@pytest.fixture
def server(serve, make_repo, tmp_path):
    make_repo("hp", {1: "hp2_tf2", 2: "hp3_tf2"})
    return serve(model_repository=str(tmp_path / "models"), file_system_poll_wait_seconds=0.2)


@pytest.fixture
def client(server):
    with Client(server.rest_url, server.grpc_target) as c:
        yield c


def workbench_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("workbench-")
        and t.is_alive()
        and t.name.split("-")[1] in ("versions", "action", "chart", "query", "load")
    ]


def settle(status) -> str:
    return wait_until(lambda: status.value if ("done" in status.value or "c00" in status.value) else "", timeout=60)


def test_versions_panel_buttons_change_the_server(client):
    panel = VersionsPanel(client, refresh_seconds=0.2)
    try:
        assert panel.model.options == ("hp",)
        assert panel.version.options == (2, 1)
        assert "AVAILABLE" in panel.table.value

        panel.version.value = 1
        panel.promote_button.click()
        assert "done" in settle(panel.status)
        assert client.model("hp")["stable"] == 1
        assert client.predict("hp", [[2.0]], protocol="grpc").version == 1

        panel.version.value = 2
        panel.canary_weight.value = 0.25
        panel.canary_button.click()
        assert "done" in settle(panel.status)
        assert client.model("hp")["canary"] == {"version": 2, "weight": 0.25}
        # The table refreshes by itself from the server's state.
        wait_until(lambda: "25%" in panel.table.value and "canary" in panel.table.value)

        panel.version.value = 1
        panel.unload_button.click()  # the stable version cannot go: the error is shown, nothing changes
        assert "stable version" in settle(panel.status)
        assert client.model("hp")["stable"] == 1
        assert all(not b.disabled for b in panel.buttons)
    finally:
        panel.close()


def test_versions_panel_sees_a_new_export_without_a_click(client, model_store, tmp_path):
    import shutil

    panel = VersionsPanel(client, refresh_seconds=0.2)
    try:
        staging = tmp_path / "models" / "hp" / ".staging"
        shutil.copytree(model_store / "hp2_tf2", staging)
        staging.rename(tmp_path / "models" / "hp" / "3")
        wait_until(lambda: 3 in panel.version.options, timeout=60)
    finally:
        panel.close()


def test_query_panel_prefills_a_valid_example_and_sends_over_both_protocols(client):
    panel = QueryPanel(client)
    try:
        assert panel.signature.value == "serving_default"
        assert panel.inputs.value == '{"x": [[0.0]]}'
        for protocol in ("rest", "grpc"):
            panel.last = None
            panel.protocol.value = protocol
            panel.inputs.value = '{"x": [[2.0]]}'
            panel.send.click()
            wait_until(lambda: panel.last is not None)
            assert panel.last["y"].tolist() == [[4.0]]  # v2 is the latest: 0.5 * 2 + 3
            assert {"rest": "REST", "grpc": "gRPC"}[protocol] in panel.response.value and " ms" in panel.response.value
        panel.inputs.value = "not json"
        panel.send.click()
        assert "not JSON" in panel.status.value
    finally:
        panel.close()


def test_example_inputs_follow_the_signature(client):
    signature = client.signature("hp")
    assert example_inputs(signature) == {"x": [[0.0]]}
    classify = client.signature("hp", "classify_x_to_y")
    assert example_inputs(classify) == {"inputs": [""]}


def test_load_panel_runs_the_generator_and_shows_the_result(client):
    panel = LoadPanel(client)
    try:
        panel.model.value = "hp"
        panel.clients.value = 4
        panel.seconds.value = 1
        panel.start.click()
        wait_until(lambda: panel.last is not None, timeout=60)
        assert panel.last.requests > 0 and panel.last.errors == 0
        assert panel.progress.value == 1.0
        assert "requests_per_second" in panel.result.value
    finally:
        panel.close()


def test_live_chart_fills_from_the_stats_stream_and_stops(client):
    chart = LiveChart(client, window_seconds=5, interval=0.1, min_redraw_seconds=0.1)
    try:
        for _ in range(20):
            client.predict("hp", [[1.0]])
        wait_until(lambda: chart.points("hp", 2) >= 3, timeout=30)
        chart.redraw()
        names = {trace.name for trace in chart.figure.data}
        assert names == {"hp v2"}
        assert len(chart.figure.data) == 5  # p50, p95, p99, requests/s, mean batch size
        assert not chart.cache_row and len(chart.figure.layout.annotations) == 3  # no cache: no cache row
        assert not chart.generation_rows  # no text generator: no time to first token, no tokens/s
        assert chart.figure.data[3].y[-1] > 0  # requests/s
        assert chart.figure.data[4].y[-1] == 1.0  # unbatched: one request a call
        # The window is bounded: 5 s at 10 snapshots a second.
        wait_until(lambda: chart.points("hp", 2) == 50, timeout=30)
    finally:
        chart.close()
    assert chart.threads == []


def test_live_chart_titles_the_asynchronous_queue_once_the_server_has_one(serve, make_repo, tmp_path):
    make_repo("hp", {1: "hp2_tf2"})
    server = serve(model_repository=str(tmp_path / "models"), async_queue=f"sqlite://{tmp_path / 'q.sqlite'}")
    with Client(server.rest_url) as client:
        chart = LiveChart(client, window_seconds=5, interval=0.1, min_redraw_seconds=0.1)
        try:
            client.predict("hp", [[1.0]])
            wait_until(lambda: chart.points("hp", 1) >= 1, timeout=30)
            assert chart.async_queue is None  # no asynchronous request yet: no queue, no title
            client.predict_async("hp", [[1.0]]).result(timeout=60)
            wait_until(lambda: chart.async_queue == (0, 0.0), timeout=30)
            chart.redraw()
            assert chart.figure.layout.title.text == "asynchronous queue: 0 waiting"
        finally:
            chart.close()


@pytest.fixture
def cached_server(serve, tmp_path):
    """A server with the response cache on for "cached" and not for "plain" (two counting Python models)."""
    write_counter(tmp_path / "repo" / "cached" / "1", 2.0)
    write_counter(tmp_path / "repo" / "plain" / "1", 2.0)
    return serve(
        model_repository=str(tmp_path / "repo"),
        allow_python_models=True,
        response_cache_bytes=1 << 20,
        response_cache_models=("cached",),
    )


def test_live_chart_has_a_cache_hit_rate_row_when_the_server_caches(cached_server):
    with Client(cached_server.rest_url) as client:
        chart = LiveChart(client, window_seconds=5, interval=0.1, min_redraw_seconds=0.1)
        try:
            assert chart.cache_row
            titles = [annotation.text for annotation in chart.figure.layout.annotations]
            assert titles[3] == "response cache hit rate (%)"
            for _ in range(4):  # one miss, then three hits
                client.predict("cached", {"x": [[1.5]]})
            client.predict("plain", {"x": [[1.5]]})
            wait_until(lambda: chart.points("cached", 1) >= 3 and chart.points("plain", 1) >= 3, timeout=30)

            def drawn_rates(label: str) -> tuple[Any, ...]:
                chart.redraw()
                (trace,) = [t for t in chart.figure.data if t.name == label and t.yaxis == "y4"]
                return trace.y or ()

            # Cumulative: 3 hits of 4 lookups (snapshots taken meanwhile showed less).
            wait_until(lambda: drawn_rates("cached v1")[-1:] == (75.0,), what="the hit rate drawn")
            assert len(drawn_rates("cached v1")) >= 3
            assert len(chart.figure.data) == 12  # six a version: the five of every chart and the hit rate's
            assert set(drawn_rates("plain v1")) == {None}  # a model without the cache: no points on that row
        finally:
            chart.close()
    assert chart.threads == []


def test_dashboard_composes_the_parts_and_closing_stops_every_thread(client):
    dashboard = Dashboard(client, window_seconds=10)
    assert len(dashboard.widget.children) == 2
    assert dashboard.threads  # the versions poller and the chart's stream reader and painter
    dashboard.close()
    assert dashboard.threads == []
    wait_until(lambda: workbench_threads() == [], what="dashboard threads gone")


def test_serve_dashboard_magic(server, tmp_path, ipython_shell):
    """`%serve dashboard` builds the same Dashboard on a server the notebook started."""
    from IPython.core.error import UsageError

    import workbench

    ip = ipython_shell
    handle = workbench.serve(tmp_path / "models", name="dash")
    try:
        dashboard = ip.run_line_magic("serve", "dashboard --server dash --window 10")
        try:
            assert isinstance(dashboard, workbench.Dashboard)
            assert dashboard.versions.model.options == ("hp",)
        finally:
            dashboard.close()
        with pytest.raises(UsageError, match="--window must be positive"):
            ip.run_line_magic("serve", "dashboard --server dash --window 0")
    finally:
        handle.stop()


# ------------------------------------------------------------------------------------------- in a kernel
@pytest.fixture
def kernel() -> Iterator[BlockingKernelClient]:
    """A real IPython kernel in a child process, as a notebook's; the test talks to it as a frontend does."""
    from jupyter_client.manager import start_new_kernel

    manager, kernel_client = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        yield kernel_client
    finally:
        kernel_client.stop_channels()
        manager.shutdown_kernel(now=True)


def in_kernel(kernel: BlockingKernelClient, code: str, expression: str = "None") -> Any:
    """Run ``code`` as a cell of the kernel, then return ``expression`` (JSON-able) as the kernel sees it."""
    reply = kernel.execute_interactive(
        code,
        user_expressions={"value": f"__import__('json').dumps({expression})"},
        timeout=120,
        output_hook=lambda _: None,
    )
    content = reply["content"]
    assert content["status"] == "ok", "\n".join(content.get("traceback", []))
    value = content["user_expressions"]["value"]
    assert value["status"] == "ok", value
    return json.loads(ast.literal_eval(value["data"]["text/plain"]))


def test_in_a_kernel_every_widget_change_is_made_on_the_kernels_thread(server, client, kernel):
    """The polling, stream, ticker and action threads only fetch: the versions panel following a canary set from
    elsewhere, the chart's redraws and the load panel's progress and result are all made on the kernel's main
    thread, the one that applies the frontend's messages to the same widgets."""
    in_kernel(
        kernel,
        f"""
import threading
from workbench.notebook.widgets import LiveChart, LoadPanel, VersionsPanel
versions = VersionsPanel({server.rest_url!r}, refresh_seconds=0.1)
chart = LiveChart({server.rest_url!r}, interval=0.1, min_redraw_seconds=0.1)
load = LoadPanel({server.rest_url!r})
changes = []  # (trait, the thread that changed it)

def record(change):
    changes.append((change["name"], threading.current_thread().name))

for widget, traits in [
    (versions.table, ["value"]), (versions.canary_weight, ["value"]), (versions.version, ["value"]),
    (versions.routing, ["value"]), (chart.figure, ["_py2js_addTraces", "_py2js_update", "_py2js_restyle"]),
    (load.progress, ["value"]), (load.result, ["value"]), (load.status, ["value"]),
]:
    widget.observe(record, names=traits)
""",
    )
    assert in_kernel(kernel, "", "versions.canary_weight.value") == 0.0  # no canary yet

    client.canary("hp", 1, 0.3)  # from outside the panel, as %serve or the sidebar would
    wait_until(lambda: in_kernel(kernel, "", "versions.canary_weight.value") == 0.3, what="the slider following")
    assert in_kernel(kernel, "", "versions.version.value") == 1
    assert "canary v1 at 30%" in in_kernel(kernel, "", "versions.routing.value")

    in_kernel(kernel, "load.model.value, load.protocol.value, load.seconds.value = 'hp', 'rest', 1\nload.start.click()")
    wait_until(lambda: in_kernel(kernel, "", "load.last is not None"), timeout=60, what="the load's result")
    wait_until(lambda: in_kernel(kernel, "", "chart.points('hp', 1) >= 3"), timeout=60, what="snapshots")
    wait_until(lambda: in_kernel(kernel, "", "len(chart.figure.data) > 0"), what="the chart drawn")

    changes = in_kernel(kernel, "", "changes")
    traits = {trait for trait, _ in changes}
    assert {"value", "_py2js_addTraces"} <= traits
    threads = {thread for _, thread in changes}
    assert threads == {"MainThread"}, changes
    running = in_kernel(kernel, "", "sorted(t.name for t in threading.enumerate())")
    assert {"workbench-versions", "workbench-chart-stream", "workbench-chart-draw"} <= set(running)
    in_kernel(kernel, "versions.close(); chart.close(); load.close()")
