"""The LightGBM platform: classifiers and a regressor trained here, served from model.txt as they answer in-process."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import lightgbm
import numpy as np
import pytest
import tabular_models as tm  # (tests/tabular_models.py)

from workbench.core.errors import ServingError
from workbench.platforms import lightgbm as platform
from workbench.platforms.base import LoadPolicy

DIGITS, SMALL_OR_LARGE, DIABETES = "digits", "small_or_large", "diabetes"
PARAMS = {"n_estimators": 20, "num_leaves": 8, "n_jobs": 1, "verbose": -1}


@pytest.fixture(scope="module")
def classifier():
    x, y = tm.digits()
    return lightgbm.LGBMClassifier(**PARAMS).fit(x, y)


@pytest.fixture(scope="module")
def labelled():
    """A binary classifier of string labels, which LightGBM's text format does not keep."""
    x, y = tm.digits()
    return lightgbm.LGBMClassifier(**PARAMS).fit(x, np.where(y < 5, "small", "large"))


@pytest.fixture(scope="module")
def booster():
    """A regressor trained with the Booster API on a DataFrame: its features have names."""
    _, y = tm.diabetes()
    data = lightgbm.Dataset(tm.diabetes_frame(), label=y)
    params = {"objective": "regression", "num_leaves": 8, "num_threads": 1, "verbose": -1}
    return lightgbm.train(params, data, num_boost_round=20)


def export(obj, folder: Path) -> Path:
    folder.mkdir(parents=True)
    assert platform.exports(obj)
    platform.write(obj, folder)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, classifier, labelled, booster):
    root = tmp_path_factory.mktemp("lightgbm")
    export(classifier, root / DIGITS / "1")
    export(labelled, root / SMALL_OR_LARGE / "1")
    export(booster, root / DIABETES / "1")
    with tm.serving(root) as running:
        for model in (DIGITS, SMALL_OR_LARGE, DIABETES):
            tm.available(running, model)
        yield running


@pytest.fixture(scope="module")
def stub(server):
    with tm.stub_for(server) as made:
        yield made


def test_rest_row_and_columnar_answers_equal_the_in_process_predictions(server, classifier, labelled):
    x, _ = tm.digits()
    expected = classifier.predict(x[:40]).tolist()
    assert tm.rest_answer(server, DIGITS, {"instances": x[:40].tolist()}) == {"predictions": expected}
    assert tm.rest_answer(server, DIGITS, {"inputs": x[:40].tolist()}) == {"outputs": expected}
    body = {"signature_name": "predict_proba", "instances": x[:40].tolist()}
    probabilities = np.array(tm.rest_answer(server, DIGITS, body)["predictions"])
    assert np.array_equal(probabilities, classifier.predict_proba(x[:40]))

    answer = tm.rest_answer(server, SMALL_OR_LARGE, {"instances": x[:40].tolist()})
    assert answer == {"predictions": labelled.predict(x[:40]).tolist()}
    body = {"signature_name": "predict_proba", "inputs": x[:40].tolist()}
    assert np.array_equal(tm.rest_answer(server, SMALL_OR_LARGE, body)["outputs"], labelled.predict_proba(x[:40]))


def test_grpc_predict_and_classify_equal_in_process(stub, classifier, labelled):
    x, _ = tm.digits()
    answer = tm.grpc_predict(stub, DIGITS, {"x": x[:25]})
    assert np.array_equal(answer["predictions"], classifier.predict(x[:25]))
    classes = tm.grpc_classify(stub, DIGITS, tm.row_examples(x[:10]))
    assert tm.as_float32(classes) == tm.expected_classes(classifier.classes_, classifier.predict_proba(x[:10]))

    answer = tm.grpc_predict(stub, SMALL_OR_LARGE, {"x": x[:25]})
    assert answer["predictions"].tolist() == [label.encode() for label in labelled.predict(x[:25])]
    classes = tm.grpc_classify(stub, SMALL_OR_LARGE, tm.row_examples(x[:10]))
    assert tm.as_float32(classes) == tm.expected_classes(labelled.classes_, labelled.predict_proba(x[:10]))


