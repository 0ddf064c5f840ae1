"""TorchServe's registration by URL (``POST /models?url=https://…/m.mar``): a ``.mar`` fetched into the model store.

The fetching (size limit, redirects held to ``allowed_urls``, the atomic rename) is
:mod:`workbench.runtime.archive_download`'s; what makes the file an archive is this platform's: its suffix, and a
manifest :func:`~workbench.platforms.torchserve_archives.archive_manifest` can read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from workbench.platforms.torchserve_archives import ARCHIVE_SUFFIX, archive_manifest
from workbench.runtime.archive_download import download_archive as download_file


def download_archive(
    url: str, store: str | os.PathLike[str], max_bytes: int, allowed: Sequence[re.Pattern[str]] = ()
) -> str:
    """Fetch the archive at ``url`` into the model store ``store``; returns its file name there. ``allowed``: the
    patterns every URL on the way must match (none given: TorchServe's default)."""
    return download_file(url, store, max_bytes, allowed, suffix=ARCHIVE_SUFFIX, check=archive_manifest)
