"""``mlserver.settings``: a model's ``model-settings.json`` as runtimes read it (``self.settings``).

Only what a runtime reads is modelled; unknown keys of a settings file are ignored, as MLServer ignores them.
``implementation`` is the dotted path the file names; the loaded class is ``implementation_class`` once loaded.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from workbench.mlserver_api.dataplane_types import MetadataTensor


class ModelParameters(BaseModel):
    """``parameters`` of a model-settings.json: where the artefact is (``uri``, relative to the file), its version,
    its format, the request content type, and ``extra`` for the runtime's own; other keys are kept."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    uri: str | None = None
    version: str | None = None
    environment_path: str | None = None
    environment_tarball: str | None = None
    format: str | None = None
    content_type: str | None = None
    extra: dict[str, Any] | None = Field(default_factory=dict)


class ModelSettings(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), populate_by_name=True)

    name: str = ""
    platform: str = ""
    versions: list[str] = Field(default_factory=list)
    inputs: list[MetadataTensor] = Field(default_factory=list)
    outputs: list[MetadataTensor] = Field(default_factory=list)
    parallel_workers: int | None = None
    warm_workers: bool = False
    max_batch_size: int = 0
    max_batch_time: float = 0.0
    implementation_: str = Field(default="", alias="implementation")
    parameters: ModelParameters | None = None
    cache_enabled: bool = False
    # The settings file this came from: ``parameters.uri`` is relative to its folder.
    _source: str | None = PrivateAttr(default=None)
    _implementation: Any = PrivateAttr(default=None)

    @property
    def version(self) -> str | None:
        return self.parameters.version if self.parameters is not None else None

    @property
    def implementation(self) -> Any:
        """The runtime's class once loaded, else its dotted path."""
        return self._implementation if self._implementation is not None else self.implementation_


class Settings(BaseModel):
    """The server's ``settings.json``: read by the server, not by runtimes; here for the imports that name it."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    debug: bool = False
    parallel_workers: int = 1
    http_port: int = 8080
    grpc_port: int = 8081
