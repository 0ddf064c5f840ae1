"""Triton's response cache: a predict answered once is answered again from memory, for the models that opt in.

Opt-in per model (``--response_cache_models``, or ``response_cache { enable: true }`` in a Triton model's
config.pbtxt), bounded in bytes for the whole server (``--response_cache_bytes``), least recently used first out.

An entry is keyed on the model, the *resolved* version, the signature, the outputs asked for and the request's
tensors (names, dtypes, shapes and bytes, hashed with BLAKE2b's 128-bit digest), so an answer never crosses versions
or labels: a label or a canary resolves to a version before the cache is asked, and a version's entries go when it
unloads. Cached arrays are read-only copies: nobody can change an answer that another request will be given.

Only deterministic models should opt in: the cache cannot know that a model samples.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

# What one entry costs beyond its arrays (the key, the dict, the OrderedDict's link): counted so that a cache of
# many tiny answers is bounded too.
ENTRY_OVERHEAD_BYTES = 256

Key = tuple[str, int, str, tuple[str, ...], bytes]


class CacheObserver(Protocol):
    """Who counts the cache's work (the server's stats and metrics); both are told the time the cache took."""

    def cache_lookup(self, model: str, version: int, hit: bool, seconds: float) -> None: ...

    def cache_insert(self, model: str, version: int, seconds: float) -> None: ...


def request_digest(inputs: Mapping[str, np.ndarray]) -> bytes:
    """A 128-bit digest of the tensors a request feeds: names, dtypes, shapes and contents."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(array.dtype.str.encode())
        digest.update(repr(array.shape).encode())
        if array.dtype == object:  # strings: their bytes, each length-prefixed so that boundaries count
            for item in array.ravel():
                data = item if isinstance(item, bytes) else str(item).encode()
                digest.update(len(data).to_bytes(8, "little"))
                digest.update(data)
        else:
            digest.update(array.data.cast("B"))  # the buffer itself: no copy of a large tensor
    return digest.digest()


def _nbytes(outputs: Mapping[str, np.ndarray]) -> int:
    total = ENTRY_OVERHEAD_BYTES
    for value in outputs.values():
        total += value.nbytes
        if value.dtype == object:
            total += sum(len(v) if isinstance(v, (bytes, str)) else 64 for v in value.ravel())
    return total


def _frozen(outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    copies = {}
    for name, value in outputs.items():
        copy = np.array(value, copy=True)
        copy.flags.writeable = False
        copies[name] = copy
    return copies


class ResponseCache:
    """A byte-bounded LRU of predict answers, for the models :meth:`enabled` names."""

    def __init__(self, max_bytes: int, models: Iterable[str] = (), observer: CacheObserver | None = None) -> None:
        self.max_bytes = max_bytes
        self._models = set(models)
        self._observer = observer
        self._entries: collections.OrderedDict[Key, tuple[dict[str, np.ndarray], int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the loop asks and fills; a version unloading evicts from a load thread

    # ----------------------------------------------------------------------------------------- opt-in
    def enabled(self, model: str) -> bool:
        """Whether ``model``'s answers are cached (asked on every request: a set lookup)."""
        return model in self._models

    def enable(self, model: str, on: bool = True) -> None:
        """Opt ``model`` in (a Triton config's ``response_cache``) or out; opting out drops its entries."""
        if on and self.max_bytes > 0:
            self._models.add(model)
        elif model in self._models:
            self._models.discard(model)
            self.evict(model)

    # ------------------------------------------------------------------------------------- the cache
    @staticmethod
    def key(model: str, version: int, signature: str, outputs: Sequence[str], digest: bytes) -> Key:
        return (model, version, signature, tuple(outputs), digest)

    def get(self, key: Key) -> dict[str, np.ndarray] | None:
        started = time.perf_counter()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        answer = dict(entry[0]) if entry is not None else None
        if self._observer is not None:
            self._observer.cache_lookup(key[0], key[1], answer is not None, time.perf_counter() - started)
        return answer

    def put(self, key: Key, outputs: Mapping[str, np.ndarray]) -> None:
        """Keep ``outputs`` for ``key``, unless one answer alone is larger than the whole cache."""
        started = time.perf_counter()
        size = _nbytes(outputs)
        if size > self.max_bytes:
            return
        frozen = _frozen(outputs)
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._bytes -= previous[1]
            self._entries[key] = (frozen, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
        if self._observer is not None:
            self._observer.cache_insert(key[0], key[1], time.perf_counter() - started)

    def evict(self, model: str, version: int | None = None) -> None:
        """Drop the entries of ``model`` (of one ``version``): it unloaded, or left the cache."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == model and (version is None or k[1] == version)]:
                self._bytes -= self._entries.pop(key)[1]

    def describe(self) -> dict[str, object]:
        with self._lock:
            return {
                "max_bytes": self.max_bytes,
                "bytes": self._bytes,
                "entries": len(self._entries),
                "models": sorted(self._models),
            }
