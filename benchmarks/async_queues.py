"""Asynchronous inference's round trip through each queue, against a synchronous predict of the same request.

Run: `.venv/bin/python benchmarks/async_queues.py [--requests 200]` (about a minute; Redis where `redis-server` is
installed, SQS on moto's server where moto is). Writes benchmarks/results/async_queues.json.

One server on 127.0.0.1 per queue (SQLite, Redis Streams, SQS with its answers in S3), serving a LogisticRegression
of the digits; one client sending one request at a time. For each: the median and p99 of a synchronous `:predict`
(REST), and of `Client.predict_async(...).result()` (the POST, the queue, the consumer, the answer stored, and the
client's polls until it sees it), and the second over the first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _common import save_results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    import workbench
    from workbench.client import Client
    from workbench.config.options import ServerOptions
    from workbench.server.running import ServerThread

    x, y = load_digits(return_X_y=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workbench.export(LogisticRegression(max_iter=2000).fit(x, y), "digits", root / "models")
        queues: dict[str, str] = {"sqlite": f"sqlite://{root / 'queue.sqlite'}"}
        redis_server = None
        if shutil.which("redis-server"):
            port = free_port()
            redis_server = subprocess.Popen(
                ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
                stdout=subprocess.DEVNULL,
            )
            import redis

            client = redis.Redis(port=port)
            for _ in range(200):  # until it answers
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            client.close()
            queues["redis"] = f"redis://127.0.0.1:{port}/0"
        aws = None
        try:
            import boto3
            from moto.server import ThreadedMotoServer

            aws = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            aws.start()
            host, aws_port = aws.get_host_and_port()
            os.environ.update(
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ENDPOINT_URL=f"http://{host}:{aws_port}",
            )
            boto3.client("sqs").create_queue(QueueName="requests")
            boto3.client("s3").create_bucket(Bucket="answers")
            queues["sqs (moto)"] = "sqs://requests?results=s3://answers/async"
        except ImportError:
            pass
        try:
            for name, uri in queues.items():
                options = ServerOptions(
                    rest_api_port=-1, port=0, model_repository=str(root / "models"), async_queue=uri
                )
                with ServerThread(options) as server, Client(server.rest_url) as client:
                    one = x[:1]
                    client.predict("digits", one)
                    client.predict_async("digits", one).result(timeout=60)  # warm: the queue opened
                    sync, queued = [], []
                    for _ in range(args.requests):
                        started = time.perf_counter()
                        client.predict("digits", one)
                        sync.append((time.perf_counter() - started) * 1000)
                        started = time.perf_counter()
                        client.predict_async("digits", one).result(timeout=60)
                        queued.append((time.perf_counter() - started) * 1000)
                row = {
                    "queue": name,
                    "predict p50 ms": round(statistics.median(sync), 2),
                    "predict p99 ms": round(percentile(sync, 0.99), 2),
                    "predictAsync round trip p50 ms": round(statistics.median(queued), 2),
                    "predictAsync round trip p99 ms": round(percentile(queued, 0.99), 2),
                    "async / sync (p50)": round(statistics.median(queued) / statistics.median(sync), 1),
                }
                rows.append(row)
                print(row, flush=True)
        finally:
            if redis_server is not None:
                redis_server.terminate()
            if aws is not None:
                aws.stop()
    results = {
        "what": "one client, one request at a time: :predict against predictAsync + polling until answered",
        "requests": args.requests,
        "cores": os.cpu_count(),
        "results": rows,
        "command": "python benchmarks/async_queues.py",
    }
    print(f"results: {save_results('async_queues', results)}")


if __name__ == "__main__":
    main()
