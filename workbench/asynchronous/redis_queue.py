"""Asynchronous requests in Redis: a stream read by a consumer group, each request's state and answer in a hash.

``redis://HOST:PORT/DB`` (``rediss://`` for TLS, a password in the URL as redis-py takes it; ``?key=NAME`` names
the stream, default ``workbench:async``). Many servers share one: each process is a consumer of the group.

- ``put``: the request's hash (state ``queued``) and its stream entry, in one transaction.
- ``claim``: entries another consumer has held longer than the visibility timeout first (``XAUTOCLAIM``: that
  consumer died, or is too slow), then new ones (``XREADGROUP``); each claim counts an attempt in the hash, and a
  request claimed ``max_attempts`` times is failed instead.
- ``finish``: the answer into the hash (kept ``results_seconds``), unless another consumer answered first, then
  ``XACK`` and ``XDEL``: the entry is gone. ``retry`` leaves the entry pending: it is claimed again once its
  visibility timeout passes.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlparse

from workbench.asynchronous.sqlite_queue import DONE, FAILED, QUEUED, RUNNING, Claimed, Record

GROUP = "workbench"


class RedisQueue:
    def __init__(self, uri: str, results_seconds: float = 86400.0, max_attempts: int = 3) -> None:
        import redis  # the redis extra: imported where a Redis queue is used

        query = parse_qs(urlparse(uri).query)
        self.key = query.get("key", ["workbench:async"])[0]
        self.results_seconds = results_seconds
        self.max_attempts = max_attempts
        # Any: redis-py types each command's answer as sync-or-async (Awaitable | Any), which says nothing here.
        self._redis: Any = redis.Redis.from_url(uri.split("?", 1)[0])
        self._watch_error = redis.WatchError
        self._consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
            self._redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # the group exists: another process made it
                raise

    def _hash(self, request_id: str) -> str:
        return f"{self.key}:request:{request_id}"

    def put(self, model: str, path: str, body: bytes) -> str:
        request_id = uuid.uuid4().hex
        now = time.time()
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                self._hash(request_id),
                mapping={"model": model, "state": QUEUED, "attempts": 0, "created": now, "updated": now},
            )
            pipe.xadd(self.key, {"id": request_id, "model": model, "path": path, "body": body})
            pipe.execute()
        return request_id

    def claim(self, limit: int, visibility: float) -> list[Claimed]:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = []
        if limit > 0:
            reclaimed = self._redis.xautoclaim(
                self.key, GROUP, self._consumer, min_idle_time=int(visibility * 1000), start_id="0-0", count=limit
            )
            entries += [entry for entry in reclaimed[1] if entry[1]]  # a deleted entry comes back empty
        if len(entries) < limit:
            read = self._redis.xreadgroup(GROUP, self._consumer, {self.key: ">"}, count=limit - len(entries))
            for _, stream_entries in read or []:
                entries += stream_entries
        claimed: list[Claimed] = []
        now = time.time()
        for entry_id, fields in entries:
            request_id = fields[b"id"].decode()
            key = self._hash(request_id)
            state = self._redis.hget(key, "state")
            if state in (DONE.encode(), FAILED.encode()):  # answered by a consumer whose claim had expired
                self._drop(entry_id)
                continue
            attempts = int(self._redis.hincrby(key, "attempts", 1))
            if attempts > self.max_attempts:
                from workbench.protocol import json_tensor

                reason = f"no answer after {attempts - 1} attempts (each consumer that took it stopped or failed)"
                self._record(key, FAILED, 503, json_tensor.encode_error(reason), now)
                self._drop(entry_id)
                continue
            self._redis.hset(key, mapping={"state": RUNNING, "updated": now})
            claimed.append(
                Claimed(
                    request_id,
                    fields[b"model"].decode(),
                    fields[b"path"].decode(),
                    bytes(fields[b"body"]),
                    attempts,
                    entry_id.decode(),
                )
            )
        return claimed

    def finish(self, claimed: Claimed, status: int, answer: bytes) -> bool:
        key = self._hash(claimed.id)
        state = DONE if 200 <= status < 300 else FAILED
        # Answered once: WATCH makes the check and the write one step against another consumer finishing it.
        with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    if pipe.hget(key, "state") in (DONE.encode(), FAILED.encode()):
                        pipe.unwatch()
                        self._drop(claimed.receipt.encode())
                        return False
                    pipe.multi()
                    self._record(key, state, status, answer, time.time(), pipe)
                    pipe.execute()
                    break
                except self._watch_error:  # another consumer wrote the hash meanwhile: look again
                    continue
        self._drop(claimed.receipt.encode())
        return True

    def retry(self, claimed: Claimed, delay: float) -> None:
        """The entry stays pending: claimed again once its visibility timeout passes (a stream has no delays)."""
        self._redis.hset(self._hash(claimed.id), mapping={"state": QUEUED, "updated": time.time()})

    def get(self, request_id: str) -> Record | None:
        fields = self._redis.hgetall(self._hash(request_id))
        if not fields:
            return None
        text = {k.decode(): v for k, v in fields.items()}
        return Record(
            request_id,
            text["model"].decode(),
            text["state"].decode(),
            int(text["attempts"]),
            float(text["created"]),
            float(text["updated"]),
            int(text["status"]) if "status" in text else None,
            bytes(text["answer"]) if "answer" in text else None,
        )

    def waiting(self) -> tuple[int, float]:
        count = int(self._redis.xlen(self.key))
        oldest = self._redis.xrange(self.key, count=1)
        if not oldest:
            return count, 0.0
        millis = int(oldest[0][0].split(b"-")[0])
        return count, max(0.0, time.time() - millis / 1000)

    def close(self) -> None:
        self._redis.close()

    def _drop(self, entry_id: bytes) -> None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.key, GROUP, entry_id)
            pipe.xdel(self.key, entry_id)
            pipe.execute()

    def _record(self, key: str, state: str, status: int, answer: bytes, now: float, pipe: Any = None) -> None:
        target = pipe if pipe is not None else self._redis
        target.hset(key, mapping={"state": state, "status": status, "answer": answer, "updated": now})
        target.expire(key, int(self.results_seconds))
