"""Replicas agree: two ``workbench serve`` processes on one repository route by the routing state stored in it.

A change made through one replica, or by editing ``<base_path>/routing.json``, reaches the other within a poll
while clients keep both busy without a failed request; a change based on an older generation is refused and
leaves the file as it was; writers racing in several processes do not both win; a repository that cannot be
written still serves and refuses changes with FAILED_PRECONDITION.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from replica import ONE, REACH_TIMEOUT_S, Replica
from waiting import RequestLoop, wait_until, write_atomically

from workbench.models.routing.policy import Routing
from workbench.models.routing.routing_file import RoutingConflict, RoutingFile, StoredRouting

V1 = '{"predictions":[[2.5]]}'  # hp2: 0.5 * 1 + 2
V2 = '{"predictions":[[3.5]]}'  # hp3: 0.5 * 1 + 3


# ------------------------------------------------------------------------------------------------ replicas
def start_replicas(count: int, root: Path, workdir: Path, *flags: str) -> list[Replica]:
    """Start ``count`` replicas at once (TensorFlow's imports overlap), then wait for each."""
    replicas = [Replica(workdir / f"replica{i}", f"--model_repository={root}", *flags) for i in range(count)]
    try:
        return [replica.wait_ready() for replica in replicas]
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise


def add_model(root: Path, model_store: Path, name: str) -> Path:
    """Model ``name`` in ``root``: version 1 answers 2.5, version 2 answers 3.5."""
    base = root / name
    shutil.copytree(model_store / "hp2_tf2", base / "1")
    shutil.copytree(model_store / "hp3_tf2", base / "2")
    return base


def both(replicas: list[Replica], predicate: Callable[[Replica], bool], what: str) -> None:
    """Wait until ``predicate`` holds on every replica."""
    wait_until(lambda: all(predicate(r) for r in replicas), timeout=REACH_TIMEOUT_S, interval=0.05, what=what)


def routes_to(name: str, stable: int | None, answer: str) -> Callable[[Replica], bool]:
    """The replica's routing has ``stable`` and its default requests are answered with ``answer``."""
    return lambda r: r.model(name)["stable"] == stable and r.predict(name) == answer


# The replicas every test below shares; each test has its own model in the repository, so none sees another's.
PAIR_MODELS = ("promoted", "stale", "edited")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[tuple[Path, list[Replica]]]:
    root = tmp_path_factory.mktemp("shared-repository")
    for name in PAIR_MODELS:
        add_model(root, model_store, name)
    replicas = start_replicas(2, root, tmp_path_factory.mktemp("replicas"), "--file_system_poll_wait_seconds=0.5")
    yield root, replicas
    for replica in replicas:
        replica.stop()


# --------------------------------------------------------------------------------------------------- tests
def test_a_promotion_and_a_canary_through_one_replica_reach_the_other_under_load(pair):
    root, (a, b) = pair
    name = "promoted"
    both([a, b], routes_to(name, None, V2), "the latest version served by both")
    loops = [RequestLoop(f"{replica.rest_url}/v1/models/{name}:predict", ONE) for replica in (a, b, a, b)]
    for loop in loops:
        loop.start()
    try:
        promoted = a.manage(f"{name}:promote", {"version": 1})
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["generation"] == 1
        both([a, b], routes_to(name, 1, V1), "the promotion on both replicas")

        canary = a.manage(f"{name}:canary", {"version": 2, "weight": 0.5})
        assert canary.status_code == 200, canary.text
        both([a, b], lambda r: r.model(name)["canary"] == {"version": 2, "weight": 0.5}, "the canary on both")
        both(
            [a, b],
            lambda r: {v["version"]: v["traffic_share"] for v in r.model(name)["versions"]} == {1: 0.5, 2: 0.5},
            "the canary's share served by both",
        )
        marks = [len(loop.results) for loop in loops]
        wait_until(
            lambda: all(len(loop.results) >= mark + 20 for loop, mark in zip(loops, marks, strict=True)),
            timeout=REACH_TIMEOUT_S,
            what="every client to send 20 more requests after the canary",
        )
    finally:
        for loop in loops:
            loop.stop()
    for loop in loops:
        assert loop.failures() == [], loop.failures()[:3]
        assert loop.count(V1) + loop.count(V2) == len(loop.results)
        assert loop.count(V2) > 0 and loop.count(V1) > 0  # served the latest, then the stable, then the canary
    assert b.model(name)["generation"] == a.model(name)["generation"] == 2
    stored = json.loads((root / name / "routing.json").read_text())
    assert (stored["generation"], stored["stable"], stored["canary"]) == (2, 1, 2)


def test_a_change_based_on_an_older_generation_is_refused_and_the_file_is_unchanged(pair):
    root, (a, b) = pair
    name, state = "stale", root / "stale" / "routing.json"
    assert a.manage(f"{name}:promote", {"version": 1, "generation": 0}).status_code == 200
    both([a, b], routes_to(name, 1, V1), "the promotion on both replicas")
    written = state.read_bytes()

    for replica in (a, b):  # the one that made generation 1, and the other
        refused = replica.manage(f"{name}:promote", {"version": 2, "generation": 0})
        assert refused.status_code == 409, refused.text  # ABORTED: read the model again and retry
        message = refused.json()["error"]
        assert "is at generation 1, not generation 0" in message and str(state) in message, message
        assert state.read_bytes() == written
    for target, body in ((f"{name}:rollback", {}), (f"{name}:canary", {"version": 2, "weight": 0.1})):
        assert b.manage(target, {**body, "generation": 0}).status_code == 409
    assert state.read_bytes() == written
    assert [r.model(name)["stable"] for r in (a, b)] == [1, 1]

    current = b.manage(f"{name}:promote", {"version": 2, "generation": 1})  # based on what it read: accepted
    assert current.status_code == 200, current.text
    assert current.json()["generation"] == 2
    both([a, b], routes_to(name, 2, V2), "the second promotion on both replicas")


def _write_racing(folder: str, start: Any, results: Any) -> None:
    """One of several processes: read the routing, wait for the others, then try to write based on it."""
    store = RoutingFile(folder)
    based_on = store.read()
    assert based_on is not None
    start.wait(timeout=60)
    try:
        store.write(Routing(stable=os.getpid()), based_on)
        results.put("written")
    except RoutingConflict as conflict:
        results.put(f"refused {conflict.based_on.generation}->{conflict.current.generation}")


def test_writers_racing_in_several_processes_do_not_both_win(tmp_path):
    store = RoutingFile(tmp_path)
    first = store.write(Routing(stable=1), StoredRouting(Routing()))
    assert first.generation == 1
    context = multiprocessing.get_context("spawn")  # clean processes: no threads or locks inherited
    start, results = context.Barrier(4), context.Queue()
    writers = [context.Process(target=_write_racing, args=(str(tmp_path), start, results)) for _ in range(4)]
    for writer in writers:
        writer.start()
    outcomes = sorted(results.get(timeout=120) for _ in writers)
    for writer in writers:
        writer.join(timeout=60)
    assert outcomes == ["refused 1->2"] * 3 + ["written"], outcomes
    final = store.read()
    assert final is not None and final.generation == 2
    assert final.routing.stable in {w.pid for w in writers}

    with pytest.raises(RoutingConflict):  # and a write based on the first generation, later, is refused too
        store.write(Routing(stable=5), first)
    assert store.read() == final


def test_editing_the_routing_file_by_hand_reaches_both_replicas(pair):
    root, (a, b) = pair
    name, state = "edited", root / "edited" / "routing.json"
    both([a, b], routes_to(name, None, V2), "the latest version served by both")

    write_atomically(state, json.dumps({"generation": 7, "stable": 1}))
    both([a, b], routes_to(name, 1, V1), "the hand-made promotion on both replicas")
    assert [r.model(name)["generation"] for r in (a, b)] == [7, 7]

    # an edit that forgets the generation still reaches them: they compare content, not only the counter
    write_atomically(state, json.dumps({"generation": 7, "stable": 1, "canary": 2, "canary_weight": 0.25}))
    both([a, b], lambda r: r.model(name)["canary"] == {"version": 2, "weight": 0.25}, "the hand-made canary")

    write_atomically(state, "{ a typo")  # a damaged file: both keep routing as before, and say so in the log
    assert b.manage(f"{name}:canary", {"version": 2, "weight": 0.5, "generation": 7}).status_code == 200
    assert json.loads(state.read_text())["generation"] == 8  # the change repaired it
    both([a, b], lambda r: r.model(name)["canary"] == {"version": 2, "weight": 0.5}, "the repaired file")
    assert {a.predict(name), b.predict(name)} <= {V1, V2}


# -------------------------------------------------------------------------------------- read-only repository
MOUNT_READ_ONLY = 'mount --bind -o ro "$0" "$0" && exec "$@"'


def read_only(root: Path) -> tuple[list[str], str]:
    """Make ``root`` read-only to a replica: the command prefix that runs it so, and the error writes then meet.

    A read-only bind mount in the replica's own user and mount namespaces, as a read-only volume is mounted in
    a container; where that is not allowed, folder permissions, which stop every user but root.
    """
    unshare = shutil.which("unshare")
    if unshare is not None:
        prefix = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", MOUNT_READ_ONLY, str(root)]
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            return prefix, "Read-only file system (EROFS)"
    if os.geteuid() != 0:
        for folder in (root, *root.iterdir()):
            folder.chmod(0o555)
        return [], "Permission denied (EACCES)"
    pytest.skip("running as root, where permissions stop no write, and no read-only bind mount is allowed here")


def test_a_read_only_repository_serves_and_refuses_changes_with_failed_precondition(tmp_path, model_store):
    root = tmp_path / "repository"
    base = add_model(root, model_store, "m")
    write_atomically(base / "routing.json", json.dumps({"generation": 3, "stable": 1}))
    prefix, reason = read_only(root)
    replica = Replica(
        tmp_path / "replica", f"--model_repository={root}", "--file_system_poll_wait_seconds=0.5", prefix=prefix
    )
    try:
        replica.wait_ready()
        assert replica.model("m")["stable"] == 1 and replica.model("m")["generation"] == 3
        assert replica.predict("m") == V1  # it serves, routed by the repository's state

        for target, body in (
            ("m:promote", {"version": 2}),
            ("m:rollback", {}),
            ("m:canary", {"version": 2, "weight": 0.5}),
            ("m/versions/2:load", {}),
            ("m/versions/1:unload", {}),
        ):
            refused = replica.manage(target, body)
            assert refused.status_code == 400, (target, refused.text)  # FAILED_PRECONDITION
            message = refused.json()["error"]
            assert message.startswith("The routing of model m cannot be changed: "), message
            assert str(base) in message and reason in message, message
        assert replica.model("m")["stable"] == 1
        assert replica.predict("m") == V1
        assert json.loads((base / "routing.json").read_text())["generation"] == 3
        assert not (base / ".routing.lock").exists()
    finally:
        replica.stop()
        for folder in (root, *root.iterdir()):
            folder.chmod(0o755)


# ------------------------------------------------------------------------------------------------- timing
def test_time_for_a_promotion_to_reach_the_second_replica_at_the_default_poll_interval(tmp_path, model_store):
    """Printed, not asserted: from the promote's answer on replica A until replica B routes by it."""
    root = tmp_path / "repository"
    add_model(root, model_store, "m")
    a, b = start_replicas(2, root, tmp_path / "replicas")  # --file_system_poll_wait_seconds defaults to 1
    try:
        both([a, b], routes_to("m", None, V2), "the latest version served by both")
        promoted = a.manage("m:promote", {"version": 1})
        answered = time.perf_counter()
        assert promoted.status_code == 200, promoted.text
        wait_until(lambda: b.model("m")["stable"] == 1, timeout=REACH_TIMEOUT_S, interval=0.01, what="B's routing")
        routed = time.perf_counter() - answered
        wait_until(lambda: b.predict("m") == V1, timeout=REACH_TIMEOUT_S, interval=0.01, what="B's answers")
        served = time.perf_counter() - answered
        print(
            f"\npromotion reached replica B at the default 1 s poll: routing read after {routed:.2f} s, "
            f"default requests answered by the promoted version (loaded on B meanwhile) after {served:.2f} s"
        )
    finally:
        a.stop()
        b.stop()
