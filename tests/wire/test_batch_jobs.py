"""Batch prediction jobs: real files in every format, models exported as users export them, the real command line.

The answers are checked against the model in-process, row by row, by the id each output row carries; a job killed
with SIGKILL mid-shard and run again is shown to lose no row and write none twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import tabular_models as tm  # (tests/tabular_models.py)
from moto_aws import moto_aws  # (tests/moto_aws.py)
from sklearn.linear_model import LogisticRegression
from waiting import wait_until

import workbench
from workbench.batch_prediction import formats
from workbench.core.errors import ServingError

PIXELS = [f"p{i}" for i in range(64)]


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    return tm.digits()


@pytest.fixture(scope="module")
def repository(tmp_path_factory, digits) -> tuple[Path, Any]:
    x, y = digits
    root = tmp_path_factory.mktemp("models")
    model = LogisticRegression(max_iter=2000).fit(x, y)
    workbench.export(model, "digits", root)
    return root, model


def answers(output: Path, fmt: str, id_column: str = "row") -> dict[Any, Any]:
    """Every answer in the output folder's parts, by id; an id met twice fails."""
    found: dict[Any, Any] = {}
    for name in sorted(os.listdir(output)):
        if not name.startswith("part-"):
            continue
        columns = formats.read_rows(str(output / name), fmt, 0, 1 << 40)
        predictions = columns["predictions"]
        for key, value in zip(columns[id_column].tolist(), predictions.tolist(), strict=True):
            assert key not in found, f"row {key} written twice"
            found[key] = value
    return found


def summary(output: Path) -> dict[str, Any]:
    return json.loads((output / "_SUMMARY.json").read_text())


def test_a_csv_of_pixel_columns_is_scored_row_for_row_as_predict_answers(tmp_path, repository, digits):
    root, model = repository
    x, _ = digits
    frame = pd.DataFrame(x, columns=PIXELS)
    frame.to_csv(tmp_path / "digits.csv", index=False)
    seen = []
    result = workbench.batch_predict(
        "digits", tmp_path / "digits.csv", tmp_path / "out", model_repository=root, shard_rows=500, progress=seen.append
    )
    expected = model.predict(x)
    got = answers(tmp_path / "out", "csv")
    assert sorted(got) == list(range(len(x)))
    assert [got[i] for i in range(len(x))] == expected.tolist()
    assert (result.rows_in, result.rows_out, result.rows_failed, result.shards) == (len(x), len(x), 0, 4)
    assert summary(tmp_path / "out")["rows_out"] == len(x)
    assert seen[-1].done == seen[-1].rows == len(x)
    assert sorted(os.listdir(tmp_path / "out")) == ["_JOB.json", "_SUMMARY.json"] + [
        f"part-0000{i}.csv" for i in range(4)
    ]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "npy", "npz", "tfrecord"])
def test_every_input_format_feeds_the_model_and_its_answers_come_back_in_it(tmp_path, repository, digits, fmt):
    root, model = repository
    x = digits[0][:300]
    ids = np.arange(1000, 1300)
    if fmt == "npy":
        np.save(tmp_path / "in.npy", x)
        id_column, columns = None, {"": x}
    else:
        id_column, columns = "id", {"id": ids, "x": x}
        formats.write_table(columns, str(tmp_path / f"in.{fmt}"), fmt)
    source = next(tmp_path.glob("in.*"))
    workbench.batch_predict(
        "digits", source, tmp_path / "out", model_repository=root, id_column=id_column, progress=False
    )
    out_format = "npz" if fmt == "npy" else fmt
    got = answers(tmp_path / "out", out_format, id_column or "row")
    keys = list(range(300)) if fmt == "npy" else ids.tolist()
    assert [got[k] for k in keys] == model.predict(x).tolist()


