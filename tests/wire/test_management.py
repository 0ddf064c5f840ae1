"""workbench's version management over REST (``/workbench/v1/models``): promote, rollback, canary, load and
unload, persisted routing, the management token, Prometheus' traffic shares, and model repository mode."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from waiting import RequestLoop, model_config_text, place_atomically, remove_atomically, version_states, wait_until

ONE = {"instances": [[1.0]]}
V1 = '{"predictions":[[2.5]]}'  # hp2: 0.5 * 1 + 2
V2 = '{"predictions":[[3.5]]}'  # hp3: 0.5 * 1 + 3
MODELS = "/workbench/v1/models"


# ------------------------------------------------------------------------------------------------ helpers
@pytest.fixture
def root(make_repo) -> Path:
    """A model repository with one model ``m``: version 1 answers 2.5, version 2 answers 3.5."""
    return make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"}).parent


def manage(server, target: str, body: object = None, *, token: str | None = None, raw: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else (json.dumps(body) if body is not None else "")
    return requests.post(f"{server.rest_url}{MODELS}/{target}", data=data, headers=headers, timeout=120)


def describe(server, model: str = "m") -> dict:
    r = requests.get(f"{server.rest_url}{MODELS}/{model}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def by_version(description: dict) -> dict[int, dict]:
    return {v["version"]: v for v in description["versions"]}


def predict(server, path: str = "/v1/models/m") -> requests.Response:
    return requests.post(f"{server.rest_url}{path}:predict", json=ONE, timeout=30)


def default_answers(server, total: int, threads: int = 4, model: str = "m") -> Counter:
    """``total`` default requests (no version in the path) from ``threads`` clients: (status, body) → count."""
    url, data = f"{server.rest_url}/v1/models/{model}:predict", json.dumps(ONE)

    def send(count: int) -> list[tuple[int, str]]:
        with requests.Session() as session:
            return [(r.status_code, r.text) for r in (session.post(url, data=data, timeout=30) for _ in range(count))]

    assert total % threads == 0
    with ThreadPoolExecutor(threads) as pool:
        return Counter(answer for part in pool.map(send, [total // threads] * threads) for answer in part)


def keep_sending(loops: list[RequestLoop], more: int = 20) -> None:
    """Wait until every client loop has sent ``more`` further requests (the clients keep going meanwhile)."""
    marks = [len(loop.results) for loop in loops]
    wait_until(
        lambda: all(len(loop.results) >= mark + more for loop, mark in zip(loops, marks, strict=True)),
        what="more requests",
    )


def error_of(response: requests.Response) -> str:
    return response.json()["error"]


# ------------------------------------------------------------------------------------------------ reading
def test_models_listing_shape(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    r = requests.get(server.rest_url + MODELS, timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    (model,) = r.json()["models"]
    assert model["name"] == "m"
    assert model["base_path"] == str((root / "m").resolve())
    assert model["policy"] == "latest(1)"
    assert model["stable"] is None and model["previous_stable"] is None and model["canary"] is None
    assert model["default_version"] == 2
    assert model["labels"] == {}
    assert [v["version"] for v in model["versions"]] == [2, 1]  # newest first
    for version in model["versions"]:
        assert {"version", "state", "labels", "traffic_share", "error"} <= set(version)
    v2, v1 = model["versions"]
    assert (v2["state"], v2["labels"], v2["traffic_share"], v2["error"]) == ("AVAILABLE", [], 1.0, "")
    assert (v1["state"], v1["labels"], v1["traffic_share"], v1["error"]) == ("NOT_LOADED", [], 0.0, "")
    assert describe(server) == model

    missing = requests.get(f"{server.rest_url}{MODELS}/nope", timeout=30)
    assert missing.status_code == 404
    assert "nope" in error_of(missing)


# ------------------------------------------------------------------------------------ promote / rollback
def test_promote_routes_default_and_stable_label_and_rollback_returns(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    assert predict(server).text == V2

    r = manage(server, "m:promote", {"version": 1})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["name"] == "m" and answer["stable"] == 1 and answer["default_version"] == 1
    assert answer["labels"] == {"stable": 1}
    assert by_version(answer)[1]["state"] == "AVAILABLE"  # loaded beyond the latest(1) policy
    assert by_version(answer)[1]["labels"] == ["stable"]
    assert (by_version(answer)[1]["traffic_share"], by_version(answer)[2]["traffic_share"]) == (1.0, 0.0)
    assert predict(server).text == V1
    assert predict(server, "/v1/models/m/labels/stable").text == V1
    assert predict(server, "/v1/models/m/versions/2").text == V2  # a named version still runs where asked

    r = manage(server, "m:promote", {"version": 2})
    assert r.status_code == 200, r.text
    assert (r.json()["stable"], r.json()["previous_stable"]) == (2, 1)
    assert predict(server).text == V2
    assert predict(server, "/v1/models/m/labels/stable").text == V2

    r = manage(server, "m:rollback")
    assert r.status_code == 200, r.text
    assert r.json()["stable"] == 1
    assert predict(server).text == V1
    assert predict(server, "/v1/models/m/labels/stable").text == V1

    again = manage(server, "m:rollback", {})
    assert again.status_code == 400
    assert error_of(again) == "Model m has no previous stable version to roll back to"
    assert predict(server).text == V1


def test_rollback_without_any_promotion_is_refused(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    r = manage(server, "m:rollback")
    assert r.status_code == 400
    assert "no previous stable version" in error_of(r)
    assert predict(server).text == V2


def test_promote_unknown_version_or_model_is_404(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    r = manage(server, "m:promote", {"version": 7})
    assert r.status_code == 404
    assert error_of(r) == "Model m has no version 7 in its repository"
    r = manage(server, "nope:promote", {"version": 1})
    assert r.status_code == 404
    assert "nope" in error_of(r)
    assert describe(server)["stable"] is None
    assert predict(server).text == V2


def test_promoting_a_version_that_fails_to_load_keeps_the_old_default(serve, make_repo, tmp_path):
    base = make_repo("m", {2: "hp3_tf2"})
    broken = base / "3"
    (broken / "variables").mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("m", base, "model_version_policy { specific { versions: 2 } }")))
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0)

    with RequestLoop(f"{server.rest_url}/v1/models/m:predict", ONE) as loop:
        wait_until(lambda: loop.count(V2) >= 10)
        r = manage(server, "m:promote", {"version": 3})
        keep_sending([loop])
    assert r.status_code == 400
    message = error_of(r)
    assert message.startswith("Version 3 of model m failed to load: ")
    state = by_version(describe(server))
    assert state[3]["state"] == "END"
    assert state[3]["error"] and state[3]["error"] in message  # the load error itself, not a generic one
    assert state[2]["state"] == "AVAILABLE"
    assert describe(server)["stable"] is None
    assert loop.failures() == []
    assert loop.count(V2) == len(loop.results)  # the old default answered every request
    assert predict(server).text == V2
    assert manage(server, "m:promote", {"version": 3}).status_code == 400  # and again, without hanging


# ---------------------------------------------------------------------------------------------------- canary
def test_promote_rollback_canary_cycle_under_load_and_the_canary_split(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    loops = [RequestLoop(f"{server.rest_url}/v1/models/m:predict", ONE) for _ in range(3)]
    for loop in loops:
        loop.start()
    try:
        keep_sending(loops)
        assert manage(server, "m:promote", {"version": 1}).status_code == 200
        keep_sending(loops)
        assert manage(server, "m:promote", {"version": 2}).status_code == 200
        keep_sending(loops)
        assert manage(server, "m:rollback").json()["stable"] == 1
        keep_sending(loops)
        r = manage(server, "m:canary", {"version": 2, "weight": 0.1})
        assert r.status_code == 200, r.text
        keep_sending(loops)
    finally:
        for loop in loops:
            loop.stop()
    for loop in loops:
        assert loop.failures() == []
        assert loop.count(V1) + loop.count(V2) == len(loop.results)

    answer = r.json()
    assert answer["stable"] == 1
    assert answer["canary"] == {"version": 2, "weight": 0.1}
    assert answer["labels"] == {"stable": 1, "canary": 2}
    shares = {v["version"]: v["traffic_share"] for v in answer["versions"]}
    assert shares == {2: pytest.approx(0.1), 1: pytest.approx(0.9)}
    assert predict(server, "/v1/models/m/labels/canary").text == V2
    assert predict(server, "/v1/models/m/labels/stable").text == V1

    counts = default_answers(server, 2000)
    assert set(counts) <= {(200, V1), (200, V2)}, counts
    assert sum(counts.values()) == 2000
    assert abs(counts[(200, V2)] / 2000 - 0.10) <= 0.02, counts

    r = manage(server, "m:canary", {"version": 2, "weight": 0})
    assert r.status_code == 200, r.text
    assert r.json()["canary"] is None
    assert r.json()["labels"] == {"stable": 1}
    assert {v["version"]: v["traffic_share"] for v in r.json()["versions"]} == {2: 0.0, 1: 1.0}
    assert default_answers(server, 200) == Counter({(200, V1): 200})
    assert predict(server, "/v1/models/m/labels/canary").status_code == 400


def test_promoting_the_canary_graduates_it(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    assert manage(server, "m:promote", {"version": 1}).status_code == 200
    assert manage(server, "m:canary", {"version": 2, "weight": 0.5}).status_code == 200
    r = manage(server, "m:promote", {"version": 2})
    assert r.status_code == 200, r.text
    assert (r.json()["stable"], r.json()["canary"], r.json()["labels"]) == (2, None, {"stable": 2})
    assert default_answers(server, 40) == Counter({(200, V2): 40})
    assert manage(server, "m:rollback").json()["stable"] == 1
    assert default_answers(server, 40) == Counter({(200, V1): 40})


@pytest.mark.parametrize("weight", [1.5, -0.1])
def test_canary_weight_outside_zero_to_one_is_refused(serve, root, weight):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    r = manage(server, "m:canary", {"version": 1, "weight": weight})
    assert r.status_code == 400
    assert error_of(r) == f"Canary weight must be between 0 and 1, got {weight}"
    assert describe(server)["canary"] is None


# --------------------------------------------------------------------------------------------- load / unload
def test_load_pins_a_version_beyond_the_policy_and_unload_drops_one(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    poll = server.server.source.poll_once  # one repository scan, as the poll loop does it
    assert by_version(describe(server))[1]["state"] == "NOT_LOADED"

    r = manage(server, "m/versions/1:load")
    assert r.status_code == 200, r.text
    assert by_version(r.json())[1]["state"] == "AVAILABLE"
    assert by_version(r.json())[1]["pinned"] is True
    poll()
    assert version_states(server.rest_url, "m") == {"2": "AVAILABLE", "1": "AVAILABLE"}
    assert predict(server, "/v1/models/m/versions/1").text == V1
    assert predict(server).text == V2  # a pin does not change the default

    r = manage(server, "m/versions/2:unload")  # the policy wants 2: unloaded all the same
    assert r.status_code == 200, r.text
    assert by_version(r.json())[2]["dropped"] is True
    wait_until(lambda: version_states(server.rest_url, "m") == {"2": "END", "1": "AVAILABLE"}, what="v2 unloaded")
    assert predict(server).text == V1
    poll()
    assert version_states(server.rest_url, "m") == {"2": "END", "1": "AVAILABLE"}

    last = manage(server, "m/versions/1:unload")
    assert last.status_code == 400
    assert error_of(last) == "Version 1 is the only version of model m serving; load another one first"
    assert predict(server).text == V1

    assert manage(server, "m/versions/2:load").status_code == 200
    assert by_version(describe(server))[2]["dropped"] is False
    assert manage(server, "m/versions/1:unload").status_code == 200
    wait_until(lambda: version_states(server.rest_url, "m") == {"2": "AVAILABLE", "1": "END"}, what="v1 unloaded")
    poll()
    assert version_states(server.rest_url, "m") == {"2": "AVAILABLE", "1": "END"}
    assert predict(server).text == V2


def test_unloading_the_stable_canary_or_last_serving_version_is_refused(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    only = manage(server, "m/versions/2:unload")
    assert only.status_code == 400
    assert "only version of model m serving" in error_of(only)
    assert manage(server, "m/versions/9:unload").status_code == 404

    assert manage(server, "m:promote", {"version": 1}).status_code == 200
    assert manage(server, "m:canary", {"version": 2, "weight": 0.5}).status_code == 200
    stable = manage(server, "m/versions/1:unload")
    assert stable.status_code == 400
    assert "stable" in error_of(stable)
    canary = manage(server, "m/versions/2:unload")
    assert canary.status_code == 400
    assert "canary" in error_of(canary)
    assert version_states(server.rest_url, "m") == {"2": "AVAILABLE", "1": "AVAILABLE"}
    assert default_answers(server, 100) == Counter({(200, V1): 50, (200, V2): 50})


# --------------------------------------------------------------------------------------------- persistence
def test_routing_state_persists_across_a_restart(serve, root):
    first = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    assert manage(first, "m:promote", {"version": 2}).status_code == 200
    assert manage(first, "m:promote", {"version": 1}).status_code == 200
    assert manage(first, "m:canary", {"version": 2, "weight": 0.25}).status_code == 200
    before = describe(first)
    first.stop()

    state_file = root / "m" / "routing.json"  # in the repository, beside the versions
    saved = json.loads(state_file.read_text())
    assert (saved["stable"], saved["history"], saved["canary"], saved["canary_weight"]) == (1, [2], 2, 0.25)
    assert saved["generation"] == before["generation"] == 3  # one per change
    assert before["routing_state"] == str(state_file.resolve())
    second = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    # routing.json and its lock file are no versions, and no models
    assert [m["name"] for m in requests.get(second.rest_url + MODELS, timeout=30).json()["models"]] == ["m"]
    assert [v["version"] for v in describe(second)["versions"]] == [2, 1]

    after = describe(second)
    for key in ("stable", "previous_stable", "canary", "labels", "default_version", "generation"):
        assert after[key] == before[key], key
    assert {v["version"]: (v["state"], v["traffic_share"]) for v in after["versions"]} == {
        2: ("AVAILABLE", 0.25),
        1: ("AVAILABLE", 0.75),
    }
    counts = default_answers(second, 400)
    assert abs(counts[(200, V2)] / 400 - 0.25) <= 0.02 and counts[(200, V1)] + counts[(200, V2)] == 400, counts
    assert manage(second, "m:rollback").json()["stable"] == 2  # the history came back too


def legacy_state(path: Path, routing: dict) -> Path:
    """An older workbench's one state file for every model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"models": {"m": routing}}))
    return path


