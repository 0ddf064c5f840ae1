"""The Hugging Face platform: tiny random-weight BERTs (tests/hf_models.py) exported by workbench.export (pipelines, a
model with its tokenizer) or written by save_pretrained alone, served for every non-generative task over TF Serving's
REST (rows and columns) and gRPC and v2 (tritonclient, REST and gRPC), each answer equal to the in-process pipeline's;
batched across concurrent requests, with a request's bad row failing it alone; pickled and TensorFlow weights
refused with the reason."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from transformers import pipeline

import workbench
from tests import hf_models
from tests.waiting import version_states, wait_until
from workbench.config.options import ServerOptions
from workbench.core.errors import Code, ServingError
from workbench.platforms import Loader
from workbench.platforms.base import LoadPolicy
from workbench.publishing import ExportError
from workbench.server import ServerThread

TASKS = (
    "text-classification",
    "token-classification",
    "fill-mask",
    "question-answering",
    "zero-shot-classification",
    "feature-extraction",
)
MODEL_NAMES = {task: task.replace("-", "_") for task in TASKS}
TEXTS = [
    "Ada Lovelace wrote the first program in London.",
    "I really hate waiting for the train!",
    "Grace Hopper built compilers near Paris, and zebras.",  # "zebras": words the tokenizer never saw
]
QUESTIONS = [
    {"question": "Who wrote the first program?", "context": TEXTS[0]},
    {"question": "What did Grace Hopper build?", "context": "Grace Hopper built compilers for the Navy in Paris."},
]
MASKED = ["Ada [MASK] wrote the first program.", "The capital of [MASK] is Paris."]
ZERO_SHOT = [
    {"text": TEXTS[0], "candidate_labels": ["history", "weather", "travel"]},
    {"text": TEXTS[1], "candidate_labels": ["trains", "food", "anger"]},
]


# ============================================================================================= models and servers
@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return hf_models.tokenizer()


@pytest.fixture(scope="module")
def pipelines(tokenizer) -> dict[str, Any]:
    """Each task's in-process pipeline (question answering, which transformers 5 dropped: the model and tokenizer)."""
    made: dict[str, Any] = {}
    for seed, task in enumerate(TASKS):
        model = hf_models.model(task, len(tokenizer), seed=seed)
        made[task] = (
            (model, tokenizer) if task == "question-answering" else pipeline(task, model=model, tokenizer=tokenizer)
        )
    return made


@pytest.fixture(scope="module")
def repository(tmp_path_factory, pipelines) -> Path:
    """Every task exported by workbench.export, but token classification: save_pretrained alone (no workbench.json),
    its task read from its config's architecture."""
    root = tmp_path_factory.mktemp("hf-models")
    for task, made in pipelines.items():
        name = MODEL_NAMES[task]
        if task == "question-answering":
            model, tokenizer = made
            workbench.export(model, name, root, tokenizer=tokenizer, examples={k: [v] for k, v in QUESTIONS[0].items()})
        elif task == "zero-shot-classification":  # an NLI classifier: zero-shot only when asked
            workbench.export(made.model, name, root, tokenizer=made.tokenizer, task=task)
        elif task == "token-classification":
            made.save_pretrained(str(root / name / "1"))
        else:
            workbench.export(made, name, root, examples=MASKED if task == "fill-mask" else None)
    return root


@pytest.fixture(scope="module")
def server(repository) -> Iterator[ServerThread]:
    params = repository.parent / "batching.config"
    params.write_text(
        "max_batch_size { value: 32 } batch_timeout_micros { value: 20000 } "
        "max_enqueued_batches { value: 1000 } num_batch_threads { value: 2 }\n"
    )
    options = ServerOptions(
        rest_api_port=-1,
        port=0,
        model_repository=str(repository),
        enable_batching=True,
        batching_parameters_file=str(params),
    )
    with ServerThread(options) as running:
        for name in MODEL_NAMES.values():
            wait_until(
                lambda m=name: version_states(running.rest_url, m).get("1") == "AVAILABLE", timeout=120, what=name
            )
        yield running


