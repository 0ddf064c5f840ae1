"""Model versions as TF Serving manages them: policies, status and metadata bodies, version folders on disk,
hot add/remove without a single failed request, and versions that fail to load (and get fixed)."""

from __future__ import annotations

import collections
import os
import shutil
import threading

import models
import pytest
import requests
from waiting import (
    RequestLoop,
    model_config_text,
    place_atomically,
    remove_atomically,
    states_are,
    version_states,
    wait_until,
)

from workbench.models.harness import Harness

OK = {"error_code": "OK", "error_message": ""}
V1_ANSWER = '{"predictions":[[2.5]]}'  # hp2: 0.5 * 1 + 2
V2_ANSWER = '{"predictions":[[3.5]]}'  # hp3: 0.5 * 1 + 3
ONE = {"instances": [[1.0]]}


def available(*versions: int) -> dict:
    return {"model_version_status": [{"version": str(v), "state": "AVAILABLE", "status": OK} for v in versions]}


def get(server, path: str) -> requests.Response:
    return requests.get(server.rest_url + path, timeout=30)


def predict(server, path: str, body: object = ONE) -> requests.Response:
    return requests.post(server.rest_url + path + ":predict", json=body, timeout=30)


def serve_config(serve, tmp_path, *entries, **options):
    config = tmp_path / "models.config"
    config.write_text(model_config_text(*entries))
    return serve(model_config_file=str(config), **options)


# ------------------------------------------------------------------------------------------------ policies
def test_default_policy_serves_only_the_latest_version(serve, make_repo):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0)

    r = get(server, "/v1/models/m")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.text == (
        '{"model_version_status":[{"version":"2","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}}]}'
    )
    assert predict(server, "/v1/models/m").text == V2_ANSWER
    assert predict(server, "/v1/models/m/versions/2").text == V2_ANSWER

    # Version 1 is on disk but not aspired: never loaded, so neither status nor inference knows it.
    r = get(server, "/v1/models/m/versions/1")
    assert r.status_code == 404
    assert r.json() == {"error": "Could not find version 1 of model m"}
    r = predict(server, "/v1/models/m/versions/1")
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Specific(m, 1)"}


def test_latest_all_and_specific_policies_from_a_config_file(serve, make_repo, tmp_path):
    three = {1: "hp2_tf2", 2: "hp3_tf2", 3: "hp2_tf2"}
    server = serve_config(
        serve,
        tmp_path,
        ("latest2", make_repo("latest2", three), "model_version_policy { latest { num_versions: 2 } }"),
        ("all", make_repo("all", {1: "hp2_tf2", 2: "hp3_tf2"}), "model_version_policy { all {} }"),
        ("specific", make_repo("specific", three), "model_version_policy { specific { versions: 1 versions: 3 } }"),
        file_system_poll_wait_seconds=0,
    )

    assert get(server, "/v1/models/latest2").json() == available(3, 2)
    assert get(server, "/v1/models/all").json() == available(2, 1)
    assert get(server, "/v1/models/specific").json() == available(3, 1)
    assert get(server, "/v1/models/all").text == (
        '{"model_version_status":[{"version":"2","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}},'
        '{"version":"1","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}}]}'
    )

    # Every served version answers by number; the default path goes to the newest.
    assert predict(server, "/v1/models/all/versions/1").text == V1_ANSWER
    assert predict(server, "/v1/models/all/versions/2").text == V2_ANSWER
    assert predict(server, "/v1/models/all").text == V2_ANSWER
    assert predict(server, "/v1/models/latest2/versions/2").text == V2_ANSWER
    assert predict(server, "/v1/models/latest2/versions/3").text == V1_ANSWER
    assert predict(server, "/v1/models/specific/versions/1").text == V1_ANSWER

    for model, missing in (("latest2", 1), ("specific", 2)):
        r = predict(server, f"/v1/models/{model}/versions/{missing}")
        assert r.status_code == 404
        assert r.json() == {"error": f"Servable not found for request: Specific({model}, {missing})"}
        r = get(server, f"/v1/models/{model}/versions/{missing}")
        assert r.status_code == 404
        assert r.json() == {"error": f"Could not find version {missing} of model {model}"}

    r = get(server, "/v1/models/specific/versions/3")
    assert r.status_code == 200
    assert r.json() == available(3)


