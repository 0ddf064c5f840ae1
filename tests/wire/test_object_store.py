"""Models in object stores: a real S3 protocol server (moto's server mode) on 127.0.0.1 holds the repository.

Two ``workbench serve`` processes serve ``s3://repo``: versions uploaded (``saved_model.pb`` last) and deleted are
loaded and unloaded by both, and each one's cache holds exactly the versions it has loaded; a version copied file by
file (the model file first, in the middle or last) after a copy cut off half-way, which both tried, failed and
described in their status, is served by both; a promotion and a canary made through one replica reach the other
while 4 clients keep both busy with no failed request; a routing write racing a newer state is refused by the
store's conditional PUT; a model whose bucket is missing shows why in its status while the others serve, and loads
once the bucket appears; a model whose bucket the server's credentials may not read (a store enforcing IAM answers
403) shows the denial while the others serve, and loads once access is granted; ``workbench.export`` writes to
``s3://``, and a notebook server started on ``s3://`` serves what ``%serve export`` uploads there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from replica import MODELS, ONE, REACH_TIMEOUT_S, Replica
from upload_orders import ORDERS, copy_cut_off_then_whole
from waiting import RequestLoop, model_config_text, version_states, wait_until

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

from botocore.exceptions import ClientError  # noqa: E402

from workbench.models.routing.policy import Routing  # noqa: E402
from workbench.models.routing.routing_file import (  # noqa: E402
    NOTHING_STORED,
    RoutingConflict,
    RoutingObject,
    RoutingStateUnwritable,
)
from workbench.models.source import scan_remote_versions  # noqa: E402
from workbench.runtime.storage import SAVED_MODEL, RemoteFolder, StorageError, VersionCache, redact  # noqa: E402

V1 = '{"predictions":[[2.5]]}'  # hp2: 0.5 * 1 + 2
V2 = '{"predictions":[[3.5]]}'  # hp3: 0.5 * 1 + 3
BUCKET = "repo"  # the replicas' repository
OTHER = "other"  # tests that need no replica write here, so the replicas' repository holds only their models
POLL = "--file_system_poll_wait_seconds=0.5"


# ----------------------------------------------------------------------------------------------- the store
@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free port; the standard AWS variables point every client (and server) at it."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    settings = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    previous = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)  # inherited by the replicas: credentials come from the environment, as on a pod
    yield endpoint
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture(scope="module")
def s3(s3_endpoint: str) -> Any:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    client.create_bucket(Bucket=OTHER)
    return client


def upload_version(s3: Any, local: Path, bucket: str, prefix: str) -> None:
    """Upload a version as an exporter must: every file, then ``saved_model.pb`` last (it publishes the version)."""
    files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: p.name == SAVED_MODEL)
    for path in files:
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


def delete_version(s3: Any, bucket: str, prefix: str) -> None:
    """Delete ``saved_model.pb`` first (the version is gone for pollers at once), then the rest."""
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/{SAVED_MODEL}")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    for item in listed:
        s3.delete_object(Bucket=bucket, Key=item["Key"])


def stored_routing(s3: Any, model: str) -> dict[str, Any]:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=f"{model}/routing.json")["Body"].read())


# -------------------------------------------------------------------------------------------- the replicas
def both(replicas: list[Replica], predicate: Callable[[Replica], bool], what: str) -> None:
    wait_until(lambda: all(predicate(r) for r in replicas), timeout=REACH_TIMEOUT_S, interval=0.05, what=what)


def cached_versions(cache: Path) -> dict[str, set[str]]:
    """Each server's cache slot → the ``model/version`` folders in it (hidden downloads and trash left out)."""
    return {
        slot.name: {f"{m.name}/{v.name}" for m in slot.iterdir() if not m.name.startswith(".") for v in m.iterdir()}
        for slot in sorted(cache.glob("slot-*"))
        if slot.is_dir()
    }