def test_an_older_management_state_file_is_where_routing_starts(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("m", base, "")))
    state = legacy_state(tmp_path / "state" / "routing.json", {"stable": 1, "history": [2]})
    legacy = state.read_text()
    options = {"model_config_file": str(config), "management_state_file": str(state)}
    first = serve(file_system_poll_wait_seconds=0, **options)
    assert (describe(first)["stable"], describe(first)["generation"]) == (1, 0)  # nothing in the repository yet
    assert predict(first).text == V1

    assert manage(first, "m:canary", {"version": 2, "weight": 0.5}).status_code == 200
    first.stop()
    stored = json.loads((base / "routing.json").read_text())  # the first change moved it into the repository
    assert (stored["generation"], stored["stable"], stored["history"], stored["canary"]) == (1, 1, [2], 2)
    assert state.read_text() == legacy  # the old file is only read

    state.write_text(json.dumps({"models": {"m": {"stable": 2}}}))
    second = serve(file_system_poll_wait_seconds=0, **options)
    assert (describe(second)["stable"], describe(second)["generation"]) == (1, 1)  # the repository's state wins
    assert describe(second)["canary"] == {"version": 2, "weight": 0.5}


def test_a_model_repositorys_older_state_file_is_read_too(serve, root):
    legacy_state(root / ".workbench" / "routing.json", {"stable": 1})
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    assert [m["name"] for m in requests.get(server.rest_url + MODELS, timeout=30).json()["models"]] == ["m"]
    assert describe(server)["stable"] == 1
    assert predict(server).text == V1