# ======================================================================== requests over each protocol, as numpy
Rows = list[Any]  # one request's rows: a text each, or a dict of inputs


def columns(task: str, rows: Rows) -> dict[str, np.ndarray]:
    """A request's rows as its input tensors (strings as numpy objects holding bytes)."""
    if not isinstance(rows[0], dict):
        return {"text": np.array([r.encode() for r in rows], dtype=object)}
    return {
        key: np.array(
            [[v.encode() for v in r[key]] if isinstance(r[key], list) else r[key].encode() for r in rows], dtype=object
        )
        for key in rows[0]
    }


def decoded(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind in "OS":
        return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(value)
    return value


def rest_rows(server: ServerThread, model: str, rows: Rows) -> dict[str, np.ndarray]:
    r = requests.post(f"{server.rest_url}/v1/models/{model}:predict", json={"instances": rows}, timeout=60)
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    return {name: np.array([p[name] for p in predictions]) for name in predictions[0]}


def rest_columns(server: ServerThread, model: str, rows: Rows) -> dict[str, np.ndarray]:
    body = {"inputs": {k: decoded(v).tolist() for k, v in columns("", rows).items()}}
    r = requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return {name: np.array(value) for name, value in r.json()["outputs"].items()}


def grpc_predict(server: ServerThread, model: str, rows: Rows) -> dict[str, np.ndarray]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for alias, value in columns("", rows).items():
        request.inputs[alias].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    return {name: decoded(tf.make_ndarray(value)) for name, value in response.outputs.items()}


def v2_infer(module: Any, url: str, model: str, rows: Rows) -> dict[str, np.ndarray]:
    client = module.InferenceServerClient(url)
    try:
        inputs = []
        for alias, value in columns("", rows).items():
            tensor = module.InferInput(alias, list(value.shape), "BYTES")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer(model, inputs)
        names = (
            [o["name"] for o in result.get_response()["outputs"]]
            if module is httpclient
            else [o.name for o in result.get_response().outputs]
        )
        return {name: decoded(result.as_numpy(name)) for name in names}
    finally:
        client.close()


def protocols(server: ServerThread) -> dict[str, Callable[[str, Rows], dict[str, np.ndarray]]]:
    return {
        "rest rows": lambda model, rows: rest_rows(server, model, rows),
        "rest columns": lambda model, rows: rest_columns(server, model, rows),
        "grpc": lambda model, rows: grpc_predict(server, model, rows),
        "v2 rest": lambda model, rows: v2_infer(httpclient, server.rest_url.removeprefix("http://"), model, rows),
        "v2 grpc": lambda model, rows: v2_infer(grpcclient, server.grpc_target, model, rows),
    }


# ================================================================ what the pipelines answer, and the served answers
def qa_reference(model: Any, tokenizer: Any, question: str, context: str) -> dict[str, Any]:
    """Extractive QA as transformers 4's pipeline defined it, brute force: start and end probabilities over CLS and
    the context's tokens, CLS itself never an answer, the best span of at most 15 tokens, widened to words."""
    encoded = tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        out = model(**{k: v for k, v in encoded.items() if k != "offset_mapping"})
    sequence = encoded.encodings[0].sequence_ids
    allowed = [i == 0 or s == 1 for i, s in enumerate(sequence)]

    def probabilities(logits: torch.Tensor) -> list[float]:
        values = [float(v) if ok else -10000.0 for v, ok in zip(logits[0].tolist(), allowed, strict=True)]
        top = max(values)
        exps = [np.exp(v - top) for v in values]
        return [e / sum(exps) for e in exps]

    starts, ends = probabilities(out.start_logits), probabilities(out.end_logits)
    best = (0.0, 0, 0)
    for s in range(1, len(sequence)):
        for e in range(s, min(s + 15, len(sequence))):
            if allowed[s] and allowed[e] and starts[s] * ends[e] > best[0]:
                best = (starts[s] * ends[e], s, e)
    score, s, e = best
    enc = encoded.encodings[0]
    first = enc.word_to_chars(enc.token_to_word(s), sequence_index=1)[0]
    last = enc.word_to_chars(enc.token_to_word(e), sequence_index=1)[1]
    return {"score": score, "start": first, "end": last, "answer": context[first:last]}


def expected(task: str, made: Any, rows: Rows) -> list[Any]:
    """What the in-process pipeline answers for each row."""
    if task == "text-classification":
        return [made(row)[0] | {"scores": made(row, top_k=None)} for row in rows]
    if task == "token-classification":
        return [made(row, aggregation_strategy="simple") for row in rows]
    if task == "fill-mask":
        return [made(row) for row in rows]
    if task == "question-answering":
        return [qa_reference(*made, **row) for row in rows]
    if task == "zero-shot-classification":
        return [made(row["text"], candidate_labels=row["candidate_labels"]) for row in rows]
    # Sentence embeddings: the pipeline's token features of each text alone, mean-pooled and L2-normalised.
    embeddings = []
    for row in rows:
        features = np.array(made(row), dtype=np.float32)[0]
        mean = features.mean(axis=0)
        embeddings.append({"embedding": mean / np.linalg.norm(mean), "num_tokens": len(features)})
    return embeddings


def served(task: str, outputs: dict[str, np.ndarray], rows: Rows) -> list[Any]:
    """A served answer in the pipeline's shape, row by row."""
    answers: list[Any] = []
    for i in range(len(rows)):
        if task == "text-classification":
            names = hf_models.SENTIMENT
            scores = [{"label": names[k], "score": float(s)} for k, s in enumerate(outputs["scores"][i])]
            scores.sort(key=lambda d: -d["score"])
            answers.append({"label": str(outputs["label"][i]), "score": float(outputs["score"][i]), "scores": scores})
        elif task == "token-classification":
            count = int(outputs["num_entities"][i])
            keys = ("entity_group", "score", "word", "start", "end")
            answers.append([{k: outputs[k][i][j] for k in keys} for j in range(count)])
        elif task == "fill-mask":
            keys = ("score", "token", "token_str", "sequence")
            answers.append([{k: outputs[k][i][j] for k in keys} for j in range(len(outputs["token"][i]))])
        elif task == "question-answering":
            answers.append({k: outputs[k][i] for k in ("score", "start", "end", "answer")})
        elif task == "zero-shot-classification":
            answers.append(
                {
                    "sequence": rows[i]["text"],
                    "labels": list(outputs["labels"][i]),
                    "scores": list(outputs["scores"][i]),
                }
            )
        else:
            answers.append({"embedding": outputs["embedding"][i], "num_tokens": int(outputs["num_tokens"][i])})
    return answers


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Equal, floats up to what a padded batch changes in the last bits."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, (float, np.floating, np.ndarray)):
        np.testing.assert_allclose(
            np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-4, atol=1e-5, err_msg=where
        )
    else:
        assert (got.item() if isinstance(got, np.generic) else got) == want, where


CASES: dict[str, Rows] = {
    "text-classification": TEXTS,
    "token-classification": TEXTS,
    "fill-mask": MASKED,
    "question-answering": QUESTIONS,
    "zero-shot-classification": ZERO_SHOT,
    "feature-extraction": TEXTS,
}


# ======================================================================================================= tests
@pytest.mark.parametrize("task", TASKS)
def test_every_protocol_answers_as_the_pipeline_does(server, pipelines, task):
    rows = CASES[task]
    want = expected(task, pipelines[task], rows)
    for protocol, call in protocols(server).items():
        assert_same(served(task, call(MODEL_NAMES[task], rows), rows), want, f"{task} over {protocol}")


def test_signatures_and_v2_metadata_name_each_tasks_tensors(server):
    client = httpclient.InferenceServerClient(server.rest_url.removeprefix("http://"))
    shapes = {
        name: (
            {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]},
            {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]},
        )
        for name, meta in ((m, client.get_model_metadata(m)) for m in MODEL_NAMES.values())
    }
    assert shapes["text_classification"] == (
        {"text": ("BYTES", [-1])},
        {"label": ("BYTES", [-1]), "score": ("FP32", [-1]), "scores": ("FP32", [-1, 3])},
    )
    assert shapes["feature_extraction"] == (
        {"text": ("BYTES", [-1])},
        {"embedding": ("FP32", [-1, 32]), "num_tokens": ("INT32", [-1])},
    )
    assert shapes["zero_shot_classification"][0] == {
        "text": ("BYTES", [-1]),
        "candidate_labels": ("BYTES", [-1, -1]),
    }
    assert shapes["question_answering"][0] == {"question": ("BYTES", [-1]), "context": ("BYTES", [-1])}
    assert shapes["fill_mask"][1]["token_str"] == ("BYTES", [-1, 5])
    assert client.get_model_metadata("text_classification")["platform"] == "huggingface"
    client.close()


