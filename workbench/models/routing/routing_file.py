"""Where a model's routing is stored: one small file in the model's base path, shared by every replica.

``<base_path>/routing.json`` holds the model's :class:`~workbench.models.routing.policy.Routing` and a ``generation``
counter. Its name is no number, so version scanners (workbench's and TF Serving's) ignore it. Every replica reads
it when it polls the repository; a change is a compare-and-write: it carries the state it was based on and is
refused (:class:`RoutingConflict`) if the stored state moved on meanwhile, so of two writers racing only one wins.

A store is anything with :class:`RoutingStateStore`'s three methods. :class:`RoutingFile` serves local and
mounted file systems: the read-compare-write runs under ``flock`` on ``<base_path>/.routing.lock`` and the new
state lands by writing a hidden temporary file in the same folder and renaming it over the old one, so a reader
sees the old file or the new one, never half of one. An object store compares its own generation or ETag in the
conditional PUT instead; :func:`routing_store_for` picks the store for a base path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from workbench.models.routing.policy import Routing
from workbench.runtime.storage import RemoteFolder, StorageError, is_remote, join, redact, storage_error, translated

log = logging.getLogger(__name__)

ROUTING_FILE = "routing.json"
LOCK_FILE = ".routing.lock"
# How long a writer waits for another one's read-compare-write (milliseconds of work) before giving up: only a
# hung mount or a stopped process holds it longer.
LOCK_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class StoredRouting:
    """A routing as read from (or written to) a store."""

    routing: Routing
    generation: int = 0  # 0: nothing stored yet; every write stores the generation it was based on, plus one
    etag: str = ""  # the store's fingerprint of exactly what it read: catches edits that kept the generation


NOTHING_STORED = StoredRouting(Routing())


class DamagedRoutingState(ValueError):
    """The stored state exists but is not a routing (a typo in a hand edit, a foreign file)."""


class RoutingConflict(Exception):
    """A write was based on a state that is no longer the stored one; ``current`` is the stored one now."""

    def __init__(self, based_on: StoredRouting, current: StoredRouting) -> None:
        super().__init__(f"based on generation {based_on.generation}, stored generation {current.generation}")
        self.based_on = based_on
        self.current = current


class RoutingStateUnwritable(Exception):
    """The store cannot be written (a read-only mount, permissions, no credentials); ``reason`` says why, and
    ``advice`` (where given) what to do instead, in place of the repository's advice."""

    def __init__(self, location: str, reason: str, advice: str = "") -> None:
        super().__init__(f"{location}: {reason}")
        self.location = location
        self.reason = reason
        self.advice = advice


class RoutingStateStore(Protocol):
    """The routing state of one model."""

    @property
    def location(self) -> str:
        """Where the state lives, for messages (a path or URL; never credentials)."""
        ...

    def read(self) -> StoredRouting | None:
        """The stored state, or None when there is none; raises DamagedRoutingState, or OSError when unreachable."""
        ...

    def check_writable(self) -> None:
        """Raise RoutingStateUnwritable now if a write could not succeed (before a slow change starts)."""
        ...

    def write(self, routing: Routing, based_on: StoredRouting) -> StoredRouting:
        """Store ``routing`` as generation ``based_on.generation + 1`` if the stored state is still ``based_on``.

        Raises RoutingConflict (nothing written) when it is not, RoutingStateUnwritable when the store refuses.
        A damaged stored state is replaced (it routes nothing; a management change is how it gets repaired).
        """
        ...

    def registry_view(self, routing: Routing) -> dict[str, Any] | None:
        """What a model's description shows of a registry that keeps the routing (MLflow's aliases), or None."""
        ...


def routing_store_for(base_path: str) -> RoutingStateStore:
    """The store of the model at ``base_path``: a file for local paths, an object for object-store URLs."""
    if is_remote(base_path):
        return RoutingObject(base_path)
    return RoutingFile(base_path)