def test_unknown_version_and_unknown_model(serve, make_repo):
    server = serve(model_name="m", model_base_path=str(make_repo("m", {1: "hp2_tf2"})), file_system_poll_wait_seconds=0)

    r = get(server, "/v1/models/m/versions/7")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "Could not find version 7 of model m"}

    r = get(server, "/v1/models/foo")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "Could not find any versions of model foo"}

    r = predict(server, "/v1/models/foo")
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Latest(foo)"}
    r = get(server, "/v1/models/m/versions/7/metadata")
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Specific(m, 7)"}


# ------------------------------------------------------------------------------------------------ metadata
def _dims(*sizes: int) -> dict:
    return {"dim": [{"size": str(s), "name": ""} for s in sizes], "unknown_rank": False}


def test_metadata_of_a_tf2_model(serve, make_repo):
    server = serve(model_name="m", model_base_path=str(make_repo("m", {4: "hp2_tf2"})), file_system_poll_wait_seconds=0)

    for path in ("/v1/models/m/metadata", "/v1/models/m/versions/4/metadata"):
        r = get(server, path)
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["model_spec"] == {"name": "m", "signature_name": "", "version": "4"}
        assert set(body) == {"model_spec", "metadata"}
        signatures = body["metadata"]["signature_def"]["signature_def"]
        assert set(signatures) == {"serving_default", "classify_x_to_y", "regress_x_to_y", "__saved_model_init_op"}
        default = signatures["serving_default"]
        assert default["method_name"] == "tensorflow/serving/predict"
        assert set(default["inputs"]) == {"x"} and set(default["outputs"]) == {"y"}
        assert default["inputs"]["x"]["dtype"] == "DT_FLOAT"
        assert default["inputs"]["x"]["tensor_shape"] == _dims(-1, 1)
        assert default["outputs"]["y"]["tensor_shape"] == _dims(-1, 1)
        assert signatures["classify_x_to_y"]["inputs"]["inputs"]["dtype"] == "DT_STRING"
        assert signatures["classify_x_to_y"]["inputs"]["inputs"]["tensor_shape"] == _dims(-1)


def test_metadata_of_a_tf1_model(serve, make_repo):
    server = serve(model_name="t", model_base_path=str(make_repo("t", {1: "hp2_tf1"})), file_system_poll_wait_seconds=0)

    body = get(server, "/v1/models/t/metadata").json()
    assert body["model_spec"] == {"name": "t", "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == {
        "serving_default",
        "classify_x_to_y",
        "regress_x_to_y",
        "regress_x_to_y2",
        "regress_x2_to_y3",
        "classify_with_classes",
    }
    assert signatures["serving_default"] == {
        "inputs": {"x": {"name": "x:0", "dtype": "DT_FLOAT", "tensor_shape": _dims(-1, 1)}},
        "outputs": {"y": {"name": "y:0", "dtype": "DT_FLOAT", "tensor_shape": _dims(-1, 1)}},
        "method_name": "tensorflow/serving/predict",
        "defaults": {},
    }
    assert signatures["classify_with_classes"]["method_name"] == "tensorflow/serving/classify"
    assert signatures["classify_with_classes"]["outputs"]["classes"]["dtype"] == "DT_STRING"
    assert signatures["classify_with_classes"]["outputs"]["classes"]["tensor_shape"] == _dims(-1, 2)
    assert signatures["regress_x_to_y"]["method_name"] == "tensorflow/serving/regress"
    assert signatures["regress_x_to_y"]["inputs"]["inputs"]["tensor_shape"] == _dims(-1)