@pytest.mark.parametrize(
    "damage",
    [
        "{this is not json",
        "[1, 2, 3]",
        '{"generation": "one", "stable": 1}',
        '{"history": ["x"]}',
        '{"stable": "two", "canary": "three", "canary_weight": 0.5}',
        '{"canary": 2, "canary_weight": 7}',
    ],
    ids=["not-json", "a-list", "bad-generation", "bad-history", "string-versions", "bad-weight"],
)
def test_a_damaged_routing_file_does_not_stop_start_up(serve, root, damage):
    state_file = root / "m" / "routing.json"
    state_file.write_text(damage)
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    assert predict(server).text == V2  # TF Serving's default: the latest version
    assert version_states(server.rest_url, "m").get("2") == "AVAILABLE"
    assert manage(server, "m:promote", {"version": 1}).status_code == 200
    assert predict(server).text == V1
    saved = json.loads(state_file.read_text())  # rewritten whole
    assert (saved["stable"], saved["generation"]) == (1, 1)


def test_a_label_the_model_config_file_sets_wins_and_is_not_managed_here(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    labels = 'model_version_policy { all {} } version_labels { key: "stable" value: 1 }'
    config.write_text(model_config_text(("m", base, labels)))
    (base / "routing.json").write_text(json.dumps({"generation": 1, "stable": 2}))  # both speak of "stable"
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0)
    model = describe(server)
    assert model["labels"] == {"stable": 1}  # the config file's label, as tensorflow_model_server answers it
    assert predict(server, "/v1/models/m/labels/stable").text == V1
    assert (model["stable"], model["default_version"], predict(server).text) == (2, 2, V2)  # the default: routing's

    for target, body in (("m:promote", {"version": 1}), ("m:rollback", {})):
        refused = manage(server, target, body)
        assert refused.status_code == 400, refused.text  # FAILED_PRECONDITION
        assert error_of(refused).startswith('Label "stable" of model m is set by the model config file'), refused.text
    assert json.loads((base / "routing.json").read_text())["generation"] == 1
    canary = manage(server, "m:canary", {"version": 1, "weight": 0.5})  # a label the config leaves to routing
    assert canary.status_code == 200, canary.text
    assert canary.json()["labels"] == {"stable": 1, "canary": 1}


