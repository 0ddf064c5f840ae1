"""Publishing a model as a numbered version of a served model repository: :func:`export` and what it returns or raises.

The public face of exporting (``workbench.export`` is this :func:`export`); its modules each do one job of it, run in
order by :mod:`workbench.publishing.exporter`. Named ``publishing`` rather than ``export``: a submodule
``workbench.export`` would shadow the function ``workbench.export`` the first time anything imported it.
"""

from __future__ import annotations

from workbench.publishing.export_errors import ExportError
from workbench.publishing.exporter import ExportResult, export

__all__ = ["ExportError", "ExportResult", "export"]
