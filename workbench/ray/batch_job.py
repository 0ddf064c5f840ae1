"""A batch prediction job on a Ray cluster, with Ray Data: ``workbench batch MODEL ... --ray=ADDRESS``,
``workbench.ray.batch_predict``.

The job is cut into parts as ``--num_workers`` cuts it (part ``i`` of ``n`` scores every ``n``-th shard), and
Ray Data runs the parts: a dataset of the part numbers goes through ``map_batches`` with a pool of actors, an
actor per engine, each one a server of its own with no ports, which loads the model as ``workbench serve`` would
and runs its part (:func:`workbench.batch_prediction.job.run_job`): reading its shards, scoring them in full batches and
writing each one whole, where every node reaches the input and the output (an object store, a shared file
system). Ray places the actors on the cluster's nodes, one CPU each, and starts one again if its node goes away.
What is written is what a job on one machine writes: parts, errors files, the plan that lets a job stopped half
way finish where it stopped, and the summary, written here once every part is done.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from workbench.batch_prediction.job import BatchJob, BatchSummary, write_summary
from workbench.batch_prediction.plan import remove_temporaries
from workbench.batch_prediction.standalone import merged, options_of, run_to_end, standalone
from workbench.config.options import ServerOptions


class _Engine:
    """A Ray Data actor: one engine (a server of its own, no ports), running the parts of the job it is given."""

    def __init__(self, options: dict[str, Any], job: dict[str, Any]) -> None:
        self.options = options_of(options)
        self.job = job

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        summaries: list[str] = []
        for index, count in zip(batch["part"], batch["count"], strict=True):
            job = BatchJob(**{**self.job, "part": (int(index), int(count))})
            summary = run_to_end(standalone(self.options, job, None))
            summaries.append(json.dumps(dataclasses.asdict(summary)))
        return {"summary": summaries}


def ray_batch(options: ServerOptions, job: BatchJob, address: str | None, actors: int) -> BatchSummary:
    """Run ``job`` on the Ray cluster at ``address`` (as ``ray.init`` takes it: ``auto``, ``local``, ``HOST:PORT``,
    ``ray://HOST:PORT``; unused where this process is connected to one already) with ``actors`` engines; its
    summary, written once every part is done."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    remove_temporaries(job.output)  # before any part writes: a killed run's half-written files
    started = time.perf_counter()
    fields = dataclasses.asdict(dataclasses.replace(job, part=None, concurrency=job.concurrency or 1))
    parts = ray.data.from_items([{"part": i, "count": actors} for i in range(actors)], override_num_blocks=actors)
    results = parts.map_batches(
        _Engine,
        fn_constructor_kwargs={"options": dataclasses.asdict(options), "job": fields},
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
    ).take_all()
    summaries = [BatchSummary(**json.loads(row["summary"])) for row in results]
    summary = merged(job, summaries, time.perf_counter() - started)
    write_summary(job.output, summary)
    return summary
