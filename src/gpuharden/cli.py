# SPDX-License-Identifier: GPL-3.0-or-later
"""The `gpuharden` command.

`gpuharden facts` runs the gpu_facts module over an inventory through ansible-runner and prints one
line per GPU (or JSON).  Exit codes: 0 all hosts answered, 1 some host failed or was unreachable,
2 usage or environment error.  `gpuharden drift` checks an inventory for drift (see gpuharden/drift.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from importlib.metadata import entry_points

from gpuharden import __version__, drift


def _facts(args: argparse.Namespace) -> int:
    try:
        import ansible_runner  # noqa: PLC0415 (keeps `gpuharden --help` fast)
    except ImportError:
        print("gpuharden facts needs ansible-runner (pip install ansible-runner)", file=sys.stderr)
        return 2
    inventory = os.path.abspath(args.inventory)
    if not os.path.exists(inventory):
        print("gpuharden facts: inventory %s does not exist" % args.inventory, file=sys.stderr)
        return 2
    # ansible-runner starts `ansible` from PATH in a scratch directory: prefer the one installed beside
    # this Python, and keep the ansible.cfg of the directory the user ran us from.
    envvars = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    if "ANSIBLE_CONFIG" not in os.environ and os.path.exists("ansible.cfg"):
        envvars["ANSIBLE_CONFIG"] = os.path.abspath("ansible.cfg")
    with tempfile.TemporaryDirectory(prefix="gpuharden-runner-") as private_data_dir:
        runner = ansible_runner.run(
            envvars=envvars,
            private_data_dir=private_data_dir,
            inventory=inventory,
            host_pattern=args.limit,
            module="gpuharden.k8s.gpu_facts",
            module_args="root=%s" % args.root,
            forks=args.forks,
            quiet=True,
            json_mode=False,
        )
        results = {}
        failed = {}
        for event in runner.events:
            data = event.get("event_data", {})
            host = data.get("host")
            if event.get("event") == "runner_on_ok":
                results[host] = data["res"]["ansible_facts"]["gpuharden"]
            elif event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
                failed[host] = data.get("res", {}).get("msg", event["event"])
        if not results and not failed:
            output = runner.stdout.read().strip() if runner.stdout else ""
            print("gpuharden facts: ansible did not run (%s, rc %s): %s" % (runner.status, runner.rc, output), file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({"hosts": results, "failed": failed}, indent=2, sort_keys=True))
    else:
        for host in sorted(results):
            facts = results[host]
            if not facts["nvml"]["available"]:
                reason = facts["nvml"]["reason"]
                print("%s\tNVML unusable: %s (%s)" % (host, reason["code"], reason["message"]))
                continue
            for gpu in facts["gpus"]:
                if gpu.get("error"):
                    print("%s\tGPU%d\terror %s" % (host, gpu["index"], gpu["error"]["code"]))
                    continue
                print(
                    "%s\tGPU%d\t%s\t%s\tNUMA %s\tMIG %s"
                    % (
                        host,
                        gpu["index"],
                        gpu["name"],
                        gpu["pci_bus_id"],
                        gpu["numa_node"],
                        gpu["mig"]["mode_current"] if gpu["mig"]["capable"] else "n/a",
                    )
                )
        for host in sorted(failed):
            print("%s\tFAILED: %s" % (host, failed[host]))
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuharden", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version="gpuharden %s" % __version__)
    commands = parser.add_subparsers(dest="command", required=True)
    facts = commands.add_parser("facts", help="gather GPU facts from every node of an inventory")
    facts.add_argument("-i", "--inventory", required=True, help="Ansible inventory file or directory")
    facts.add_argument("-l", "--limit", default="all", help="host pattern (default: all)")
    facts.add_argument("--root", default="/", help="where the node's filesystem is visible (default: /)")
    facts.add_argument("-f", "--forks", type=int, default=16)
    facts.add_argument("--json", action="store_true", help="print JSON instead of a table")
    facts.set_defaults(handler=_facts)
    drift.add_parser(commands)
    # Further commands (the lab, in a source checkout) plug in here without this module naming them.
    for entry_point in entry_points(group="gpuharden.commands"):
        entry_point.load()(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
