"""What a failed export raises, and how its cause is told in one line."""

from __future__ import annotations

__all__ = ["ExportError", "one_line"]


class ExportError(Exception):
    """An export failed; the message says why in one line and the cause is chained."""


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (TensorFlow's run with node dumps over many lines), bounded."""
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) else str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 400 else first[:397] + "..."