def test_rows_that_do_not_cast_fail_alone_with_their_reasons(tmp_path, repository, digits):
    root, model = repository
    x = digits[0][:100]
    frame = pd.DataFrame(x, columns=PIXELS)
    frame.insert(0, "id", [f"r{i}" for i in range(100)])
    frame["p3"] = frame["p3"].astype(object)
    frame.loc[7, "p3"] = "seven"
    frame.loc[42, "p10"] = np.nan  # a float: NaN is a value LogisticRegression refuses
    frame.to_csv(tmp_path / "rows.csv", index=False)
    result = workbench.batch_predict(
        "digits", tmp_path / "rows.csv", tmp_path / "out", model_repository=root, id_column="id", progress=False
    )
    assert (result.rows_out, result.rows_failed) == (98, 2)
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors-00000.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["r7", "r42"]
    assert "column p3: 'seven' is not a float64" in errors[0]["error"]
    assert "NaN" in errors[1]["error"] or "nan" in errors[1]["error"].lower()
    got = answers(tmp_path / "out", "csv", "id")
    kept = [i for i in range(100) if i not in (7, 42)]
    assert [got[f"r{i}"] for i in kept] == model.predict(x[kept]).tolist()

    with pytest.raises(ServingError, match="more than --max_failed_rows=1"):
        workbench.batch_predict(
            "digits", tmp_path / "rows.csv", tmp_path / "out2", model_repository=root, id_column="id",
            max_failed_rows=1, progress=False,
        )  # fmt: skip


def test_a_job_whose_columns_name_no_input_is_refused_before_a_row_runs(tmp_path, repository):
    root, _ = repository
    formats.write_table(
        {"a": np.ones(3), "b": np.array(["x", "y", "z"], dtype=object)}, str(tmp_path / "t.jsonl"), "jsonl"
    )
    with pytest.raises(ServingError, match="--columns names nothing, which the input does not have"):
        workbench.batch_predict(
            "digits", tmp_path / "t.jsonl", tmp_path / "out", model_repository=root, columns={"nothing": "x"},
            progress=False,
        )  # fmt: skip
    with pytest.raises(ServingError, match=r"The input's columns \(a, b\) make rows of 2 values; x takes 64"):
        workbench.batch_predict("digits", tmp_path / "t.jsonl", tmp_path / "out", model_repository=root, progress=False)
    assert not (tmp_path / "out" / "part-00000.jsonl").exists()


def test_the_same_output_with_another_plan_is_refused_and_a_finished_job_rerun_writes_nothing(
    tmp_path, repository, digits
):
    root, _ = repository
    np.save(tmp_path / "in.npy", digits[0][:200])
    kwargs: dict[str, Any] = {"model_repository": root, "progress": False, "shard_rows": 50}
    first = workbench.batch_predict("digits", tmp_path / "in.npy", tmp_path / "out", **kwargs)
    again = workbench.batch_predict("digits", tmp_path / "in.npy", tmp_path / "out", **kwargs)
    assert (first.shards_resumed, again.shards_resumed, again.rows_out) == (0, 4, 200)
    with pytest.raises(ServingError, match="holds the output of another job"):
        workbench.batch_predict("digits", tmp_path / "in.npy", tmp_path / "out", **{**kwargs, "shard_rows": 40})


SLOW_MODEL = textwrap.dedent(
    """
    import time
    import workbench


    class SlowDouble(workbench.PythonModel):
        inputs = {"x": ("float64", [-1, 4])}
        outputs = {"y": ("float64", [-1, 4])}

        def predict(self, inputs):
            time.sleep(0.03)
            return {"y": inputs["x"] * 2.0}
    """
)


def test_a_job_killed_mid_shard_and_run_again_loses_no_row_and_writes_none_twice(tmp_path):
    version = tmp_path / "models" / "slow" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(SLOW_MODEL)
    x = np.arange(2000 * 4, dtype=np.float64).reshape(2000, 4)
    formats.write_table({"key": np.arange(2000) * 3, "x": x}, str(tmp_path / "in.parquet"), "parquet")
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "workbench", "batch", "slow", f"--model_repository={tmp_path / 'models'}",
        f"--input={tmp_path / 'in.parquet'}", f"--output={out}", "--allow_python_models", "--shard_rows=100",
        "--batch_size=20", "--concurrency=2", "--id_column=key", "--json",
    ]  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: len([n for n in _names(out) if n.startswith("part-")]) >= 3, timeout=120, what="3 parts")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    written_before = {n for n in _names(out) if n.startswith("part-")}
    assert 3 <= len(written_before) < 20  # killed mid-job
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shards_resumed"] >= len(written_before) and result["rows_out"] == 2000
    found: dict[int, list[float]] = {}
    for name in sorted(_names(out)):
        if name.startswith("part-"):
            columns = formats.read_rows(str(out / name), "parquet", 0, 1 << 40)
            for key, y in zip(columns["key"].tolist(), columns["y"].tolist(), strict=True):
                assert key not in found, f"key {key} written twice"
                found[key] = y
    assert sorted(found) == (np.arange(2000) * 3).tolist()
    assert all(found[3 * i] == (x[i] * 2).tolist() for i in range(2000))
    assert not [n for n in _names(out) if n.startswith(".tmp-")]  # what the killed run left half-written is gone


