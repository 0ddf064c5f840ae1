"""Copying a version into an object store file by file, as ``aws s3 cp --recursive`` and ``gsutil cp -r`` do.

Those tools walk the folder and may write ``saved_model.pb`` before, between or after the variables, one object at a
time; a server polling the store meanwhile sees every state in between. The tests of each store copy a version in
each ``ORDER`` with a pause between files long enough for the replicas to poll (``PACE_S``): the pause only makes
the states in between visible, nothing is asserted about time.
"""

from __future__ import annotations

from pathlib import Path

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
