"""Batch prediction jobs on a Ray cluster with Ray Data (``workbench batch --ray ADDRESS``), on a local multi-node
cluster (``ray.cluster_utils.Cluster``) of its own: a head node with no CPUs and two worker nodes of one CPU each, so
that the job's two engines (Ray Data actors of one CPU) run one on each worker node.

A cluster of its own rather than the Ray Serve tests' one: that module also starts a second, local Ray on this
machine, and Ray (2.60) then fails to create actors on the first cluster, from any driver ("The actor never ran - it
was cancelled before it started running").
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import workbench

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'workbench-serving[ray]')")
pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'ray[data]')")

OBJECT_STORE_BYTES = 80 * 1024**2  # Ray's floor is 75 MiB; the job passes file names, not data


@pytest.fixture(scope="module")
def cluster_address() -> Iterator[str]:
    from ray.cluster_utils import Cluster
    from waiting import patient_ray_nodes, start_ray_node  # tests/waiting.py

    with patient_ray_nodes():  # a busy machine starts the nodes slower than Ray's own 30 s wait
        cluster = Cluster()  # its head is its first node
        start_ray_node(
            lambda: cluster.add_node(num_cpus=0, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False)
        )
        try:
            for _ in range(2):
                start_ray_node(lambda: cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES))
            cluster.wait_for_nodes()
            yield str(cluster.address)
        finally:
            cluster.shutdown()


@pytest.mark.timeout(900)  # two jobs of a minute or two each; several times that on a busy machine
def test_a_batch_job_runs_on_the_clusters_nodes_with_ray_data(cluster_address: str, tmp_path: Path) -> None:
    """``workbench batch --ray ADDRESS`` as a user types it (a driver of its own): two engines score the shards;
    the output is what a job on one machine writes, every row once, and a second run finds every shard written."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    from workbench.batch_prediction import formats

    x, y = load_digits(return_X_y=True)
    model = LogisticRegression(max_iter=2000).fit(x, y)
    workbench.export(model, "digits", tmp_path / "models")
    formats.write_table({"id": np.arange(len(x)), "x": x}, str(tmp_path / "in.parquet"), "parquet")
    command = [
        sys.executable, "-m", "workbench", "batch", "digits",
        "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"),
        "--model_repository", str(tmp_path / "models"), "--id_column", "id", "--shard_rows", "300",
        "--num_workers", "2", "--ray", cluster_address, "--json",
    ]  # fmt: skip

    def run() -> dict[str, Any]:
        done = subprocess.run(command, capture_output=True, text=True, timeout=420)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    first = run()
    assert (first["rows_in"], first["rows_out"], first["rows_failed"], first["shards"]) == (len(x), len(x), 0, 6)
    found: dict[int, int] = {}
    for part in sorted((tmp_path / "out").glob("part-*.parquet")):
        columns = formats.read_rows(str(part), "parquet", 0, 1 << 40)
        for key, value in zip(columns["id"].tolist(), columns["predictions"].tolist(), strict=True):
            assert key not in found
            found[key] = value
    assert [found[i] for i in range(len(x))] == model.predict(x).tolist()
    assert json.loads((tmp_path / "out" / "_SUMMARY.json").read_text())["rows_out"] == len(x)
    assert run()["shards_resumed"] == 6
