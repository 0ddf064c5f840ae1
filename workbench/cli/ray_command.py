"""``workbench ray deploy | status | shutdown``: the command line of :mod:`workbench.ray` (imported when run)."""

from __future__ import annotations

import argparse
import sys

from workbench.cli.logs import configure_logging
from workbench.config.ray_deploy_defaults import RAY_DEPLOY_DEFAULTS as DEFAULTS
from workbench.config.vocabulary import VocabularyParser

RAY_EXAMPLES = """\
examples:
  workbench ray deploy --model_repository=/shared/models --num_replicas=2
  workbench ray deploy --model_repository=s3://models --address=auto --max_replicas=4 -- --enable_batching
  workbench ray status --address=auto
  workbench ray shutdown --address=auto
"""


def add_ray_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "ray",
        help="serve a model repository on a Ray cluster (Ray Serve replicas behind Ray's HTTP and gRPC proxies)",
        description="Deploy workbench on Ray Serve: each replica runs the engine on a shared repository, Ray's "
        "proxies serve TF Serving's REST and gRPC APIs and v2 on every node. Needs `pip install "
        "'workbench-serving[ray]'`.",
        epilog=RAY_EXAMPLES,
    )
    actions = p.add_subparsers(title="actions", metavar="ACTION", required=True, parser_class=VocabularyParser)
    common = VocabularyParser(add_help=False)
    common.add_argument("--name", default=DEFAULTS.name, metavar="NAME", help="the Ray Serve application's name")
    common.add_argument(
        "--address",
        default="",
        metavar="ADDRESS",
        help="the Ray cluster (default: $RAY_ADDRESS; deploy without "
        "either starts a local Ray and serves until SIGINT or SIGTERM)",
    )
    deploy = actions.add_parser(
        "deploy",
        parents=[common],
        help="deploy (or redeploy) the application",
        description="Deploy a repository on Ray Serve; flags after -- go to every replica's `workbench serve`.",
    )
    deploy.add_argument(
        "--model_repository",
        default="",
        metavar="DIR",
        help="every model folder under DIR (a path every node sees, or an s3:// / gs:// URL)",
    )
    deploy.add_argument("--num_replicas", type=int, metavar="N", help="a fixed number of replicas (default 1)")
    deploy.add_argument("--min_replicas", type=int, default=1, metavar="N", help="autoscaling's lower bound")
    deploy.add_argument("--max_replicas", type=int, metavar="N", help="autoscale up to N replicas")
    deploy.add_argument(
        "--target_ongoing_requests", type=float, metavar="N", help="autoscaling's target of requests per replica"
    )
    deploy.add_argument("--num_cpus", type=float, metavar="N", help="CPUs Ray reserves for each replica")
    deploy.add_argument("--num_gpus", type=float, metavar="N", help="GPUs Ray reserves for each replica")
    deploy.add_argument(
        "--http_host", default=DEFAULTS.http_host, metavar="ADDRESS", help="address Ray's HTTP proxies bind"
    )
    deploy.add_argument(
        "--http_port", type=int, default=DEFAULTS.http_port, metavar="PORT", help="Ray's HTTP proxy port (REST)"
    )
    deploy.add_argument(
        "--grpc_port", type=int, default=DEFAULTS.grpc_port, metavar="PORT", help="Ray's gRPC proxy port"
    )
    deploy.add_argument(
        "--route_prefix", default=DEFAULTS.route_prefix, metavar="PATH", help="where the REST API is mounted"
    )
    deploy.add_argument(
        "--ready_file", default="", metavar="FILE", help="once serving, write the addresses as JSON to FILE"
    )
    deploy.add_argument("serve_flags", nargs="*", metavar="-- SERVE_FLAG", help="`workbench serve` flags for replicas")
    deploy.set_defaults(command=_ray, action="deploy")
    status = actions.add_parser("status", parents=[common], help="the application's status and replicas, as JSON")
    status.set_defaults(command=_ray, action="status")
    shutdown = actions.add_parser("shutdown", parents=[common], help="delete the application (and Serve if last)")
    shutdown.set_defaults(command=_ray, action="shutdown")
    p.commands = tuple(actions.choices)  # dispatches like the top level: each action's parser reads its flags


def _ray(args: argparse.Namespace) -> int:
    try:
        from workbench.ray import command
    except ImportError as exc:
        print(f"workbench ray: {exc}", file=sys.stderr)
        return 2
    configure_logging()
    run = {"deploy": command.deploy_command, "status": command.status_command, "shutdown": command.shutdown_command}
    return run[args.action](args)
