"""Batch prediction: a whole data set through a model, on the engine that serves requests (``workbench batch``,
``workbench.batch_predict``). :mod:`~workbench.batch.formats` reads and writes the files, :mod:`~workbench.batch.plan`
cuts the input into shards and resumes, :mod:`~workbench.batch.feeding` maps columns to inputs,
:mod:`~workbench.batch.job` runs a job on a data plane, :mod:`~workbench.batch.standalone` on a server of its own."""

from __future__ import annotations

from workbench.batch.job import BatchJob, BatchSummary, Progress
from workbench.batch.standalone import batch_predict

__all__ = ["BatchJob", "BatchSummary", "Progress", "batch_predict"]