def loaded_versions(replica: Replica) -> set[str]:
    """Every ``model/version`` the replica has loaded, from its management view."""
    described = requests.get(f"{replica.rest_url}{MODELS}", timeout=30).json()["models"]
    return {f"{m['name']}/{v['version']}" for m in described for v in m["versions"] if v["state"] == "AVAILABLE"}


PAIR_MODELS = ("promoted", "stale", "versions")


@pytest.fixture(scope="module")
def pair(s3: Any, model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Replica]]]:
    """Two replicas on ``s3://repo`` sharing one cache directory (each takes a slot of its own)."""
    for name in PAIR_MODELS:
        upload_version(s3, model_store / "hp2_tf2", BUCKET, f"{name}/1")
        if name != "versions":
            upload_version(s3, model_store / "hp3_tf2", BUCKET, f"{name}/2")
    workdir = tmp_path_factory.mktemp("s3-replicas")
    cache = workdir / "cache"
    flags = (f"--model_repository=s3://{BUCKET}", POLL, f"--model_cache_dir={cache}")
    replicas = [Replica(workdir / f"replica{i}", *flags) for i in range(2)]
    try:
        for replica in replicas:
            replica.wait_ready()
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise
    yield cache, replicas
    for replica in replicas:
        replica.stop()


# --------------------------------------------------------------------------------------------------- tests
def test_versions_uploaded_and_deleted_are_loaded_and_unloaded_by_both_and_cached_only_while_loaded(
    pair: tuple[Path, list[Replica]], s3: Any, model_store: Path
) -> None:
    cache, replicas = pair
    both(replicas, lambda r: r.states("versions") == {"1": "AVAILABLE"}, "version 1 served by both")

    upload_version(s3, model_store / "hp3_tf2", BUCKET, "versions/2")
    both(replicas, lambda r: r.states("versions") == {"2": "AVAILABLE", "1": "END"}, "version 2 replacing 1")
    both(replicas, lambda r: r.predict("versions") == V2, "version 2 answering")

    def caches_hold_what_is_loaded() -> bool:
        slots = cached_versions(cache)
        loaded = sorted(sorted(loaded_versions(r)) for r in replicas)
        return len(slots) == 2 and sorted(sorted(held) for held in slots.values()) == loaded

    wait_until(caches_hold_what_is_loaded, timeout=REACH_TIMEOUT_S, what="each cache slot to hold its loaded versions")
    assert all("versions/1" not in held and "versions/2" in held for held in cached_versions(cache).values())

    delete_version(s3, BUCKET, "versions/2")
    both(replicas, lambda r: r.states("versions").get("1") == "AVAILABLE", "version 1 again once 2 is deleted")
    both(replicas, lambda r: r.states("versions").get("2") == "END", "version 2 unloaded")
    wait_until(caches_hold_what_is_loaded, timeout=REACH_TIMEOUT_S, what="version 2 gone from the caches")
    assert all("versions/2" not in held for held in cached_versions(cache).values())


def test_a_half_uploaded_version_is_not_loaded_until_its_saved_model_arrives(
    pair: tuple[Path, list[Replica]], s3: Any, model_store: Path
) -> None:
    _, replicas = pair
    both(replicas, lambda r: "1" in r.states("versions"), "the model served")
    local = model_store / "hp3_tf2"
    for path in (p for p in local.rglob("*") if p.is_file() and p.name != SAVED_MODEL):
        s3.upload_file(str(path), BUCKET, f"versions/7/{path.relative_to(local).as_posix()}")
    # A model uploaded after the partial version: once both serve it, both have polled since (a poll discovers
    # models, then scans every model's versions), and neither may have found a version 7.
    upload_version(s3, local, BUCKET, "witness/1")
    both(replicas, lambda r: r.states("witness") == {"1": "AVAILABLE"}, "a poll after the partial upload")
    for replica in replicas:
        assert "7" not in replica.states("versions")
        assert all(v["version"] != 7 for v in replica.model("versions")["versions"])
    s3.upload_file(str(local / SAVED_MODEL), BUCKET, f"versions/7/{SAVED_MODEL}")
    both(replicas, lambda r: r.states("versions").get("7") == "AVAILABLE", "version 7 once complete")
    delete_version(s3, BUCKET, "versions/7")
    both(replicas, lambda r: r.states("versions").get("7") == "END", "version 7 unloaded")


