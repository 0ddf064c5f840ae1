"""Batch prediction: a whole data set through a model, on the engine that serves requests (``workbench batch``,
``workbench.batch_predict``). :mod:`~workbench.batch.formats` reads and writes the files, :mod:`~workbench.batch.plan`
cuts the input into shards and resumes, :mod:`~workbench.batch.feeding` maps columns to inputs,
:mod:`~workbench.batch.job` runs a job on a data plane, :mod:`~workbench.batch.standalone` on a server of its own
(or several), :mod:`~workbench.batch.api` is the Python API; :mod:`workbench.ray.batch_job` runs one on Ray."""

from __future__ import annotations

from workbench.batch.api import batch_predict
from workbench.batch.job import BatchJob, BatchSummary, Progress

__all__ = ["BatchJob", "BatchSummary", "Progress", "batch_predict"]