# -------------------------------------------------------------------------------------------- authorization
def test_management_token_guards_changes_but_not_reads(serve, root):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0, management_token="s3cret")
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic s3cret"},
        {"Authorization": "s3cret"},
    ):
        r = requests.post(f"{server.rest_url}{MODELS}/m:promote", json={"version": 1}, headers=headers, timeout=30)
        assert r.status_code == 401, headers
        assert "token" in error_of(r)
    assert manage(server, "m/versions/1:load", token="wrong").status_code == 401
    assert manage(server, "m:rollback").status_code == 401
    assert describe(server)["stable"] is None

    r = manage(server, "m:promote", {"version": 1}, token="s3cret")
    assert r.status_code == 200, r.text
    assert r.json()["stable"] == 1
    for path in (MODELS, f"{MODELS}/m", "/workbench/v1/health", "/workbench/v1/stats"):
        assert requests.get(server.rest_url + path, timeout=30).status_code == 200, path
    assert predict(server).text == V1


@pytest.mark.parametrize(
    ("target", "raw", "fragment"),
    [
        ("m:promote", "{not json", "Request body is not JSON"),
        ("m:promote", "[1]", "Request body must be a JSON object"),
        ("m:promote", '{"version": "1"}', '"version" must be a non-negative integer, got "1"'),
        ("m:promote", '{"version": 1.0}', '"version" must be a non-negative integer'),
        ("m:promote", '{"version": true}', '"version" must be a non-negative integer, got true'),
        ("m:promote", '{"version": -1}', '"version" must be a non-negative integer, got -1'),
        ("m:promote", "", '"version" must be a non-negative integer, got null'),
        ("m:canary", '{"version": 2}', '"weight" must be a number from 0 to 1, got null'),
        ("m:canary", '{"version": 2, "weight": "0.1"}', '"weight" must be a number from 0 to 1'),
        ("m:canary", '{"weight": 0.1}', '"version" must be a non-negative integer'),
        ("m:explode", "{}", "Malformed request"),
        ("m/versions/x:load", "", "Malformed request"),
    ],
)
def test_bad_management_requests_are_400(serve, root, target, raw, fragment):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    r = manage(server, target, raw=raw)
    assert r.status_code == 400, r.text
    assert fragment in error_of(r)
    assert describe(server)["stable"] is None and describe(server)["canary"] is None