@pytest.mark.parametrize("order", ORDERS)
def test_a_version_copied_file_by_file_is_served_by_both_replicas_whatever_the_order(
    pair: tuple[Path, list[Replica]], s3: Any, model_store: Path, order: str
) -> None:
    """A copy cut off after the model file (both replicas try it and fail, and say what they tried), then the whole
    version copied again with the model file first, in the middle or last, a poll between two files: both end up
    serving it. Each used to stay failed: the fingerprint was the model file's, unchanged by the variables."""
    _, replicas = pair
    name, local = f"copied-{order}", model_store / "hp3_tf2"
    upload_version(s3, model_store / "hp2_tf2", BUCKET, f"{name}/1")
    both(replicas, lambda r: r.states(name) == {"1": "AVAILABLE"}, "version 1 served by both")

    def put(file: str) -> None:
        s3.upload_file(str(local / file), BUCKET, f"{name}/2/{file}")

    copy_cut_off_then_whole(replicas, name, local, order, put, both, (V1, V2))


def test_a_promotion_and_a_canary_through_one_replica_reach_the_other_under_load(
    pair: tuple[Path, list[Replica]], s3: Any
) -> None:
    _, (a, b) = pair
    name = "promoted"
    both([a, b], lambda r: r.model(name)["stable"] is None and r.predict(name) == V2, "the latest served by both")
    loops = [RequestLoop(f"{replica.rest_url}/v1/models/{name}:predict", ONE) for replica in (a, b, a, b)]
    for loop in loops:
        loop.start()
    try:
        started = time.monotonic()
        promoted = a.manage(f"{name}:promote", {"version": 1})
        assert promoted.status_code == 200, promoted.text
        both([a, b], lambda r: r.model(name)["stable"] == 1 and r.predict(name) == V1, "the promotion on both")
        print(f"\npromotion through replica A answered by B after {time.monotonic() - started:.2f}s (poll 0.5s)")

        canary = a.manage(f"{name}:canary", {"version": 2, "weight": 0.5})
        assert canary.status_code == 200, canary.text
        both(
            [a, b],
            lambda r: {v["version"]: v["traffic_share"] for v in r.model(name)["versions"]} == {1: 0.5, 2: 0.5},
            "the canary's share served by both",
        )
        marks = [len(loop.results) for loop in loops]
        wait_until(
            lambda: all(len(loop.results) >= mark + 20 for loop, mark in zip(loops, marks, strict=True)),
            timeout=REACH_TIMEOUT_S,
            what="every client to send 20 more requests after the canary",
        )
    finally:
        for loop in loops:
            loop.stop()
    for loop in loops:
        assert loop.failures() == [], loop.failures()[:3]
        assert loop.count(V1) + loop.count(V2) == len(loop.results)
    assert b.model(name)["generation"] == a.model(name)["generation"] == 2
    stored = stored_routing(s3, name)
    assert (stored["generation"], stored["stable"], stored["canary"]) == (2, 1, 2)
    assert a.model(name)["routing_state"] == f"s3://{BUCKET}/{name}/routing.json"


def test_a_change_based_on_an_older_generation_is_refused_and_the_object_is_unchanged(
    pair: tuple[Path, list[Replica]], s3: Any
) -> None:
    _, (a, b) = pair
    name = "stale"
    assert a.manage(f"{name}:promote", {"version": 1, "generation": 0}).status_code == 200
    both([a, b], lambda r: r.model(name)["stable"] == 1, "the promotion on both")
    written = s3.get_object(Bucket=BUCKET, Key=f"{name}/routing.json")["Body"].read()
    refused = b.manage(f"{name}:promote", {"version": 2, "generation": 0})
    assert refused.status_code == 409, refused.text
    assert s3.get_object(Bucket=BUCKET, Key=f"{name}/routing.json")["Body"].read() == written


