"""``workbench manifests MODEL``: KServe or Kubernetes manifests that serve a model with workbench.

The options it shares with ``%serve manifests`` are declared once in
:data:`workbench.deploy.manifests.MANIFESTS_ARGUMENTS`.
"""

from __future__ import annotations

import argparse
import sys

from workbench.deploy.manifests import MANIFESTS_ARGUMENTS

MANIFESTS_EXAMPLES = """\
examples:
  workbench manifests digits --kserve --storage_uri=s3://models/digits --out=deploy-digits
  workbench manifests wine --kserve --model_format=mlflow --storage_uri=s3://mlflow/1/RUN/artifacts/model
  workbench manifests digits --kubernetes --storage_uri=s3://models/digits --server=http://localhost:8501
"""


def add_manifests_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "manifests",
        help="KServe or Kubernetes manifests that serve a model with workbench",
        description="Render the manifests that deploy MODEL with workbench: an InferenceService on the workbench "
        "ClusterServingRuntime (--kserve), or a Deployment, Service, HorizontalPodAutoscaler and model config "
        "(--kubernetes). With --server, the model's routing (stable version, canary) is read from a running "
        "workbench and described in them; the replicas themselves read it from routing.json beside the versions.",
        epilog=MANIFESTS_EXAMPLES,
    )
    p.add_argument("model", metavar="MODEL", help="the model's name")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--kserve", dest="target", action="store_const", const="kserve", help="an InferenceService and the runtime"
    )
    target.add_argument(
        "--kubernetes", dest="target", action="store_const", const="kubernetes", help="a Deployment, Service, HPA…"
    )
    p.add_argument(
        "--storage_uri",
        metavar="URI",
        help="the model's base path for the cluster: s3://…, gs://…, pvc://CLAIM/PATH "
        "(default: the server's base path with --server, else pvc://workbench-models/MODEL)",
    )
    MANIFESTS_ARGUMENTS["replicas"].add_to(p)
    MANIFESTS_ARGUMENTS["image"].add_to(p)
    MANIFESTS_ARGUMENTS["model_format"].add_to(p)
    p.add_argument("--server", metavar="URL", help="a running workbench's REST address, to read MODEL's routing")
    p.add_argument("--out", metavar="DIR", help="write the files into DIR (default: print them)")
    p.set_defaults(command=_manifests)


def _manifests(args: argparse.Namespace) -> int:
    from workbench.deploy.manifests import DEFAULT_IMAGE, render_manifests

    routing = None
    storage_uri = args.storage_uri
    try:
        if args.server:
            from workbench.client import Client

            with Client(args.server) as client:
                routing = client.model(args.model)
            storage_uri = storage_uri or routing["base_path"]
        manifests = render_manifests(
            args.model,
            target=args.target,
            storage_uri=storage_uri,
            replicas=args.replicas,
            image=args.image or DEFAULT_IMAGE,
            routing=routing,
            model_format=args.model_format,
        )
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench manifests: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    if args.out is None:
        print(repr(manifests), end="")
        return 0
    for path in manifests.write(args.out):
        print(f"wrote {path}")
    return 0