def test_triton_classification_extension_names_the_labels(server, pipelines):
    client = grpcclient.InferenceServerClient(server.grpc_target)
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([TEXTS[0].encode()], dtype=object))
    result = client.infer(
        "text_classification", [text], outputs=[grpcclient.InferRequestedOutput("scores", class_count=3)]
    )
    ranked = [entry.decode().split(":") for entry in result.as_numpy("scores")[0]]
    want = sorted(pipelines["text-classification"](TEXTS[0], top_k=None), key=lambda d: -d["score"])
    assert [label for _, _, label in ranked] == [d["label"] for d in want]
    client.close()


def test_zero_shot_pads_labels_and_takes_its_template_and_multi_label_from_the_folder(tmp_path, server, pipelines):
    made = pipelines["zero-shot-classification"]
    body = {
        "inputs": {
            "text": [TEXTS[0], TEXTS[2]],
            "candidate_labels": [["history", "travel", "weather"], ["food", "science", ""]],
        }
    }
    r = requests.post(f"{server.rest_url}/v1/models/zero_shot_classification:predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    first = made(TEXTS[0], candidate_labels=["history", "travel", "weather"])
    second = made(TEXTS[2], candidate_labels=["food", "science"])
    assert outputs["labels"] == [first["labels"], [*second["labels"], ""]]
    assert_same(outputs["scores"], [first["scores"], [*second["scores"], 0.0]])

    folder = tmp_path / "nli"
    made.save_pretrained(str(folder))
    settings = {"platform": "huggingface", "task": "zero-shot-classification", "hypothesis_template": "It is {}."}
    (folder / "workbench.json").write_text(json.dumps(settings | {"multi_label": True}))
    servable = Loader()("z", 1, str(folder))
    feed = {
        "text": np.array([TEXTS[1].encode()], dtype=object),
        "candidate_labels": np.array([[b"trains", b"food"]], dtype=object),
    }
    (answer,) = servable.run_requests(servable.signatures["serving_default"], [feed], ["labels", "scores"])
    want = made(TEXTS[1], candidate_labels=["trains", "food"], hypothesis_template="It is {}.", multi_label=True)
    assert [b.decode() for b in answer["labels"][0]] == want["labels"]
    assert_same(list(answer["scores"][0]), want["scores"])
    servable.close()
    (folder / "workbench.json").write_text(json.dumps(settings | {"hypothesis_template": "no slot"}))
    with pytest.raises(ServingError, match="must hold \\{\\} where the label goes"):
        Loader()("z", 1, str(folder))


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server, pipelines):
    """Requests of 1 to 3 texts from 16 clients: batched together (fewer executions than texts), each answered with
    its own rows, the token classifier's padded to its own longest row only."""
    made = pipelines["token-classification"]
    client = httpclient.InferenceServerClient(server.rest_url.removeprefix("http://"))
    before = client.get_inference_statistics("token_classification")["model_stats"][0]
    texts = [*TEXTS, *hf_models.SENTENCES]

    def call(i: int) -> tuple[Rows, dict[str, np.ndarray]]:
        rows = [texts[(i + k) % len(texts)] for k in range(1 + i % 3)]
        if i % 2:
            return rows, grpc_predict(server, "token_classification", rows)
        return rows, rest_columns(server, "token_classification", rows)

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(call, range(48)))
    for rows, outputs in answers:
        want = expected("token-classification", made, rows)
        assert outputs["entity_group"].shape[1] == max(len(w) for w in want)  # its own rows' padding
        assert_same(served("token-classification", outputs, rows), want)
    after = client.get_inference_statistics("token_classification")["model_stats"][0]
    rows_run = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert rows_run == sum(len(rows) for rows, _ in answers)
    assert executions < 48  # requests shared model calls
    client.close()