def test_a_routing_write_racing_a_newer_state_is_refused_by_the_conditional_put(s3: Any) -> None:
    url = f"s3://{OTHER}/raced"
    first, second = RoutingObject(url), RoutingObject(url)
    assert first.read() is None
    created = first.write(Routing(stable=1), NOTHING_STORED)
    assert created.generation == 1
    with pytest.raises(RoutingConflict) as raced:  # also based on "nothing stored": If-None-Match refuses it
        second.write(Routing(stable=2), NOTHING_STORED)
    assert raced.value.current.generation == 1 and raced.value.current.routing.stable == 1

    base = second.read()
    assert base is not None and base.etag == created.etag
    newer = first.write(Routing(stable=3), created)  # the state moves on
    with pytest.raises(RoutingConflict) as stale:  # a write based on generation 1: If-Match refuses it
        second.write(Routing(stable=4), base)
    assert stale.value.current.etag == newer.etag
    stored = second.read()
    assert stored is not None and (stored.generation, stored.routing.stable) == (2, 3)


def test_a_missing_bucket_shows_in_status_while_the_other_model_serves(
    s3: Any, model_store: Path, serve: Any, tmp_path: Path
) -> None:
    upload_version(s3, model_store / "hp2_tf2", OTHER, "good/1")
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("good", f"s3://{OTHER}/good", ""), ("broken", "s3://not-yet/broken", "")))
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0.5, model_cache_dir=str(tmp_path))
    url = server.rest_url
    assert requests.post(f"{url}/v1/models/good:predict", json=ONE, timeout=30).text == V1
    status = requests.get(f"{url}/v1/models/broken", timeout=30)
    assert status.status_code == 404 and "not-yet" in status.json()["error"], status.text
    view = requests.get(f"{url}{MODELS}/broken", timeout=30).json()
    assert "not-yet" in view["error"] and "does not exist" in view["error"], view
    assert requests.get(f"{url}{MODELS}/good", timeout=30).json()["error"] == ""

    s3.create_bucket(Bucket="not-yet")  # the next poll retries, and finds it
    upload_version(s3, model_store / "hp3_tf2", "not-yet", "broken/1")
    wait_until(lambda: version_states(url, "broken") == {"1": "AVAILABLE"}, timeout=REACH_TIMEOUT_S)
    assert requests.post(f"{url}/v1/models/broken:predict", json=ONE, timeout=30).text == V2
    assert requests.get(f"{url}{MODELS}/broken", timeout=30).json()["error"] == ""

    # The bucket goes away under a serving model: an error, not "no versions": what serves keeps serving.
    delete_version(s3, "not-yet", "broken/1")
    s3.delete_bucket(Bucket="not-yet")
    wait_until(lambda: requests.get(f"{url}{MODELS}/broken", timeout=30).json()["error"], timeout=REACH_TIMEOUT_S)
    assert version_states(url, "broken") == {"1": "AVAILABLE"}
    assert requests.post(f"{url}/v1/models/broken:predict", json=ONE, timeout=30).text == V2


def test_a_store_without_conditional_writes_refuses_routing_changes_and_says_why() -> None:
    store = RoutingObject("memory://repository/model")
    assert store.read() is None
    with pytest.raises(RoutingStateUnwritable, match="conditional writes"):
        store.check_writable()
    with pytest.raises(RoutingStateUnwritable, match="conditional writes"):
        store.write(Routing(stable=1), NOTHING_STORED)


def test_a_store_whose_library_is_missing_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test install has gcsfs; a None in sys.modules makes importing it fail as on a machine without it.
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    import fsspec  # noqa: F401 - loads fsspec.registry, the module (the package's attribute is a read-only view)

    known = sys.modules["fsspec.registry"]._registry
    for scheme in ("gs", "gcs"):  # forget a class an earlier test imported (fsspec caches it per scheme)
        monkeypatch.delitem(known, scheme, raising=False)
    with pytest.raises(StorageError, match=re.escape("pip install 'workbench-serving[gcs]'")):
        scan_remote_versions("gs://bucket/model")


