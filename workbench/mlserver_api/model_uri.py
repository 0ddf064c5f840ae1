"""``mlserver.utils``: where a model's artefact is (``get_model_uri``), and the request helpers runtimes import."""

from __future__ import annotations

import os
import urllib.parse
import uuid
from typing import Any

from workbench.mlserver_api.api_errors import InvalidModelURI
from workbench.mlserver_api.settings_models import ModelSettings


def to_absolute_path(model_settings: ModelSettings, uri: str) -> str:
    """``uri`` relative to the folder of the settings file (as written), or as it is when absolute or sourceless."""
    source = model_settings._source  # noqa: SLF001 - the settings' own record of where they were read
    if os.path.isabs(uri) or not source:
        return uri
    return os.path.join(os.path.dirname(source), uri)


async def get_model_uri(settings: ModelSettings, wellknown_filenames: list[str] | None = None) -> str:
    """The artefact's path: a file, else a folder's first well-known file, else the folder; a non-file URI (s3://)
    as written; none, or a path that does not exist, is :class:`InvalidModelURI`."""
    uri = settings.parameters.uri if settings.parameters is not None else None
    if not uri:
        raise InvalidModelURI(settings.name)
    parsed = urllib.parse.urlparse(uri, scheme="file")
    if parsed.scheme != "file":
        return uri
    path = to_absolute_path(settings, parsed.path)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for name in wellknown_filenames or ():
            candidate = os.path.join(path, name)
            if os.path.isfile(candidate):
                return candidate
        return path
    raise InvalidModelURI(settings.name, path)


def generate_uuid() -> str:
    return str(uuid.uuid4())


def get_wrapped_method(f: Any) -> Any:
    """The function under decorators (``functools.wraps``' ``__wrapped__`` chain)."""
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    return f
