"""Jupyter server extension: list the running workbench servers and proxy to their REST APIs.

Enabled by ``jupyter-config/jupyter_server_config.d/workbench.json`` (installed into
``etc/jupyter/jupyter_server_config.d``), or by hand with ``jupyter server extension enable workbench.jupyter``.
It adds, under Jupyter's base URL and behind Jupyter's own authentication:

- ``GET workbench/api/servers``: every running server with its models (see :mod:`workbench.jupyter.server_records`);
- ``workbench/proxy/<server-id>/<path>``: a request forwarded to that server's REST API.

This module only wires entry points; the serving process imports :mod:`workbench.jupyter.server_records`, so nothing
here may import Jupyter or tornado at module level.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "workbench.jupyter"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the handlers to the Jupyter server's web application."""
    from workbench.jupyter.handlers import handlers
    from workbench.jupyter.server_records import registry_dir

    base_url = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", handlers(base_url))
    serverapp.log.info("workbench extension: listing servers recorded in %s", registry_dir())