def test_a_server_of_local_models_claims_no_cache_slot(tmp_path: Path) -> None:
    cache = VersionCache(tmp_path / "cache")
    cache.release("model", 1)  # what every unload of a local version calls
    cache.close()
    assert not (tmp_path / "cache").exists()


def test_credentials_in_a_url_are_never_shown() -> None:
    assert redact("s3://AKIA123:s3cr3t@bucket/m") == "s3://***@bucket/m"
    assert redact("s3://bucket/m") == "s3://bucket/m"


def test_export_to_s3_is_served_by_both_replicas(pair: tuple[Path, list[Replica]], s3: Any) -> None:
    import tensorflow as tf

    from workbench.publishing import export

    class Affine(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable([[1.0], [2.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x @ self.w}

    result = export(Affine(), "exported", model_repository=f"s3://{BUCKET}", examples={"x": [[1.0, 1.0]]})
    assert (result.version, result.path) == (1, f"s3://{BUCKET}/exported/1")
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="exported/")["Contents"]]
    assert f"exported/1/{SAVED_MODEL}" in keys and any(k.startswith("exported/1/variables/") for k in keys)
    _, replicas = pair
    body = {"instances": [[1.0, 1.0]]}

    def answers(r: Replica) -> bool:
        reply = requests.post(f"{r.rest_url}/v1/models/exported:predict", json=body, timeout=30)
        return reply.status_code == 200 and reply.json() == {"predictions": [[3.0]]}

    both(replicas, answers, "the exported model served by both")
    second = export(Affine(), "exported", model_repository=f"s3://{BUCKET}")
    assert second.version == 2


def test_download_time_against_loading_from_disk(s3: Any, model_store: Path, tmp_path: Path) -> None:
    """Prints both numbers (no timing assert) for a tiny and a 16 MB version: downloaded from the local S3 server
    into the cache, and loaded from disk; the copy must be byte-identical and load."""
    from models import save_dense

    from workbench.platforms.tensorflow import load_saved_model

    versions = {"half_plus_two": model_store / "hp2_tf2", "dense_16mb": save_dense(tmp_path / "dense", 2_000_000)}
    cache = VersionCache(tmp_path / "cache")
    started = time.perf_counter()
    RemoteFolder(f"s3://{OTHER}").list_folders()  # the S3 client's set-up, once per server: not part of a download
    print(f"\nS3 client set-up and a first listing: {(time.perf_counter() - started) * 1000:.0f} ms")
    try:
        for number, (name, original) in enumerate(versions.items(), start=1):
            upload_version(s3, original, OTHER, f"timed/{number}")
            started = time.perf_counter()
            local = cache.fetch("timed", number, f"s3://{OTHER}/timed/{number}")
            downloaded = time.perf_counter() - started
            files = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
            assert sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file()) == files
            assert all((local / f).read_bytes() == (original / f).read_bytes() for f in files)

            started = time.perf_counter()
            servable = load_saved_model("timed", number, str(original))
            loaded = time.perf_counter() - started
            servable.close()
            size = sum((original / f).stat().st_size for f in files)
            print(
                f"\n{name} ({size / 1e6:.1f} MB): downloaded from the local S3 server in {downloaded * 1000:.0f} ms, "
                f"loaded from disk in {loaded * 1000:.0f} ms"
            )
            cache.release("timed", number)
            assert not cache.path_of("timed", number).exists()
    finally:
        cache.close()


