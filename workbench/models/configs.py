"""The model configs a server reads, checked against the platforms it has.

:mod:`workbench.config.options` parses TF Serving's ``ModelServerConfig`` on the config floor, below the platforms, so
it cannot know which ``model_platform`` names exist; these are its readers with the platforms' names bound, for every
place that reads a config to serve it (start-up, the config file poll, gRPC's ``HandleReloadConfigRequest``), and
the repository's discovery with the models platforms pack in files of their own (TorchServe's ``.mar`` archives).
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.config import options
from workbench.config.options import ModelConfig, ServerOptions
from workbench.platforms import names as platform_names
from workbench.platforms import packaged_models


def parse_model_config_file(path: str | os.PathLike[str]) -> list[ModelConfig]:
    """A ``--model_config_file``'s models; an unknown ``model_platform`` is UNIMPLEMENTED."""
    return options.parse_model_config_file(path, platform_names)


def model_configs_from_proto(config_list: object, base_dir: Path | None = None) -> list[ModelConfig]:
    """A ``ModelConfigList`` proto's models (gRPC's reload); an unknown ``model_platform`` is UNIMPLEMENTED."""
    return options.model_configs_from_proto(config_list, base_dir, platform_names)


def initial_models(server_options: ServerOptions) -> list[ModelConfig]:
    """The models to serve at start-up: the config file's, the repository's, or the one-model shorthand."""
    return server_options.initial_models(platform_names, packaged_models)


def discover_models(root: str | os.PathLike[str]) -> list[ModelConfig]:
    """A model repository's models: its model folders, and the models packed in platforms' own files in it."""
    return options.discover_models(root, packaged_models)
