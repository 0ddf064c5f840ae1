"""Asynchronous requests in Amazon SQS, their state and answers as JSON objects in an object store.

``sqs://QUEUE?results=s3://BUCKET/PREFIX``: the queue by name (its region, endpoint and credentials from boto3's
own places: the environment, config files, an instance role; ``AWS_ENDPOINT_URL`` for an SQS-compatible server),
and where each request's record goes (any fsspec URL), as SageMaker's asynchronous endpoints write their outputs
to S3. SQS keeps no answers, so the record ``<results>/<id>.json`` says a request's state, attempts and, once
answered, its status and answer; ``GET /workbench/v1/async/{id}`` reads it.

- ``put``: the record (``queued``) first, then the message: a message never names a request without a record.
- ``claim``: ``ReceiveMessage`` with the visibility timeout; SQS counts the receives (``ApproximateReceiveCount``),
  which are the attempts; a message received ``max_attempts`` times already is failed instead (SQS's own redrive
  policy to a dead-letter queue may be set on the queue too).
- ``finish``: the answer into the record unless it holds one already, then ``DeleteMessage``. ``retry`` makes the
  message visible again after the delay (``ChangeMessageVisibility``).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlparse

from workbench.asynchronous.sqlite_queue import DONE, FAILED, QUEUED, RUNNING, Claimed, Record
from workbench.core.errors import Code, ServingError
from workbench.runtime.storage import join, translated


class SqsQueue:
    def __init__(self, uri: str, results_seconds: float = 86400.0, max_attempts: int = 3) -> None:
        import boto3  # the s3 extra's botocore, and boto3: imported where an SQS queue is used
        from fsspec.core import url_to_fs

        parsed = urlparse(uri)
        results = parse_qs(parsed.query).get("results", [""])[0]
        if not parsed.netloc or not results:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"--async_queue={uri}: an SQS queue is sqs://QUEUE?results=s3://BUCKET/PREFIX (where answers go)",
            )
        self.results, self.results_seconds, self.max_attempts = results.rstrip("/"), results_seconds, max_attempts
        self._sqs: Any = boto3.client("sqs")
        with translated(uri):
            self._url = self._sqs.get_queue_url(QueueName=parsed.netloc)["QueueUrl"]
        self._fs, _ = url_to_fs(self.results)

    # ------------------------------------------------------------------------------------------- records
    def _record_url(self, request_id: str) -> str:
        return join(self.results, f"{request_id}.json")

    def _read(self, request_id: str) -> dict[str, Any] | None:
        url = self._record_url(request_id)
        with translated(url):
            try:
                return dict(json.loads(self._fs.cat_file(url)))
            except FileNotFoundError:
                return None

    def _write(self, record: dict[str, Any]) -> None:
        url = self._record_url(record["id"])
        with translated(url):
            self._fs.pipe_file(url, json.dumps(record).encode())  # one PUT: an object is never half-written

    # ------------------------------------------------------------------------------------------- the queue
    def put(self, model: str, path: str, body: bytes) -> str:
        request_id = uuid.uuid4().hex
        now = time.time()
        self._write({"id": request_id, "model": model, "state": QUEUED, "attempts": 0, "created": now, "updated": now})
        message = {"id": request_id, "model": model, "path": path, "body": base64.b64encode(body).decode()}
        with translated(self._url):
            self._sqs.send_message(QueueUrl=self._url, MessageBody=json.dumps(message))
        return request_id

    def claim(self, limit: int, visibility: float) -> list[Claimed]:
        if limit <= 0:
            return []
        with translated(self._url):
            received = self._sqs.receive_message(
                QueueUrl=self._url,
                MaxNumberOfMessages=min(limit, 10),  # SQS's most
                VisibilityTimeout=max(1, int(visibility)),
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            ).get("Messages", [])
        claimed: list[Claimed] = []
        for message in received:
            fields = json.loads(message["Body"])
            attempts = int(message["Attributes"]["ApproximateReceiveCount"])
            record = self._read(fields["id"]) or {
                "id": fields["id"], "model": fields["model"], "created": time.time(), "attempts": 0
            }  # fmt: skip
            if record.get("state") in (DONE, FAILED):  # answered by a consumer whose claim had expired
                self._delete(message["ReceiptHandle"])
                continue
            if attempts > self.max_attempts:
                from workbench.protocol import json_tensor

                reason = f"no answer after {attempts - 1} attempts (each consumer that took it stopped or failed)"
                self._answer(record, 503, json_tensor.encode_error(reason))
                self._delete(message["ReceiptHandle"])
                continue
            self._write({**record, "state": RUNNING, "attempts": attempts, "updated": time.time()})
            body = base64.b64decode(fields["body"])
            claimed.append(
                Claimed(fields["id"], fields["model"], fields["path"], body, attempts, message["ReceiptHandle"])
            )
        return claimed

    def finish(self, claimed: Claimed, status: int, answer: bytes) -> bool:
        record = self._read(claimed.id) or {"id": claimed.id, "model": claimed.model, "created": time.time()}
        answered = record.get("state") not in (DONE, FAILED)
        if answered:
            self._answer({**record, "attempts": claimed.attempts}, status, answer)
        self._delete(claimed.receipt)
        return answered

    def retry(self, claimed: Claimed, delay: float) -> None:
        record = self._read(claimed.id)
        if record is not None:
            self._write({**record, "state": QUEUED, "updated": time.time()})
        with translated(self._url):
            self._sqs.change_message_visibility(
                QueueUrl=self._url, ReceiptHandle=claimed.receipt, VisibilityTimeout=max(0, int(delay))
            )

    def get(self, request_id: str) -> Record | None:
        record = self._read(request_id)
        if record is None or (record.get("expires") is not None and record["expires"] < time.time()):
            return None
        answer = record.get("answer")
        return Record(
            request_id,
            record["model"],
            record["state"],
            int(record.get("attempts", 0)),
            float(record["created"]),
            float(record["updated"]),
            record.get("status"),
            base64.b64decode(answer) if answer is not None else None,
        )

    def waiting(self) -> tuple[int, float]:
        """Messages queued or held (SQS's approximate counts); SQS tells no message's age but through CloudWatch."""
        with translated(self._url):
            attributes = self._sqs.get_queue_attributes(
                QueueUrl=self._url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )["Attributes"]
        count = int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )
        return count, 0.0

    def close(self) -> None:
        self._sqs.close()

    def _delete(self, receipt: str) -> None:
        with translated(self._url):
            self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=receipt)

    def _answer(self, record: dict[str, Any], status: int, answer: bytes) -> None:
        now = time.time()
        self._write(
            {
                **record,
                "state": DONE if 200 <= status < 300 else FAILED,
                "status": status,
                "answer": base64.b64encode(answer).decode(),
                "updated": now,
                "expires": now + self.results_seconds,
            }
        )
