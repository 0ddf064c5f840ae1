"""The scikit-learn platform: pipelines trained here, served over REST and gRPC, answering as they do in-process."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import grpc
import joblib
import numpy as np
import pytest
import tabular_models as tm  # (tests/tabular_models.py)
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from workbench.platforms import sklearn as platform
from workbench.platforms.base import PICKLE_SETTING, LoadPolicy

DIGITS, DIABETES = "digits", "diabetes"


@pytest.fixture(scope="module")
def classifier():
    x, y = tm.digits()
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x, y)


@pytest.fixture(scope="module")
def regressor():
    """Fit on a DataFrame, scaling three columns chosen by name: it needs its columns by name when served."""
    _, y = tm.diabetes()
    scale = ColumnTransformer([("scale", StandardScaler(), ["bmi", "bp", "s5"])], remainder="passthrough")
    return make_pipeline(scale, Ridge(alpha=0.1)).fit(tm.diabetes_frame(), y)


def export(estimator, folder: Path) -> Path:
    folder.mkdir(parents=True)
    assert platform.exports(estimator)
    platform.write(estimator, folder)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, classifier, regressor):
    root = tmp_path_factory.mktemp("sklearn")
    export(classifier, root / DIGITS / "1")
    export(regressor, root / DIABETES / "1")
    with tm.serving(root) as running:
        tm.available(running, DIGITS)
        tm.available(running, DIABETES)
        yield running


@pytest.fixture(scope="module")
def stub(server):
    with tm.stub_for(server) as made:
        yield made


# ------------------------------------------------------------------------------------------------ predict
def test_rest_row_and_columnar_answers_equal_the_in_process_predictions(server, classifier):
    x, _ = tm.digits()
    rows = x[:40]
    expected = classifier.predict(rows).tolist()
    assert tm.rest_answer(server, DIGITS, {"instances": rows.tolist()}) == {"predictions": expected}
    assert tm.rest_answer(server, DIGITS, {"inputs": rows.tolist()}) == {"outputs": expected}
    assert tm.rest_answer(server, DIGITS, {"inputs": {"x": rows.tolist()}}) == {"outputs": expected}

    probabilities = tm.rest_answer(server, DIGITS, {"signature_name": "predict_proba", "instances": rows.tolist()})
    assert np.array_equal(np.array(probabilities["predictions"]), classifier.predict_proba(rows))
    decisions = tm.rest_answer(server, DIGITS, {"signature_name": "decision_function", "inputs": rows.tolist()})
    assert np.array_equal(np.array(decisions["outputs"]), classifier.decision_function(rows))


def test_a_dataframe_fit_pipeline_takes_its_features_by_name_over_rest(server, regressor):
    frame = tm.diabetes_frame().iloc[:25]
    expected = regressor.predict(frame)
    columns = {name: frame[name].tolist() for name in tm.DIABETES_FEATURES}
    by_name = tm.rest_answer(server, DIABETES, {"inputs": columns})
    assert np.array_equal(np.array(by_name["outputs"]), expected)
    as_rows = tm.rest_answer(server, DIABETES, {"instances": frame.to_dict(orient="records")})
    assert np.array_equal(np.array(as_rows["predictions"]), expected)
    as_matrix = tm.rest_answer(server, DIABETES, {"instances": frame.to_numpy().tolist()})
    assert np.array_equal(np.array(as_matrix["predictions"]), expected)

    partial = {k: v for k, v in columns.items() if k != "bmi"}
    r = tm.rest(server, DIABETES, "predict", {"inputs": partial})
    assert r.status_code == 400
    assert "Missing named input: bmi" in r.json()["error"]


def test_grpc_predict_equals_in_process_by_matrix_and_by_feature_name(stub, classifier, regressor):
    x, _ = tm.digits()
    answer = tm.grpc_predict(stub, DIGITS, {"x": x[:30]})
    assert answer["predictions"].dtype == np.int64
    assert np.array_equal(answer["predictions"], classifier.predict(x[:30]))
    proba = tm.grpc_predict(stub, DIGITS, {"x": x[:30]}, signature="predict_proba")["probabilities"]
    assert np.array_equal(proba, classifier.predict_proba(x[:30]))

    frame = tm.diabetes_frame().iloc[:20]
    columns = {name: frame[name].to_numpy() for name in tm.DIABETES_FEATURES}
    answer = tm.grpc_predict(stub, DIABETES, columns)
    assert np.array_equal(answer["predictions"], regressor.predict(frame))


def test_grpc_classify_and_regress_equal_in_process(stub, classifier, regressor):
    x, _ = tm.digits()
    got = tm.grpc_classify(stub, DIGITS, tm.row_examples(x[:12]))
    assert tm.as_float32(got) == tm.expected_classes(classifier.classes_, classifier.predict_proba(x[:12]))

    frame = tm.diabetes_frame().iloc[:15]
    values = tm.grpc_regress(stub, DIABETES, tm.named_examples(frame.to_numpy(), tm.DIABETES_FEATURES))
    rounded = frame.astype(np.float32).astype(np.float64)  # tf.Example's float_list is 32-bit
    assert values == regressor.predict(rounded).astype(np.float32).tolist()


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_the_client_classifies_and_regresses_with_what_it_sends(server, classifier, regressor, protocol):
    from workbench.client import Client

    x, _ = tm.digits()
    frame = tm.diabetes_frame().iloc[:5]
    with Client(server.rest_url, server.grpc_target, protocol=protocol) as client:
        got = client.classify(DIGITS, tm.row_examples(x[:6]), signature_name="classify")
        values = client.regress(DIABETES, frame.to_dict(orient="records"), signature_name="regress")
    assert tm.as_float32(got) == tm.expected_classes(classifier.classes_, classifier.predict_proba(x[:6]))
    rounded = frame.astype(np.float32).astype(np.float64)
    assert np.array_equal(np.float32(values), regressor.predict(rounded).astype(np.float32))


# ------------------------------------------------------------------------------------------------ metadata
def test_metadata_describes_every_signature_alike_over_rest_and_grpc(server, stub):
    rest = {name: tm.described(sig) for name, sig in tm.rest_signatures(server, DIGITS).items()}
    assert rest == {
        "serving_default": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_DOUBLE", [-1, 64])},
            "outputs": {"predictions": ("DT_INT64", [-1])},
        },
        "predict_proba": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_DOUBLE", [-1, 64])},
            "outputs": {"probabilities": ("DT_DOUBLE", [-1, 10])},
        },
        "decision_function": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_DOUBLE", [-1, 64])},
            "outputs": {"decision_scores": ("DT_DOUBLE", [-1, 10])},
        },
        "classify": {
            "method": "tensorflow/serving/classify",
            "inputs": {"inputs": ("DT_STRING", [-1])},
            "outputs": {"classes": ("DT_STRING", [-1, 10]), "scores": ("DT_FLOAT", [-1, 10])},
        },
    }
    grpc_side = {name: tm.grpc_described(sig) for name, sig in tm.grpc_signatures(stub, DIGITS).items()}
    assert grpc_side == rest

    regressor = {name: tm.described(sig) for name, sig in tm.rest_signatures(server, DIABETES).items()}
    assert set(regressor) == {"serving_default", "regress"}
    assert regressor["regress"]["outputs"] == {"outputs": ("DT_FLOAT", [-1])}
    assert regressor["serving_default"]["inputs"] == {"x": ("DT_DOUBLE", [-1, 10])}


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_input_is_a_clear_client_error(server, stub):
    r = tm.rest(server, DIGITS, "predict", {"instances": [[1.0, 2.0, 3.0]]})
    assert r.status_code == 400
    assert r.json()["error"].startswith('Input "x" expects double [-1,64] but received double [1,3]')

    error = tm.grpc_error(lambda: tm.grpc_predict(stub, DIGITS, {"x": np.zeros((2, 5))}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expects double [-1,64]" in error.details()

    error = tm.grpc_error(lambda: tm.grpc_classify(stub, DIGITS, [{"pixels": [0.0] * 64}]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'Example 0 has no feature "x"' in error.details()
    error = tm.grpc_error(lambda: tm.grpc_classify(stub, DIGITS, [{"x": [0.0] * 3}]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "takes a row of 64 features" in error.details()

    r = tm.rest(server, DIABETES, "regress", {"signature_name": "regress", "examples": [{"age": 1.0}]})
    assert r.status_code == 400
    assert 'has no feature "sex"' in r.json()["error"]


# ------------------------------------------------------------------------------------------------ batching
def test_eight_concurrent_requests_run_as_one_batch(tmp_path, classifier):
    base = tmp_path / "models" / DIGITS
    export(classifier, base / "1")
    (base / "batching_parameters.txt").write_text(tm.EIGHT_ROW_BATCHES)
    x, _ = tm.digits()
    with tm.serving(tmp_path / "models") as server:
        tm.available(server, DIGITS)
        answers = tm.in_threads(lambda i: tm.rest(server, DIGITS, "predict", {"instances": [x[i].tolist()]}), 8, 8)
        assert [a.json() for a in answers] == [{"predictions": [int(p)]} for p in classifier.predict(x[:8])]
        assert tm.mean_batch_size(server, DIGITS) == 8.0


def test_concurrent_clients_over_rest_and_grpc_each_get_their_own_answers(tmp_path, classifier):
    base = tmp_path / "models" / DIGITS
    export(classifier, base / "1")
    (base / "batching_parameters.txt").write_text(tm.SHORT_BATCHES)
    x, _ = tm.digits()
    expected = classifier.predict_proba(x)

    with tm.serving(tmp_path / "models") as server, tm.stub_for(server) as stub:
        tm.available(server, DIGITS)

        def call(i: int) -> bool:
            rows = slice(i * 3, i * 3 + 1 + i % 3)
            if i % 2:
                got = tm.grpc_predict(stub, DIGITS, {"x": x[rows]}, signature="predict_proba")["probabilities"]
            else:
                body = {"signature_name": "predict_proba", "instances": x[rows].tolist()}
                got = np.array(tm.rest_answer(server, DIGITS, body)["predictions"])
            # Rows computed in a batch with other callers' go through BLAS with another row count, which may
            # change the last bits of a matrix product: equal to 1e-12, and each caller has its own rows.
            return np.allclose(got, expected[rows], rtol=1e-12, atol=1e-15)

        assert all(tm.in_threads(call, 160, 16))


# ------------------------------------------------------------------------------------------------ what loads
def test_a_pickle_is_refused_unless_allowed_and_served_when_allowed(tmp_path, classifier):
    x, _ = tm.digits()
    (tmp_path / "models" / "joblib" / "1").mkdir(parents=True)
    joblib.dump(classifier, tmp_path / "models" / "joblib" / "1" / "model.joblib")
    (tmp_path / "models" / "pkl" / "1").mkdir(parents=True)
    (tmp_path / "models" / "pkl" / "1" / "model.pkl").write_bytes(pickle.dumps(classifier))

    with tm.serving(tmp_path / "models") as server:
        for model in ("joblib", "pkl"):
            status = tm.load_error(server, model)
            assert status["error_code"] == "FAILED_PRECONDITION"
            assert PICKLE_SETTING in status["error_message"]
            assert "runs code when it is loaded" in status["error_message"]

    with tm.serving(tmp_path / "models", allow_pickle=True) as server:
        for model in ("joblib", "pkl"):
            tm.available(server, model)
            answer = tm.rest_answer(server, model, {"instances": x[:10].tolist()})
            assert answer == {"predictions": classifier.predict(x[:10]).tolist()}


def test_untrusted_skops_types_are_refused_by_name(tmp_path):
    x, y = tm.digits()
    custom = make_pipeline(tm.Doubler(), LogisticRegression(max_iter=2000)).fit(x, y)
    export(custom, tmp_path / "models" / "custom" / "1")

    with tm.serving(tmp_path / "models") as server:
        status = tm.load_error(server, "custom")
    assert status["error_code"] == "FAILED_PRECONDITION"
    assert "holds types neither skops nor workbench trusts: tabular_models.Doubler" in status["error_message"]
    assert PICKLE_SETTING in status["error_message"]

    with tm.serving(tmp_path / "models", allow_pickle=True) as server:  # trusted where code may run
        tm.available(server, "custom")
        assert tm.rest_answer(server, "custom", {"instances": x[:5].tolist()}) == {
            "predictions": custom.predict(x[:5]).tolist()
        }


def test_a_folder_with_a_scikit_learn_and_a_tensorflow_model_is_refused_naming_both(tmp_path, model_store, classifier):
    folder = export(classifier, tmp_path / "models" / "both" / "1")
    shutil.copy(model_store / "hp2_tf2" / "saved_model.pb", folder / "saved_model.pb")
    with tm.serving(tmp_path / "models") as server:
        status = tm.load_error(server, "both")
    assert status["error_code"] == "FAILED_PRECONDITION"
    assert "saved_model.pb (tensorflow)" in status["error_message"]
    assert "model.skops (sklearn)" in status["error_message"]


def test_a_corrupt_skops_file_is_reported_and_nothing_else_breaks(tmp_path, classifier):
    export(classifier, tmp_path / "models" / "good" / "1")
    (tmp_path / "models" / "corrupt" / "1").mkdir(parents=True)
    (tmp_path / "models" / "corrupt" / "1" / "model.skops").write_bytes(b"not a zip file")
    with tm.serving(tmp_path / "models") as server:
        status = tm.load_error(server, "corrupt")
        assert status["error_code"] == "DATA_LOSS"
        assert "Could not read" in status["error_message"]
        tm.available(server, "good")


# ------------------------------------------------------------------------------------------------ export side
def test_exports_only_scikit_learn_estimators(classifier):
    import lightgbm
    import xgboost

    assert platform.exports(classifier)
    assert platform.exports(StandardScaler())
    assert platform.exports(tm.Doubler())  # a BaseEstimator of the user's own
    assert not platform.exports(xgboost.XGBClassifier())
    assert not platform.exports(lightgbm.LGBMRegressor())
    assert not platform.exports(np.zeros(3))
    with pytest.raises(TypeError, match="takes no options"):
        platform.write(classifier, Path("."), compression=9)


def test_a_dataframe_fit_pipeline_is_given_a_dataframe(tmp_path, regressor, recwarn):
    """Its ColumnTransformer selects columns by name, and no 'X does not have valid feature names' warning."""
    folder = export(regressor, tmp_path / "1")
    servable = platform.load("diabetes", 1, str(folder), LoadPolicy())
    frame = tm.diabetes_frame().iloc[:3]
    signature = servable.signatures["serving_default"]
    got = servable.run(signature, {"x": frame.to_numpy()}, ["predictions"])["predictions"]
    assert np.array_equal(got, regressor.predict(frame))
    assert not [w for w in recwarn if "feature names" in str(w.message)]
