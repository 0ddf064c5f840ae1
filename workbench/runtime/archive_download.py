"""Model archives fetched from an http(s) URL into the model store, for TorchServe's ``POST /models?url=https://…``.

TorchServe downloads the URL's file into its model store under the URL path's last segment, refusing one that is
there already, and registers it. workbench does the same with a size limit: the body is streamed into a hidden
temporary file of the store (``.<name>.<random>.part``, which the store's scan skips), and renamed into place only
when it is whole, within the limit and a readable archive (its manifest), so the store never shows a half-written
or foreign file. Other schemes (``s3://``, ``file://``) are refused: the archive belongs in the store, where
workbench serves it already.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import urllib.parse
import uuid
from pathlib import Path

from workbench.runtime.model_archives import ARCHIVE_SUFFIX, ArchiveError, archive_manifest

CHUNK_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # between two chunks of the body, not for the whole download


class DownloadError(Exception):
    """An archive that cannot be fetched; ``status`` is the HTTP status TorchServe answers it with."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def is_download_url(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")


def archive_name(url: str) -> str:
    """The file name an archive URL is stored under: its path's last segment (TorchServe's getFilenameFromUrl)."""
    name = posixpath.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    if not name or name.startswith(".") or "/" in name or "\\" in name or not name.endswith(ARCHIVE_SUFFIX):
        raise DownloadError(
            400, "BadRequestException", f"The URL's path must end in the archive's file name (x{ARCHIVE_SUFFIX}): {url}"
        )
    return name


def download_archive(url: str, store: str | os.PathLike[str], max_bytes: int) -> str:
    """Fetch ``url`` into the model store ``store``; returns the archive's file name there."""
    # Imported here, on the rare registration by URL: a serving process must not load requests and urllib3 (their
    # warning filters cost every scikit-learn ensemble call; see tests/system/test_layering.py).
    import requests

    if ".." in url:
        raise DownloadError(404, "ModelNotFoundException", f"Relative path is not allowed in url: {url}")
    name = archive_name(url)
    target = Path(store) / name
    if target.exists():
        raise DownloadError(409, "ConflictStatusException", f"Model file already exists {name}")
    partial = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with requests.get(url, stream=True, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)) as response:
            if response.status_code != 200:
                raise DownloadError(
                    400,
                    "DownloadArchiveException",
                    f"Failed to download archive from: {url} (HTTP {response.status_code})",
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise _too_large(url, max_bytes)
            size = 0
            with open(partial, "xb") as out:
                for chunk in response.iter_content(CHUNK_BYTES):
                    size += len(chunk)
                    if size > max_bytes:
                        raise _too_large(url, max_bytes)
                    out.write(chunk)
        try:  # a page that is no archive (an error page, a login form) never enters the store
            archive_manifest(partial)
        except ArchiveError as exc:
            raise DownloadError(400, "InvalidModelException", f"{url} is not a model archive: {exc}") from None
        if target.exists():  # another registration of the same name finished first
            raise DownloadError(409, "ConflictStatusException", f"Model file already exists {name}")
        os.replace(partial, target)
    except requests.RequestException as exc:
        raise DownloadError(
            400, "DownloadArchiveException", f"Failed to download archive from: {url} ({type(exc).__name__})"
        ) from None
    except OSError as exc:  # the store cannot take the file: the server's problem, not the request's
        raise DownloadError(
            500, "InternalServerException", f"Failed to save model: {url} ({exc.strerror or exc})"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return name


def _too_large(url: str, max_bytes: int) -> DownloadError:
    return DownloadError(
        413, "DownloadArchiveException", f"Failed to download archive from: {url} (larger than {max_bytes} bytes)"
    )
