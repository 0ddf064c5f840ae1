"""Text-format config protos (model config, monitoring, batching, request logging), parsed with one error shape."""

from __future__ import annotations

import os
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from workbench.core.errors import Code, ServingError

M = TypeVar("M", bound=Message)


def parse_text_config(text: str, message: M, where: str | os.PathLike[str]) -> M:
    """``text`` parsed into ``message``; a syntax error is INVALID_ARGUMENT naming the proto and ``where``."""
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        kind = message.DESCRIPTOR.full_name
        raise ServingError(Code.INVALID_ARGUMENT, f"Error parsing text-format {kind}: {where}: {exc}") from None
    return message
