"""``mlserver.errors``: the errors a runtime raises, each with the HTTP status it answers (400 unless it says)."""

from __future__ import annotations

BAD_REQUEST = 400
NOT_FOUND = 404
UNPROCESSABLE = 422


class MLServerError(Exception):
    def __init__(self, msg: str, status_code: int = BAD_REQUEST) -> None:
        super().__init__(msg)
        self.status_code = status_code


class InvalidModelURI(MLServerError):
    def __init__(self, name: str, model_uri: str | None = None) -> None:
        where = f" ({model_uri})" if model_uri else ""
        super().__init__(f"Model {name} has no usable parameters.uri{where}", UNPROCESSABLE)


class ModelNotFound(MLServerError):
    def __init__(self, name: str, version: str | None = None) -> None:
        which = f"Model {name}" + (f" version {version}" if version is not None else "")
        super().__init__(f"{which} is not served here", NOT_FOUND)


class ModelNotReady(MLServerError):
    def __init__(self, name: str, version: str | None = None) -> None:
        which = f"Model {name}" + (f" version {version}" if version is not None else "")
        super().__init__(f"{which} is not ready")


class InferenceError(MLServerError):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)


class ModelParametersMissing(MLServerError):
    def __init__(self, model_name: str) -> None:
        super().__init__(f"Model {model_name} has no parameters in its model-settings.json")
