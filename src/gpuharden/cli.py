# SPDX-License-Identifier: GPL-3.0-or-later
"""The `gpuharden` command.

`gpuharden facts` runs the gpu_facts module over an inventory through ansible-runner and prints one
line per GPU (or JSON).  Exit codes: 0 all hosts answered, 1 some host failed or was unreachable,
2 usage or environment error, or no host matched.  `gpuharden drift` checks an inventory for drift (see
gpuharden/drift.py); `gpuharden drift-merge` joins the reports of `gpuharden drift --slice` runs.  Further
commands (`gpuharden lab`, from the gpuharden-lab distribution) plug in through the ``gpuharden.commands`` entry
point group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from importlib.metadata import entry_points

from gpuharden import __version__, ansible_output, cluster_side, drift, drift_run, drift_slices, explain, kubeconfig, report_cli

DESCRIPTION = """\
gpuharden: harden the GPU nodes of a Kubernetes cluster and keep them hardened, with the gpuharden.k8s Ansible
collection.  The collection's playbooks make the changes (ansible-playbook gpuharden.k8s.harden_gpu_nodes, from a
checkout playbooks/harden-gpu-nodes.yml); this command gathers GPU facts and checks a fleet for drift from the
hardened state, read-only, with reports for people (a table) and machines (JSON, Prometheus).
"""
EPILOG = """\
examples:
  gpuharden facts -i inventory/                 the GPUs of every node: model, PCI bus, NUMA node, MIG mode
  gpuharden drift -i inventory/                 first survey: which nodes differ from the hardened state
  gpuharden drift -i inventory/ -l gpu-node-07 --remediate
                                                fix one node's drift (only the stages with findings), check again
  gpuharden drift -i inventory/ --slice 2/3 --report slice-2.json
                                                check one third of the fleet; gpuharden drift-merge joins the slices
  gpuharden explain pod ml/train-0             why a GPU pod fails: the cause, the evidence, the fix
  gpuharden report drift-report.json --html fleet.html
                                                the page (or --table) of a report already written
  gpuharden kubeconfig -o /etc/gpuharden/kubeconfig
                                                the tool's kubeconfig: a bound token of its ServiceAccount (720h)
  ansible-playbook -i inventory/ gpuharden.k8s.harden_gpu_nodes
                                                harden the fleet (a canary first, within a disruption budget)