def test_a_notebook_server_on_a_store_serves_what_serve_export_writes_there(
    s3: Any, ipython_shell: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``%serve start --model_repository s3://...`` keeps the URL (no local folder is made of it), and
    ``%serve export`` uploads the version to the store and returns once the server has loaded it from there."""
    import keras
    import numpy as np

    x = keras.Input((1,), name="x")
    model = keras.Model(x, keras.layers.Dense(1, name="y")(x))
    model.get_layer("y").set_weights([np.array([[2.0]], "float32"), np.array([1.0], "float32")])
    ipython_shell.user_ns["store_model"] = model
    repository = f"s3://{OTHER}/notebook"
    monkeypatch.chdir(tmp_path)  # a URL taken for a relative path would show up here as an "s3:" folder
    handle = ipython_shell.run_line_magic("serve", f"start --server_name store --model_repository {repository}")
    try:
        assert handle.model_repository == repository and f"--model_repository={repository}" in handle.command()
        ipython_shell.run_line_magic("serve", "export store_model lin --server_name store")
        keys = [item["Key"] for item in s3.list_objects_v2(Bucket=OTHER, Prefix="notebook/lin/")["Contents"]]
        assert f"notebook/lin/1/{SAVED_MODEL}" in keys
        answer = ipython_shell.run_line_magic("serve", "predict lin [[1.0]] --server_name store")
        assert answer["y"].tolist() == [[3.0]]
        assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())
    finally:
        ipython_shell.run_line_magic("serve", "stop store")
    assert not handle.running


# ------------------------------------------------------------------------------ a store enforcing permissions
def read_policy(*buckets: str) -> str:
    """An IAM policy that may list and read the given buckets, and nothing else."""
    resources = [arn for b in buckets for arn in (f"arn:aws:s3:::{b}", f"arn:aws:s3:::{b}/*")]
    statement = {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetObject"], "Resource": resources}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


class GuardedStore:
    """moto's S3 server in a process of its own, enforcing IAM: an "admin" may do anything and a "reader" may read
    the buckets its policy names; any other request is answered 403, as S3 answers it. Its own process, because
    moto's switch to enforce permissions is process-wide: the module's server stays open for the other tests."""

    ADMIN_POLICY = json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    )
    SERVER_CODE = (
        "import sys; from moto.server import ThreadedMotoServer; "
        "server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); server.start(); "
        "print(server.get_host_and_port()[1], flush=True); sys.stdin.read()"  # serves until its stdin closes
    )

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.SERVER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().strip()
        assert port.isdigit(), f"moto's server did not start (exit {self.proc.poll()})"
        self.endpoint = f"http://127.0.0.1:{port}"
        setup = {"endpoint_url": self.endpoint, "region_name": "us-east-1"}
        bootstrap = boto3.client("iam", **setup, aws_access_key_id="setup", aws_secret_access_key="setup")
        self.admin_key = self._user(bootstrap, "admin", self.ADMIN_POLICY)  # made while nothing is enforced yet
        self.reader_key = self._user(bootstrap, "reader", None)  # reads nothing until allow_reader
        requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"0", timeout=30).raise_for_status()
        admin = {"aws_access_key_id": self.admin_key[0], "aws_secret_access_key": self.admin_key[1], **setup}
        self.s3 = boto3.client("s3", **admin)
        self.iam = boto3.client("iam", **admin)

    @staticmethod
    def _user(iam: Any, name: str, policy: str | None) -> tuple[str, str]:
        iam.create_user(UserName=name)
        if policy:
            iam.put_user_policy(UserName=name, PolicyName="access", PolicyDocument=policy)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def allow_reader(self, *buckets: str) -> None:
        self.iam.put_user_policy(UserName="reader", PolicyName="access", PolicyDocument=read_policy(*buckets))

    def reader_environment(self) -> dict[str, str]:
        """What a pod given the reader's credentials would have."""
        key, secret = self.reader_key
        return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": self.endpoint}

    def reader_client_settings(self) -> dict[str, str]:
        key, secret = self.reader_key
        return {"endpoint_url": self.endpoint, "aws_access_key_id": key, "aws_secret_access_key": secret}

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture()
def guarded_store() -> Iterator[GuardedStore]:
    store = GuardedStore()
    yield store
    store.stop()


def test_a_denied_bucket_shows_the_denial_in_status_while_the_other_model_serves(
    guarded_store: GuardedStore, model_store: Path, tmp_path: Path
) -> None:
    store = guarded_store
    for bucket, model, version in (("granted", "open", "hp2_tf2"), ("locked", "closed", "hp3_tf2")):
        store.s3.create_bucket(Bucket=bucket)
        upload_version(store.s3, model_store / version, bucket, f"{model}/1")
    store.allow_reader("granted")
    reader = boto3.client("s3", **store.reader_client_settings())
    assert reader.list_objects_v2(Bucket="granted", Prefix="open/")["KeyCount"] > 0
    with pytest.raises(ClientError, match="AccessDenied"):  # a 403 from the store itself, not a missing bucket
        reader.list_objects_v2(Bucket="locked")
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("open", "s3://granted/open", ""), ("closed", "s3://locked/closed", "")))
    flags = (f"--model_config_file={config}", POLL, f"--model_cache_dir={tmp_path / 'cache'}")
    replica = Replica(tmp_path / "replica", *flags, env=store.reader_environment())
    try:
        replica.wait_ready()
        wait_until(lambda: replica.states("open") == {"1": "AVAILABLE"}, timeout=REACH_TIMEOUT_S, what="open served")
        assert replica.predict("open") == V1
        wait_until(lambda: replica.model("closed")["error"], timeout=REACH_TIMEOUT_S, what="closed's error")
        error = replica.model("closed")["error"]
        assert "s3://locked/closed: access denied" in error and "does not exist" not in error, error
        status = requests.get(f"{replica.rest_url}/v1/models/closed", timeout=30)
        assert status.status_code == 404 and "locked/closed: access denied" in status.json()["error"], status.text
        assert replica.model("open")["error"] == ""
        secret = store.reader_key[1]
        assert secret not in error and secret not in status.text and secret not in replica.log()

        store.allow_reader("granted", "locked")  # the next poll retries, and may read it now
        wait_until(lambda: replica.states("closed") == {"1": "AVAILABLE"}, timeout=REACH_TIMEOUT_S, what="closed")
        assert replica.predict("closed") == V2 and replica.predict("open") == V1
        assert replica.model("closed")["error"] == ""
    finally:
        replica.stop()