def test_a_bad_row_fails_its_own_request_alone(server, pipelines):
    """A fill-mask text without its mask is INVALID_ARGUMENT for its request; one batched beside it is answered."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        bad = [pool.submit(rest_columns_raw, server, "fill_mask", ["no mask here"]) for _ in range(4)]
        good = [pool.submit(rest_columns_raw, server, "fill_mask", MASKED) for _ in range(4)]
    for future in bad:
        r = future.result()
        assert r.status_code == 400
        assert "fill-mask fills one [MASK] token per text; it holds 0" in r.json()["error"]
    want = expected("fill-mask", pipelines["fill-mask"], MASKED)
    for future in good:
        r = future.result()
        assert r.status_code == 200, r.text
        outputs = {k: np.array(v) for k, v in r.json()["outputs"].items()}
        assert_same(served("fill-mask", outputs, MASKED), want)


def rest_columns_raw(server: ServerThread, model: str, texts: list[str]) -> requests.Response:
    return requests.post(f"{server.rest_url}/v1/models/{model}:predict", json={"inputs": {"text": texts}}, timeout=60)


@pytest.mark.parametrize(
    ("model", "body", "fragment"),
    [
        ("text_classification", {"inputs": {"text": [1.5]}}, 'Input "text" expects'),
        ("text_classification", {"inputs": {"text": [["a", "b"]]}}, "expects shape [-1]"),
        ("question_answering", {"inputs": {"question": ["a", "b"], "context": ["c"]}}, ""),
        ("zero_shot_classification", {"inputs": {"text": ["a"], "candidate_labels": [["", ""]]}}, "names no label"),
        ("fill_mask", {"instances": ["[MASK] and [MASK]"]}, "it holds 2"),
    ],
)
def test_bad_requests_are_refused_precisely(server, model, body, fragment):
    r = requests.post(f"{server.rest_url}/v1/models/{model}:predict", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]


# ================================================================================================ folders
def test_the_task_comes_from_workbench_json_else_the_architecture(repository):
    assert json.loads((repository / "zero_shot_classification" / "1" / "workbench.json").read_text()) == {
        "platform": "huggingface",
        "task": "zero-shot-classification",
    }
    folder = repository / "token_classification" / "1"
    assert not (folder / "workbench.json").exists()
    servable = Loader()("t", 1, str(folder))
    assert servable.platform == "huggingface" and servable.task_name == "token-classification"  # type: ignore[attr-defined]
    assert servable.signatures["serving_default"].batchable
    servable.close()


@pytest.mark.parametrize("task", TASKS)
def test_each_tasks_forward_pass_is_traced_and_answers_as_the_eager_model(repository, tmp_path, task):
    """The TorchScript trace serves every task's tiny BERT, and answers what the same folder served eagerly
    (``"traced": false``) answers, on requests of other lengths and batch sizes than the trace's."""
    folder = repository / MODEL_NAMES[task] / "1"
    eager_folder = tmp_path / "eager"
    shutil.copytree(folder, eager_folder)
    settings = json.loads((folder / "workbench.json").read_text()) if (folder / "workbench.json").exists() else {}
    (eager_folder / "workbench.json").write_text(json.dumps({"platform": "huggingface", **settings, "traced": False}))
    traced, eager = Loader()("t", 1, str(folder)), Loader()("e", 1, str(eager_folder))
    assert traced.forward_pass == "traced"  # type: ignore[attr-defined]
    assert eager.forward_pass == 'eager: workbench.json says "traced": false'  # type: ignore[attr-defined]
    rows = CASES[task]
    feeds = [columns(task, rows), columns(task, rows[:1]), columns(task, rows[1:])]
    signature = traced.signatures["serving_default"]
    outputs = list(signature.outputs)
    for got, want in zip(
        traced.run_requests(signature, feeds, outputs), eager.run_requests(signature, feeds, outputs), strict=True
    ):
        assert not isinstance(got, ServingError) and not isinstance(want, ServingError)
        assert_same({k: decoded(v).tolist() for k, v in got.items()}, {k: decoded(v).tolist() for k, v in want.items()})
    traced.close()
    eager.close()


