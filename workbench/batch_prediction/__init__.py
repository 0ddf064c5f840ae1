"""Batch prediction: a whole data set through a model, on the engine that serves requests (``workbench batch``,
``workbench.batch_predict``). :mod:`~workbench.batch_prediction.formats` reads and writes the files,
:mod:`~workbench.batch_prediction.plan` cuts the input into shards and resumes,
:mod:`~workbench.batch_prediction.feeding` maps columns to inputs, :mod:`~workbench.batch_prediction.job` runs a job on
a data plane, :mod:`~workbench.batch_prediction.standalone` on a server of its own (or several),
:mod:`~workbench.batch_prediction.launch` is the Python API; :mod:`workbench.ray.batch_job` runs one on Ray."""

from __future__ import annotations

from workbench.batch_prediction.job import BatchJob, BatchSummary, Progress
from workbench.batch_prediction.launch import batch_predict

__all__ = ["BatchJob", "BatchSummary", "Progress", "batch_predict"]