exit codes (each command's --help has the details):
  0    done: every host answered, and (drift) nothing differs from the hardened state
  1    an answer that needs a look: (drift, drift-merge, report) a node drifted or needs attention;
       (explain) a cause found; (facts) a host failed or was unreachable
  2    usage or environment error, or no host matched the inventory, the playbook's hosts or -l
  3    (drift) incomplete: the check could not finish, so there is no answer; 128+N: stopped by signal N
  4    (drift, explain, report) not checked: what could not be checked comes first, with its cause and fix;
       (kubeconfig) the API server refused or could not be reached: nothing written

"gpuharden COMMAND --help" describes a command, its options and its exit codes.
"""
FACTS_DESCRIPTION = """\
Gather GPU facts from every host of an Ansible inventory (the gpuharden.k8s.gpu_facts module, read-only, run
through ansible-runner) and print one line per GPU: host, GPU index, model, PCI bus id, NUMA node, MIG mode;
or a host whose NVML is unusable, with why.  With --json: the facts as the module returns them.

NUMA shows the GPU's node from sysfs; "-" when the platform gives none (one NUMA node, or firmware without
proximity information: sysfs says -1), "?" when sysfs could not be read.  MIG shows the current mode, "n/a" on
a GPU without MIG.
"""
FACTS_EPILOG = """\
examples:
  gpuharden facts -i inventory/
  gpuharden facts -i inventory/ -l gpu_nodes --json > gpus.json
  gpuharden facts -i inventory/ -l gpu-node-07 --root /host       (a node's filesystem mounted at /host)

exit codes:
  0    every host answered (a host whose NVML is unusable still answered, with why)
  1    some host failed or was unreachable; the others are printed
  2    usage or environment error, or no host matched (-l, or an empty inventory): nothing was gathered
"""


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
    # ansible-runner starts `ansible` from PATH in a scratch directory: the one beside this Python, the ansible.cfg
    # of the directory the user ran us from, no colour (as for gpuharden drift)
    with tempfile.TemporaryDirectory(prefix="gpuharden-runner-") as private_data_dir:
        runner = ansible_runner.run(
            envvars=drift_run.runner_env(),
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
            output = runner.stdout.read() if runner.stdout else ""
            print("gpuharden facts: %s" % not_run_message(output, inventory, args.limit, runner.status, runner.rc), file=sys.stderr)
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
                        numa_text(gpu.get("numa_node")),
                        gpu["mig"]["mode_current"] if gpu["mig"]["capable"] else "n/a",
                    )
                )
        for host in sorted(failed):
            print("%s\tFAILED: %s" % (host, failed[host]))
    return 1 if failed else 0


def numa_text(value):
    """gpu_facts' numa_node as the table shows it: the node, "-" for -1 (the platform names none: one NUMA node, or
    no firmware proximity information), "?" for null (sysfs unreadable)."""
    if value is None:
        return "?"
    return "-" if int(value) < 0 else str(value)


def not_run_message(output, inventory, limit, status, rc):
    """Why `ansible` ran gpu_facts on no host: the pattern matched none, or ansible's first error lines."""
    if any(text in ansible_output.strip_ansi(output) for text in ansible_output.NO_HOSTS_TEXTS):
        _kind, reason = ansible_output.no_hosts(output, inventory=inventory, unmatched_plays=[limit])
        return "no host to gather facts from: %s" % reason.replace("the play's hosts pattern", "-l")
    excerpt = ansible_output.error_excerpt(output)
    return "ansible ran gpu_facts on no host (%s)%s" % (
        ansible_output.describe_exit(status, rc), (":\n" + ansible_output.indent(excerpt)) if excerpt else ", and printed nothing")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuharden", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="gpuharden %s" % __version__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    facts = commands.add_parser("facts", help="gather GPU facts from every node of an inventory (read-only)",
                                description=FACTS_DESCRIPTION, epilog=FACTS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    facts.add_argument("-i", "--inventory", required=True, help="Ansible inventory file or directory")
    facts.add_argument("-l", "--limit", default="all", metavar="PATTERN",
                       help="the hosts to ask, an Ansible host pattern (default: all, every host of the inventory)")
    facts.add_argument("--root", default="/", metavar="DIR",
                       help="where the node's filesystem is visible on the node, for a node run from a container with the host "
                            "mounted (default: /)")
    facts.add_argument("-f", "--forks", type=int, default=16, help="hosts asked in parallel (default 16)")
    facts.add_argument("--json", action="store_true", help="print the facts of every host as JSON, with the failed hosts, instead of a table")
    facts.set_defaults(handler=_facts)
    drift.add_parser(commands)
    drift_slices.add_merge_parser(commands)
    explain.add_parser(commands)
    report_cli.add_parser(commands)
    kubeconfig.add_parser(commands)
    # Further commands (the lab, in a source checkout) plug in here without this module naming them.
    for entry_point in entry_points(group="gpuharden.commands"):
        entry_point.load()(commands)
    return parser


# The commands that run the gpuharden.k8s collection's modules or playbooks: each checks first that it is installed and
# of this CLI's release (cluster_side.require_collection), so each fails the same way, exit 2, when it is not.
# drift-merge and report read reports only; the lab's commands bring their own checkout.
NEEDS_COLLECTION = ("facts", "drift", "explain", "kubeconfig")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in NEEDS_COLLECTION:
        try:
            _base, warning = cluster_side.require_collection()
        except cluster_side.CollectionError as error:
            print("gpuharden: %s" % error, file=sys.stderr)
            return 2
        if warning:
            print("gpuharden: warning: %s" % warning, file=sys.stderr)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
