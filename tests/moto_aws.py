"""AWS on 127.0.0.1 for the tests: moto's server (S3, SQS, ...) on a free port, reached by boto3 and s3fs through the
standard AWS variables, which the servers a test starts inherit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def moto_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's server, running; its endpoint URL. Skips where moto is not installed."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _forget_s3_clients()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(key, value)
    try:
        yield endpoint
    finally:
        server.stop()
        _forget_s3_clients()


def _forget_s3_clients() -> None:
    """fsspec keeps one S3 file system per set of options, and with it the endpoint it was made for: a later test
    on another moto server would reach this one's, stopped, through it."""
    with contextlib.suppress(ImportError):
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
