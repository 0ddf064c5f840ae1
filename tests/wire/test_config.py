"""The model config file: several models, version labels, start-up errors, and reloads by polling."""

from __future__ import annotations

import logging
import shutil

import pytest
import requests
from waiting import RequestLoop, model_config_text, version_states, wait_until, write_atomically

from workbench.config.options import ServerOptions
from workbench.core.errors import ServingError
from workbench.server import ServerThread

OK = {"error_code": "OK", "error_message": ""}
HP2 = '{"predictions":[[2.5]]}'
HP3 = '{"predictions":[[3.5]]}'
ONE = {"instances": [[1.0]]}
ALL = "model_version_policy { all {} }"


def get(server, path: str) -> requests.Response:
    return requests.get(server.rest_url + path, timeout=30)


def post(server, path: str, body: object = ONE) -> requests.Response:
    return requests.post(server.rest_url + path, json=body, timeout=30)


def start_failure(**fields) -> ServingError:
    """Start a server that must fail; return the error ServerThread.start raised (and free what it loaded)."""
    thread = ServerThread(ServerOptions(rest_api_port=-1, port=0, **fields))
    try:
        with pytest.raises(ServingError) as raised:
            thread.start()
    finally:
        thread.server.manager.stop()
    return raised.value


def test_two_models_from_one_config_file(serve, make_repo, tmp_path):
    config = tmp_path / "models.config"
    config.write_text(
        model_config_text(("tf2", make_repo("tf2", {1: "hp2_tf2"}), ""), ("tf1", make_repo("tf1", {3: "hp2_tf1"}), ""))
    )
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0)

    for name, version in (("tf2", "1"), ("tf1", "3")):
        assert get(server, f"/v1/models/{name}").json() == {
            "model_version_status": [{"version": version, "state": "AVAILABLE", "status": OK}]
        }
        assert post(server, f"/v1/models/{name}:predict").text == HP2
    r = post(server, "/v1/models/tf1:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})
    assert r.json() == {"results": [3.0]}


# ------------------------------------------------------------------------------------------------ labels
def test_version_labels_route_inference_status_and_metadata(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    labels = 'version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 }'
    config.write_text(model_config_text(("m", base, f"{ALL} {labels}")))
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0)

    assert post(server, "/v1/models/m/labels/stable:predict").text == HP2
    assert post(server, "/v1/models/m/labels/canary:predict").text == HP3
    assert post(server, "/v1/models/m:predict").text == HP3
    assert get(server, "/v1/models/m/labels/stable").json() == {
        "model_version_status": [{"version": "1", "state": "AVAILABLE", "status": OK}]
    }
    assert get(server, "/v1/models/m/labels/canary").json() == {
        "model_version_status": [{"version": "2", "state": "AVAILABLE", "status": OK}]
    }
    assert get(server, "/v1/models/m/labels/stable/metadata").json()["model_spec"] == {
        "name": "m",
        "signature_name": "",
        "version": "1",
    }

    for r in (post(server, "/v1/models/m/labels/nope:predict"), get(server, "/v1/models/m/labels/nope")):
        assert r.status_code == 400
        assert r.json() == {"error": "Unrecognized servable version label: nope"}


def test_label_on_an_unavailable_version_fails_start_up(make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})  # latest(1): version 1 is never loaded
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("m", base, 'version_labels { key: "stable" value: 1 }')))
    error = start_failure(model_config_file=str(config), file_system_poll_wait_seconds=0)
    assert "not currently available" in error.message
    assert "version 1 of model m" in error.message

    config.write_text(model_config_text(("m", base, 'version_labels { key: "stable" value: 7 }')))
    error = start_failure(model_config_file=str(config), file_system_poll_wait_seconds=0)
    assert "not currently available" in error.message


def test_label_on_an_unavailable_version_is_allowed_with_the_flag(serve, make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2", 2: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(
        model_config_text(
            ("m", base, 'version_labels { key: "stable" value: 1 } version_labels { key: "future" value: 7 }')
        )
    )
    server = serve(
        model_config_file=str(config), file_system_poll_wait_seconds=0, allow_version_labels_for_unavailable_models=True
    )

    assert post(server, "/v1/models/m:predict").text == HP3
    for label, version in (("stable", 1), ("future", 7)):
        r = post(server, f"/v1/models/m/labels/{label}:predict")
        assert r.status_code == 404
        assert r.json() == {"error": f"Servable not found for request: Specific(m, {version})"}


# ------------------------------------------------------------------------------------- start-up errors
def test_malformed_config_file_fails_start_up(tmp_path):
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "m" base_path: "/x" nonsense_field: 1 } }\n')
    error = start_failure(model_config_file=str(config))
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in error.message

    config.write_text('model_config_list { config { name: "m" base_path: "/x" }\n')  # unbalanced brace
    error = start_failure(model_config_file=str(config))
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in error.message


def test_duplicate_model_names_are_rejected(make_repo, tmp_path):
    base = make_repo("m", {1: "hp2_tf2"})
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("m", base, ""), ("other", base, ""), ("m", base, "")))
    error = start_failure(model_config_file=str(config))
    assert error.message == "Illegal to list model m multiple times in config list"


