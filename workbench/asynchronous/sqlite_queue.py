"""Asynchronous requests, queued and answered, in one SQLite file: the embedded queue that needs nothing.

A request accepted by ``:predictAsync`` is a row: its id, the model, the REST path and body it came with, its state
(``queued`` → ``running`` → ``done`` or ``failed``), and once answered its HTTP status and body, kept until
``expires``. SQLite in WAL mode lets every process of a server (``--num_workers``) share the file: each consumer
*claims* rows in one transaction, which hides them for ``visibility`` seconds (the visibility timeout of SQS): a
consumer that dies mid-request leaves its claim to expire, and another takes the row again. Nothing accepted is
lost: the row is written (and synced) before ``202 Accepted`` answers, and survives a restart.

Delivery is at least once and the answer idempotent: a request is answered once, by the first consumer to finish
it; a consumer finishing it again (its claim had expired) changes nothing. A request claimed ``max_attempts``
times without an answer (its consumers kept dying, or the model kept failing with a server error) is failed
(dead-lettered) with the reason, rather than retried forever.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import threading
import time
import uuid
from pathlib import Path

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    path TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    visible_at REAL NOT NULL,
    receipt TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    status INTEGER,
    answer BLOB,
    expires REAL
);
CREATE INDEX IF NOT EXISTS waiting ON requests (state, visible_at);
"""


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A request a consumer holds until it finishes it or its claim expires."""

    id: str
    model: str
    path: str
    body: bytes
    attempts: int  # this claim included
    receipt: str  # names this claim: an expired one finishes nothing another consumer holds


@dataclasses.dataclass(frozen=True)
class Record:
    """A request as ``GET /workbench/v1/async/{id}`` shows it."""

    id: str
    model: str
    state: str
    attempts: int
    created: float
    updated: float
    status: int | None  # the answer's HTTP status, once answered
    answer: bytes | None  # the answer's JSON body, as the synchronous predict would have answered


class SqliteStore:
    """The queue and the answers, in the SQLite file ``path`` (shared by every process of one server)."""

    def __init__(self, path: str | os.PathLike[str], results_seconds: float = 86400.0, max_attempts: int = 3) -> None:
        self.path = Path(path)
        self.results_seconds = results_seconds
        self.max_attempts = max_attempts
        self._local = threading.local()  # a connection per thread: sqlite3's objects stay on their thread
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            db.executescript(_SCHEMA)

    def _connection(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            # isolation_level=None: transactions are the explicit BEGIN IMMEDIATE below, one write lock each.
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # accepted means on disk: a power cut loses nothing answered 202
            self._local.db = db
        return db

    def put(self, model: str, path: str, body: bytes) -> str:
        """Queue a request; its id."""
        request_id = uuid.uuid4().hex
        now = time.time()
        self._connection().execute(
            "INSERT INTO requests (id, model, path, body, state, visible_at, created, updated)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (request_id, model, path, body, QUEUED, now, now, now),
        )
        return request_id

    def claim(self, limit: int, visibility: float) -> list[Claimed]:
        """Up to ``limit`` requests, oldest first, hidden from other consumers for ``visibility`` seconds. A request
        claimed ``max_attempts`` times already is failed instead (its consumers died, or kept failing)."""
        db = self._connection()
        now = time.time()
        claimed: list[Claimed] = []
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = db.execute(
                "SELECT id, model, path, body, attempts FROM requests WHERE state IN (?, ?) AND visible_at <= ?"
                " ORDER BY created LIMIT ?",
                (QUEUED, RUNNING, now, limit),
            ).fetchall()
            for request_id, model, path, body, attempts in rows:
                if attempts >= self.max_attempts:
                    reason = f"no answer after {attempts} attempts (each consumer that took it stopped or failed)"
                    self._fail_locked(db, request_id, now, 503, reason)
                    continue
                receipt = uuid.uuid4().hex
                db.execute(
                    "UPDATE requests SET state = ?, attempts = attempts + 1, visible_at = ?, receipt = ?, updated = ?"
                    " WHERE id = ?",
                    (RUNNING, now + visibility, receipt, now, request_id),
                )
                claimed.append(Claimed(request_id, model, path, bytes(body), attempts + 1, receipt))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return claimed

    def finish(self, claimed: Claimed, status: int, answer: bytes) -> bool:
        """Record the answer (done for a 2xx, failed otherwise); False if the request was answered already."""
        now = time.time()
        state = DONE if 200 <= status < 300 else FAILED
        cursor = self._connection().execute(
            "UPDATE requests SET state = ?, status = ?, answer = ?, updated = ?, expires = ?, receipt = NULL"
            " WHERE id = ? AND state NOT IN (?, ?)",
            (state, status, answer, now, now + self.results_seconds, claimed.id, DONE, FAILED),
        )
        return cursor.rowcount == 1

    def retry(self, claimed: Claimed, delay: float) -> None:
        """Give the request back for another attempt in ``delay`` seconds (if this claim still holds it)."""
        self._connection().execute(
            "UPDATE requests SET state = ?, visible_at = ?, receipt = NULL, updated = ? WHERE id = ? AND receipt = ?",
            (QUEUED, time.time() + delay, time.time(), claimed.id, claimed.receipt),
        )

    def get(self, request_id: str) -> Record | None:
        row = (
            self._connection()
            .execute(
                "SELECT id, model, state, attempts, created, updated, status, answer, expires FROM requests"
                " WHERE id = ?",
                (request_id,),
            )
            .fetchone()
        )
        if row is None or (row[8] is not None and row[8] < time.time()):
            return None
        answer = bytes(row[7]) if row[7] is not None else None
        return Record(row[0], row[1], row[2], row[3], row[4], row[5], row[6], answer)

    def waiting(self) -> tuple[int, float]:
        """Requests not answered yet (queued or running), and the age in seconds of the oldest of them (0: none)."""
        count, oldest = (
            self._connection()
            .execute("SELECT COUNT(*), MIN(created) FROM requests WHERE state IN (?, ?)", (QUEUED, RUNNING))
            .fetchone()
        )
        return int(count), (time.time() - oldest) if oldest is not None else 0.0

    def purge(self) -> int:
        """Delete the answers kept past their time; how many."""
        cursor = self._connection().execute(
            "DELETE FROM requests WHERE state IN (?, ?) AND expires < ?", (DONE, FAILED, time.time())
        )
        return cursor.rowcount

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def _fail_locked(self, db: sqlite3.Connection, request_id: str, now: float, status: int, reason: str) -> None:
        from workbench.protocol import json_tensor

        db.execute(
            "UPDATE requests SET state = ?, status = ?, answer = ?, updated = ?, expires = ?, receipt = NULL"
            " WHERE id = ?",
            (FAILED, status, json_tensor.encode_error(reason), now, now + self.results_seconds, request_id),
        )
