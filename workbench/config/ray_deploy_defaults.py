"""``workbench ray deploy``'s defaults, declared once.

The command line's flags (:mod:`workbench.cli.ray_command`) and :func:`workbench.ray.deploy`'s keywords both read
them here, on the ground floor, so that parsing the command line does not import Ray.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RayDeployDefaults:
    name: str = "workbench"  # the Ray Serve application's name
    http_host: str = "127.0.0.1"  # where Ray's HTTP proxies bind
    http_port: int = 8501  # Ray's HTTP proxy (REST): TF Serving's REST port
    grpc_port: int = 8500  # Ray's gRPC proxy: TF Serving's gRPC port
    route_prefix: str = "/"  # where the REST API is mounted


RAY_DEPLOY_DEFAULTS = RayDeployDefaults()
