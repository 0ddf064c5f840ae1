"""workbench's own management API (``/workbench/v1/...``): models, labels, canaries, loads and stats, over REST."""

from __future__ import annotations

from typing import Any

from workbench.client.http import HttpConnection


class ManagementAPI:
    """The calls behind the :class:`~workbench.client.Client`'s management methods (documented there)."""

    def __init__(self, http: HttpConnection) -> None:
        self._http = http

    def models(self) -> list[dict[str, Any]]:
        return self._http.json("GET", "/workbench/v1/models")["models"]

    def model(self, name: str) -> dict[str, Any]:
        return self._http.json("GET", f"/workbench/v1/models/{name}")

    def promote(self, model: str, version: int, condition: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"version": int(version)}
        if condition is not None:
            body["if"] = condition
        return self._http.json("POST", f"/workbench/v1/models/{model}:promote", body)

    def rollback(self, model: str) -> dict[str, Any]:
        return self._http.json("POST", f"/workbench/v1/models/{model}:rollback", {})

    def canary(self, model: str, version: int, weight: float) -> dict[str, Any]:
        body = {"version": int(version), "weight": weight}
        return self._http.json("POST", f"/workbench/v1/models/{model}:canary", body)

    def shadow(self, model: str, version: int, fraction: float) -> dict[str, Any]:
        body = {"version": int(version), "fraction": fraction}
        return self._http.json("POST", f"/workbench/v1/models/{model}:shadow", body)

    def set_batching(self, model: str, text: str | None) -> dict[str, Any]:
        body = {"batching_parameters": text}
        return self._http.json("POST", f"/workbench/v1/models/{model}:batching", body)

    def load(self, model: str, version: int) -> dict[str, Any]:
        return self._http.json("POST", f"/workbench/v1/models/{model}/versions/{int(version)}:load", {})

    def unload(self, model: str, version: int) -> dict[str, Any]:
        return self._http.json("POST", f"/workbench/v1/models/{model}/versions/{int(version)}:unload", {})

    def stats(self) -> dict[str, Any]:
        return self._http.json("GET", "/workbench/v1/stats")

    def health(self) -> dict[str, Any]:
        return self._http.json("GET", "/workbench/v1/health")
