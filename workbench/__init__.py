"""workbench: serve TensorFlow models from a notebook, speaking TF Serving's REST and gRPC APIs.

The public face: :func:`serve` (a server process of the kernel), :func:`export` (a model → the next numbered
version), :class:`Client` (REST/gRPC with numpy), and ``%load_ext workbench`` for the ``%serve`` magics.
Everything is imported lazily: ``import workbench`` must not pull in TensorFlow, nor any other workbench module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Every name below is bound on first use (PEP 562): ``import workbench`` imports no other workbench module. Exporting
# lives in ``workbench.publishing``: a submodule ``workbench.export`` would shadow the function once imported.
if TYPE_CHECKING:
    from workbench.analyzer import analyze
    from workbench.batch_prediction import BatchSummary, batch_predict
    from workbench.client import Client
    from workbench.notebook.handle import ServerHandle, serve
    from workbench.notebook.widgets import Dashboard
    from workbench.platforms.pipeline import Pipeline, Step
    from workbench.platforms.python import PythonModel
    from workbench.platforms.python_text import TextEmbedder, TextGenerator
    from workbench.publishing import ExportError, export
    from workbench.runtime.version import __version__

__all__ = [
    "BatchSummary",
    "Client",
    "Dashboard",
    "ExportError",
    "Pipeline",
    "PythonModel",
    "ServerHandle",
    "TextEmbedder",
    "TextGenerator",
    "__version__",
    "analyze",
    "batch_predict",
    "export",
    "load_ipython_extension",
    "serve",
    "Step",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # kept on the ground floor: servers report it without importing this package's face
        from workbench.runtime.version import __version__

        return __version__
    if name in ("export", "ExportError"):  # a model → the next numbered version (workbench.publishing)
        from workbench import publishing

        return getattr(publishing, name)
    if name == "analyze":  # the model analyzer (workbench.analyzer)
        from workbench.analyzer import analyze

        return analyze
    if name in ("batch_predict", "BatchSummary"):  # a data set through a model (workbench.batch_prediction)
        from workbench import batch_prediction

        return getattr(batch_prediction, name)
    if name == "Client":
        from workbench.client import Client

        return Client
    if name == "Dashboard":
        from workbench.notebook.widgets import Dashboard

        return Dashboard
    if name == "PythonModel":  # the base of model.py models (workbench.platforms.python)
        from workbench.platforms.python import PythonModel

        return PythonModel
    if name in ("TextGenerator", "TextEmbedder"):  # Python text models (workbench.platforms.python_text)
        from workbench.platforms import python_text

        return getattr(python_text, name)
    if name in ("Pipeline", "Step"):  # a pipeline description, for workbench.export
        from workbench.platforms import pipeline

        return getattr(pipeline, name)
    if name in ("serve", "ServerHandle"):
        from workbench.notebook import handle

        return getattr(handle, name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt JupyterLab extension (the "Model serving" sidebar, built from ``extension/``) lies.

    ``jupyter-builder develop`` (run by ``make install``) reads this to link ``workbench/labextension`` into
    JupyterLab's paths; a wheel installs the same folder as shared data.
    """
    return [{"src": "labextension", "dest": "workbench-serving-jupyterlab"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext workbench``: register the ``%serve`` magics."""
    from workbench.notebook.magics import load_ipython_extension as load

    load(ipython)
