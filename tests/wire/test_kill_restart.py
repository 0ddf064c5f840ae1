"""A notebook server killed with SIGKILL while clients load it, then restarted from its handle.

What a user sees when the OOM killer (or ``kill -9``) takes the server out from under a notebook: the clients'
requests fail at once with connection errors (UNAVAILABLE), never hang; the handle says the server died, by which
signal, with the end of its log; ``restart()`` (or ``%serve restart``) brings it back on the same REST and gRPC
ports, so the clients made for the old server work again unchanged, with the same routing (promotion, canary,
labels), read back from the repository's ``routing.json``.

Real ``workbench serve`` processes on free ports, real SavedModels, the real notebook client over REST and gRPC.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from waiting import wait_until

import workbench
from workbench.client import Client
from workbench.core.errors import Code, ServingError
from workbench.notebook.handle import ServerDied, ServerHandle

STABLE, CANARY = 1, 2
ANSWER = {STABLE: 2.5, CANARY: 3.5}  # y for x = 1: v1 is 0.5x + 2, v2 is 0.5x + 3
CANARY_WEIGHT = 0.5
START_TIMEOUT_S = 240.0  # a fresh Python importing TensorFlow on a loaded 2-core machine
CLIENT_TIMEOUT_S = 30.0  # a request that hangs instead of failing ends with "timed out" / DEADLINE_EXCEEDED


@pytest.fixture
def repository(tmp_path: Path, model_store: Path) -> Path:
    """``m`` v1 (0.5x + 2) and v2 (0.5x + 3)."""
    root = tmp_path / "repo"
    for version, stored in {STABLE: "hp2_tf2", CANARY: "hp3_tf2"}.items():
        shutil.copytree(model_store / stored, root / "m" / str(version))
    return root


@pytest.fixture
def handle(repository: Path) -> Iterator[ServerHandle]:
    """A server with routing set through its client: v1 promoted to stable, v2 the canary for half the traffic."""
    server = workbench.serve(repository, server_name="killed", timeout=START_TIMEOUT_S)
    try:
        server.wait_for_version("m", CANARY, timeout=120)
        assert server.client.promote("m", STABLE)["stable"] == STABLE
        server.wait_for_state("m", STABLE, "AVAILABLE", timeout=120)
        assert server.client.canary("m", CANARY, CANARY_WEIGHT)["canary"] == {"version": CANARY, "weight": 0.5}
        yield server
    finally:
        server.stop()


def routing_of(server: ServerHandle) -> tuple[int | None, object, dict[str, list[str]]]:
    """The model's stable version, its canary, and each version's labels, as the server reports them."""
    doc = server.client.model("m")
    labels = {str(v["version"]): sorted(v["labels"]) for v in doc["versions"] if v["labels"]}
    return doc["stable"], doc["canary"], labels


class Load(threading.Thread):
    """One notebook client predicting ``m`` in a loop until stopped; every answer or error kept in order."""

    def __init__(self, client: Client, protocol: str, label: str | None) -> None:
        super().__init__(daemon=True, name=f"load-{protocol}-{label or 'default'}")
        self.client, self.protocol, self.label = client, protocol, label
        self.outcomes: list[float | ServingError] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                answer = self.client.predict("m", [[1.0]], label=self.label, protocol=self.protocol)
                self.outcomes.append(float(answer["y"].item()))
            except ServingError as exc:  # the client's one error type: a connection error is UNAVAILABLE
                self.outcomes.append(exc)

    def expected(self) -> set[float]:
        if self.label == "stable":
            return {ANSWER[STABLE]}
        if self.label == "canary":
            return {ANSWER[CANARY]}
        return {ANSWER[STABLE], ANSWER[CANARY]}  # the default traffic, split by the canary

    def answers_since(self, start: int) -> list[float]:
        return [o for o in self.outcomes[start:] if isinstance(o, float)]

    def errors_since(self, start: int) -> list[ServingError]:
        return [o for o in self.outcomes[start:] if isinstance(o, ServingError)]

    def answered(self, start: int, count: int) -> bool:
        return len(self.answers_since(start)) >= count

    def failed(self, start: int, count: int) -> bool:
        return len(self.errors_since(start)) >= count

    def stop(self) -> None:
        self._stopping.set()
        # Every request in flight ends within the client's timeout, failure or not: a thread still alive after
        # that hangs.
        self.join(CLIENT_TIMEOUT_S + 30)
        assert not self.is_alive(), f"{self.name} still waits for an answer"


def start_load(clients: dict[str, Client]) -> list[Load]:
    """REST and gRPC clients, for the default route (the canary's split) and for each label."""
    plan = [("rest", None), ("grpc", None), ("rest", "stable"), ("grpc", "canary")]
    loads = [Load(clients[protocol], protocol, label) for protocol, label in plan]
    for load in loads:
        load.start()
    return loads


def wait_for_answers(loads: list[Load], since: list[int], count: int = 5) -> None:
    for load, start in zip(loads, since, strict=True):
        wait_until(partial(load.answered, start, count), timeout=120, what=f"{load.name} to be answered")
        assert set(load.answers_since(start)) <= load.expected(), (load.name, load.outcomes[start:][:20])


def test_a_killed_server_is_reported_with_its_log_and_restarts_on_its_ports_with_its_routing(
    handle: ServerHandle,
) -> None:
    rest_api_port, grpc_port, old_pid = handle.rest_api_port, handle.port, handle.pid
    assert old_pid is not None
    routing = routing_of(handle)
    assert routing == (STABLE, {"version": CANARY, "weight": 0.5}, {"1": ["stable"], "2": ["canary"]})
    # Clients made once for this server, as a notebook cell makes them; they must work again after the restart.
    clients = {
        "rest": Client(handle.rest_url, protocol="rest", timeout=CLIENT_TIMEOUT_S),
        "grpc": Client(grpc=handle.grpc_target, protocol="grpc", timeout=CLIENT_TIMEOUT_S),
    }
    loads = start_load(clients)
    try:
        wait_for_answers(loads, [0] * len(loads))

        killed_at = [len(load.outcomes) for load in loads]
        os.kill(old_pid, signal.SIGKILL)

        # Every client's requests fail, each at once with a connection error: UNAVAILABLE, not a timeout.
        for load, start in zip(loads, killed_at, strict=True):
            wait_until(partial(load.failed, start, 3), timeout=60, what=f"{load.name} to fail")
    finally:
        for load in loads:
            load.stop()
    for load, start in zip(loads, killed_at, strict=True):
        errors = load.errors_since(start)
        assert all(error.code == Code.UNAVAILABLE for error in errors), (load.name, errors[:5])
        assert not any("timed out" in error.message.lower() for error in errors), (load.name, errors[:5])
        assert load.outcomes[-1] in errors, f"{load.name} was answered after the kill: {load.outcomes[-5:]}"

    # The handle says what happened: by which signal, with the end of the log.
    wait_until(lambda: not handle.running, timeout=30, what="the killed server to be reaped")
    assert handle.exit_code == -signal.SIGKILL
    with pytest.raises(ServerDied) as died:
        handle.check()
    message = str(died.value)
    assert message.startswith(f"workbench server 'killed' exited with code {-signal.SIGKILL} (killed by SIGKILL):\n")
    tail = handle.log_tail()
    assert tail.strip() and message.endswith(tail), message
    assert died.value.exit_code == -signal.SIGKILL and died.value.log_tail == tail
    assert "died: exited with code -9 (killed by SIGKILL)" in repr(handle)
    assert str(handle.log_path) in repr(handle)
    assert "killed by SIGKILL" in handle._repr_html_()
    with pytest.raises(ServerDied, match="killed by SIGKILL"):
        handle.client  # noqa: B018 - the property checks the server first

    handle.restart(timeout=START_TIMEOUT_S)
    assert handle.running and handle.pid != old_pid
    assert (handle.rest_api_port, handle.port) == (rest_api_port, grpc_port)
    assert handle.client.health()["pid"] == handle.pid
    assert routing_of(handle) == routing  # read back from the repository's routing.json

    # The very clients of before reach the new server: the same ports, the same answers per route.
    loads = start_load(clients)
    try:
        wait_for_answers(loads, [0] * len(loads))
    finally:
        for load in loads:
            load.stop()
        for client in clients.values():
            client.close()
    assert handle.client.predict("m", [[1.0]], label="stable")["y"].item() == ANSWER[STABLE]
    assert handle.client.predict("m", [[1.0]], label="canary", protocol="grpc")["y"].item() == ANSWER[CANARY]


def test_the_magic_restarts_a_killed_server_by_name(ipython_shell, repository: Path) -> None:  # type: ignore[no-untyped-def]
    server = workbench.serve(repository, server_name="magic-killed", timeout=START_TIMEOUT_S)
    try:
        server.wait_for_version("m", CANARY, timeout=120)
        server.client.promote("m", STABLE)
        server.wait_for_state("m", STABLE, "AVAILABLE", timeout=120)
        ports, pid = (server.rest_api_port, server.port), server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not server.running, timeout=30, what="the killed server to be reaped")

        with pytest.raises(UsageError) as died:
            ipython_shell.run_line_magic("serve", "status --server_name magic-killed")
        assert "exited with code -9 (killed by SIGKILL)" in str(died.value)

        restarted = ipython_shell.run_line_magic("serve", "restart magic-killed")
        assert restarted is server and server.running and server.pid != pid
        assert (server.rest_api_port, server.port) == ports
        assert server.client.model("m")["stable"] == STABLE
        assert server.client.predict("m", [[1.0]])["y"].item() == ANSWER[STABLE]
    finally:
        server.stop()
