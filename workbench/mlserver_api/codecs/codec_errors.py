"""``mlserver.codecs.errors``: a codec's failures, each a 400 (what was sent cannot be what the model takes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workbench.mlserver_api.api_errors import MLServerError


class CodecNotFound(MLServerError):
    def __init__(
        self, name: str | None = None, payload_type: str | None = None, is_input: bool = False, is_request: bool = False
    ) -> None:
        side = "input" if is_input else "output"
        level = ("request" if is_input else "response") if is_request else "field"
        what = " ".join(
            part for part in (f"'{name}'" if name else "", f"of type {payload_type}" if payload_type else "")
        )
        super().__init__(f"No codec for the {side} {level} {what}".rstrip())


class CodecError(MLServerError):
    def __init__(self, msg: str) -> None:
        super().__init__(f"The payload could not be encoded or decoded: {msg}")


class OutputNotFound(MLServerError):
    def __init__(self, output_idx: int, output_type: type, output_hints: Sequence[Any]) -> None:
        hints = ", ".join(f"'{hint}'" for hint in output_hints) or "none"
        super().__init__(f"Output {output_idx} is a {output_type}, which no return type declares (declared: {hints})")


class InputsNotFound(MLServerError):
    def __init__(self, inputs: Sequence[Any], input_hints: Mapping[str, Any]) -> None:
        sent = ", ".join(f"'{getattr(i, 'name', i)}'" for i in inputs)
        known = ", ".join(f"'{name}'" for name in input_hints)
        super().__init__(f"Unknown input {sent}; the model takes {known}")
