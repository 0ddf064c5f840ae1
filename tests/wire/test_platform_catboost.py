"""The CatBoost platform: classifiers and a regressor trained here, served from model.cbm as they answer in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tabular_models as tm  # (tests/tabular_models.py)

catboost = pytest.importorskip("catboost")  # the catboost extra

from workbench.core.errors import Code, ServingError  # noqa: E402
from workbench.platforms import catboost as platform  # noqa: E402

DIGITS, SMALL_OR_LARGE, DIABETES = "digits", "small_or_large", "diabetes"
# allow_writing_files=False: CatBoost writes its training logs into catboost_info/ in the working folder otherwise.
PARAMS = {"iterations": 20, "depth": 3, "thread_count": 1, "verbose": False, "allow_writing_files": False}


@pytest.fixture(scope="module")
def classifier():
    x, y = tm.digits()
    return catboost.CatBoostClassifier(loss_function="MultiClass", **PARAMS).fit(x, y)


@pytest.fixture(scope="module")
def labelled():
    """A binary classifier of string labels, which model.cbm keeps."""
    x, y = tm.digits()
    return catboost.CatBoostClassifier(**PARAMS).fit(x, np.where(y < 5, "small", "large"))


@pytest.fixture(scope="module")
def regressor():
    x, y = tm.diabetes()
    return catboost.CatBoostRegressor(**PARAMS).fit(x, y)


def save(model, folder: Path) -> Path:
    folder.mkdir(parents=True)
    model.save_model(str(folder / platform.FILE))
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, classifier, labelled, regressor):
    root = tmp_path_factory.mktemp("catboost")
    save(classifier, root / DIGITS / "1")
    save(labelled, root / SMALL_OR_LARGE / "1")
    save(regressor, root / DIABETES / "1")
    with tm.serving(root) as running:
        for model in (DIGITS, SMALL_OR_LARGE, DIABETES):
            tm.available(running, model)
        yield running


def test_classifiers_answer_their_labels_and_probabilities_as_in_process(server, classifier, labelled):
    x, _ = tm.digits()
    expected = classifier.predict(x[:40]).reshape(-1).tolist()
    assert tm.rest_answer(server, DIGITS, {"instances": x[:40].tolist()}) == {"predictions": expected}
    body = {"signature_name": "predict_proba", "instances": x[:40].tolist()}
    probabilities = np.array(tm.rest_answer(server, DIGITS, body)["predictions"])
    np.testing.assert_allclose(probabilities, classifier.predict_proba(x[:40]), rtol=1e-6)
    answer = tm.rest_answer(server, SMALL_OR_LARGE, {"instances": x[:40].tolist()})
    assert answer == {"predictions": labelled.predict(x[:40]).tolist()}


def test_a_regressor_answers_its_values(server, regressor):
    x, _ = tm.diabetes()
    answer = tm.rest_answer(server, DIABETES, {"instances": x[:20].tolist()})
    np.testing.assert_allclose(answer["predictions"], regressor.predict(x[:20]), rtol=1e-6)


def test_categorical_features_are_refused_at_load_naming_them(tmp_path):
    rows = [["a", 1.0], ["b", 2.0], ["a", 3.0], ["b", 4.0]]
    model = catboost.CatBoostRegressor(iterations=2, verbose=False, cat_features=[0], allow_writing_files=False)
    model.fit(rows, [1, 2, 3, 4])
    folder = save(model, tmp_path / "m" / "1")
    with pytest.raises(ServingError) as refused:
        platform.read_model(folder / platform.FILE)
    assert refused.value.code is Code.FAILED_PRECONDITION and "categorical" in refused.value.message


def test_a_file_that_is_not_catboosts_is_data_loss(tmp_path):
    (tmp_path / platform.FILE).write_text("not a model")
    with pytest.raises(ServingError) as refused:
        platform.read_model(tmp_path / platform.FILE)
    assert refused.value.code is Code.DATA_LOSS
