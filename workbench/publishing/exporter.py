"""Export a model from the notebook into a served model repository: ``export(model, "digits")``.

The result is ``<model_repository>/<name>/<version>/``: a SavedModel with a ``serving_default`` signature and,
when examples are given, ``assets.extra/tf_serving_warmup_requests``. A server polling ``<model_repository>/<name>``
picks the new version up.

Every export is built in a hidden folder inside ``<model_repository>/<name>`` (the server skips dot-folders), checked
by loading it exactly the way the server will, and only then renamed to its number, so a server never sees a
half-written or broken version, and a failed export leaves nothing behind.

``model_repository`` may also be an object store (``s3://bucket/models``, ``gs://…``, any fsspec URL): the export is
built and checked in a local temporary folder, then uploaded to ``<model_repository>/<name>/<version>/`` with
``saved_model.pb`` last. Object stores have no rename; a server counts a version as present only once its
``saved_model.pb`` exists, so it never sees a half-uploaded one.

This module runs the steps; each has its own module: the model's platform's writer (:mod:`.writers`, which asks
the platforms' modules; TensorFlow's SavedModel route is :mod:`workbench.platforms.tensorflow_export`), the check
and warmup (:mod:`.check`, :mod:`.warmup`), publishing under a number (:mod:`.versions`, :mod:`.store`) and a full
disk (:mod:`.disk`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.vocabulary import renamed_keywords
from workbench.explain.background import write_background
from workbench.platforms.export_request import VersionWriter, estimated_bytes
from workbench.publishing.check import write_warmup_and_verify
from workbench.publishing.disk import bytes_under, examples_bytes, no_space_message, out_of_space
from workbench.publishing.export_errors import ExportError, one_line
from workbench.publishing.object_store_versions import refuse_existing_in_store, store_of, upload
from workbench.publishing.reference import write_reference
from workbench.publishing.versions import check_name, check_version, publish, refuse_existing
from workbench.publishing.writers import platform_writer, write_version
from workbench.runtime.storage import is_remote, join
from workbench.runtime.tensorflow_runtime import quiet_tensorflow

if TYPE_CHECKING:  # only for annotations: importing TensorFlow at runtime is slow
    from numpy.typing import ArrayLike

__all__ = ["ExportResult", "export"]


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote: the version folder and its signatures (name → ``(inputs) -> (outputs)``)."""

    name: str
    version: int
    path: Path | str  # a URL (str) for a version exported to an object store, a model URI for a registry
    signatures: dict[str, str]
    warmup_records: int

    def __repr__(self) -> str:
        return (
            f"ExportResult(name={self.name!r}, version={self.version}, path='{self.path}', "
            f"signatures={self.signatures!r}, warmup_records={self.warmup_records})"
        )