# ------------------------------------------------------------------------------------------ folder names
def test_version_folder_names_parse_as_integers_and_others_are_ignored(serve, tmp_path, model_store):
    base = tmp_path / "m"
    shutil.copytree(model_store / "hp2_tf2", base / "00000123")
    # Non-numeric folders are not versions, even when they hold a perfectly good (and "newer") model.
    for ignored in ("abc", "124abc", "v125", "-126", "1.5"):
        shutil.copytree(model_store / "hp3_tf2", base / ignored)
    (base / "999").write_text("a file, not a folder")
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0)

    assert get(server, "/v1/models/m").json() == available(123)
    assert predict(server, "/v1/models/m/versions/123").text == V1_ANSWER
    assert predict(server, "/v1/models/m").text == V1_ANSWER
    assert get(server, "/v1/models/m/metadata").json()["model_spec"]["version"] == "123"


# --------------------------------------------------------------------------------------------- hot swaps
def _assert_switched_once(results: list[tuple[int, str]], before: str, after: str) -> None:
    failures = [r for r in results if r[0] != 200]
    assert not failures, f"{len(failures)} of {len(results)} requests failed during the swap: {failures[:3]}"
    assert len(results) > 50
    answers = [body for _, body in results]
    assert set(answers) == {before, after}
    first_after = answers.index(after)
    assert first_after > 0
    # Once the new answer appears the old one never comes back.
    assert all(a == after for a in answers[first_after:]), "answers flip-flopped between versions"


def test_hot_add_of_a_version_switches_traffic_without_a_failed_request(serve, make_repo, model_store):
    base = make_repo("m", {1: "hp2_tf2"})
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0.2)
    url = server.rest_url
    assert version_states(url, "m") == {"1": "AVAILABLE"}

    with RequestLoop(f"{url}/v1/models/m:predict", ONE) as client:
        wait_until(lambda: client.count(V1_ANSWER) >= 25, what="v1 traffic")
        place_atomically(model_store / "hp3_tf2", base / "2")
        wait_until(states_are(url, "m", {"2": "AVAILABLE", "1": "END"}), what="v2 AVAILABLE, v1 END")
        wait_until(lambda: client.count(V2_ANSWER) >= 25, what="v2 traffic")
    _assert_switched_once(client.results, V1_ANSWER, V2_ANSWER)

    assert get(server, "/v1/models/m").json() == {
        "model_version_status": [
            {"version": "2", "state": "AVAILABLE", "status": OK},
            {"version": "1", "state": "END", "status": OK},
        ]
    }
    r = predict(server, "/v1/models/m/versions/1")
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Specific(m, 1)"}


@pytest.mark.parametrize("policy", ["all {}", "latest { num_versions: 1 }"])
def test_hot_remove_of_the_newest_version_without_a_failed_request(serve, make_repo, tmp_path, policy):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    server = serve_config(
        serve, tmp_path, ("m", base, f"model_version_policy {{ {policy} }}"), file_system_poll_wait_seconds=0.2
    )
    url = server.rest_url
    assert predict(server, "/v1/models/m").text == V2_ANSWER

    with RequestLoop(f"{url}/v1/models/m:predict", ONE) as client:
        wait_until(lambda: client.count(V2_ANSWER) >= 25, what="v2 traffic")
        remove_atomically(base / "2")
        wait_until(states_are(url, "m", {"2": "END", "1": "AVAILABLE"}), what="v2 END, v1 AVAILABLE")
        wait_until(lambda: client.count(V1_ANSWER) >= 25, what="v1 traffic")
    _assert_switched_once(client.results, V2_ANSWER, V1_ANSWER)

    assert get(server, "/v1/models/m/versions/2").json() == {
        "model_version_status": [{"version": "2", "state": "END", "status": OK}]
    }