# ---------------------------------------------------------------------------------------------- monitoring
def test_prometheus_traffic_share_follows_the_canary(serve, root, tmp_path):
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0, monitoring_config_file=str(monitoring))

    def shares() -> dict[tuple[str, str], float]:
        text = requests.get(server.rest_url + "/monitoring/prometheus/metrics", timeout=30).text
        return {
            (sample.labels["model"], sample.labels["version"]): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "workbench_traffic_share"
            for sample in family.samples
        }

    assert shares() == {("m", "2"): 1.0}
    assert manage(server, "m:promote", {"version": 1}).status_code == 200
    assert manage(server, "m:canary", {"version": 2, "weight": 0.1}).status_code == 200
    assert shares() == {("m", "1"): pytest.approx(0.9), ("m", "2"): pytest.approx(0.1)}
    assert manage(server, "m:canary", {"version": 2, "weight": 0}).status_code == 200
    assert shares() == {("m", "1"): 1.0, ("m", "2"): 0.0}


# ------------------------------------------------------------------------------------------ repository mode
def test_model_folders_come_and_go_without_a_restart(serve, root, model_store, tmp_path):
    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0.1)
    names = lambda: [m["name"] for m in requests.get(server.rest_url + MODELS, timeout=30).json()["models"]]  # noqa: E731
    assert names() == ["m"]

    with RequestLoop(f"{server.rest_url}/v1/models/m:predict", ONE) as loop:
        built = tmp_path / "built"
        shutil.copytree(model_store / "hp2_tf1", built / "1")
        place_atomically(built, root / "fresh")  # a whole model folder, in one rename
        wait_until(lambda: version_states(server.rest_url, "fresh") == {"1": "AVAILABLE"}, what="fresh served")
        assert predict(server, "/v1/models/fresh").text == V1
        assert names() == ["fresh", "m"]
        assert describe(server, "fresh")["base_path"] == str((root / "fresh").resolve())

        remove_atomically(root / "fresh")
        wait_until(lambda: "fresh" not in names(), what="fresh gone from the listing")
        wait_until(lambda: predict(server, "/v1/models/fresh").status_code == 404, what="fresh not served")
        # Its status shows its version UNLOADING until the unload ends (a busy machine can be seen between the two).
        wait_until(
            lambda: requests.get(server.rest_url + "/v1/models/fresh", timeout=30).status_code == 404,
            what="fresh forgotten by GetModelStatus",
        )
        keep_sending([loop])
    assert loop.failures() == []
    assert loop.count(V2) == len(loop.results)


