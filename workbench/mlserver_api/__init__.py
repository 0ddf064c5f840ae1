"""MLServer's runtime API (``MLModel``, ``mlserver.types``, ``mlserver.codecs``...), workbench's own.

Custom runtimes written for Seldon's MLServer (``class MyModel(MLModel)`` in a ``models.py`` beside a
``model-settings.json``) run unchanged on workbench (:mod:`workbench.platforms.mlserver_runtime`). Their imports
(``from mlserver import MLModel``, ``from mlserver.codecs import decode_args``) resolve to:

- the real ``mlserver`` package where it is installed: a runtime may use parts of it this layer leaves out, and
  its users pinned it knowingly;
- else this package, mapped to the ``mlserver`` names by :mod:`.mlserver_imports` while a runtime is loaded. MLServer
  is unmaintained and pins old dependencies (FastAPI, uvicorn, protobuf, its own gRPC stubs), which would hold back
  the server's own; what runtimes touch is small (the v2 messages as pydantic v2 models, the codecs, the settings,
  ``MLModel``), documented, and written here from that documentation: the same names, fields and behaviour, so
  ``mlserver.types.InferenceRequest`` is a pydantic model with the same fields and ``StringCodec`` decodes as
  MLServer's does.

What is left out is the server (``MLServer``, its REST and gRPC apps, parallel workers, adaptive batching): those are
workbench's. Module names map as MLServer's do: ``mlserver.types`` is :mod:`.dataplane_types`, ``mlserver.settings``
:mod:`.settings_models`, ``mlserver.utils`` :mod:`.model_uri`, ``mlserver.errors`` :mod:`.api_errors`,
``mlserver.model`` :mod:`.mlmodel`, ``mlserver.codecs[.base|.utils|.numpy|.string|.base64|.datetime|.pandas|.decorator|
.errors]`` :mod:`.codecs` and its modules.
"""

from __future__ import annotations

import logging

from workbench.mlserver_api import codecs, dataplane_types
from workbench.mlserver_api.mlmodel import MLModel
from workbench.mlserver_api.settings_models import ModelSettings, Settings

types = dataplane_types  # ``from mlserver import types``, as MLServer's examples write it
logger = logging.getLogger("mlserver")  # ``mlserver.logging.logger``
__version__ = "1.7.1"  # the MLServer release whose documented API this follows

__all__ = ["MLModel", "ModelSettings", "Settings", "codecs", "logger", "types"]
