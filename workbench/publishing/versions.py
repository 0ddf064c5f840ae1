"""Numbered versions in a local model folder: valid names and numbers, which numbers are taken, and publishing a
checked export under the next one with a single rename."""

from __future__ import annotations

import os
import re
from pathlib import Path

from workbench.publishing.export_errors import ExportError

__all__ = ["check_name", "check_version", "publish", "refuse_existing"]

# A safe folder name on every OS, and never hidden (the server skips dot-folders).
_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ExportError(f"Invalid model name {name!r}: use letters, digits, '_', '-' and '.', not starting with '.'")


def check_version(version: int) -> None:
    # bool is an int subclass; True as a version number is surely a mistake.
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ExportError(f"Invalid version {version!r}: it must be a non-negative integer")


def _existing_versions(base: Path) -> set[int]:
    """Version numbers of the numbered folders in ``base``, parsed the way the server parses them."""
    from workbench.models.source import parse_version

    if not base.is_dir():
        return set()
    found = set()
    for entry in os.scandir(base):
        number = parse_version(entry.name)
        if number is not None and entry.is_dir():
            found.add(number)
    return found


def refuse_existing(name: str, base: Path, version: int) -> None:
    if version in _existing_versions(base):
        raise ExportError(f"Version {version} of model {name!r} already exists in {base}")


def publish(name: str, base: Path, staging: Path, version: int | None) -> int:
    """Rename the checked export to its number; the number is chosen last, so concurrent exports do not clash."""
    for _attempt in range(10):
        number = version if version is not None else max(_existing_versions(base), default=0) + 1
        refuse_existing(name, base, number)
        target = base / str(number)
        try:
            # One rename(2): a polling server sees no version, then the complete one.
            os.rename(staging, target)
            return number
        except OSError as exc:
            if version is None and target.exists():
                continue  # another export took this number between the scan and the rename
            raise ExportError(f"Could not move the export into place at {target}: {exc}") from exc
    raise ExportError(f"Could not find a free version number in {base}")