def test_relative_base_path_is_resolved_against_the_config_files_folder(serve, model_store, tmp_path, monkeypatch):
    conf_dir = tmp_path / "conf"
    shutil.copytree(model_store / "hp3_tf2", conf_dir / "repo" / "rel" / "5")
    config = conf_dir / "models.config"
    config.write_text(model_config_text(("rel", "repo/rel", "")))
    monkeypatch.chdir(tmp_path)  # the working directory is NOT the config file's folder
    server = serve(model_config_file=str(config), file_system_poll_wait_seconds=0)

    assert version_states(server.rest_url, "rel") == {"5": "AVAILABLE"}
    assert post(server, "/v1/models/rel:predict").text == HP3


# ------------------------------------------------------------------------------------------------ reloads
def test_config_reload_realises_exactly_the_new_config(serve, make_repo, tmp_path, caplog):
    keep = make_repo("keep", {1: "hp2_tf2", 2: "hp3_tf2"})
    gone = make_repo("gone", {1: "hp2_tf1"})
    added = make_repo("added", {4: "hp3_tf2"})
    config = tmp_path / "models.config"
    config.write_text(
        model_config_text(("keep", keep, f'{ALL} version_labels {{ key: "stable" value: 1 }}'), ("gone", gone, ""))
    )
    server = serve(
        model_config_file=str(config), model_config_file_poll_wait_seconds=0.3, file_system_poll_wait_seconds=0
    )
    url = server.rest_url
    assert post(server, "/v1/models/keep/labels/stable:predict").text == HP2
    assert post(server, "/v1/models/gone:predict").text == HP2
    assert get(server, "/v1/models/added").status_code == 404

    with (
        RequestLoop(f"{url}/v1/models/keep:predict", ONE) as by_default,
        RequestLoop(f"{url}/v1/models/keep/labels/stable:predict", ONE) as by_label,
    ):
        wait_until(lambda: by_default.count() >= 20 and by_label.count() >= 20, what="traffic")
        write_atomically(
            config,
            model_config_text(
                ("keep", keep, f'{ALL} version_labels {{ key: "stable" value: 2 }}'), ("added", added, "")
            ),
        )
        wait_until(lambda: version_states(url, "added") == {"4": "AVAILABLE"}, what="added model AVAILABLE")
        wait_until(lambda: get(server, "/v1/models/gone").status_code == 404, what="removed model gone")
        wait_until(lambda: by_label.count(HP3) >= 20, what="label moved")
        wait_until(lambda: by_default.count() >= 60, what="more traffic")

    # The client on the model that stayed never saw a failure; the label moved from v1's answer to v2's.
    assert by_default.failures() == [] and by_label.failures() == []
    assert {body for _, body in by_default.results} == {HP3}
    label_answers = [body for _, body in by_label.results]
    first_v2 = label_answers.index(HP3)
    assert first_v2 > 0 and set(label_answers[:first_v2]) == {HP2} and set(label_answers[first_v2:]) == {HP3}

    r = get(server, "/v1/models/gone")
    assert r.json() == {"error": "Could not find any versions of model gone"}
    r = post(server, "/v1/models/gone:predict")
    assert r.status_code == 404
    assert r.json() == {"error": "Servable not found for request: Latest(gone)"}
    assert post(server, "/v1/models/added:predict").text == HP3
    assert get(server, "/v1/models/keep/labels/stable").json() == {
        "model_version_status": [{"version": "2", "state": "AVAILABLE", "status": OK}]
    }
    assert version_states(url, "keep") == {"2": "AVAILABLE", "1": "AVAILABLE"}

    # A broken rewrite is ignored: the server says so and goes on serving the last good config.
    caplog.set_level(logging.ERROR, logger="workbench.server")
    write_atomically(config, model_config_text(("keep", keep, "")) + "} trailing garbage {")
    wait_until(
        lambda: any(
            "Error parsing text-format tensorflow.serving.ModelServerConfig" in r.getMessage() for r in caplog.records
        ),
        what="the broken config to be read and rejected",
    )
    assert post(server, "/v1/models/added:predict").text == HP3
    assert post(server, "/v1/models/keep/labels/stable:predict").text == HP3
    assert version_states(url, "keep") == {"2": "AVAILABLE", "1": "AVAILABLE"}
    assert version_states(url, "added") == {"4": "AVAILABLE"}

    # ...and a good config after it is applied again.
    write_atomically(config, model_config_text(("keep", keep, ALL), ("gone", gone, "")))
    wait_until(lambda: version_states(url, "gone") == {"1": "AVAILABLE"}, what="re-added model")
    wait_until(lambda: get(server, "/v1/models/added").status_code == 404, what="added model removed")
    assert post(server, "/v1/models/gone:predict").text == HP2
    r = post(server, "/v1/models/keep/labels/stable:predict")
    assert r.status_code == 400
    assert r.json() == {"error": "Unrecognized servable version label: stable"}
