"""The server's system shared-memory regions (Triton's system shared memory extension), for every frontend.

A client creates a POSIX shared-memory object (``shm_open``; ``tritonclient.utils.shared_memory`` does it) and
registers a window of it, by ``key``, ``offset`` and ``byte_size``, under a region ``name``. Requests then name the
region (with an offset and size inside it) instead of carrying an input's bytes, or to have an output written there.
One :class:`SharedMemoryRegistry` belongs to the server and is shared by its REST and gRPC frontends, so a region
registered over one is usable over the other.

It is a boundary: whoever registers a region makes the server map it read-write. So keys are POSIX shared-memory
names only (never a path: ``shm_open`` opens only in the shared-memory folder, without following links), the window
must lie inside the object when it is registered, every use is checked against the window, the regions' bytes and
count are bounded, and nothing outside a window is ever read or written. An object the client shrank after
registering it is refused too, its size read before each use: touching a mapping past its object's end would stop the
process (SIGBUS). Who may register at all (clients on this host) is the frontends' rule:
:mod:`workbench.frontends.v2_shared_memory`.

Reads copy the bytes out of the region (the client may rewrite it as soon as the answer comes, and the request may
wait in a batch queue until then); writes copy an output in after the model ran. A region unregistered while a read
or write uses it is unmapped once that read or write ends, as Triton does.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.protocol.shared_memory_parameters import OFFSET, SharedTensor

DEFAULT_MAX_BYTES = 4 << 30  # --shared_memory_max_bytes: what all registered regions may span together
# Each region holds a mapping and (before Python 3.13) a duplicate of its file descriptor: bounded, so that clients
# cannot exhaust the server's descriptors, which its sockets need too.
MAX_REGIONS = 256
MAX_NAME_LENGTH = 255  # NAME_MAX: the longest file name shm_open creates in its folder, and the longest region name


@dataclasses.dataclass(frozen=True)
class RegionStatus:
    """One registered region, as Triton's status answers describe it."""

    name: str
    key: str
    offset: int
    byte_size: int


class _Region:
    """A registered window of a shared-memory object, mapped read-write; ``users`` reads and writes under way."""

    def __init__(self, status: RegionStatus, mapping: mmap.mmap, start: int) -> None:
        self.status = status
        self.mapping = mapping
        self.start = start  # where the window begins in the mapping (mappings begin at page boundaries)
        self.users = 0
        self.unregistered = False


