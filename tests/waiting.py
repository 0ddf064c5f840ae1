"""Polling helpers for tests that watch a live server change state (never a bare sleep as a readiness check)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Collection, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import requests

from workbench.runtime.process import available_cores

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.02, what: str | Callable[[], str] = ""
) -> T:
    """Call ``predicate`` until it returns something truthy (returned) or ``timeout`` passes (AssertionError).
    ``what`` names what was awaited; a callable is asked at the timeout, to say how things stood then."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = predicate()
        except requests.RequestException as exc:  # a server between states may refuse a connection once
            last = exc
        if last and not isinstance(last, Exception):
            return last  # type: ignore[return-value]
        if time.monotonic() > deadline:
            awaited = (what() if callable(what) else what) or repr(predicate)
            raise AssertionError(f"timed out after {timeout}s waiting for {awaited}; last value: {last!r}")
        time.sleep(interval)


def version_states(base_url: str, model: str) -> dict[str, str]:
    """``{"2": "AVAILABLE", "1": "END"}`` from the REST status API (empty when the model is unknown)."""
    r = requests.get(f"{base_url}/v1/models/{model}", timeout=10)
    if r.status_code != 200:
        return {}
    return {s["version"]: s["state"] for s in r.json()["model_version_status"]}


def states_are(base_url: str, model: str, expected: dict[str, str]) -> Callable[[], bool]:
    """A predicate: the model's versions are exactly ``expected`` (version → state)."""
    return lambda: version_states(base_url, model) == expected


