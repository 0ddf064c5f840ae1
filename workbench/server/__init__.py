"""The serving process: the composition root (:class:`ModelServer`) and how it runs (:func:`run`,
:class:`ServerThread`).

- :mod:`~workbench.server.model_server`: the engine, the data and control planes and the frontends wired together,
  and a server's life (start, drain, stop);
- :mod:`~workbench.server.ports`: binding the REST socket, uvicorn, gRPC, and closing them;
- :mod:`~workbench.server.watchers`: the model config file and the parent process;
- :mod:`~workbench.server.announce`: the ready file and the Jupyter record;
- :mod:`~workbench.server.running`: ``workbench serve``'s main loop and signals, and the background-thread server.
"""

from __future__ import annotations

from workbench.server.announce import write_ready_file
from workbench.server.cache_counts import CacheCounts
from workbench.server.model_server import ModelServer
from workbench.server.running import ServerThread, run

__all__ = ["CacheCounts", "ModelServer", "ServerThread", "run", "write_ready_file"]
