"""The repository source's rules for versions being copied: in-process, on version folders in ``tmp_path`` (and an
fsspec ``memory://`` store), loaded by the unit tier's ``FakeLoader``.

- A poll (what the poll loop makes, ``RepositorySource.poll``) loads a version only once two polls in a row saw
  its files unchanged: a copy in progress is not loaded half done. A scan someone asked for (``poll_once``: the
  start-up, a config reload, a load request) takes what is there, as TF Serving does at start-up.
- A version's fingerprint covers every file of its folder, recursively: a failed version is retried when any of
  them changes, ``variables/`` included; its status says what was tried.
- An object store's version is fingerprinted from one listing of the model's folder: every file's name, size and
  stamp.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeRepository

from workbench.core.errors import Code, ServingError
from workbench.models.manager import VersionState
from workbench.models.source import scan_remote_versions

AVAILABLE, END = VersionState.AVAILABLE, VersionState.END
WAIT = 5.0  # seconds any one transition may take before a test fails (they take milliseconds)


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[FakeRepository]:
    repository = FakeRepository(tmp_path)
    yield repository
    repository.stop()


def write(folder: Path, name: str, data: bytes = b"x") -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def states(repo: FakeRepository) -> dict[int, VersionState]:
    """Model m's versions and their states (none yet: empty)."""
    try:
        return {s.version: s.state for s in repo.manager.served.version_status("m")}
    except ServingError as exc:
        assert exc.code == Code.NOT_FOUND, exc
        return {}


def poll(repo: FakeRepository) -> dict[int, VersionState]:
    """One poll, as the poll loop makes it; the model's version states once the loads it started are over."""
    repo.source.poll()
    assert repo.manager.served.wait_until_settled(WAIT), "the manager did not settle"
    return states(repo)


def test_a_version_whose_files_changed_since_the_last_poll_waits_for_a_poll_that_sees_them_unchanged(
    repo: FakeRepository, tmp_path: Path
) -> None:
    repo.configure("m", 1)
    write(tmp_path / "m" / "1", "saved_model.pb")
    repo.rescan()  # the start-up's scan: a complete version loads at once, with no poll to wait for
    assert states(repo) == {1: AVAILABLE}

    copy = tmp_path / "m" / "2"
    write(copy, "saved_model.pb")  # a copy begins: new since the last poll
    assert poll(repo) == {1: AVAILABLE}
    write(copy, "variables/variables.index")  # and goes on, under variables/
    assert poll(repo) == {1: AVAILABLE}
    write(copy, "variables/variables.index", b"longer")  # a file still being written
    assert poll(repo) == {1: AVAILABLE}
    assert ("m", 2) not in repo.loader.loaded
    assert poll(repo) == {2: AVAILABLE, 1: END}  # unchanged since the last poll: loaded

    write(copy, "assets/vocabulary.txt")  # a serving version's files change: it keeps serving, as in TF Serving
    assert poll(repo) == {2: AVAILABLE, 1: END}
    assert poll(repo) == {2: AVAILABLE, 1: END}
    assert repo.loader.loaded.count(("m", 2)) == 1


def test_a_model_first_seen_by_a_poll_waits_like_a_new_version(repo: FakeRepository, tmp_path: Path) -> None:
    """A model copied into the repository while the server runs is a copy in progress too."""
    repo.configure("m")
    write(tmp_path / "m" / "1", "saved_model.pb")
    assert poll(repo) == {}
    assert poll(repo) == {1: AVAILABLE}


def test_a_failed_version_is_retried_when_a_file_under_its_folder_changes(repo: FakeRepository, tmp_path: Path) -> None:
    repo.configure("m", 1)
    copy = tmp_path / "m" / "2"
    write(copy, "saved_model.pb")
    write(copy, "variables/variables.data-00000-of-00001", b"half")
    repo.loader.fail("m", 2, "Restoring from checkpoint failed")
    repo.rescan()
    (failed,) = [s for s in repo.manager.served.version_status("m") if s.version == 2]
    assert failed.state == END and failed.error is not None
    message = failed.error.message
    assert message.startswith("Restoring from checkpoint failed"), message
    assert f"loaded from {copy}, which held 2 files (saved_model.pb, variables/variables.data-00000-of-00001" in message
    assert "retried when any of its files changes" in message

    del repo.loader.failing[("m", 2)]  # it would load now, but nothing in its folder says it changed
    repo.rescan()
    write(copy, "__pycache__/model.cpython-311.pyc")  # what importing a version's code writes: not a change
    repo.rescan()
    assert repo.loader.loaded.count(("m", 2)) == 0

    write(copy, "variables/variables.data-00000-of-00001", b"the whole")  # deep in the folder: its dir's mtime stays
    repo.rescan()
    assert states(repo) == {2: AVAILABLE}


def test_a_stored_versions_fingerprint_covers_every_file_of_its_folder() -> None:
    import fsspec

    store = fsspec.filesystem("memory")
    base = "memory://fingerprints/m"
    store.pipe(f"{base}/2/saved_model.pb", b"graph")
    store.pipe(f"{base}/3/variables/variables.index", b"no model file yet")  # not a version until it has one
    first = scan_remote_versions(base)
    assert set(first) == {2}

    store.pipe(f"{base}/2/variables/variables.index", b"index")
    second = scan_remote_versions(base)
    assert second[2].fingerprint != first[2].fingerprint

    store.pipe(f"{base}/2/variables/variables.index", b"a longer index")
    third = scan_remote_versions(base)
    assert third[2].fingerprint != second[2].fingerprint

    store.pipe(f"{base}/routing.json", b"{}")  # beside the versions, not in one
    assert scan_remote_versions(base)[2].fingerprint == third[2].fingerprint
    assert scan_remote_versions(base)[2].path == f"{base}/2"


def test_a_version_gone_from_one_listing_goes_once_the_next_poll_agrees(repo: FakeRepository, tmp_path: Path) -> None:
    """A listing taken in the middle of a change (a version's objects deleted before their bucket is, a sync with
    --delete on its way) shows a serving version gone for a moment: it keeps serving until a poll confirms it."""
    repo.configure("m", 2)
    write(tmp_path / "m" / "2", "saved_model.pb")
    repo.rescan()
    assert states(repo) == {2: AVAILABLE}

    moved = tmp_path / "elsewhere"
    (tmp_path / "m" / "2").rename(moved)  # gone from one listing...
    assert poll(repo) == {2: AVAILABLE}
    moved.rename(tmp_path / "m" / "2")  # ...and back in the next: it never stopped serving
    assert poll(repo) == {2: AVAILABLE}
    assert repo.loader.loaded.count(("m", 2)) == 1

    (tmp_path / "m" / "2").rename(moved)  # gone for good: the second poll that misses it unloads it
    assert poll(repo) == {2: AVAILABLE}
    assert poll(repo) == {2: END}
