"""Model archives fetched from an http(s) URL into the model store, for TorchServe's ``POST /models?url=https://…``.

What an archive is (its suffix, how it is read) is the platform's (:mod:`workbench.platforms.torchserve_download`);
this module fetches files and holds URLs to the allowed patterns.

TorchServe downloads the URL's file into its model store under the URL path's last segment, refusing one that is
there already, and registers it. workbench does the same with a size limit: the body is streamed into a hidden
temporary file of the store (``.<name>.<random>.part``, which the store's scan skips), and renamed into place only
when it is whole, within the limit and a readable archive (its manifest), so the store never shows a half-written
or foreign file. Other schemes (``s3://``, ``file://``) are refused: the archive belongs in the store, where
workbench serves it already.

Which URLs may be fetched is TorchServe's ``allowed_urls`` (``--torchserve_allowed_urls``): comma-separated regular
expressions, one of which must match the whole URL, case aside, or the registration is refused as TorchServe refuses
it (404, "Given URL … does not match any allowed URL(s)"). TorchServe's default allows every file and http(s) URL.
Redirects are followed one at a time, at most :data:`MAX_REDIRECTS`, and every URL they lead to must be allowed too:
an allowed host cannot hand the download on to one that is not.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import requests

CHUNK_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # between two chunks of the body, not for the whole download
MAX_REDIRECTS = 5
DEFAULT_ALLOWED_URLS = r"file://.*|http(s)?://.*"  # TorchServe's default allowed_urls: every file and web URL
_FILE_OR_WEB = re.compile(r"(file|https?)://.*", re.IGNORECASE)  # the URLs TorchServe holds to allowed_urls


class DownloadError(Exception):
    """An archive that cannot be fetched; ``status`` is the HTTP status TorchServe answers it with."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def allowed_urls(text: str = "") -> tuple[re.Pattern[str], ...]:
    """``--torchserve_allowed_urls``: TorchServe's ``allowed_urls``, comma-separated regular expressions ("":
    its default); ValueError names one that does not compile."""
    patterns = []
    for item in (text or DEFAULT_ALLOWED_URLS).split(","):
        if not item.strip():
            continue
        try:
            patterns.append(re.compile(item.strip(), re.IGNORECASE))
        except re.error as exc:
            raise ValueError(
                f"--torchserve_allowed_urls: {item.strip()!r} is not a regular expression ({exc})"
            ) from None
    if not patterns:
        raise ValueError("--torchserve_allowed_urls names no pattern")
    return tuple(patterns)


def check_allowed(url: str, patterns: Sequence[re.Pattern[str]]) -> None:
    """Refuse a file or web ``url`` unless one of ``patterns`` matches all of it, with TorchServe's status and
    words; a URL of another scheme (``s3://``) is left for the registration to refuse as one it cannot fetch."""
    if _FILE_OR_WEB.fullmatch(url) and not any(pattern.fullmatch(url) for pattern in patterns):
        raise DownloadError(404, "ModelNotFoundException", f"Given URL {url} does not match any allowed URL(s)")


def is_download_url(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")


def archive_name(url: str, suffix: str) -> str:
    """The file name an archive URL is stored under: its path's last segment (TorchServe's getFilenameFromUrl), which
    must end in the archives' ``suffix``."""
    name = posixpath.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    if not name or name.startswith(".") or "/" in name or "\\" in name or not name.endswith(suffix):
        raise DownloadError(
            400, "BadRequestException", f"The URL's path must end in the archive's file name (x{suffix}): {url}"
        )
    return name


def download_archive(
    url: str,
    store: str | os.PathLike[str],
    max_bytes: int,
    allowed: Sequence[re.Pattern[str]] = (),
    *,
    suffix: str,
    check: Callable[[Path], object],
) -> str:
    """Fetch ``url`` into the model store ``store``; returns the archive's file name there. ``allowed``: the
    patterns every URL on the way must match (none given: TorchServe's default). The archive's file name ends in
    ``suffix``, and ``check`` reads the downloaded file, raising ValueError where it is not such an archive."""
    # Imported here, on the rare registration by URL: a serving process must not load requests and urllib3 (their
    # warning filters cost every scikit-learn ensemble call; see tests/system/test_layering.py).
    import requests

    if ".." in url:
        raise DownloadError(404, "ModelNotFoundException", f"Relative path is not allowed in url: {url}")
    patterns = allowed or allowed_urls()
    check_allowed(url, patterns)
    name = archive_name(url, suffix)
    target = Path(store) / name
    if target.exists():
        raise DownloadError(409, "ConflictStatusException", f"Model file already exists {name}")
    partial = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with requests.Session() as session, _fetch(session, url, patterns) as response:
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
            check(partial)
        except ValueError as exc:
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


def _fetch(session: requests.Session, url: str, patterns: Sequence[re.Pattern[str]]) -> requests.Response:
    """The response at the end of ``url``'s redirects, each of which was allowed before it was followed."""
    for _ in range(MAX_REDIRECTS + 1):
        response = session.get(url, stream=True, allow_redirects=False, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        if not response.is_redirect:
            return response
        response.close()
        url = urllib.parse.urljoin(url, response.headers["location"])
        check_allowed(url, patterns)
    raise DownloadError(400, "DownloadArchiveException", f"Failed to download archive from: {url} (too many redirects)")


def _too_large(url: str, max_bytes: int) -> DownloadError:
    return DownloadError(
        413, "DownloadArchiveException", f"Failed to download archive from: {url} (larger than {max_bytes} bytes)"
    )
