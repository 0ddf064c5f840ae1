"""``workbench ray deploy | status | shutdown``: the command-line face of :func:`workbench.ray.deploy`.

With ``--address`` (or ``RAY_ADDRESS``) the application is deployed onto that cluster and lives there after the
command returns, as ``serve deploy`` leaves it; ``status`` and ``shutdown`` find it there by name. Without a
cluster, ``deploy`` starts a local Ray and serves in the foreground until SIGINT or SIGTERM, then shuts the
application and that Ray down: the Ray sibling of ``workbench serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

import ray
from ray import serve

from workbench.config.serve_options import FlagError
from workbench.ray.deployment import RayDeployment, application_status, delete_application, deploy


def _connect(address: str) -> None:
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)


def _autoscaling(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.max_replicas is None:
        return None
    config: dict[str, Any] = {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas}
    if args.target_ongoing_requests is not None:
        config["target_ongoing_requests"] = args.target_ongoing_requests
    return config


def _actor_options(args: argparse.Namespace) -> dict[str, Any] | None:
    options = {key: value for key, value in (("num_cpus", args.num_cpus), ("num_gpus", args.num_gpus)) if value}
    return options or None


def deploy_command(args: argparse.Namespace) -> int:
    address = args.address or os.environ.get("RAY_ADDRESS", "")
    if args.num_replicas is not None and args.max_replicas is not None:
        print("workbench ray deploy: give --num_replicas or --max_replicas, not both", file=sys.stderr)
        return 2
    try:
        deployment = deploy(
            args.model_repository or None,
            name=args.name,
            num_replicas=args.num_replicas,
            autoscaling_config=_autoscaling(args),
            http_host=args.http_host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            ray_actor_options=_actor_options(args),
            serve_flags=args.serve_flags,
            route_prefix=args.route_prefix,
            address=address or None,
        )
    except FlagError as exc:
        print(f"workbench ray deploy: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench ray deploy: {exc}", file=sys.stderr)
        return 1
    _announce(deployment, args.ready_file)
    if address:  # the application lives in the cluster now
        return 0
    return _serve_until_signalled(deployment)


def _announce(deployment: RayDeployment, ready_file: str) -> None:
    print(
        f"Deployed {deployment.name!r} on Ray Serve in {deployment.started_seconds:.1f}s: "
        f"REST {deployment.rest_url}, gRPC {deployment.grpc_target}",
        flush=True,
    )
    if ready_file:
        from workbench.server import write_ready_file

        write_ready_file(
            ready_file,
            {
                "name": deployment.name,
                "rest_url": deployment.rest_url,
                "grpc_target": deployment.grpc_target,
                "rest_port": deployment.http_port,
                "grpc_port": deployment.grpc_port,
                "pid": os.getpid(),
            },
        )


def _serve_until_signalled(deployment: RayDeployment) -> int:
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    stop.wait()
    print(f"{received[0]}: shutting down {deployment.name!r} and the local Ray", flush=True)
    deployment.shutdown()
    return 0


def status_command(args: argparse.Namespace) -> int:
    _connect(args.address)
    status = application_status(args.name)
    print(json.dumps({"name": args.name, **status}))
    return 0 if status["status"] != "NOT_DEPLOYED" else 1


def shutdown_command(args: argparse.Namespace) -> int:
    _connect(args.address)
    if args.name not in serve.status().applications:
        print(f"workbench ray shutdown: no application {args.name!r}", file=sys.stderr)
        return 1
    delete_application(args.name)
    print(f"Deleted {args.name!r}")
    return 0
