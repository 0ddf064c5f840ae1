"""``workbench routing``: a running server's version routing from the command line: promote (with ``--if``, only
when the version's shadow record earns it), roll back, canary, shadow, and the shadow's record; the management
API's calls (``/workbench/v1/models/...``) through :class:`~workbench.client.Client`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

ROUTING_EXAMPLES = """\
examples:
  workbench routing --target=localhost:8501 shadow digits 2 --fraction=0.5
  workbench routing --target=localhost:8501 record digits
  workbench routing --target=localhost:8501 promote digits 2 --if="agreement >= 0.99 and p99_ms <= 20"
  workbench routing --target=localhost:8501 canary digits 2 0.1
  workbench routing --target=localhost:8501 rollback digits
"""


def add_routing_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "routing",
        help="a running server's versions: promote (--if), rollback, canary, shadow, the shadow's record",
        description="Change which version of a model answers, on a running server (its management API; a server "
        "with a management token needs --token). Every change answers the model's new description as JSON.",
        epilog=ROUTING_EXAMPLES,
    )
    p.add_argument(
        "--target", required=True, metavar="ADDRESS", help="the server's REST address (--target=host:port, or a URL)"
    )
    p.add_argument("--token", default="", metavar="TOKEN", help="its management token, if it has one")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(p))
    promote = actions.add_parser("promote", help="make VERSION the stable version")
    promote.add_argument("model", metavar="MODEL")
    promote.add_argument("version", type=int, metavar="VERSION")
    promote.add_argument("--if", dest="condition", metavar="CONDITION", help="only if VERSION's shadow record meets it")
    rollback = actions.add_parser("rollback", help="back to the stable version before the last promotion")
    rollback.add_argument("model", metavar="MODEL")
    canary = actions.add_parser("canary", help="send a share of default traffic to VERSION (0 ends it)")
    canary.add_argument("model", metavar="MODEL")
    canary.add_argument("version", type=int, metavar="VERSION")
    canary.add_argument("weight", type=float, metavar="WEIGHT")
    shadow = actions.add_parser("shadow", help="copy a share of default traffic to VERSION, compared (0 ends it)")
    shadow.add_argument("model", metavar="MODEL")
    shadow.add_argument("version", type=int, metavar="VERSION")
    shadow.add_argument("--fraction", type=float, default=1.0, metavar="F", help="share copied (default 1)")
    record = actions.add_parser("record", help="the shadow's comparison with the answering version, as JSON")
    record.add_argument("model", metavar="MODEL")
    p.commands = tuple(actions.choices)  # dispatches like the top level: each action's parser reads its flags
    p.set_defaults(command=_routing)


def _routing(args: argparse.Namespace) -> int:
    from workbench.client import Client
    from workbench.core.errors import ServingError

    url = args.target if "://" in args.target else f"http://{args.target}"
    try:
        with Client(url, token=args.token or None) as client:
            answer: dict[str, Any] | None
            if args.action == "promote":
                answer = client.promote(args.model, args.version, args.condition)
            elif args.action == "rollback":
                answer = client.rollback(args.model)
            elif args.action == "canary":
                answer = client.canary(args.model, args.version, args.weight)
            elif args.action == "shadow":
                answer = client.shadow(args.model, args.version, args.fraction)
            else:
                answer = client.shadow_record(args.model)
                if answer is None:
                    print(f"workbench routing: model {args.model} has no shadow", file=sys.stderr)
                    return 1
    except ServingError as exc:  # refused: the server's words (a promotion not earned says its figures)
        print(f"workbench routing: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a command line tool: say what went wrong, no traceback
        print(f"workbench routing: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=1))
    return 0