def test_traced_is_true_or_false(tmp_path, repository):
    folder = tmp_path / "odd"
    shutil.copytree(repository / MODEL_NAMES["feature-extraction"] / "1", folder)
    settings = json.loads((folder / "workbench.json").read_text())
    (folder / "workbench.json").write_text(json.dumps(settings | {"traced": "yes"}))
    with pytest.raises(ServingError) as info:
        Loader()("o", 1, str(folder))
    assert info.value.code is Code.INVALID_ARGUMENT
    assert info.value.message == "workbench.json: \"traced\" is true or false; got 'yes'"


def test_pickled_weights_load_only_when_allowed_and_tensorflow_weights_never(tmp_path, pipelines):
    made = pipelines["text-classification"]
    folder = tmp_path / "pickled"
    made.model.save_pretrained(str(folder))
    made.tokenizer.save_pretrained(str(folder))
    (folder / "model.safetensors").unlink()
    torch.save(made.model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(ServingError) as info:
        Loader()("p", 1, str(folder))
    assert info.value.code is Code.FAILED_PRECONDITION
    assert "pytorch_model.bin holds pickled PyTorch weights" in info.value.message
    assert "--allow_pickle" in info.value.message
    servable = Loader(LoadPolicy(allow_pickle=True))("p", 1, str(folder))
    rows = {"text": np.array([TEXTS[0].encode()], dtype=object)}
    (answer,) = servable.run_requests(servable.signatures["serving_default"], [rows], ["label", "score"])
    assert not isinstance(answer, ServingError)
    assert answer["label"][0].decode() == made(TEXTS[0])[0]["label"]
    servable.close()
    (folder / "pytorch_model.bin").rename(folder / "tf_model.h5")
    with pytest.raises(ServingError) as info:
        Loader(LoadPolicy(allow_pickle=True))("p", 1, str(folder))
    assert info.value.code is Code.FAILED_PRECONDITION
    assert (
        "TensorFlow weights (tf_model.h5), which are not served: transformers 5 runs PyTorch only" in info.value.message
    )


def test_an_architecture_without_a_task_names_the_setting(tmp_path, pipelines):
    folder = tmp_path / "odd"
    pipelines["feature-extraction"].save_pretrained(str(folder))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"architectures": ["BertForPreTraining"]}))
    with pytest.raises(ServingError) as info:
        Loader()("o", 1, str(folder))
    assert info.value.code is Code.FAILED_PRECONDITION
    assert '"task": "text-classification"' in info.value.message