# ------------------------------------------------------------------------------------------ sticky canaries
def test_a_sticky_key_always_lands_on_the_same_version_and_keys_split_by_the_weight(serve, root):
    """X-Workbench-Key (REST), x-workbench-key metadata (gRPC) and the v2 parameter workbench_key (gRPC, and REST's
    body) hash into the canary split: one key gets one version every time, on every API, and over many keys the
    canary's share is its weight."""
    import grpc
    import numpy as np
    import tritonclient.grpc as triton_grpc

    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from workbench.models.routing.policy import Routing, sticky_pick
    from workbench.protocol.tensor_proto import from_numpy

    server = serve(model_repository=str(root), file_system_poll_wait_seconds=0)
    assert manage(server, "m:promote", {"version": 1}).status_code == 200
    assert manage(server, "m:canary", {"version": 2, "weight": 0.3}).status_code == 200
    answers = {V1: 1, V2: 2}
    url = f"{server.rest_url}/v1/models/m:predict"

    with requests.Session() as session:

        def rest_version(key: str) -> int:
            return answers[session.post(url, json=ONE, headers={"X-Workbench-Key": key}, timeout=30).text]

        keys = [f"user-{n}" for n in range(1000)]
        first = {key: rest_version(key) for key in keys}
        # What the key's hash says (the same function in every worker and replica), not the order requests came in.
        split = Routing(stable=1, canary=2, canary_weight=0.3)
        assert first == {key: sticky_pick(split, [1, 2], key) for key in keys}
        share = sum(1 for version in first.values() if version == 2) / len(keys)
        assert abs(share - 0.3) <= 0.05, share  # 1,000 keys: one standard deviation is 0.0145
        again = {key: rest_version(key) for key in keys[:100]}
        assert again == {key: first[key] for key in keys[:100]}
        # Without a key, requests keep the exact per-request split.
        unkeyed = Counter(session.post(url, json=ONE, timeout=30).text for _ in range(100))
        assert unkeyed == Counter({V1: 70, V2: 30})
        v2_rest = [
            session.post(
                f"{server.rest_url}/v2/models/m/infer",
                json={"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]},
                headers={"X-Workbench-Key": key},
                timeout=30,
            ).json()["model_version"]
            for key in keys[:50]
        ]
        assert [int(v) for v in v2_rest] == [first[key] for key in keys[:50]]
        # The key as the body's parameter, as tritonclient's HTTP client sends parameters (JSON and binary bodies).
        import tritonclient.http as triton_http

        http = triton_http.InferenceServerClient(server.rest_url.removeprefix("http://"))
        for binary in (False, True):
            given = triton_http.InferInput("x", [1, 1], "FP32")
            given.set_data_from_numpy(np.array([[1.0]], np.float32), binary_data=binary)
            by_body = [
                int(http.infer("m", [given], parameters={"workbench_key": key}).get_response()["model_version"])
                for key in keys[:50]
            ]
            assert by_body == [first[key] for key in keys[:50]], binary
        http.close()

    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "m"
        from_numpy(np.array([[1.0]], np.float32), request.inputs["x"])
        grpc_versions = [
            stub.Predict(request, metadata=[("x-workbench-key", key)], timeout=30).model_spec.version.value
            for key in keys[:50]
        ]
    assert grpc_versions == [first[key] for key in keys[:50]]

    triton = triton_grpc.InferenceServerClient(server.grpc_target)
    tensor = triton_grpc.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
    by_parameter = [
        int(triton.infer("m", [tensor], parameters={"workbench_key": key}).get_response().model_version)
        for key in keys[:50]
    ]
    assert by_parameter == [first[key] for key in keys[:50]]
    triton.close()

    # workbench's Client sends the key on every API.
    from workbench.client import Client

    with Client(server.rest_url, server.grpc_target) as client:
        for protocol in ("rest", "grpc", "v2", "v2-grpc"):
            versions = [client.predict("m", [[1.0]], protocol=protocol, key=key).version for key in keys[:20]]
            assert versions == [first[key] for key in keys[:20]], protocol

    # Without a canary, every key gets the stable version.
    assert manage(server, "m:canary", {"version": 2, "weight": 0}).status_code == 200
    with requests.Session() as session:
        texts = {session.post(url, json=ONE, headers={"X-Workbench-Key": key}, timeout=30).text for key in keys[:50]}
    assert texts == {V1}