def test_workers_with_a_model_runner_share_one_download_and_one_copy_of_a_stored_version(
    s3: Any, tmp_path: Path
) -> None:
    """Two workers and a model runner serving a version from S3: the workers name the version by its URL, so the
    runner downloads it once and loads it once (each worker used to download it into a cache slot of its own and
    hand the runner its own path: two copies in the runner)."""
    import signal

    from test_cli import START_DEADLINE_S, Workbench
    from test_model_runners import MODEL

    s3.put_object(Bucket=BUCKET, Key="runners/m/1/model.py", Body=MODEL.encode())
    cache = tmp_path / "cache"
    records = cache / "records"  # the model notes its loads three folders above its file: the cache's root
    records.mkdir(parents=True)
    ready = tmp_path / "ready.json"
    (tmp_path / "cwd").mkdir()
    wb = Workbench(
        tmp_path / "cwd",
        f"--model_base_path=s3://{BUCKET}/runners/m",
        "--model_name=m",
        "--allow_python_models",
        "--num_workers=2",
        "--model_runners=1",
        f"--model_cache_dir={cache}",
        "--rest_api_port=-1",
        "--port=0",
        f"--ready_file={ready}",
    )
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        started = json.loads(ready.read_text())
        url = f"http://127.0.0.1:{started['rest_port']}/v1/models/m:predict"
        for x in range(8):  # new connections: the kernel spreads them over both workers
            answer = requests.post(url, json={"instances": [[float(x)]]}, timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"][0]["y"] == [2.0 * x]
        (runner,) = started["runners"]
        assert (records / "loads").read_text().split() == [str(runner["pid"])], "loaded more than once"
        copies = [path for path in cache.rglob("model.py")]
        assert len(copies) == 1, copies
    finally:
        if wb.proc.poll() is None:
            wb.proc.send_signal(signal.SIGTERM)
            assert wb.wait(120) == 0, wb.stderr[-3000:]