# ================================================================================================= export side
def test_export_refuses_a_model_without_its_tokenizer_and_options_for_other_models(tmp_path, pipelines):
    model = pipelines["text-classification"].model
    with pytest.raises(ExportError, match="is served with its tokenizer: workbench.export\\(model, name, tokenizer="):
        workbench.export(model, "m", tmp_path)
    with pytest.raises(ExportError, match="task 'summarise' is not served"):
        workbench.export(model, "m", tmp_path, tokenizer=pipelines["text-classification"].tokenizer, task="summarise")
    with pytest.raises(ExportError, match="tokenizer= is for huggingface models"):
        workbench.export(np.float32, "m", tmp_path, tokenizer=object())
    assert not (tmp_path / "m").exists()


def test_an_export_writes_safetensors_the_tokenizer_and_the_task(repository):
    files = sorted(p.name for p in (repository / "text_classification" / "1").iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files and "config.json" in files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]
    assert json.loads((repository / "text_classification" / "1" / "workbench.json").read_text()) == {
        "platform": "huggingface",
        "task": "text-classification",
    }
    # examples= became the version's warmup requests
    assert (repository / "question_answering" / "1" / "assets.extra" / "tf_serving_warmup_requests").is_file()


# ======================================================================================= MLServer's runtime
def test_mlserver_huggingface_runtime_answers_as_mlserver_does(tmp_path, pipelines):
    """model-settings.json naming mlserver_huggingface.HuggingFaceRuntime: the pipeline called with the request's
    inputs (args positional, the others by name), its answer one JSON element per item of output "output"."""
    classifier, nli = pipelines["text-classification"], pipelines["zero-shot-classification"]
    qa_model, tokenizer = pipelines["question-answering"]
    classifier.save_pretrained(str(tmp_path / "sentiment" / "model"))
    nli.save_pretrained(str(tmp_path / "topics" / "weights"))
    qa_model.save_pretrained(str(tmp_path / "qa" / "model"))
    tokenizer.save_pretrained(str(tmp_path / "qa" / "tokenizer"))
    runtime = "mlserver_huggingface.HuggingFaceRuntime"
    for name, extra in {
        "sentiment": {"task": "text-classification", "pretrained_model": "./model"},
        "topics": {"task": "zero-shot-classification", "pretrained_model": "weights"},
        "qa": {"task": "question-answering", "pretrained_model": "model", "pretrained_tokenizer": "tokenizer"},
    }.items():
        settings = {"name": name, "implementation": runtime, "parameters": {"version": "v1.2", "extra": extra}}
        (tmp_path / name / "model-settings.json").write_text(json.dumps(settings))
    options = ServerOptions(rest_api_port=-1, port=0, model_repository=str(tmp_path))
    with ServerThread(options) as running:
        for name in ("sentiment", "topics", "qa"):
            wait_until(
                lambda m=name: "AVAILABLE" in version_states(running.rest_url, m).values(), timeout=120, what=name
            )

        def infer(model: str, *inputs: dict[str, Any]) -> requests.Response:
            return requests.post(
                f"{running.rest_url}/v2/models/{model}/infer", json={"inputs": list(inputs)}, timeout=60
            )

        def text(name: str, *values: str) -> dict[str, Any]:
            return {"name": name, "shape": [len(values)], "datatype": "BYTES", "data": list(values)}

        r = infer("sentiment", text("args", TEXTS[1]))
        assert r.status_code == 200, r.text
        body = r.json()
        (output,) = body["outputs"]
        assert body["model_version"] == "v1.2"
        assert (output["name"], output["shape"], output["datatype"]) == ("output", [1, 1], "BYTES")
        assert output["parameters"] == {"content_type": "hg_jsonlist"}
        assert output["data"][0].startswith('{"label": ')  # json.dumps' separators, as MLServer writes it
        assert_same(json.loads(output["data"][0]), classifier(TEXTS[1])[0])

        r = infer("topics", text("args", TEXTS[0]), text("candidate_labels", "history", "weather"))
        assert r.status_code == 200, r.text
        want = nli(TEXTS[0], candidate_labels=["history", "weather"])
        assert_same(json.loads(r.json()["outputs"][0]["data"][0]), want)

        question = QUESTIONS[1]
        r = infer("qa", text("question", question["question"]), text("context", question["context"]))
        assert r.status_code == 200, r.text
        assert_same(json.loads(r.json()["outputs"][0]["data"][0]), qa_reference(qa_model, tokenizer, **question))

        # Several texts go as array_inputs (one list argument); in args they are several positional arguments,
        # which the pipeline refuses, in MLServer as here.
        client = grpcclient.InferenceServerClient(running.grpc_target)
        texts = grpcclient.InferInput("array_inputs", [2], "BYTES")
        texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS[:2]], dtype=object))
        result = client.infer("sentiment", [texts])
        (output,) = result.get_response().outputs  # in contents, as MLServer's (tritonclient's as_numpy fails there)
        assert (output.name, list(output.shape)) == ("output", [2, 1])
        got = [json.loads(b) for b in output.contents.bytes_contents]
        assert_same(got, [classifier(t)[0] for t in TEXTS[:2]])
        client.close()
        assert infer("sentiment", text("args", *TEXTS[:2])).status_code == 400

        r = infer("topics", text("args", TEXTS[0]))  # the pipeline refuses: no candidate labels
        assert r.status_code == 400, r.text