def place_atomically(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Copy ``source`` (a folder) to ``target`` through a hidden sibling and one rename, as exporters should."""
    target = Path(target)
    staging = target.parent / f".staging-{target.name}-{uuid.uuid4().hex}"
    shutil.copytree(source, staging)
    os.replace(staging, target)
    return target


def remove_atomically(target: str | os.PathLike[str]) -> None:
    """Rename a version folder out of sight (one rename), then delete it."""
    target = Path(target)
    hidden = target.parent / f".removed-{target.name}-{uuid.uuid4().hex}"
    os.replace(target, hidden)
    shutil.rmtree(hidden)


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    path = Path(path)
    staging = path.parent / f".{path.name}.{uuid.uuid4().hex}"
    staging.write_text(text)
    os.replace(staging, path)


class RequestLoop(threading.Thread):
    """Keeps POSTing one request until stopped; records every (HTTP status, body) in order."""

    def __init__(self, url: str, body: object) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.data = json.dumps(body)
        self.results: list[tuple[int, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            while not self._stop_event.is_set():
                try:
                    r = session.post(self.url, data=self.data, timeout=30)
                    self.results.append((r.status_code, r.text))
                except requests.RequestException as exc:
                    self.results.append((-1, repr(exc)))

    def count(self, text: str | None = None) -> int:
        return sum(1 for code, body in list(self.results) if text is None or (code == 200 and body == text))

    def failures(self) -> list[tuple[int, str]]:
        return [(code, body) for code, body in list(self.results) if code != 200]

    def stop(self) -> list[tuple[int, str]]:
        self._stop_event.set()
        self.join(timeout=30)
        return list(self.results)

    def __enter__(self) -> RequestLoop:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def model_config_text(*models: tuple[str, str | os.PathLike[str], str]) -> str:
    """A ModelServerConfig text proto; each model is (name, base_path, extra fields inside its ``config {}``)."""
    entries = "".join(
        f'  config {{ name: "{name}" base_path: "{base}" model_platform: "tensorflow" {extra} }}\n'
        for name, base, extra in models
    )
    return "model_config_list {\n" + entries + "}\n"


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited: no such process, or a zombie its parent has not reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a new server could listen on ``port`` now (bound and listened on, then closed again)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port no one listens on now, from the kernel (for a server that cannot be given port 0)."""
    return free_ports(1)[0]


def agent_ports(taken: Collection[int] = ()) -> dict[str, int]:
    """Fixed ports for a Ray node's agents, which :func:`patient_ray_nodes` gives every node started without them.

    Given port 0, each agent picks one and writes it to a file in the session folder, and the node's raylet waits for
    those files about 15 s (no setting of Ray's that we found changes it), then crashes: "Timed out waiting for file
    .../metrics_agent_port_<node>". On two cores busy with other tests an agent's Python start took longer, and the
    cluster never came up. With its ports given, nothing waits for the files: the metrics export port's too (CI lost
    the Ray Data module, whose head gives none, to "Timed out waiting for file .../metrics_export_port_<node>" four
    starts in a row, its agent's first line logged 26 s after its start).

    The four differ from each other and from ``taken`` (the node's other given ports): the kernel may hand a port
    just closed out again, and Ray refuses a node two of whose components share one (CI saw the runtime-env agent
    given the metrics-export port picked a moment before)."""
    names = ("metrics_agent_port", "dashboard_agent_listen_port", "runtime_env_agent_port", "metrics_export_port")
    return dict(zip(names, free_ports(len(names), taken), strict=True))


def free_ports(count: int, taken: Collection[int] = ()) -> list[int]:
    """``count`` different ports no one listens on now, none of them in ``taken``.

    Each socket stays bound until all are picked, so the kernel cannot hand the same port out twice."""
    import socket

    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in taken:
                ports.append(port)
        return ports


def _raylet_alive(node_id: str) -> bool:
    """Whether the raylet of the node ``node_id`` (hex) still runs."""
    import psutil

    for process in psutil.process_iter(["name", "cmdline", "status"]):
        info = process.info
        if (
            "raylet" in (info["name"] or "")
            and info["status"] != psutil.STATUS_ZOMBIE
            and any(node_id in word for word in info["cmdline"] or ())
        ):
            return True
    return False


def start_ray_node(start: Callable[[], T], attempts: int = 5, calm_seconds: float = 90.0) -> T:
    """``start()``, a Ray node's start (``cluster.add_node(...)``), again if the node failed to start.

    A node's raylet waits about 15 s for its dashboard agent to write its port files (metrics, listen port) and
    aborts when they are late, for each port it was not given (:func:`agent_ports`; Ray's constant). On a
    machine starting three test workers at once, the agent's Python start took longer, and the module's cluster
    never came up. The next start finds the agent's modules read and compiled; before it, the machine's rush is
    given up to ``calm_seconds`` to pass (:func:`wait_for_calm`): on a slow machine under three workers' start
    (browsers, wheel builds), three starts in a row, each soon after the last, all failed the same way."""
    for _ in range(attempts - 1):
        try:
            return start()
        except Exception as exc:  # Ray says it with a bare Exception
            if "timed out during startup" not in str(exc):
                raise
        wait_for_calm(calm_seconds)
    return start()


def wait_for_calm(seconds: float) -> None:
    """Wait until the machine's last minute averaged fewer runnable processes than it has cores, ``seconds`` at
    most: not a readiness check (nothing here waits for a state), a pause for a start that must win a race."""
    deadline = time.monotonic() + seconds
    cores = available_cores()
    while time.monotonic() < deadline and os.getloadavg()[0] >= cores:
        time.sleep(2.0)


@contextlib.contextmanager
def patient_ray_nodes(seconds: float = 180.0) -> Iterator[None]:
    """While inside, a Ray node started in this process (``ray.cluster_utils.Cluster``'s head and workers) may take
    ``seconds`` to register with its GCS, instead of the 30 s that ``ray._private.node.Node`` waits (a constant there):
    on a busy machine a new node's processes take longer to start, and the cluster failed to come up at all. Ray's
    loop asks ``ray._private.services.get_node`` until it answers; this one asks again inside each of those asks. The
    processes Ray starts meanwhile (raylets, their agents) get the same patience through Ray's own settings, and
    every node started without its agents' ports (``Cluster.add_node``, ``ray.init(address="local")``, which takes
    none) gets them from :func:`agent_ports`, its raylet told the dashboard agent's listen port as well, so that it
    waits for none of their port files. Ray's worker processes run at the tests' own priority, not niced."""
    import ray._private.parameter as parameter
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    import ray.serve._private.api as serve_api

    settings = {
        "RAY_raylet_start_wait_time_s": str(int(seconds)),
        "RAY_agent_register_timeout_ms": str(int(seconds * 1000)),
        # Ray Serve's controller kills an HTTP/gRPC proxy not ready in 5 s, or not answering its health check in 10.
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(seconds / 3),
        "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": str(seconds / 3),
        # Ray starts its worker processes (Serve's replicas, proxies and controller among them) at nice 15: beside
        # anything at the default priority (the other test workers, CI's other work) they got a CPU share about 30
        # times smaller, and a replica took minutes to start; CI saw one STARTING for 5 minutes under load.
        "RAY_worker_niceness": "0",
    }
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    original = services.get_node

    def get_node(gcs_address: str, node_id: str, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            try:
                return original(gcs_address, node_id, *args, **kwargs)
            except RuntimeError:
                # A raylet that aborted (its agents' port files, below) never registers: no more patience.
                if time.monotonic() > deadline or not _raylet_alive(node_id):
                    raise
                time.sleep(0.5)

    make_params = parameter.RayParams.__init__

    def with_agent_ports(params: Any, *args: Any, **kwargs: Any) -> None:
        make_params(params, *args, **kwargs)
        if params.dashboard_agent_listen_port == ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT:  # every node's
            params.dashboard_agent_listen_port = 0
        given = {value for name, value in vars(params).items() if name.endswith("_port") and isinstance(value, int)}
        for name, port in agent_ports(taken=given).items():
            if not getattr(params, name, None):
                setattr(params, name, port)

    start_process = services.start_ray_process

    def raylet_told_its_agents_port(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        # Ray hands the dashboard agent its listen port (0 on a cluster's worker node: the agent picks one) but not
        # the raylet, which then waits for the agent's file of it; the raylet has the flag, and Ray 2.60's
        # start_raylet passes it no value. The agent's port is fixed here when it is 0, and the raylet told it.
        if process_type != ray_constants.PROCESS_TYPE_RAYLET or any(
            arg.startswith("--dashboard_agent_listen_port=") for arg in command
        ):
            return start_process(command, process_type, *args, **kwargs)
        at = next((i for i, arg in enumerate(command) if arg.startswith("--dashboard_agent_command=")), None)
        if at is not None:
            words = command[at].split(" ")
            given = {int(word) for arg in command for word in re.findall(r"port[=_-]*(\d+)", arg)}
            for i, word in enumerate(words):
                if word.startswith("--listen-port="):
                    port = int(word.split("=", 1)[1]) or free_ports(1, given)[0]
                    words[i] = f"--listen-port={port}"
                    command = [*command[:at], " ".join(words), *command[at + 1 :]]
                    command.append(f"--dashboard_agent_listen_port={port}")
        return start_process(command, process_type, *args, **kwargs)

    # serve.start gives up on proxies not ready in 60 s (HTTP_PROXY_TIMEOUT, a constant, which api.py imports).
    proxy_timeout = serve_api.HTTP_PROXY_TIMEOUT
    services.get_node = get_node
    services.start_ray_process = raylet_told_its_agents_port
    parameter.RayParams.__init__ = with_agent_ports  # type: ignore[method-assign]
    serve_api.HTTP_PROXY_TIMEOUT = seconds
    try:
        yield
    finally:
        services.get_node = original
        services.start_ray_process = start_process
        parameter.RayParams.__init__ = make_params  # type: ignore[method-assign]
        serve_api.HTTP_PROXY_TIMEOUT = proxy_timeout
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class JumpingClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs with real time and can also jump forward at once (:meth:`jump`).

    Timers still fire in the order of their due times however slow the machine is, so a test can put a callback
    between two timers a minute apart and jump over that minute instead of waiting for it: no real time to race.
    Use it with ``asyncio.Runner(loop_factory=JumpingClockLoop)``; jump only from code running on the loop.
    """

    def __init__(self) -> None:
        super().__init__()
        self.jumped = 0.0

    def time(self) -> float:
        return super().time() + self.jumped

    def jump(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead: every timer due by then fires on the loop's next turn, in order."""
        if seconds < 0:
            raise ValueError("the clock only jumps forward")
        self.jumped += seconds


def run_with_jumping_clock(main: Callable[[JumpingClockLoop], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(loop)`` to completion on a fresh :class:`JumpingClockLoop`."""

    async def entry() -> T:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, JumpingClockLoop)
        return await main(loop)

    with asyncio.Runner(loop_factory=JumpingClockLoop) as runner:
        return runner.run(entry())