def encode(routing: Routing, generation: int) -> bytes:
    doc: dict[str, Any] = {"generation": generation, **routing.to_json()}
    # Who wrote it and when: for the person reading the file or a conflict's message; readers ignore both.
    doc["written_by"] = f"{socket.gethostname()}:{os.getpid()}"
    doc["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return (json.dumps(doc, indent=2) + "\n").encode()


def decode(data: bytes, location: str) -> StoredRouting:
    """Parse a stored routing; anything that is not one raises DamagedRoutingState naming ``location``."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise TypeError(f"expected a JSON object, found {type(doc).__name__}")
        generation = doc.get("generation", 0)
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise TypeError(f"generation must be a non-negative integer, not {generation!r}")
        routing = Routing.from_json(doc)
    except (ValueError, TypeError) as exc:
        raise DamagedRoutingState(f"{location} is not a routing state: {exc}") from None
    return StoredRouting(routing, generation, hashlib.sha256(data).hexdigest()[:16])


# Threads of one process exclude each other here: flock excludes open files, but on NFS the kernel emulates it
# with POSIX locks, which are per process.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(path, threading.Lock())


class RoutingFile:
    """``<base_path>/routing.json`` on a local or mounted file system."""

    def __init__(self, base_path: str | os.PathLike[str]) -> None:
        self.folder = Path(base_path)
        self.path = self.folder / ROUTING_FILE
        self.lock_path = self.folder / LOCK_FILE

    @property
    def location(self) -> str:
        return str(self.path)

    def read(self) -> StoredRouting | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return decode(data, self.location)

    def registry_view(self, routing: Routing) -> None:
        return None  # a file beside the versions: the routing is all there is to show

    def check_writable(self) -> None:
        with self._locked():
            pass
        try:  # the lock file may exist where no new file can be made: try making one, as a write will
            with tempfile.TemporaryFile(dir=self.folder, prefix=".routing-"):
                pass
        except OSError as exc:
            raise _unwritable(exc, self.folder) from None

    def write(self, routing: Routing, based_on: StoredRouting) -> StoredRouting:
        with self._locked():
            try:
                current = self.read() or NOTHING_STORED
            except DamagedRoutingState as exc:
                log.error("Replacing a damaged routing state: %s", exc)
                current = based_on
            if (current.generation, current.etag) != (based_on.generation, based_on.etag):
                raise RoutingConflict(based_on, current)
            data = encode(routing, based_on.generation + 1)
            self._replace(data)
        return decode(data, self.location)

    def _replace(self, data: bytes) -> None:
        """Write ``data`` to a hidden file in the same folder, then rename it over routing.json (atomic)."""
        try:
            mode = self.path.stat().st_mode & 0o777
        except OSError:
            mode = 0o644  # readable by replicas running as other users
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".routing-", suffix=".tmp")
        except OSError as exc:
            raise _unwritable(exc, self.folder) from None
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the rename must not land before the bytes do (a crash would leave it empty)
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise _unwritable(exc, self.path) from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with contextlib.suppress(OSError):  # make the rename itself durable; not every file system can
            dir_fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold this model's write lock: this process's threads, then other processes (flock on the lock file)."""
        thread_lock = _thread_lock(str(self.lock_path))
        if not thread_lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise RoutingStateUnwritable(str(self.lock_path), f"still locked by this process after {LOCK_TIMEOUT_S:g}s")
        try:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise _unwritable(exc, self.lock_path) from None
            try:
                _flock(fd, str(self.lock_path))
                yield
            finally:
                os.close(fd)  # closing releases the flock
        finally:
            thread_lock.release()


def _flock(fd: int, path: str) -> None:
    """An exclusive flock, polled so that a lock held by a hung process ends in an error, not a hang."""
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RoutingStateUnwritable(path, f"locked by another writer for over {LOCK_TIMEOUT_S:g}s") from None
            time.sleep(0.01)
        except OSError as exc:  # e.g. ENOLCK: a mount without locking
            raise _unwritable(exc, Path(path)) from None


def _unwritable(exc: OSError, path: Path) -> RoutingStateUnwritable:
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    return RoutingStateUnwritable(str(exc.filename or path), reason)


def read_legacy_state(path: str | os.PathLike[str] | None) -> dict[str, Routing]:
    """Every model's routing from an older workbench's one state file (``--management_state_file``, or a model
    repository's ``.workbench/routing.json``): read once, as the start for models whose repository has no state.

    A damaged file must not stop the server: it is ignored, loudly.
    """
    if not path or not os.path.exists(path):
        return {}
    try:
        doc = json.loads(Path(path).read_text())
        return {name: Routing.from_json(entry) for name, entry in doc.get("models", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.error("Ignoring unreadable routing state %s: %s", path, exc)
        return {}


class RoutingObject:
    """``<base_url>/routing.json`` in an object store, written with a conditional PUT.

    The write carries the store's fingerprint of the state it was based on, and the store itself refuses it when
    the object moved on since, with no lock: on S3 (and S3-compatible stores that implement conditional writes)
    ``If-Match`` with the ETag read (``If-None-Match: *`` when nothing was stored); on Google Cloud Storage the
    precondition ``ifGenerationMatch`` with the object generation read (``0`` when nothing was stored). Other
    stores cannot be written by workbench: their routing is read on every poll, and a management change fails
    with FAILED_PRECONDITION saying so.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.url = join(base_url, ROUTING_FILE)
        self._display = redact(self.url)
        self._remote: RemoteFolder | None = None

    @property
    def location(self) -> str:
        return self._display

    @property
    def _folder(self) -> RemoteFolder:
        """Made on first use: a store whose library is missing fails its reads (logged), not the server's start."""
        if self._remote is None:
            self._remote = RemoteFolder(self.base_url)
        return self._remote

    @property
    def _s3(self) -> bool:
        return type(self._folder.fs).__name__ == "S3FileSystem"

    @property
    def _gcs(self) -> bool:
        """gcsfs's file system, whichever class of it (gcsfs swaps in a subclass for its experimental features)."""
        protocol = self._folder.fs.protocol
        return "gs" in (protocol if isinstance(protocol, tuple) else (protocol,))

    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, prefix = self._folder.path.partition("/")
        return bucket, "/".join(filter(None, [prefix.rstrip("/"), ROUTING_FILE]))

    def read(self) -> StoredRouting | None:
        if not (self._s3 or self._gcs):
            return self._read_generic()
        data, etag = self._get()
        if data is None:
            return None
        return dataclasses.replace(decode(data, self.location), etag=etag)

    def _get(self) -> tuple[bytes | None, str]:
        """The object's bytes and fingerprint (S3's ETag, GCS's generation) in one request, so the fingerprint is
        exactly that of the bytes."""
        bucket, key = self._bucket_key()
        try:
            if self._gcs:
                return _get_gcs_object(self._folder.fs, bucket, key, self.location)
            return _get_object(self._folder.fs, bucket, key)
        except FileNotFoundError:
            return None, ""
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - botocore's and aiohttp's own types
            raise storage_error(self.url, exc) from None

    def _read_generic(self) -> StoredRouting | None:
        with translated(self.url):
            try:
                data = self._folder.fs.cat_file(f"{self._folder.path}/{ROUTING_FILE}")
            except FileNotFoundError:
                return None
        return decode(data, self.location)

    def registry_view(self, routing: Routing) -> None:
        return None  # a file beside the versions: the routing is all there is to show

    def check_writable(self) -> None:
        if not (self._s3 or self._gcs):
            scheme = self.url.split("://", 1)[0]
            raise RoutingStateUnwritable(
                self.location,
                f"workbench cannot make conditional writes to {scheme}:// stores, so it does not write routing "
                "there (a write could silently undo another replica's); edit routing.json yourself",
            )

    def write(self, routing: Routing, based_on: StoredRouting) -> StoredRouting:
        self.check_writable()
        bucket, key = self._bucket_key()
        data = encode(routing, based_on.generation + 1)
        try:
            if self._gcs:
                etag = _put_gcs_object(self._folder.fs, bucket, key, data, if_generation_match=based_on.etag or "0")
            else:
                condition = {"IfMatch": based_on.etag} if based_on.etag else {"IfNoneMatch": "*"}
                response = self._folder.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
                etag = str(response.get("ETag", ""))
        except Exception as exc:  # noqa: BLE001 - a refused condition arrives as OSError or FileExistsError
            return self._after_refusal(routing, based_on, data, exc)
        return dataclasses.replace(decode(data, self.location), etag=etag)

    def _after_refusal(self, routing: Routing, based_on: StoredRouting, data: bytes, exc: Exception) -> StoredRouting:
        """Tell a lost race (RoutingConflict) from a store that refuses writes (RoutingStateUnwritable)."""
        try:
            stored, etag = self._get()
        except OSError:
            stored, etag = None, based_on.etag
        if stored == data:  # the write landed, and a retry of it was refused by its own precondition
            return dataclasses.replace(decode(data, self.location), etag=etag)
        if etag != based_on.etag:
            try:
                current = dataclasses.replace(decode(stored, self.location), etag=etag) if stored else NOTHING_STORED
            except DamagedRoutingState as damaged:
                log.error("Replacing a damaged routing state: %s", damaged)
                return self.write(routing, dataclasses.replace(based_on, etag=etag))
            raise RoutingConflict(based_on, current) from None
        raise RoutingStateUnwritable(self.location, storage_error(self.url, exc).reason) from None


def _get_object(fs: Any, bucket: str, key: str) -> tuple[bytes, str]:
    """One GET on s3fs's event loop: the bytes and the ETag of exactly those bytes."""
    from fsspec.asyn import sync

    async def get() -> tuple[bytes, str]:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key)  # noqa: SLF001 - s3fs's raw call: the ETag of exactly these bytes
        async with response["Body"] as stream:
            data = await stream.read()
        return bytes(data), str(response.get("ETag", ""))

    result: tuple[bytes, str] = sync(fs.loop, get)
    return result


# Google Cloud Storage, through gcsfs's request helper: gcsfs reads an object's bytes without its generation, and
# writes with a precondition only for "no object yet" (``pipe_file(mode="create")``, i.e. ``ifGenerationMatch=0``).
# A compare-and-set needs ``ifGenerationMatch=<the generation read>``, so these two make the JSON API's requests
# themselves (the ones gcsfs makes) through its private ``_call``, which brings its session, credentials, retries,
# endpoint (``STORAGE_EMULATOR_HOST`` included) and errors (404 → FileNotFoundError). A refused precondition (412:
# FileExistsError, HttpError before gcsfs 2024.12) is told from other refusals by reading the object again.
def _get_gcs_object(fs: Any, bucket: str, key: str, location: str) -> tuple[bytes, str]:
    """One media GET: the bytes and the generation of exactly those bytes (GCS sends it as ``x-goog-generation``)."""
    from fsspec.asyn import sync

    async def get() -> tuple[bytes, str]:
        headers, data = await fs._call("GET", "b/{}/o/{}", bucket, key, alt="media")  # noqa: SLF001 - gcsfs's raw call, as for s3fs above
        return bytes(data), str(headers.get("x-goog-generation", ""))

    data, generation = sync(fs.loop, get)
    if not generation:  # GCS always sends it; a store that does not could not refuse a stale write either
        raise StorageError(location, "the store sent no object generation (x-goog-generation) with the object")
    return data, generation


def _put_gcs_object(fs: Any, bucket: str, key: str, data: bytes, if_generation_match: str) -> str:
    """One multipart upload that GCS stores only while the object's generation is ``if_generation_match`` ("0":
    while there is no object), else answers 412; returns the new object's generation."""
    from fsspec.asyn import sync

    boundary = uuid.uuid4().hex  # appears nowhere in the routing document
    metadata = json.dumps({"name": key, "contentType": "application/json"})
    head = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
        f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
    )
    body = head.encode() + data + f"\r\n--{boundary}--\r\n".encode()

    async def put() -> dict[str, Any]:
        resource: dict[str, Any] = await fs._call(  # noqa: SLF001
            "POST",
            f"{fs._location}/upload/storage/v1/b/{{}}/o",  # noqa: SLF001
            bucket,
            uploadType="multipart",
            ifGenerationMatch=if_generation_match,
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            data=body,
            json_out=True,
        )
        return resource

    resource = sync(fs.loop, put)
    return str(resource.get("generation", ""))