class SharedMemoryRegistry:
    """Registered regions by name; thread-safe (the frontends' event loop and inference threads share it).

    Implements :class:`workbench.protocol.shared_memory_parameters.SharedMemory` (``read``, ``check``, ``write``), which
    the v2 codecs use to move tensors in and out of regions.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self._refusal: ServingError | None = None  # set by close(): why nothing registers any more

    # ------------------------------------------------------------------------------------ registration
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes of the shared-memory object ``key`` from ``offset`` as region ``name``."""
        check_region_name(name)
        check_key(name, key)
        if offset < 0 or byte_size <= 0:
            raise invalid_argument(
                f"failed to register shared memory region '{name}': offset must be 0 or more and byte_size at least "
                f"1 (got offset {offset}, byte_size {byte_size})"
            )
        with self._lock:
            self._check_room(name, byte_size)
        region = _map(name, key, offset, byte_size)
        with self._lock:  # checked again: another registration may have come in while this one mapped
            try:
                self._check_room(name, byte_size)
            except ServingError:
                region.mapping.close()
                raise
            self._regions[name] = region

    def _check_room(self, name: str, byte_size: int) -> None:
        if self._refusal is not None:
            raise self._refusal
        if name in self._regions:  # Triton's words
            raise ServingError(Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        if len(self._regions) >= MAX_REGIONS:
            raise ServingError(
                Code.RESOURCE_EXHAUSTED,
                f"failed to register shared memory region '{name}': {MAX_REGIONS} regions are registered, the most "
                "this server holds; unregister one first",
            )
        used = sum(region.status.byte_size for region in self._regions.values())
        if used + byte_size > self.max_bytes:
            raise ServingError(
                Code.RESOURCE_EXHAUSTED,
                f"failed to register shared memory region '{name}': its {byte_size} bytes and the {used} bytes "
                f"registered already exceed the server's limit of {self.max_bytes} bytes "
                "(workbench serve --shared_memory_max_bytes)",
            )

    def unregister(self, name: str) -> None:
        """Forget region ``name`` and unmap it (once no read or write uses it); an unknown name is no error, as in
        Triton."""
        with self._lock:
            region = self._regions.pop(name, None)
            if region is not None:
                _retire(region)

    def unregister_all(self) -> None:
        with self._lock:
            regions, self._regions = list(self._regions.values()), {}
            for region in regions:
                _retire(region)

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region (``name`` empty), or the one named: NOT_FOUND, in Triton's words, when it is not registered."""
        with self._lock:
            if not name:
                return sorted((region.status for region in self._regions.values()), key=lambda s: s.name)
            region = self._regions.get(name)
        if region is None:
            raise ServingError(Code.NOT_FOUND, f"Unable to find system shared memory region: '{name}'")
        return [region.status]

    def close(self, code: Code = Code.UNAVAILABLE, reason: str = "The server is stopping") -> None:
        """Unregister every region, and refuse registrations from now on with ``code`` and ``reason``."""
        with self._lock:
            self._refusal = ServingError(code, reason)
        self.unregister_all()

    # ------------------------------------------------------------------------------------ tensors
    def read(self, tensor: SharedTensor, what: str) -> bytes:
        """A copy of the bytes ``tensor`` names; ``what`` ('Input "x"') starts every error."""
        with self._use(tensor, what) as (region, start):
            return region.mapping[start : start + tensor.byte_size]

    def check(self, tensor: SharedTensor, what: str) -> None:
        """Raise unless ``tensor`` names a window inside a registered region."""
        with self._use(tensor, what):
            pass

    def write(self, tensor: SharedTensor, data: bytes, what: str) -> None:
        """Copy ``data`` to where ``tensor`` points; more bytes than its ``byte_size`` is INVALID_ARGUMENT."""
        if len(data) > tensor.byte_size:
            raise invalid_argument(
                f"{what} takes {len(data)} bytes, more than its shared memory holds (shared_memory_byte_size "
                f"{tensor.byte_size})"
            )
        with self._use(tensor, what) as (region, start):
            region.mapping[start : start + len(data)] = data

    @contextmanager
    def _use(self, tensor: SharedTensor, what: str) -> Iterator[tuple[_Region, int]]:
        """The region ``tensor`` names and where its window starts in the mapping, held mapped meanwhile."""
        with self._lock:
            region = self._regions.get(tensor.region)
            if region is None:
                raise invalid_argument(f"{what}: shared memory region '{tensor.region}' is not registered")
            size = region.status.byte_size
            if tensor.offset >= size or tensor.offset + tensor.byte_size > size:
                raise invalid_argument(
                    f"{what}: {OFFSET} {tensor.offset} and shared_memory_byte_size {tensor.byte_size} do not fit in "
                    f"shared memory region '{tensor.region}' ({size} bytes)"
                )
            # The object may have shrunk since it was registered (ftruncate): touching its mapping past its end would
            # stop the whole process with SIGBUS, so its size is read before every use.
            end = region.status.offset + tensor.offset + tensor.byte_size
            if region.mapping.size() < end:
                raise invalid_argument(
                    f"{what}: shared memory {region.status.key!r} of region '{tensor.region}' is smaller than when it "
                    "was registered; unregister the region and register it again"
                )
            region.users += 1
        try:
            yield region, region.start + tensor.offset
        finally:
            with self._lock:
                region.users -= 1
                if region.unregistered:
                    _retire(region)


def check_region_name(name: str) -> None:
    """A region name: 1 to 255 printable characters, no ``/``, ``\\`` or control characters (names appear in URL
    paths, logs and messages)."""
    if (
        not name
        or len(name) > MAX_NAME_LENGTH
        or not name.isprintable()
        or any(c in "/\\" for c in name)
        or name in (".", "..")
    ):
        raise invalid_argument(
            f"{_short(name)} cannot name a shared memory region: give 1 to {MAX_NAME_LENGTH} printable characters "
            "without '/' or '\\'"
        )


def check_key(name: str, key: str) -> None:
    """A POSIX shared-memory name: one optional leading ``/``, then a file name (no other ``/``, not ``.`` or ``..``,
    no NUL or control character, at most 255 characters): what ``shm_open`` opens portably, and never a path."""
    stem = key[1:] if key.startswith("/") else key
    if (
        not stem
        or len(stem) > MAX_NAME_LENGTH
        or stem in (".", "..")
        or "/" in stem
        or not stem.isprintable()
        or ".." in stem
    ):
        raise invalid_argument(
            f"cannot register shared memory region '{name}': {_short(key)} is not a shared memory key (a POSIX "
            "shared memory name such as '/input_simple': one optional leading '/', then up to 255 printable "
            "characters without '/' or '..')"
        )


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _map(name: str, key: str, offset: int, byte_size: int) -> _Region:
    """Open the object ``key`` read-write and map the window: refused unless it lies inside the object."""
    fd = _shm_open(name, key)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # shm_open's objects are files of its folder; anything else is refused
            raise invalid_argument(f"failed to register shared memory region '{name}': {key!r} is not shared memory")
        if offset + byte_size > info.st_size:
            raise invalid_argument(
                f"failed to register shared memory region '{name}': offset {offset} + byte_size {byte_size} runs past "
                f"the end of shared memory {key!r} ({info.st_size} bytes)"
            )
        start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap's offset must fall on a page boundary
        try:
            mapping = mmap.mmap(
                fd, offset - start + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start
            )
        except OSError as exc:
            raise ServingError(
                Code.RESOURCE_EXHAUSTED if exc.errno == errno.ENOMEM else Code.INVALID_ARGUMENT,
                f"failed to register shared memory region '{name}': cannot map {key!r}: {exc.strerror}",
            ) from None
    finally:
        os.close(fd)
    return _Region(RegionStatus(name, key, offset, byte_size), mapping, offset - start)


def _shm_open(name: str, key: str) -> int:
    """``shm_open(key, O_RDWR)``: CPython's own binding (what multiprocessing.shared_memory uses), which opens in the
    shared-memory folder only and follows no links."""
    try:
        import _posixshmem
    except ImportError:  # not a POSIX system (Windows): no shm_open
        raise ServingError(
            Code.UNIMPLEMENTED, "System shared memory needs POSIX shm_open, which this platform does not have"
        ) from None
    path = key if key.startswith("/") else f"/{key}"
    try:
        return int(_posixshmem.shm_open(path, os.O_RDWR, mode=0o600))
    except FileNotFoundError:
        raise invalid_argument(
            f"failed to register shared memory region '{name}': shared memory {key!r} does not exist (the client "
            "creates it first, e.g. with tritonclient.utils.shared_memory.create_shared_memory_region)"
        ) from None
    except PermissionError:
        raise ServingError(
            Code.PERMISSION_DENIED,
            f"failed to register shared memory region '{name}': the server may not open shared memory {key!r} "
            "for reading and writing",
        ) from None
    except OSError as exc:  # ELOOP (a link), ENAMETOOLONG, EMFILE ...
        raise invalid_argument(
            f"failed to register shared memory region '{name}': cannot open shared memory {key!r}: {exc.strerror}"
        ) from None


def _retire(region: _Region) -> None:
    """Unmap an unregistered region now, or, while reads or writes use it, when the last one ends (called locked)."""
    region.unregistered = True
    if region.users == 0 and not region.mapping.closed:
        region.mapping.close()
