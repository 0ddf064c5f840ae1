"""Telling someone an asynchronous request was answered (``--async_notify_url``): a webhook, or a message on a
result queue.

- ``http://`` or ``https://``: a webhook, POSTed the notice as JSON;
- ``sqs://QUEUE``: a message on that Amazon SQS queue (boto3's credentials and endpoint);
- ``redis://HOST:PORT/DB?key=STREAM``: an entry on that Redis stream (default key ``workbench:async:answered``).

The notice is ``{"id", "model", "state", "status", "url"}``: where ``GET`` gives the answer. A notice is sent once,
at most: one that fails is logged, and the answer stays where ``GET`` finds it.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0
SCHEMES = ("http", "https", "sqs", "redis", "rediss")


class Notifier:
    """Sends each notice to one place (on a thread of the consumer's: every kind here blocks)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._scheme = urlparse(url).scheme
        self._client: Any = None

    def notify(self, notice: dict[str, Any]) -> None:
        data = json.dumps(notice).encode()
        try:
            if self._scheme in ("http", "https"):
                request = urllib.request.Request(self.url, data, {"Content-Type": "application/json"}, method="POST")  # noqa: S310 - http and https only, checked above
                with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310 - the operator's
                    answer.read()
            elif self._scheme == "sqs":
                self._sqs_send(data)
            else:
                self._redis_add(data)
        except Exception as exc:  # noqa: BLE001 - urllib's, botocore's and redis' own errors: a notice is best effort
            log.warning("Could not notify %s of asynchronous request %s: %s", self.url, notice.get("id"), exc)

    def _sqs_send(self, data: bytes) -> None:
        if self._client is None:
            import boto3

            sqs = boto3.client("sqs")
            self._client = (sqs, sqs.get_queue_url(QueueName=urlparse(self.url).netloc)["QueueUrl"])
        sqs, queue_url = self._client
        sqs.send_message(QueueUrl=queue_url, MessageBody=data.decode())

    def _redis_add(self, data: bytes) -> None:
        if self._client is None:
            import redis

            key = parse_qs(urlparse(self.url).query).get("key", ["workbench:async:answered"])[0]
            self._client = (redis.Redis.from_url(self.url.split("?", 1)[0]), key)
        client, key = self._client
        client.xadd(key, {"notice": data})
