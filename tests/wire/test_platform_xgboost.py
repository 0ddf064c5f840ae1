"""The XGBoost platform: a classifier and a regressor trained here, served as XGBoost answers in-process."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tabular_models as tm  # (tests/tabular_models.py)
import xgboost

from workbench.platforms import xgboost as platform

DIGITS, DIABETES = "digits", "diabetes"


@pytest.fixture(scope="module")
def classifier():
    x, y = tm.digits()
    return xgboost.XGBClassifier(n_estimators=20, max_depth=3, n_jobs=1).fit(x, y)


@pytest.fixture(scope="module")
def booster():
    """A regressor trained with the Booster API (no scikit-learn wrapper), saved as JSON."""
    x, y = tm.diabetes()
    return xgboost.train({"objective": "reg:squarederror", "nthread": 1}, xgboost.DMatrix(x, label=y), 20)


@pytest.fixture(scope="module")
def server(tmp_path_factory, classifier, booster):
    root = tmp_path_factory.mktemp("xgboost")
    (root / DIGITS / "1").mkdir(parents=True)
    assert platform.exports(classifier)
    platform.write(classifier, root / DIGITS / "1")
    (root / DIABETES / "1").mkdir(parents=True)
    booster.save_model(root / DIABETES / "1" / "model.json")
    with tm.serving(root) as running:
        tm.available(running, DIGITS)
        tm.available(running, DIABETES)
        yield running


@pytest.fixture(scope="module")
def stub(server):
    with tm.stub_for(server) as made:
        yield made


def booster_predict(booster, x: np.ndarray) -> np.ndarray:
    return booster.predict(xgboost.DMatrix(x))


def test_rest_row_and_columnar_answers_equal_the_in_process_predictions(server, classifier, booster):
    x, _ = tm.digits()
    expected = classifier.predict(x[:40]).tolist()
    assert tm.rest_answer(server, DIGITS, {"instances": x[:40].tolist()}) == {"predictions": expected}
    assert tm.rest_answer(server, DIGITS, {"inputs": {"x": x[:40].tolist()}}) == {"outputs": expected}
    body = {"signature_name": "predict_proba", "inputs": x[:40].tolist()}
    probabilities = np.array(tm.rest_answer(server, DIGITS, body)["outputs"], dtype=np.float32)
    assert np.array_equal(probabilities, classifier.predict_proba(x[:40]))

    xr, _ = tm.diabetes()
    values = np.array(tm.rest_answer(server, DIABETES, {"instances": xr[:30].tolist()})["predictions"], np.float32)
    assert np.array_equal(values, booster_predict(booster, xr[:30]))


def test_grpc_predict_classify_and_regress_equal_in_process(stub, classifier, booster):
    x, _ = tm.digits()
    rows = x[:25].astype(np.float32)  # XGBoost computes in float32; a float64 tensor is refused as for TF models
    answer = tm.grpc_predict(stub, DIGITS, {"x": rows})
    assert answer["predictions"].dtype == np.int64
    assert np.array_equal(answer["predictions"], classifier.predict(x[:25]))
    proba = tm.grpc_predict(stub, DIGITS, {"x": rows}, signature="predict_proba")["probabilities"]
    assert np.array_equal(proba, classifier.predict_proba(x[:25]))
    classes = tm.grpc_classify(stub, DIGITS, tm.row_examples(x[:10]))
    assert tm.as_float32(classes) == tm.expected_classes(classifier.classes_, classifier.predict_proba(x[:10]))

    xr, _ = tm.diabetes()
    answer = tm.grpc_predict(stub, DIABETES, {"x": xr[:20].astype(np.float32)})
    assert np.array_equal(answer["predictions"], booster_predict(booster, xr[:20]))
    values = tm.grpc_regress(stub, DIABETES, tm.row_examples(xr[:20]))
    assert np.array_equal(np.float32(values), booster_predict(booster, xr[:20]))

    error = tm.grpc_error(lambda: tm.grpc_predict(stub, DIGITS, {"x": x[:2]}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expects arg[x] to be float but double is provided" in error.details()


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_the_client_classifies_with_what_it_sends(server, classifier, protocol):
    from workbench.client import Client

    x, _ = tm.digits()
    with Client(server.rest_url, server.grpc_target, protocol=protocol) as client:
        got = client.classify(DIGITS, tm.row_examples(x[:6]), signature_name="classify")
    assert tm.as_float32(got) == tm.expected_classes(classifier.classes_, classifier.predict_proba(x[:6]))


def test_metadata_over_rest_and_grpc(server, stub):
    rest = {name: tm.described(sig) for name, sig in tm.rest_signatures(server, DIGITS).items()}
    assert rest == {
        "serving_default": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_FLOAT", [-1, 64])},
            "outputs": {"predictions": ("DT_INT64", [-1])},
        },
        "predict_proba": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_FLOAT", [-1, 64])},
            "outputs": {"probabilities": ("DT_FLOAT", [-1, 10])},
        },
        "classify": {
            "method": "tensorflow/serving/classify",
            "inputs": {"inputs": ("DT_STRING", [-1])},
            "outputs": {"classes": ("DT_STRING", [-1, 10]), "scores": ("DT_FLOAT", [-1, 10])},
        },
    }
    assert {name: tm.grpc_described(sig) for name, sig in tm.grpc_signatures(stub, DIGITS).items()} == rest
    regressor = {name: tm.described(sig) for name, sig in tm.rest_signatures(server, DIABETES).items()}
    assert regressor == {
        "serving_default": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_FLOAT", [-1, 10])},
            "outputs": {"predictions": ("DT_FLOAT", [-1])},
        },
        "regress": {
            "method": "tensorflow/serving/regress",
            "inputs": {"inputs": ("DT_STRING", [-1])},
            "outputs": {"outputs": ("DT_FLOAT", [-1])},
        },
    }


def test_batched_concurrent_clients_each_get_their_own_answers(tmp_path, classifier):
    base = tmp_path / "models" / DIGITS
    (base / "1").mkdir(parents=True)
    platform.write(classifier, base / "1")
    (base / "batching_parameters.txt").write_text(tm.EIGHT_ROW_BATCHES)
    x, _ = tm.digits()
    expected = classifier.predict_proba(x)
    with tm.serving(tmp_path / "models") as server, tm.stub_for(server) as stub:
        tm.available(server, DIGITS)

        def call(i: int) -> bool:
            if i % 2:
                got = tm.grpc_predict(stub, DIGITS, {"x": x[i : i + 1].astype(np.float32)}, "predict_proba")
                return np.array_equal(got["probabilities"], expected[i : i + 1])
            body = {"signature_name": "predict_proba", "instances": x[i : i + 1].tolist()}
            got = np.array(tm.rest_answer(server, DIGITS, body)["predictions"], np.float32)
            return np.array_equal(got, expected[i : i + 1])

        assert tm.in_threads(call, 8, 8) == [True] * 8  # trees add each row's leaves alone: exact in a batch too
        assert tm.mean_batch_size(server, DIGITS) == 8.0


def test_a_folder_with_model_ubj_and_model_json_is_refused(tmp_path, classifier):
    folder = tmp_path / "models" / "both" / "1"
    folder.mkdir(parents=True)
    classifier.save_model(folder / "model.ubj")
    classifier.save_model(folder / "model.json")
    with tm.serving(tmp_path / "models") as server:
        status = tm.load_error(server, "both")
    assert status["error_code"] == "FAILED_PRECONDITION"
    assert "holds several XGBoost models: model.ubj, model.json" in status["error_message"]


def test_exports_xgboost_models_only(classifier, booster):
    from sklearn.linear_model import Ridge

    assert platform.exports(classifier) and platform.exports(booster)
    assert platform.exports(xgboost.XGBRegressor())
    assert not platform.exports(Ridge())
    assert not platform.exports("model.ubj")
