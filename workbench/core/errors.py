"""The one error type of the engine: a canonical gRPC code plus a message.

Every layer raises :class:`ServingError`; only the frontends turn it into an HTTP status or a gRPC status,
using the table below (the one in TF Serving's REST handler), so a rule about errors lives in one place.
"""

from __future__ import annotations

import enum


class Code(enum.IntEnum):
    """Canonical status codes (google.rpc.Code), numbered as gRPC numbers them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


def http_status(code: Code) -> int:
    """The HTTP status TF Serving's REST API answers for ``code``."""
    return _HTTP_STATUS[code]


class ServingError(Exception):
    """An error with a canonical code; the message is what clients see."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ServingError({self.code.name}, {self.message!r})"

    @property
    def http_status(self) -> int:
        return http_status(self.code)


def invalid_argument(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def from_exception(exc: BaseException) -> ServingError:
    """Map anything raised while serving to a ServingError, keeping TensorFlow's own codes.

    TensorFlow's ``OpError`` subclasses carry the same canonical codes (a shape mismatch is INVALID_ARGUMENT,
    a corrupt checkpoint DATA_LOSS); whatever else escapes is an INTERNAL error with its message, never a crash.
    """
    if isinstance(exc, ServingError):
        return exc
    error_code = getattr(exc, "error_code", None)
    message = getattr(exc, "message", None)
    if isinstance(error_code, int) and isinstance(message, str):
        try:
            return ServingError(Code(error_code), message)
        except ValueError:
            pass
    return ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
