"""What a failed export raises, and how its cause is told in one line."""

from __future__ import annotations

from workbench.platforms.export_request import one_line  # platforms' writers word their errors alike

__all__ = ["ExportError", "one_line"]


class ExportError(Exception):
    """An export failed; the message says why in one line and the cause is chained."""
