"""The queues asynchronous requests wait in, behind one interface, chosen by ``--async_queue``'s URI.

- ``sqlite:///PATH`` (:class:`~workbench.asynchronous.sqlite_queue.SqliteStore`): the embedded default, one file every
  process of a server shares; it needs nothing.
- ``redis://HOST:PORT/DB`` (:class:`~workbench.asynchronous.redis_queue.RedisQueue`): a Redis stream read by a
  consumer group, the answers in Redis too: many servers (replicas, pods) share it.
- ``sqs://QUEUE?results=s3://BUCKET/PREFIX`` (:class:`~workbench.asynchronous.sqs_queue.SqsQueue`): Amazon SQS,
  each request's record and answer a JSON object in the object store.

Each keeps the requests and their answers: accepted ones are on disk (or in Redis) before ``202`` answers, a claim
hides a request from other consumers until it is finished or its visibility timeout passes, a request is answered
once, and one claimed ``max_attempts`` times without an answer is failed rather than retried forever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from workbench.asynchronous.sqlite_queue import Claimed, Record

SCHEMES = ("sqlite", "redis", "sqs")


class AsyncQueue(Protocol):
    def put(self, model: str, path: str, body: bytes) -> str: ...

    def claim(self, limit: int, visibility: float) -> list[Claimed]: ...

    def finish(self, claimed: Claimed, status: int, answer: bytes) -> bool: ...

    def retry(self, claimed: Claimed, delay: float) -> None: ...

    def get(self, request_id: str) -> Record | None: ...

    def waiting(self) -> tuple[int, float]: ...

    def close(self) -> None: ...


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else "sqlite"


def queue_exists(uri: str) -> bool:
    """Whether requests may wait there already: an SQLite file that exists, or any server's queue."""
    if scheme_of(uri) == "sqlite":
        return sqlite_path(uri).exists()
    return True


def open_queue(uri: str, results_seconds: float, max_attempts: int) -> AsyncQueue:
    scheme = scheme_of(uri)
    if scheme == "sqlite":
        from workbench.asynchronous.sqlite_queue import SqliteStore

        return SqliteStore(sqlite_path(uri), results_seconds, max_attempts)
    if scheme in ("redis", "rediss"):
        from workbench.asynchronous.redis_queue import RedisQueue

        return RedisQueue(uri, results_seconds, max_attempts)
    if scheme == "sqs":
        from workbench.asynchronous.sqs_queue import SqsQueue

        return SqsQueue(uri, results_seconds, max_attempts)
    raise ValueError(f"--async_queue={uri}: a queue is sqlite:///PATH, redis://HOST:PORT/DB or sqs://QUEUE?results=URL")


def sqlite_path(uri: str) -> Path:
    return Path(urlparse(uri).path if uri.startswith("sqlite://") else uri)