@renamed_keywords(repo="model_repository")  # the name before the vocabulary was made one
def export(
    model: Any,
    name: str,
    model_repository: str | os.PathLike[str] = "workbench-models",
    version: int | None = None,
    examples: Mapping[str, ArrayLike] | Sequence[Mapping[str, ArrayLike]] | ArrayLike | None = None,
    signatures: Mapping[str, Any] | None = None,
    format: str | None = None,  # the word users know (skl2onnx, Keras' export use it too)
    example_inputs: Any = None,
    background: ArrayLike | None = None,
    reference: Any = None,
    registry: str | None = None,
    tokenizer: Any = None,
    task: str | None = None,
) -> ExportResult:
    """Save ``model`` as version ``version`` (default: the next one) of ``<model_repository>/<name>``; check it serves.

    ``model`` is a built Keras 3 model, a ``tf.Module`` whose ``tf.function`` (``serve``, ``serving_default``,
    ``__call__`` or its only one) has an ``input_signature``, a ``tf.function`` with an ``input_signature``, or
    a concrete function; ``signatures`` adds (or replaces) named signatures with such functions. It may also be a
    scikit-learn estimator or pipeline, an XGBoost or LightGBM model, an ONNX model (``onnx.ModelProto``, bytes or
    a path to a ``.onnx`` file), a :class:`workbench.PythonModel` class, or a pipeline description: each is written
    in its platform's format (see :mod:`workbench.platforms`). ``format="onnx"`` converts a scikit-learn model to
    ONNX with skl2onnx, where the estimator supports it. A ``torch.nn.Module`` is written as a ``torch.export``
    program (``model.pt2``, with a dynamic batch dimension) or, with ``format="torchscript"``, as TorchScript; it is
    traced with ``example_inputs`` (a tuple of forward()'s inputs, a dict of them by name, or one batch), else with
    ``examples`` (see :mod:`workbench.platforms.pytorch`).

    A ``transformers`` pipeline is written with ``save_pretrained`` (safetensors) with its tokenizer and task; a
    ``transformers`` model needs ``tokenizer`` (and ``task`` where its architecture does not say it), see
    :mod:`workbench.platforms.huggingface`.

    ``examples`` — one dict of input alias → batch, a list of such dicts (one warmup request each, at most
    1000), or a bare batch when ``serving_default`` has one input — are cast to the signature's types, written
    as the version's warmup requests and run through the exported model before it is published.

    ``background`` — rows like the training data (``X_train[:100]``) — is stored beside the version as the data set
    SHAP explanations compare a row with (``:explain``; LinearExplainer and KernelExplainer need one, see
    :mod:`workbench.explain.background`).

    ``reference`` — the training inputs (a batch for the only input, a DataFrame, or a dict of input name → rows) —
    is stored beside the version as the data its served inputs are tested for drift against
    (``GET /workbench/v1/models/{name}/drift``; see :mod:`workbench.publishing.reference`).

    ``registry="mlflow"`` logs the model to MLflow instead (its framework's flavor, the first of ``examples`` as its
    input example, the signature MLflow infers from it), checks it as above and registers it as the next version of
    the registered model ``name`` in the tracking server MLflow's own calls use (``MLFLOW_TRACKING_URI``): the
    result's ``version`` is the registry's number and its ``path`` the model URI, ``models:/<name>/<version>``. A
    server of ``models:/<name>`` serves it (see :mod:`workbench.publishing.mlflow_versions`).
    """
    check_name(name)
    if registry is not None:
        return _export_to_registry(
            model,
            name,
            registry,
            examples,
            {
                "version": version,
                "signatures": signatures,
                "format": format,
                "example_inputs": example_inputs,
                "background": background,
                "reference": reference,
                "tokenizer": tokenizer,
                "task": task,
            },
        )
    store = store_of(str(model_repository), name) if is_remote(model_repository) else None
    # A store's export is built in a local temporary folder, then uploaded (object stores have no rename).
    base = Path(tempfile.mkdtemp(prefix="workbench-export-")) if store else Path(model_repository).absolute() / name
    if version is not None:
        check_version(version)
        if store is not None:
            refuse_existing_in_store(name, store, version)
        else:
            refuse_existing(name, base, version)
    staging = base / f".tmp-export-{uuid.uuid4().hex}"
    # A model folder this export creates goes again if the export fails: a server polling the repository would
    # otherwise list an empty model.
    creates_base = store is None and not base.exists()
    published = False
    write: VersionWriter | None = None
    # What TensorFlow logs while it imports, traces, saves, loads and runs the export ("Assets written to ...",
    # optimizer notices) is about workbench's work, not the user's: the cell shows the result, or the error.
    with quiet_tensorflow():
        try:
            # Understood before mkdir (a TensorFlow model is traced): a model nobody can export makes nothing.
            write = platform_writer(
                model, format, signatures, examples, example_inputs, {"tokenizer": tokenizer, "task": task}
            )
            try:
                base.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ExportError(f"Cannot create the model folder {base}: {exc}") from exc
            staging.mkdir()
            write_version(write, staging)
            if background is not None:
                write_background(staging, background)
            if reference is not None:
                write_reference(staging, reference)
            described, records = write_warmup_and_verify(name, staging, examples)
            if store is not None:
                final_version = upload(name, store, staging, version)
            else:
                final_version = publish(name, base, staging, version)
            published = True
        except Exception as exc:
            if out_of_space(exc):  # TensorFlow's or Python's, raw or already wrapped: one message that says so
                written = estimated_bytes(write) if write is not None else 0
                needed = max(bytes_under(staging), written + examples_bytes(examples))
                shutil.rmtree(staging, ignore_errors=True)  # first, so the free space reported is the real one
                raise ExportError(no_space_message(name, base, needed)) from exc
            if isinstance(exc, ExportError):
                raise
            # A failure nobody foresaw still gets the one-line, cleaned-up treatment.
            raise ExportError(f"Export of {name!r} failed: {one_line(exc)}") from exc
        finally:
            # Reached with staging still present only when something failed (or was interrupted).
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
            if store is not None:
                shutil.rmtree(base, ignore_errors=True)
            elif creates_base and not published:
                with contextlib.suppress(OSError):  # not empty: another export published meanwhile, keep it
                    base.rmdir()
    return ExportResult(
        name=name,
        version=final_version,
        path=join(store.location, str(final_version)) if store is not None else base / str(final_version),
        signatures=described,
        warmup_records=records,
    )


def _export_to_registry(
    model: Any, name: str, registry: str, examples: Any, refused: Mapping[str, Any]
) -> ExportResult:
    """``export(..., registry=...)``: a registry is a destination of its own, numbering the versions itself."""
    from workbench.publishing.mlflow_versions import REGISTRIES, log_and_register

    if registry not in REGISTRIES:
        raise ExportError(f"Unknown registry {registry!r}: workbench exports to {', '.join(REGISTRIES)}")
    with quiet_tensorflow():
        number, uri, described = log_and_register(model, name, examples, refused)
    return ExportResult(name=name, version=number, path=uri, signatures=described, warmup_records=1)
