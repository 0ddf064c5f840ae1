"""Telling others that a server answers: the ready file its starter waits for, and the record Jupyter lists.

The Jupyter record (:mod:`workbench.jupyter.server_records`) is written once the server answers and removed when it
starts draining, so Jupyter's extension stops listing and proxying a server going away; writing it never raises.
"""

from __future__ import annotations

from workbench.config.options import ServerOptions
from workbench.jupyter import server_records  # Jupyter's server extension lists and proxies running servers
from workbench.runtime.process import write_json_atomically


def write_ready_file(path: str, content: dict[str, object]) -> None:
    """Tell whoever started this server that it answers, and on which ports (written atomically)."""
    write_json_atomically(path, content)


class JupyterRecord:
    """This server's record for Jupyter, while it serves."""

    def __init__(self) -> None:
        self._id: str | None = None

    def write(self, options: ServerOptions, rest_port: int | None, grpc_port: int | None, started_at: float) -> None:
        self._id = server_records.register_server(options, rest_port, grpc_port, started_at)

    def remove(self) -> None:
        if self._id is not None:
            server_records.unregister(self._id)
            self._id = None