def test_a_named_feature_regressor_over_grpc_by_name_and_by_examples(stub, booster):
    frame = tm.diabetes_frame().iloc[:20]
    columns = {name: frame[name].to_numpy() for name in tm.DIABETES_FEATURES}
    assert np.array_equal(tm.grpc_predict(stub, DIABETES, columns)["predictions"], booster.predict(frame))
    assert np.array_equal(
        tm.grpc_predict(stub, DIABETES, {"x": frame.to_numpy()})["predictions"], booster.predict(frame)
    )

    values = tm.grpc_regress(stub, DIABETES, tm.named_examples(frame.to_numpy(), tm.DIABETES_FEATURES))
    rounded = frame.astype(np.float32).astype(np.float64)
    assert np.array_equal(np.float32(values), booster.predict(rounded).astype(np.float32))

    error = tm.grpc_error(lambda: tm.grpc_regress(stub, DIABETES, tm.row_examples(frame.to_numpy())))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'Example 0 has no feature "age"' in error.details()


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_the_client_classifies_with_what_it_sends(server, labelled, protocol):
    from workbench.client import Client

    x, _ = tm.digits()
    with Client(server.rest_url, server.grpc_target, protocol=protocol) as client:
        got = client.classify(SMALL_OR_LARGE, tm.row_examples(x[:6]), signature_name="classify")
    assert tm.as_float32(got) == tm.expected_classes(labelled.classes_, labelled.predict_proba(x[:6]))


def test_metadata_over_rest_and_grpc(server, stub):
    rest = {name: tm.described(sig) for name, sig in tm.rest_signatures(server, SMALL_OR_LARGE).items()}
    assert rest == {
        "serving_default": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_DOUBLE", [-1, 64])},
            "outputs": {"predictions": ("DT_STRING", [-1])},
        },
        "predict_proba": {
            "method": "tensorflow/serving/predict",
            "inputs": {"x": ("DT_DOUBLE", [-1, 64])},
            "outputs": {"probabilities": ("DT_DOUBLE", [-1, 2])},
        },
        "classify": {
            "method": "tensorflow/serving/classify",
            "inputs": {"inputs": ("DT_STRING", [-1])},
            "outputs": {"classes": ("DT_STRING", [-1, 2]), "scores": ("DT_FLOAT", [-1, 2])},
        },
    }
    assert {n: tm.grpc_described(s) for n, s in tm.grpc_signatures(stub, SMALL_OR_LARGE).items()} == rest
    regressor = {name: tm.described(sig) for name, sig in tm.rest_signatures(server, DIABETES).items()}
    assert set(regressor) == {"serving_default", "regress"}
    assert regressor["serving_default"]["outputs"] == {"predictions": ("DT_DOUBLE", [-1])}


def test_the_export_keeps_labels_the_text_format_drops(tmp_path, labelled, classifier):
    folder = export(labelled, tmp_path / "labelled")
    assert json.loads((folder / "workbench.json").read_text()) == {
        "platform": "lightgbm",
        "classes": ["large", "small"],
    }
    assert not (export(classifier, tmp_path / "digits") / "workbench.json").exists()  # 0..9 need no list

    (folder / "workbench.json").write_text(json.dumps({"platform": "lightgbm", "classes": ["only one"]}))
    with pytest.raises(ServingError, match="must list the model's 2 classes"):
        platform.load("labelled", 1, str(folder), LoadPolicy())


def test_batched_concurrent_clients_each_get_their_own_answers(tmp_path, classifier):
    base = tmp_path / "models" / DIGITS
    export(classifier, base / "1")
    (base / "batching_parameters.txt").write_text(tm.EIGHT_ROW_BATCHES)
    x, _ = tm.digits()
    expected = classifier.predict_proba(x)
    with tm.serving(tmp_path / "models") as server, tm.stub_for(server) as stub:
        tm.available(server, DIGITS)

        def call(i: int) -> bool:
            if i % 2:
                got = tm.grpc_predict(stub, DIGITS, {"x": x[i : i + 1]}, "predict_proba")["probabilities"]
            else:
                body = {"signature_name": "predict_proba", "instances": x[i : i + 1].tolist()}
                got = np.array(tm.rest_answer(server, DIGITS, body)["predictions"])
            return np.array_equal(got, expected[i : i + 1])

        assert tm.in_threads(call, 8, 8) == [True] * 8
        assert tm.mean_batch_size(server, DIGITS) == 8.0


def test_exports_lightgbm_models_only(classifier, booster):
    import xgboost

    assert platform.exports(classifier) and platform.exports(booster)
    assert not platform.exports(xgboost.XGBClassifier())
    assert not platform.exports({"objective": "binary"})
