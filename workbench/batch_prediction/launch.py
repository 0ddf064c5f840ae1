"""``workbench.batch_predict`` (and ``workbench batch``'s body): a job here, in worker processes, or on Ray.

Progress is a tqdm bar: in a terminal a text line, in a notebook tqdm's widget (rows/s, time left, failed rows).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from workbench.batch_prediction.job import BatchJob, BatchSummary, Progress
from workbench.batch_prediction.standalone import in_workers, run_to_end, standalone
from workbench.config.batch_flags import DEFAULTS
from workbench.config.options import ServerOptions
from workbench.runtime.storage import is_remote


def batch_predict(
    model: str,
    input: str,  # noqa: A002 - the flag's name
    output: str,
    *,
    model_repository: str | os.PathLike[str] = DEFAULTS["model_repository"],
    model_base_path: str | os.PathLike[str] | None = DEFAULTS["model_base_path"],
    model_config_file: str | os.PathLike[str] | None = DEFAULTS["model_config_file"],
    model_version: int | None = DEFAULTS["model_version"],
    version_label: str | None = DEFAULTS["version_label"],
    signature_name: str = DEFAULTS["signature_name"],
    columns: Mapping[str, str] | None = DEFAULTS["columns"],
    id_column: str | None = DEFAULTS["id_column"],
    input_format: str | None = DEFAULTS["input_format"],
    output_format: str | None = DEFAULTS["output_format"],
    batch_size: int = DEFAULTS["batch_size"],
    shard_rows: int = DEFAULTS["shard_rows"],
    concurrency: int = DEFAULTS["concurrency"],
    max_failed_rows: int | None = DEFAULTS["max_failed_rows"],
    num_workers: int = DEFAULTS["num_workers"],
    ray_address: str | None = DEFAULTS["ray_address"],
    allow_pickle: bool = DEFAULTS["allow_pickle"],
    allow_python_models: bool = DEFAULTS["allow_python_models"],
    progress: bool | Callable[[Progress], None] = True,
) -> BatchSummary:
    """Score every row of ``input`` (a file, folder, glob or ``s3://``/``gs://`` URL of CSV, Parquet, JSON Lines,
    ``.npy``/``.npz`` or TFRecord files) with ``model``, writing the answers to the folder ``output``.

    The model is ``<model_repository>/<model>`` (what ``workbench.export`` wrote), or ``model_base_path``, or a model
    of ``model_config_file``; its latest version unless ``model_version`` or ``version_label`` says otherwise.
    Each shard of ``shard_rows`` rows is written whole as ``part-NNNNN.<format>``, with an id column (``id_column``,
    else ``row``: the row's number in the input), and its failed rows with their reasons in
    ``errors-NNNNN.jsonl``; run the same job again after it was stopped and it finishes the shards left.
    ``max_failed_rows`` stops the job once more rows than that failed. ``num_workers`` processes score the
    shards side by side, each with the model loaded (what a model whose calls hold the GIL needs to use several
    cores). ``ray_address`` runs those workers on a Ray cluster with Ray Data instead (``"auto"``: the cluster this
    machine belongs to; ``"local"``: a Ray started here; see :mod:`workbench.ray.batch_job`), ``num_workers`` of
    them. ``progress``: a tqdm bar (True), nothing (False), or a function told after each batch.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, not {num_workers}")
    job = BatchJob(
        model,
        str(input),
        str(output),
        model_version,
        version_label,
        signature_name,
        dict(columns or {}),
        id_column,
        input_format,
        output_format,
        batch_size,
        shard_rows,
        concurrency,
        max_failed_rows,
    )
    options = job_server_options(
        model, model_repository, model_base_path, model_config_file, allow_pickle, allow_python_models
    )
    bar = _ProgressBar(model) if progress is True else None
    told = bar.update if bar is not None else (progress if callable(progress) else None)
    if ray_address is not None:
        from workbench.ray.batch_job import ray_batch

        return ray_batch(options, job, ray_address, num_workers)
    try:
        if num_workers > 1:
            return in_workers(options, job, num_workers, told)
        return run_to_end(standalone(options, job, told))
    finally:
        if bar is not None:
            bar.close()


def job_server_options(
    model: str,
    model_repository: str | os.PathLike[str],
    model_base_path: str | os.PathLike[str] | None,
    model_config_file: str | os.PathLike[str] | None,
    allow_pickle: bool,
    allow_python_models: bool,
) -> ServerOptions:
    """A server that loads ``model`` alone (from a config file: every model it names, a pipeline's members too)."""
    common: dict[str, Any] = {
        "allow_pickle": allow_pickle,
        "allow_python_models": allow_python_models,
        "file_system_poll_wait_seconds": 0.0,  # the versions there at the start: a job pins one anyway
        # A job's batches are not cheap calls: each runs on a thread of its own, side by side.
        "inline_cheap_calls": False,
    }
    if model_config_file:
        return ServerOptions(model_config_file=str(model_config_file), **common)
    if not model_base_path:  # None, or an empty flag
        repository = str(model_repository)
        model_base_path = (
            f"{repository.rstrip('/')}/{model}" if is_remote(repository) else os.path.join(repository, model)
        )
    return ServerOptions(model_name=model, model_base_path=str(model_base_path), **common)


class _ProgressBar:
    """tqdm's bar (its notebook widget inside Jupyter), in rows, with the failed rows beside."""

    def __init__(self, model: str) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=None, unit="rows", unit_scale=True, desc=f"scoring with {model}", dynamic_ncols=True)
        self._failed = -1

    def update(self, progress: Progress) -> None:
        bar = self._bar
        if bar.total != progress.rows:
            bar.total = progress.rows
        bar.n = progress.done
        if progress.failed != self._failed:
            self._failed = progress.failed
            bar.set_postfix(failed=progress.failed, refresh=False)
        bar.refresh()

    def close(self) -> None:
        self._bar.close()
