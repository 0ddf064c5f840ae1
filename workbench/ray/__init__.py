"""Workbench on Ray Serve: the same TF Serving REST and gRPC APIs (and v2) from a Ray cluster.

``workbench.ray.deploy(repository, num_replicas=2)`` runs a workbench engine in each Ray Serve replica; Ray's HTTP
and gRPC proxies carry the requests, so ``tensorflow-serving-api`` and Triton's clients work unchanged. Needs the
``ray`` extra: ``pip install 'workbench-serving[ray]'``.
"""

from __future__ import annotations

try:
    import ray.serve  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is in the test install
    raise ImportError("workbench.ray needs Ray Serve: pip install 'workbench-serving[ray]'") from exc

from workbench.ray.deployment import RayDeployment, deploy

__all__ = ["RayDeployment", "deploy"]