def test_a_request_that_resolved_a_version_finishes_on_it_while_that_version_unloads(
    serve, make_repo, tmp_path, monkeypatch
):
    """The deterministic form of the hot-remove race: TF Serving hands a request a servable *handle*, and a
    version is only unloaded once the handles on it are released, so a request that already picked v2 is
    answered by v2 even if v2 is taken away before it runs."""
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    server = serve_config(
        serve, tmp_path, ("m", base, "model_version_policy { all {} }"), file_system_poll_wait_seconds=0.1
    )
    dataplane, manager = server.server.dataplane, server.server.manager
    resolved, proceed = threading.Event(), threading.Event()
    held: list[Harness] = []
    original_resolve = dataplane.resolve

    def resolve_then_pause(spec):
        harness = original_resolve(spec)  # held for the request from here until it is answered
        if not resolved.is_set():
            held.append(harness)
            resolved.set()
            proceed.wait(30)  # holds this one request between resolution and execution
        return harness

    monkeypatch.setattr(dataplane, "resolve", resolve_then_pause)
    answers: list[requests.Response] = []
    client = threading.Thread(target=lambda: answers.append(predict(server, "/v1/models/m")), daemon=True)
    client.start()
    try:
        assert resolved.wait(30)
        (v2,) = held
        assert v2.servable.version == 2
        remove_atomically(base / "2")
        # The unload has begun once v2 refuses new holders. It marks v2 so under the servable's lock and keeps that
        # lock until it waits for the holders to leave: from here a correct server waits for the held request,
        # and one that does not wait has already freed v2 under it. Either way, however fast the machine.
        wait_until(lambda: refuses_new_holders(v2), what="v2's unload to begin")
        # (Asked of the manager: the held request holds the REST frontend's loop too.)
        assert {s.version: s.state.name for s in manager.served.version_status("m")} == {2: "UNLOADING", 1: "AVAILABLE"}
    finally:
        proceed.set()
        client.join(30)
    (answer,) = answers
    assert (answer.status_code, answer.text) == (200, V2_ANSWER)
    wait_until(states_are(server.rest_url, "m", {"2": "END", "1": "AVAILABLE"}), what="v2 END")


def refuses_new_holders(harness: Harness) -> bool:
    """True once the version is unloading (a new request could no longer hold it)."""
    if harness.acquire():
        harness.release()
        return False
    return True


# ------------------------------------------------------------------------------------------ failed loads
def _write_corrupt_atomically(target) -> None:
    staging = target.parent / f".staging-{target.name}"
    models.write_corrupt_version(staging)
    os.replace(staging, target)


def test_corrupt_version_is_reported_and_the_good_version_keeps_serving(serve, make_repo):
    base = make_repo("m", {1: "hp2_tf2"})
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0.2)
    url = server.rest_url

    with RequestLoop(f"{url}/v1/models/m:predict", ONE) as client:
        wait_until(lambda: client.count() >= 10, what="traffic")
        _write_corrupt_atomically(base / "2")
        wait_until(lambda: version_states(url, "m").get("2") == "END", what="v2 END")
        seen = client.count()
        wait_until(lambda: client.count() >= seen + 10, what="traffic after the failure")
    assert client.failures() == []
    assert {body for _, body in client.results} == {V1_ANSWER}

    statuses = get(server, "/v1/models/m").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in statuses] == [("2", "END"), ("1", "AVAILABLE")]
    assert statuses[0]["status"]["error_code"] not in ("OK", "", 0)
    assert statuses[0]["status"]["error_message"]
    assert statuses[1]["status"] == OK
    assert predict(server, "/v1/models/m").text == V1_ANSWER
    r = predict(server, "/v1/models/m/versions/2")
    assert r.status_code == 404
    # TF Serving's words (clients match on them), then why: the version's load error.
    assert r.json()["error"].startswith("Servable not found for request: Specific(m, 2): version 2 failed to load: ")
    assert statuses[0]["status"]["error_message"] in r.json()["error"]