def _names(folder: Path) -> list[str]:
    return os.listdir(folder) if folder.exists() else []


def test_the_command_line_prints_a_summary_and_refuses_a_bad_column_map(tmp_path, repository, digits):
    root, _ = repository
    np.save(tmp_path / "in.npy", digits[0][:10])
    base = [
        sys.executable,
        "-m",
        "workbench",
        "batch",
        "digits",
        f"--model_repository={root}",
        f"--input={tmp_path / 'in.npy'}",
    ]
    done = subprocess.run([*base, f"--output={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "10 rows scored, 0 failed, by digits version 1" in done.stdout
    # Worker processes of their own: nothing of the command (its __main__) runs again in them.
    two = subprocess.run(
        [*base, f"--output={tmp_path / 'two'}", "--num_workers=2", "--shard_rows=4"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr
    assert "10 rows scored, 0 failed" in two.stdout and len(list((tmp_path / "two").glob("part-*"))) == 3
    bad = subprocess.run([*base, f"--output={tmp_path / 'o2'}", "--columns=x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--columns takes column=input pairs, not 'x'" in bad.stderr
    missing = subprocess.run(
        [*base[:4], "nope", *base[5:], f"--output={tmp_path / 'o3'}"], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and "workbench batch:" in missing.stderr


@pytest.fixture()
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A bucket on moto's S3 server (127.0.0.1, a free port)."""
    import boto3

    with moto_aws(monkeypatch):
        boto3.client("s3").create_bucket(Bucket="data")
        yield "data"


def test_input_and_output_in_an_object_store(tmp_path, repository, digits, s3_bucket):
    import boto3

    root, model = repository
    x = digits[0][:400]
    s3 = boto3.client("s3")
    for part in range(2):  # two files under one prefix: the glob lists them in order
        frame = pd.DataFrame(x[part * 200 : (part + 1) * 200], columns=PIXELS)
        frame.insert(0, "id", np.arange(part * 200, (part + 1) * 200))
        s3.put_object(Bucket=s3_bucket, Key=f"rows/part-{part}.csv", Body=frame.to_csv(index=False).encode())
    result = workbench.batch_predict(
        "digits", f"s3://{s3_bucket}/rows/*.csv", f"s3://{s3_bucket}/scored", model_repository=root,
        id_column="id", output_format="parquet", progress=False,
    )  # fmt: skip
    assert (result.rows_out, result.shards) == (400, 2)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="scored/")["Contents"])
    parts = ["scored/part-00000.parquet", "scored/part-00001.parquet"]
    assert keys == ["scored/_JOB.json", "scored/_SUMMARY.json", *parts]
    got: dict[int, int] = {}
    for key in keys[2:]:
        (tmp_path / "part.parquet").write_bytes(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        columns = formats.read_rows(str(tmp_path / "part.parquet"), "parquet", 0, 1000)
        got.update(zip(columns["id"].tolist(), columns["predictions"].tolist(), strict=True))
    assert [got[i] for i in range(400)] == model.predict(x).tolist()


# ------------------------------------------------------------------------------------------ inside a server
def run_in_server(url: str, job: dict[str, Any], token: str = "") -> dict[str, Any]:
    import requests

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = requests.post(f"{url}/workbench/v1/batch", json=job, headers=headers, timeout=30)
    assert started.status_code == 202, started.text
    found: dict[str, Any] = {}

    def finished() -> bool:
        found.update(requests.get(f"{url}{started.json()['url']}", timeout=30).json())
        return found["state"] != "running"

    wait_until(finished, timeout=120, interval=0.05, what="the batch job")
    return found


def test_a_job_runs_inside_a_server_on_its_loaded_model_and_is_counted(tmp_path, repository, digits):
    import requests

    root, model = repository
    x = digits[0][:600]
    formats.write_table({"id": np.arange(600), "x": x}, str(tmp_path / "in.parquet"), "parquet")
    with tm.serving(root) as server:
        tm.available(server, "digits")
        job = {"model": "digits", "input": str(tmp_path / "in.parquet"), "output": str(tmp_path / "out"),
               "id_column": "id", "shard_rows": 250}  # fmt: skip
        record = run_in_server(server.rest_url, job)
        assert (record["state"], record["rows"], record["done"], record["failed"]) == ("done", 600, 600, 0)
        assert record["summary"]["shards"] == 3 and record["summary"]["version"] == 1
        got = answers(tmp_path / "out", "parquet", "id")
        assert [got[i] for i in range(600)] == model.predict(x).tolist()
        metrics = requests.get(f"{server.rest_url}/metrics", timeout=30).text
        assert 'workbench_batch_rows_total{model="digits",outcome="scored"} 600.0' in metrics
        assert "workbench_batch_jobs_running 0.0" in metrics
        requests_counted = [line for line in metrics.splitlines() if 'protocol="batch"' in line and "code=" in line]
        assert requests_counted  # its batches went through the data plane as requests

        refused = requests.post(f"{server.rest_url}/workbench/v1/batch", json={"model": "digits"}, timeout=30)
        assert refused.status_code == 400 and "missing: input, output" in refused.json()["error"]
        typo = requests.post(f"{server.rest_url}/workbench/v1/batch", json={**job, "shards": 3}, timeout=30)
        assert typo.status_code == 400 and "unknown fields: shards" in typo.json()["error"]
        unknown = requests.get(f"{server.rest_url}/workbench/v1/batch/nope", timeout=30)
        assert unknown.status_code == 404
        failing = run_in_server(server.rest_url, {**job, "input": str(tmp_path / "missing.csv")})
        assert failing["state"] == "failed" and "missing.csv" in failing["error"]


def test_a_server_with_a_management_token_needs_it_for_jobs_and_a_job_can_be_cancelled(tmp_path):
    import requests

    version = tmp_path / "models" / "slow" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(SLOW_MODEL)
    formats.write_table({"x": np.ones((4000, 4))}, str(tmp_path / "in.npz"), "npz")
    job = {"model": "slow", "input": str(tmp_path / "in.npz"), "output": str(tmp_path / "out"), "batch_size": 10}
    with tm.serving(tmp_path / "models", allow_python_models=True, management_token="s3cret") as server:
        tm.available(server, "slow")
        denied = requests.post(f"{server.rest_url}/workbench/v1/batch", json=job, timeout=30)
        assert denied.status_code == 401
        started = requests.post(
            f"{server.rest_url}/workbench/v1/batch", json=job, headers={"Authorization": "Bearer s3cret"}, timeout=30
        ).json()
        cancelled = requests.delete(
            f"{server.rest_url}{started['url']}", headers={"Authorization": "Bearer s3cret"}, timeout=30
        ).json()
        assert cancelled["state"] == "cancelled" and cancelled["done"] < 4000


def test_workers_score_the_shards_side_by_side_and_one_summary_adds_them_up(tmp_path, repository, digits):
    root, model = repository
    x = digits[0][:900]
    formats.write_table({"id": np.arange(900), "x": x}, str(tmp_path / "in.parquet"), "parquet")
    seen: list[Any] = []
    result = workbench.batch_predict(
        "digits", tmp_path / "in.parquet", tmp_path / "out", model_repository=root, id_column="id", shard_rows=100,
        num_workers=2, progress=seen.append,
    )  # fmt: skip
    assert (result.rows_in, result.rows_out, result.shards, result.shards_resumed) == (900, 900, 9, 0)
    got = answers(tmp_path / "out", "parquet", "id")
    assert [got[i] for i in range(900)] == model.predict(x).tolist()
    assert summary(tmp_path / "out")["rows_out"] == 900
    assert seen[-1].done == seen[-1].rows == 900
