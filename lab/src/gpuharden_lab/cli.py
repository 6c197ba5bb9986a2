# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden lab …`, registered through the `gpuharden.commands` entry point so the CLI never imports the lab."""

from __future__ import annotations

import argparse
import json
import sys

from gpuharden_lab import manager
from gpuharden_lab.scenario import available
from gpuharden_lab.system import LabError


def _up(args: argparse.Namespace) -> int:
    state = manager.up(args.scenario, args.nodes, with_cluster=not args.no_cluster, kwok_nodes=args.kwok_nodes,
                       harden=not args.no_harden, stand_ins=args.stand_ins)
    print(json.dumps(manager.status() | {"timings": state["timings"]}, indent=2))
    return 0


def _down(args: argparse.Namespace) -> int:
    leftovers = manager.down()
    if leftovers:
        print("lab down left behind: %s" % ", ".join(leftovers), file=sys.stderr)
        return 1
    print("lab is down; nothing left behind")
    return 0


def _status(args: argparse.Namespace) -> int:
    print(json.dumps(manager.status(), indent=2))
    return 0


def _guard(handler):
    def wrapped(args):
        try:
            return handler(args)
        except LabError as error:
            print("gpuharden lab: %s" % error, file=sys.stderr)
            return 2

    return wrapped


def register(commands) -> None:
    lab = commands.add_parser("lab", help="simulated GPU fleet for tests and demos (needs root)")
    actions = lab.add_subparsers(dest="lab_command", required=True)
    up = actions.add_parser("up", help="bring up a scenario's nodes and control plane")
    up.add_argument("--scenario", required=True, choices=available())
    up.add_argument("--nodes", type=int, default=None, help="node count for scenarios that scale (scale)")
    up.add_argument("--no-cluster", action="store_true", help="nodes only, no control plane (faster)")
    up.add_argument("--no-harden", action="store_true",
                    help="leave the fleet as installed, before the harden run a scenario's state is reached by (healthy)")
    up.add_argument("--stand-ins", action="store_true",
                    help="every node on the stand-in kubelet and containerd, the scenario's real parts left out")
    up.add_argument("--kwok-nodes", type=int, default=0, help="extra Nodes that exist only in the apiserver (scale checks)")
    up.set_defaults(handler=_guard(_up))
    actions.add_parser("status", help="show the lab's nodes and services").set_defaults(handler=_guard(_status))
    actions.add_parser("down", help="remove everything the lab created").set_defaults(handler=_guard(_down))
