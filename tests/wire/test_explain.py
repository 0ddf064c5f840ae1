""":explain over REST: SHAP for tabular models and integrated gradients for Keras (and PyTorch) models, trained
here, exported with workbench.export, served by a real server; the notebook Client's explain and its plots."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest
import requests
import tabular_models as tm  # tests/tabular_models.py

import workbench
from workbench.client import Client
from workbench.notebook.explanations import heatmap, plot, waterfall
from workbench.protocol.attributions import TENSORS

FOREST, BOOST, XGB, LGBM, LOGISTIC, KNN, BARE, CNN, TORCH = (
    "forest", "boost", "xgb", "lgbm", "logistic", "knn", "bare", "cnn", "torchnet",
)  # fmt: skip


@pytest.fixture(scope="module")
def fitted():
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = tm.digits()
    xr, yr = tm.diabetes()
    models = {
        FOREST: RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0).fit(x, y),
        BOOST: GradientBoostingRegressor(n_estimators=20, random_state=0).fit(xr, yr),
        LOGISTIC: LogisticRegression(max_iter=200).fit(x, y),
        KNN: make_pipeline(StandardScaler(), KNeighborsClassifier()).fit(x, y),
    }
    xgboost = pytest.importorskip("xgboost")
    lightgbm = pytest.importorskip("lightgbm")
    models[XGB] = xgboost.XGBClassifier(n_estimators=10, max_depth=3, n_jobs=1).fit(x, y)
    models[LGBM] = lightgbm.LGBMRegressor(n_estimators=20, verbose=-1, n_jobs=1).fit(xr, yr)
    return models


def _images(n: int) -> np.ndarray:
    x, _ = tm.digits()
    return (x[:n] / 16.0).reshape(n, 8, 8, 1).astype(np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory, fitted):
    import keras

    root = tmp_path_factory.mktemp("explain")
    x, _ = tm.digits()
    for name in (FOREST, BOOST, XGB, LGBM):
        workbench.export(fitted[name], name, root)
    workbench.export(fitted[LOGISTIC], LOGISTIC, root, background=x[:100])
    workbench.export(fitted[KNN], KNN, root, background=x[:20])
    workbench.export(fitted[KNN], BARE, root)  # no background: nothing explains a k-NN pipeline without one
    keras.utils.set_random_seed(0)
    cnn = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    workbench.export(cnn, CNN, root)
    names = [FOREST, BOOST, XGB, LGBM, LOGISTIC, KNN, BARE, CNN]
    net = None
    if importlib.util.find_spec("torch") is not None:  # the pytorch extra
        import torch

        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10)
        ).eval()
        workbench.export(net, TORCH, root, example_inputs=torch.from_numpy(_images(2).transpose(0, 3, 1, 2).copy()))
        names.append(TORCH)
    with tm.serving(root) as running:
        for name in names:
            tm.available(running, name)
        running.keras_model, running.torch_module, running.root = cnn, net, root
        yield running


def explain(server, path: str, body) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{path}:explain", json=body, timeout=60)


def explained(server, path: str, body) -> dict:
    r = explain(server, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def added_up(document: dict) -> np.ndarray:
    return np.array([e["base_value"] + np.sum(e["attributions"]) for e in document["explanations"]])


def test_tree_explanations_add_up_to_each_models_own_output(server, fitted):
    x, _ = tm.digits()
    xr, _ = tm.diabetes()
    forest = explained(server, FOREST, {"instances": x[:5].tolist()})
    # KServe v1's answer: the predictions :predict gives, and one explanation per row.
    assert forest["predictions"] == tm.rest_answer(server, FOREST, {"instances": x[:5].tolist()})["predictions"]
    assert forest["explainer"]["explainer"] == "TreeExplainer"
    assert forest["explainer"]["output_space"] == "probability"
    proba = fitted[FOREST].predict_proba(x[:5])
    targets = [e["target"] for e in forest["explanations"]]
    assert targets == np.argmax(proba, axis=1).tolist()  # each row's predicted class
    assert np.allclose(added_up(forest), proba[np.arange(5), targets])
    assert all(len(e["attributions"]) == 64 for e in forest["explanations"])

    boost = explained(server, BOOST, {"instances": xr[:4].tolist()})
    assert np.allclose(added_up(boost), fitted[BOOST].predict(xr[:4]))
    assert boost["explainer"]["output_space"] == "prediction"

    margins = fitted[XGB].predict(x[:3], output_margin=True)
    xgb = explained(server, XGB, {"instances": x[:3].tolist(), "parameters": {"target": 4}})
    assert [e["target"] for e in xgb["explanations"]] == [4, 4, 4]
    assert np.allclose(added_up(xgb), margins[:, 4], atol=1e-4)  # XGBoost computes in float32

    lgbm = explained(server, LGBM, {"instances": xr[:3].tolist()})
    assert np.allclose(added_up(lgbm), fitted[LGBM].predict(xr[:3]))


def test_linear_explanations_are_coefficients_times_distance_from_the_background_mean(server, fitted):
    x, _ = tm.digits()
    model = fitted[LOGISTIC]
    # Columnar request on the version's path: the predictions come back as "outputs", as :predict answers.
    answer = explained(server, f"{LOGISTIC}/versions/1", {"inputs": {"x": x[10:12].tolist()}})
    assert answer["outputs"] == model.predict(x[10:12]).tolist()
    assert answer["explainer"]["explainer"] == "LinearExplainer"
    assert answer["explainer"]["output_space"] == "log-odds"
    scores = model.decision_function(x[10:12])
    for i, row in enumerate(answer["explanations"]):
        target = row["target"]
        assert target == int(np.argmax(scores[i]))
        expected = model.coef_[target] * (x[10 + i] - x[:100].mean(axis=0))
        assert np.allclose(row["attributions"], expected)
        assert np.isclose(row["value"], scores[i, target])
    assert np.allclose(added_up(answer), [r["value"] for r in answer["explanations"]])


def test_kernel_explainer_is_the_fallback_and_explains_probabilities(server, fitted):
    x, _ = tm.digits()
    answer = explained(server, KNN, {"instances": x[30:32].tolist(), "parameters": {"nsamples": 150}})
    head = answer["explainer"]
    assert (head["explainer"], head["signature"], head["output_space"]) == (
        "KernelExplainer",
        "predict_proba",
        "probability",
    )
    assert head["nsamples"] <= 150
    proba = fitted[KNN].predict_proba(x[30:32])
    for i, row in enumerate(answer["explanations"]):
        assert row["target"] == int(np.argmax(proba[i]))
        # KernelSHAP keeps efficiency exactly: the attributions sum to f(x) - E[f(background)].
        assert np.isclose(row["base_value"] + np.sum(row["attributions"]), proba[i, row["target"]], atol=1e-6)
        assert np.isclose(row["base_value"], fitted[KNN].predict_proba(x[:20])[:, row["target"]].mean())


def test_a_model_without_an_explainer_gets_a_precise_error_and_the_server_keeps_serving(server):
    x, _ = tm.digits()
    one = {"instances": x[:1].tolist()}
    r = explain(server, BARE, one)
    assert r.status_code == 400
    message = r.json()["error"]
    assert "Model bare version 1 has no background data set, which KernelExplainer needs" in message
    assert "background=X_train[:100]" in message

    r = explain(server, LOGISTIC, {**one, "parameters": {"explainer": "tree"}})
    assert (r.status_code, r.json()["error"]) == (
        400,
        "Model logistic version 1: TreeExplainer does not read a LogisticRegression",
    )
    r = explain(server, FOREST, {**one, "parameters": {"target": 10}})
    assert r.status_code == 400 and "target 10 is out of range" in r.json()["error"]
    r = explain(server, FOREST, {**one, "parameters": {"samples": 3}})
    assert r.status_code == 400 and "unknown explain parameter(s): samples" in r.json()["error"]
    images = {"instances": _images(1).tolist()}
    r = explain(server, CNN, {**images, "parameters": {"explainer": "linear"}})
    assert r.status_code == 400
    assert r.json()["error"].startswith("Model cnn version 1 (platform tensorflow): LinearExplainer does not apply")
    r = explain(server, CNN, {**images, "parameters": {"explainer": "kernel"}})
    assert r.status_code == 501
    assert "KernelExplainer, the general fallback, explains one numeric matrix input" in r.json()["error"]
    assert explain(server, "nobody", one).status_code == 404
    assert explain(server, f"{FOREST}/versions/7", one).status_code == 404

    # Still serving: the same models answer predict and explain.
    assert tm.rest_answer(server, BARE, one)["predictions"] == [0]
    assert explained(server, FOREST, one)["explanations"][0]["target"] == 0


def test_v2_grpc_model_infer_with_the_explain_parameter_answers_the_explanation_as_tensors(server, fitted):
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    x, _ = tm.digits()
    client = triton.InferenceServerClient(server.grpc_target)
    rows = triton.InferInput("x", [3, 64], "FP64")
    rows.set_data_from_numpy(x[:3].astype(np.float64))
    result = client.infer(FOREST, [rows], parameters={"explain": True, "target": 2})
    proba = fitted[FOREST].predict_proba(x[:3])
    assert np.array_equal(result.as_numpy("predictions"), fitted[FOREST].predict(x[:3]))
    attributions = result.as_numpy("explain_attributions")
    assert attributions.shape == (3, 64) and attributions.dtype == np.float64
    assert result.as_numpy("explain_targets").tolist() == [2, 2, 2]
    assert np.allclose(result.as_numpy("explain_base_values") + attributions.sum(axis=1), proba[:, 2])
    assert np.allclose(result.as_numpy("explain_values"), proba[:, 2])
    head = result.get_response().parameters
    assert head["explainer"].string_param == "TreeExplainer"
    assert head["output_space"].string_param == "probability"
    # Without the parameter, the same RPC is the plain inference it was.
    plain = client.infer(FOREST, [rows])
    assert plain.as_numpy("explain_attributions") is None

    with pytest.raises(InferenceServerException) as refused:
        client.infer(BARE, [rows], parameters={"explain": True})
    assert refused.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert "Model bare version 1 has no background data set" in refused.value.message()
    with pytest.raises(InferenceServerException) as refused:
        client.infer(FOREST, [rows], parameters={"explain": "yes"})
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert 'the parameter "explain" must be a boolean' in refused.value.message()
    client.close()


def test_v2_rest_infer_with_the_explain_parameter_answers_the_same_tensors(server, fitted):
    x, _ = tm.digits()
    tensor = {"name": "x", "shape": [2, 64], "datatype": "FP64", "data": x[:2].ravel().tolist()}
    body = {"inputs": [tensor], "parameters": {"explain": True, "explainer": "linear"}}
    r = requests.post(f"{server.rest_url}/v2/models/{LOGISTIC}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["parameters"]["explainer"] == "LinearExplainer"
    assert answer["parameters"]["output_space"] == "log-odds"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert list(outputs) == ["predictions", *TENSORS]
    assert outputs["explain_attributions"]["shape"] == [2, 64]
    scores = fitted[LOGISTIC].decision_function(x[:2])
    targets = outputs["explain_targets"]["data"]
    assert targets == np.argmax(scores, axis=1).tolist()
    assert np.allclose(outputs["explain_values"]["data"], scores[[0, 1], targets])
    # Asking for one output by name: it, then the explanation's.
    body["outputs"] = [{"name": "explain_values"}]
    r = requests.post(f"{server.rest_url}/v2/models/{LOGISTIC}/infer", json=body, timeout=60)
    assert [o["name"] for o in r.json()["outputs"]] == [
        "explain_values",
        "explain_attributions",
        "explain_base_values",
        "explain_targets",
    ]
    body["outputs"] = [{"name": "nothing"}]
    r = requests.post(f"{server.rest_url}/v2/models/{LOGISTIC}/infer", json=body, timeout=60)
    assert r.status_code == 400 and "Unexpected outputs nothing" in r.json()["error"]


def test_an_explanation_past_its_deadline_is_answered_504_and_the_server_keeps_serving(server, tmp_path):
    shutil.copytree(server.root / KNN, tmp_path / KNN)
    x, _ = tm.digits()
    with tm.serving(tmp_path, rest_api_timeout_in_ms=1) as hurried:  # every REST request has 1 ms
        tm.available(hurried, KNN)
        r = explain(hurried, KNN, {"instances": x[:2].tolist()})
        assert r.status_code == 504, r.text
        assert tm.version_status(hurried, KNN)["state"] == "AVAILABLE"


def test_integrated_gradients_explain_a_keras_image_model(server):
    images = _images(2)
    answer = explained(server, CNN, {"instances": images.tolist(), "parameters": {"steps": 64}})
    head = answer["explainer"]
    assert (head["explainer"], head["steps"], head["baseline"]) == ("IntegratedGradients", 64, 0.0)
    probabilities = server.keras_model.predict(images, verbose=0)
    assert np.allclose(answer["predictions"], probabilities, atol=1e-6)
    for i, row in enumerate(answer["explanations"]):
        assert row["target"] == int(np.argmax(probabilities[i]))
        assert np.array(row["attributions"]).shape == (8, 8, 1)
        assert np.isclose(row["value"], probabilities[i, row["target"]], atol=1e-6)
        # Completeness: the attributions add up to F(x) - F(baseline), up to the integral's error.
        assert abs(np.sum(row["attributions"]) - (row["value"] - row["base_value"])) < 2e-3
        assert head["deltas"][i] < 2e-3


def test_integrated_gradients_explain_a_pytorch_model(server):
    if server.torch_module is None:
        pytest.skip("torch is not installed")
    import torch

    images = _images(2).transpose(0, 3, 1, 2).copy()  # PyTorch's channels first
    answer = explained(server, TORCH, {"instances": images.tolist(), "parameters": {"steps": 100}})
    assert answer["explainer"]["explainer"] == "IntegratedGradients"
    with torch.no_grad():
        logits = server.torch_module(torch.from_numpy(images)).numpy()
    zeros = server.torch_module(torch.zeros(1, 1, 8, 8)).detach().numpy()[0]
    for i, row in enumerate(answer["explanations"]):
        target = row["target"]
        assert target == int(np.argmax(logits[i]))
        assert np.array(row["attributions"]).shape == (1, 8, 8)
        assert np.isclose(row["value"], logits[i, target], atol=1e-5)
        assert np.isclose(row["base_value"], zeros[target], atol=1e-5)
        assert abs(np.sum(row["attributions"]) - (row["value"] - row["base_value"])) < 5e-3


def test_client_explain_and_the_notebook_plots(server, fitted):
    import plotly.graph_objects as go

    x, _ = tm.digits()
    with Client(server.rest_url) as client:
        forest = client.explain(FOREST, x[:2])
        assert forest.method == "TreeExplainer"
        assert forest.attributions.shape == (2, 64)
        assert np.array_equal(forest.predictions["predictions"], fitted[FOREST].predict(x[:2]))
        linear = client.explain(LOGISTIC, x[:1], target=3)
        assert linear.targets.tolist() == [3]
        images = client.explain(CNN, _images(1), steps=32)
    assert images.attributions.shape == (1, 8, 8, 1)

    figure = plot(forest, row=1)
    assert isinstance(figure, go.Figure)
    (trace,) = figure.data
    assert trace.type == "waterfall"
    assert trace.y[0] == "base value" and trace.y[-1] == "output"
    assert trace.x[0] == pytest.approx(forest.base_values[1])
    # 12 features and the rest summed: every attribution is in the figure once.
    assert len(trace.y) == 1 + 12 + 1 + 1
    assert sum(trace.x[1:-1]) == pytest.approx(forest.attributions[1].sum())
    assert len(waterfall(forest, max_features=100).data[0].y) == 1 + 64 + 1

    (cells,) = heatmap(images).data
    assert cells.type == "heatmap"
    assert np.asarray(cells.z).shape == (8, 8)
    assert np.allclose(np.asarray(cells.z), images.attributions[0, :, :, 0])
    assert plot(images).data[0].type == "heatmap"
