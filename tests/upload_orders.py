"""Copying a version into an object store file by file, as ``aws s3 cp --recursive`` and ``gsutil cp -r`` do.

Those tools walk the folder and may write ``saved_model.pb`` before, between or after the variables, one object at a
time; a server polling the store meanwhile sees every state in between. The tests of each store copy a version in
each ``ORDER`` with a pause between files long enough for the replicas to poll (``PACE_S``): the pause only makes
the states in between visible, nothing is asserted about time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import requests
from replica import Replica

from workbench.runtime.storage import SAVED_MODEL

ORDERS = ("first", "middle", "last")  # where the model file goes among the version's files
PACE_S = 1.0  # between two files: two polls of the test replicas (0.5 s), so each sees the copy half done
# The copy that was cut off: a walk writes the version's top-level files, then variables/; it stopped in between.
CUT_OFF = ("fingerprint.pb", SAVED_MODEL)


def in_order(local: Path, order: str) -> list[str]:
    """The relative names of ``local``'s files with the model file ``first``, ``last``, or in the ``middle`` (one
    file of variables/ before it and one after); the others in a walk's (sorted) order."""
    rest = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() and p.name != SAVED_MODEL)
    assert sum(name.startswith("variables/") for name in rest) >= 2, rest  # "middle" needs one on each side
    position = {"first": 0, "middle": len(rest) - 1, "last": len(rest)}[order]
    return [*rest[:position], SAVED_MODEL, *rest[position:]]


def tried_files(message: str) -> bool:
    """Whether a failed load's status names what was tried: the cut-off copy's files, and that it is retried."""
    return f"which held 2 files ({', '.join(sorted(CUT_OFF))}" in message and "retried when" in message


def version_error(replica: Replica, name: str, version: int) -> str:
    """The version's ``status.error_message`` in TF Serving's GetModelStatus (``/v1/models/{name}``)."""
    statuses = requests.get(f"{replica.rest_url}/v1/models/{name}", timeout=30).json()["model_version_status"]
    return next(s["status"]["error_message"] for s in statuses if s["version"] == str(version))


def copy_cut_off_then_whole(
    replicas: list[Replica],
    name: str,
    local: Path,
    order: str,
    put: Callable[[str], None],
    both: Callable[[list[Replica], Callable[[Replica], bool], str], None],
    answers: tuple[str, str],
) -> None:
    """Version 2 of ``name`` (version 1 serving, answering ``answers[0]``) copied from ``local`` by ``put`` (a file's
    relative name, uploaded as ``{name}/2/{file}``): first the cut-off copy, which both replicas try, fail and say so
    while version 1 serves on; then every file in ``order``, after which both serve version 2 (``answers[1]``)."""
    for file in CUT_OFF:
        put(file)
    both(replicas, lambda r: r.states(name).get("2") == "END", "the cut-off copy tried by both")
    for replica in replicas:
        assert tried_files(version_error(replica, name, 2)), version_error(replica, name, 2)
        assert f"Failed to load {name} version 2" in replica.log()
        assert replica.predict(name) == answers[0]  # version 1 serves on

    for file in in_order(local, order):
        put(file)
        time.sleep(PACE_S)  # each replica polls the copy half done
    both(replicas, lambda r: r.states(name) == {"2": "AVAILABLE", "1": "END"}, "version 2 served by both")
    assert [r.predict(name) for r in replicas] == [answers[1]] * len(replicas)
    assert all(version_error(r, name, 2) == "" for r in replicas)