def test_legacy_export_is_reported_as_not_a_saved_model(serve, tmp_path):
    base = tmp_path / "legacy"
    models.write_legacy_export(base / "1")
    server = serve(model_name="legacy", model_base_path=str(base), file_system_poll_wait_seconds=0)

    (status,) = get(server, "/v1/models/legacy").json()["model_version_status"]
    assert status["version"] == "1"
    assert status["state"] == "END"
    assert status["status"]["error_code"] != "OK"
    assert "SavedModel" in status["status"]["error_message"]
    r = predict(server, "/v1/models/legacy")
    assert r.status_code == 404
    # TF Serving's words, then why the model does not serve: its version's load error.
    message = r.json()["error"]
    assert message.startswith("Servable not found for request: Latest(legacy): version 1 failed to load: ")
    assert status["status"]["error_message"] in message


def test_failed_version_is_retried_once_its_folder_is_fixed(serve, make_repo, model_store, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    server = serve(model_name="m", model_base_path=str(base), file_system_poll_wait_seconds=0.2)
    url = server.rest_url
    _write_corrupt_atomically(base / "2")
    wait_until(states_are(url, "m", {"2": "END", "1": "AVAILABLE"}), what="v2 failed, v1 serving")
    assert predict(server, "/v1/models/m").text == V1_ANSWER

    # Replace the folder's contents with a good model, item by item (the folder itself stays).
    staging = tmp_path / "good"
    shutil.copytree(model_store / "hp3_tf2", staging)
    shutil.rmtree(base / "2" / "variables")
    for item in sorted(staging.iterdir(), key=lambda p: p.name == "saved_model.pb"):  # the .pb goes last
        os.replace(item, base / "2" / item.name)

    with RequestLoop(f"{url}/v1/models/m:predict", ONE) as client:
        wait_until(states_are(url, "m", {"2": "AVAILABLE", "1": "END"}), what="fixed v2 AVAILABLE")
        wait_until(lambda: client.count(V2_ANSWER) >= 5, what="v2 traffic")
    assert client.failures() == []
    assert get(server, "/v1/models/m/versions/2").json() == available(2)
    assert predict(server, "/v1/models/m").text == V2_ANSWER


# ------------------------------------------------------------------------------------- lock-free resolution
def test_requests_resolve_while_the_manager_holds_its_lock_and_see_a_version_leave_before_it_unloads(
    serve, make_repo, tmp_path
):
    """Resolution never takes the manager's lock: a request is routed while a state listener (called under that
    lock) is busy, and by then the route no longer offers the version that is about to unload."""
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    server = serve_config(
        serve, tmp_path, ("m", base, "model_version_policy { all {} }"), file_system_poll_wait_seconds=0.1
    )
    manager = server.server.manager
    in_listener, resolved = threading.Event(), threading.Event()

    def busy_listener(model: str, version: int, state) -> None:
        if (model, version, state.name) == ("m", 2, "UNLOADING") and not in_listener.is_set():
            in_listener.set()
            resolved.wait(30)  # holds the manager's lock until the request below was routed

    manager.add_listener(busy_listener)
    remove_atomically(base / "2")
    assert in_listener.wait(30), "v2 never started to unload"
    versions: list[int] = []

    def request() -> None:
        with manager.served.handle("m") as servable:
            versions.append(servable.version)
        resolved.set()

    client = threading.Thread(target=request, daemon=True)
    client.start()
    client.join(10)
    resolved.set()
    assert not client.is_alive(), "resolution waited for the manager's lock"
    assert versions == [1]
    wait_until(states_are(server.rest_url, "m", {"2": "END", "1": "AVAILABLE"}), what="v2 END")


def test_the_canary_share_stays_exact_when_threads_resolve_at_once(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    server = serve_config(serve, tmp_path, ("m", base, "model_version_policy { all {} }"))
    manager = server.server.manager
    server.server.controlplane.set_canary("m", 1, 0.25)  # v2 is the default (the latest); v1 takes a quarter
    counts: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    start = threading.Barrier(4)

    def requests_from_one_thread() -> None:
        start.wait(30)
        seen = collections.Counter()
        for _ in range(250):
            with manager.served.handle("m") as servable:
                seen[servable.version] += 1
        with lock:
            counts.update(seen)

    threads = [threading.Thread(target=requests_from_one_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert counts == {1: 250, 2: 750}
