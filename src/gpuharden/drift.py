# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden drift`: the drift check over an inventory, as a report.

Runs the collection's drift-check playbook (one node_audit module run per node) through ansible-runner, then its
cluster-side consistency check in this process, from what the play handed over (gpuharden/cluster_side.py); shows
progress, and writes a JSON report, a table on the terminal and a Prometheus textfile-collector file.  With
``--remediate`` it then runs harden_gpu_nodes.yml on the drifted hosts only, limited to the stages (tags) with
remediable findings, and checks those hosts again.

A node is ``clean``, ``drift`` (findings at or above --fail-severity that harden fixes), ``attention`` (only
findings no playbook fixes: a PCIe link trained down, a privileged GPU pod) or ``not_checked`` (no such finding, but a
check, or a part of one, could not run there).  A run that finished reports every host of the play: audited,
``unreachable`` or ``failed`` (a host the play ended without a node_audit result for counts as failed, never as
clean).  Every check ends in one of three states (gpuharden/coverage.py): checked, could not check (the cause and the
fix, listed first; never counted as clean or as drift) or refused (outside what gpuharden changes safely, named).

Runs that did not finish never look clean.  An interrupted (SIGINT, SIGTERM), timed-out (--timeout) or canceled run,
or one where ansible-playbook stopped before the end of the play (no closing stats), writes NOTHING: the previous
JSON report and Prometheus file stay byte for byte as they were, no table or summary is printed, and stderr names
every host without a final result.  So the Prometheus file always describes the last complete run:
gpuharden_last_success_timestamp_seconds stops advancing while runs do not complete (and while complete runs cannot
check everything; gpuharden_last_run_timestamp_seconds then advances alone), and the per-node series (drifted,
attention, not checked, unreachable, failed) keep their last complete values instead of vanishing, so their alerts
do not resolve.  Alert
on ``time() - gpuharden_last_success_timestamp_seconds`` (or node_exporter's ``node_textfile_mtime_seconds``) above
about two run intervals, and on the unit or Job failing (exit codes 3, 4, 130, 143).

A run with no host to check (the playbook's hosts pattern, gpuharden_target_hosts default gpu_nodes, or -l matched
no host of the inventory) is a usage error, never an empty clean report; so is a playbook ansible-playbook could
not start (a YAML error, an unknown variable in a play's keywords).  Their message is the first error lines of
ansible-playbook's output (started with ANSIBLE_NOCOLOR=1, ANSI codes stripped; see gpuharden/ansible_output.py).

Exit codes: 0 the run finished, every node answered and is clean; 1 the run finished and found drift or attention,
or a cluster finding; 2 usage or environment error, or no host to check (nothing was checked, nothing written); 3
incomplete: timed out, canceled, or ansible-playbook stopped early (nothing written); 4 not checked: the run finished,
but something it was asked to check could not be (the cluster side blind: a missing kubeconfig, an expired or revoked
token, RBAC that forbids a LIST, an unreachable API server; a node check that could not run; a node unreachable or
failed): the report is written, its first line names the cause and the fix, and the success time in the metrics does
not advance; 130 interrupted by SIGINT, 143 by SIGTERM (nothing written).  1 is an answer about the nodes; 4 a
partial answer; 3, 130 and 143 say there is no answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import uuid

from gpuharden import ansible_output, drift_check, drift_metrics, drift_report, drift_run, drift_slices, drift_terminal, explain, report_html
from gpuharden.severity import SEVERITIES

DESCRIPTION = """\
Check the GPU nodes of an Ansible inventory for drift from the state harden_gpu_nodes.yml sets up, read-only,
and report it: a progress line per host on stderr, a table (or --json) on stdout, and optionally a JSON report
(--report) and a Prometheus textfile-collector file (--prometheus).  It runs the collection's drift_check.yml
playbook through ansible-runner: one node_audit run per node, under the node's run lock, plus the cluster-side
checks (GPUs advertised and allocated, the RuntimeClass) once for the run.

Each node of the report is "clean", "drift" (findings at or above --fail-severity that harden_gpu_nodes.yml fixes,
with the stages to run) or "attention" (only findings no playbook fixes: a PCIe link trained down, a privileged
GPU pod); a host that could not be checked is "unreachable" or "failed", never clean.  With --remediate, the
drifted nodes then get harden_gpu_nodes.yml, limited to them and to the stages with findings, and are checked again.

The hosts are the playbook's: the group in gpuharden_target_hosts (default gpu_nodes), narrowed by -l.  A run
where these match no host exits 2 and names the pattern; it never reports an empty fleet as clean.

With --slice K/N (K from 1 to N) a run checks one Nth of those hosts: the ones whose sha256(inventory host name),
as a number, mod N is K-1; it lists the hosts first (ansible-playbook --list-hosts) and hands the slice's to the
run as its limit, so the other slices' hosts are not contacted.  N runs, on N controllers or as the pods of an
Indexed Job, check the fleet between them; `gpuharden drift-merge` makes their --report files one report and one
metrics file, equal to an unsliced run's but for the timings.  A slice that gets no host writes an empty report
and exits 0 (stderr says so); each slice also runs the cluster-side checks, which the merge keeps once.
"""
EPILOG = """\
examples:
  first survey of a fleet (read-only; exit 1 when anything needs a look):
    gpuharden drift -i inventory/
  from cron or a systemd timer, for node_exporter's textfile collector (the files are replaced whole, and only
  by a run that finished):
    gpuharden drift -i inventory/ -q --timeout 1800 --report /var/lib/gpuharden/drift.json \\
        --prometheus /var/lib/node_exporter/textfile/gpuharden.prom
  fix the drift of one node (only the stages with findings), then check it again:
    gpuharden drift -i inventory/ -l gpu-node-07 --remediate
  a fleet in three slices, on three controllers (or an Indexed Job), then one report of them:
    gpuharden drift -i inventory/ --slice 2/3 --report /shared/drift/slice-2.json
    gpuharden drift-merge /shared/drift/slice-*.json --report drift.json --prometheus gpuharden.prom

exit codes:
  0    clean: the run finished, every node answered, and nothing differs from the desired state (no cluster
       finding either)
  1    DRIFT, an answer: the run finished, checked everything it was asked to, and some node differs from the
       desired state (drift, which harden fixes), needs attention (hardware, workloads), or a cluster object
       differs; the report and metrics are written and say which
  4    NOT CHECKED, a partial answer: the run finished, but could not check something it was asked to: the
       cluster side (no kubeconfig, an expired or revoked token, RBAC that forbids a LIST, the API server not
       reachable), a node check (a tool prerequisite missing on the node, such as nvidia-ml-py), or a node
       (unreachable, failed). The first line of the output names the cause and the fix; the report and metrics
       are written (gpuharden_drift_checked 0 for the blind check), but gpuharden_last_success_timestamp_seconds
       keeps its earlier value. Whatever else the run found, 4 wins: part of the fleet is unknown
  2    usage or environment error, or no host to check (gpuharden_target_hosts, default gpu_nodes, or -l matched
       no host of the inventory; ansible-playbook could not start the playbook): nothing checked, nothing written
  3    INCOMPLETE, no answer: the check could not finish (--timeout, canceled, ansible-playbook stopped before
       the end of the play), so the fleet's state is unknown: neither clean nor drifted; nothing written, stderr
       names the hosts without a final result
  128+N  stopped by signal N, incomplete as for 3: 130 SIGINT (Ctrl-C), 143 SIGTERM

1 says something about the nodes, 4 says part of it is unknown; 3, 130 and 143 say there is no answer.  An
incomplete run leaves the previous
--report, --prometheus and --html files byte for byte as they were and prints no table or summary, so the metrics always
describe the last complete run: gpuharden_last_success_timestamp_seconds stops advancing (alert on its age, or on
node_textfile_mtime_seconds) and the per-node series (gpuharden_drift_node_drifted, _attention, _unreachable,
_failed) keep their last complete values, so their alerts do not resolve.
"""


def remediate(args, report, base_vars, stream, stop=None, deadline=None):
    """harden_gpu_nodes.yml once on the drifted hosts, tagged with the stages any of them needs, then the drift check again.

    One run, not one per set of stages: harden's plan runs on each node only the stages whose check is not ok (the same
    audit as this check, tests/integration/test_drift.py holds the two to each other; gpuharden_skip_compliant_stages
    is forced on for it), and one run keeps harden's own order across the nodes: the disruptive steps in the budgeted
    rollout, the device plugin after them.  Runs per set of stages rolled the plugin out over every GPU node before
    another run repaired a stopped kubelet, whose old plugin pod then held the rolling update for good (found with the
    real kubelet on the seed-failures lab)."""
    by_host = {host: list(node["remediable_stages"]) for host, node in report["nodes"].items() if node["remediable_stages"]}
    if not by_host:
        return []
    hosts = sorted(by_host)
    stages = sorted({stage for host_stages in by_host.values() for stage in host_stages})

    def stop_here(status=None):
        reason = drift_check.stopped(args, stop, deadline, status)
        if reason:
            # the remediated hosts' state is unknown until they are checked again; the others' results are final
            # but the report is not written without them
            raise drift_check.Incomplete(reason[0] + " during --remediate (harden_gpu_nodes.yml may have stopped part way)", reason[1],
                             pending=set(hosts), checked=set(report["nodes"]) - set(hosts))

    stop_here()
    if not args.quiet:
        stream.write("remediating %s: stages %s\n" % (", ".join(hosts), ", ".join(stages)))
    changed = {}
    plays = drift_report.PlayTracker()

    def handler(event):
        plays.feed(event)
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and (data.get("res") or {}).get("changed"):
            changed[data["host"]] = changed.get(data["host"], 0) + 1
        return True

    status, rc, stats, stdout = drift_run.run_playbook(args.harden_playbook, args.inventory, limit=",".join(hosts), forks=args.forks,
                                             extravars=dict(base_vars, gpuharden_skip_compliant_stages=True), tags=stages,
                                             event_handler=handler, cancel=stop.requested if stop is not None else None,
                                             timeout=drift_check.runner_timeout(deadline))
    stop_here(status)
    if plays.first_unmatched():
        # the drift check just ran on these hosts: harden's own pattern (gpuharden_target_hosts) leaves them out
        raise drift_check.not_run("harden_gpu_nodes.yml (--remediate)", args.inventory, ",".join(hosts), plays.plays[0][:1], status, rc, stdout)
    entry = {"hosts": hosts, "stages": stages, "stages_by_host": dict(sorted(by_host.items())), "status": status, "rc": rc, "changed_tasks": changed,
             "failures": sorted(set(stats.get("failures", {})) | set(stats.get("dark", {})))}
    if rc:
        entry["error"] = ansible_output.error_excerpt(stdout)
        stream.write("gpuharden drift: harden_gpu_nodes.yml on %s failed (%s)%s\n" % (
            ", ".join(hosts), ansible_output.describe_exit(status, rc),
            (":\n" + ansible_output.indent(entry["error"])) if entry["error"] else ""))
        stream.flush()
    return [entry]


def run(args, stream=None, out=None):
    stream, out = stream or sys.stderr, out or sys.stdout  # looked up now: tests and callers may have replaced them
    with drift_check.StopRequest() as stop:
        try:
            return _run(args, stream, out, stop)
        except drift_check.Incomplete as error:
            drift_terminal.explain_incomplete(error, args, stream)
            return error.code


def _run(args, stream, out, stop):
    deadline = time.monotonic() + args.timeout if getattr(args, "timeout", None) else None
    if not os.path.exists(args.inventory):
        raise drift_run.DriftError("inventory %s does not exist" % args.inventory)
    try:
        import ansible_runner  # noqa: F401, PLC0415
    except ImportError:
        raise drift_run.DriftError("gpuharden drift needs ansible-runner (pip install ansible-runner)") from None
    extravars = drift_run.parse_extra_vars(args.extra_vars)
    args.playbook = drift_run.resolve_playbook(args.playbook)
    if args.remediate:
        args.harden_playbook = drift_run.resolve_playbook(args.harden_playbook)
    args.inventory = os.path.abspath(args.inventory)
    owner = "drift@%s:%d:%s" % (socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8])
    # the run data play of drift_check.yml is for ansible-playbook and AWX: the results come from the events here
    extravars.update(gpuharden_drift_fail=False, gpuharden_drift_run_data=False, gpuharden_run_owner=owner)
    report = drift_check.check_slice(args, extravars, stream, stop, deadline) if getattr(args, "slice", None) else \
        drift_check.check(args, extravars, stream, args.limit, stop, deadline)
    if args.remediate:
        before = report
        base = dict(extravars)
        base.pop("gpuharden_drift_fail")
        base.pop("gpuharden_drift_run_data")
        base["gpuharden_run_owner"] = owner.replace("drift@", "remediate@")
        runs = remediate(args, before, base, stream, stop, deadline)
        if runs:
            hosts = sorted({host for entry in runs for host in entry["hosts"]})
            after = drift_check.check(args, extravars, stream, ",".join(hosts), stop, deadline)
            report = drift_report.merge_after_remediation(before, after)
        report["remediation"] = {"runs": runs, "before": before["summary"]}
    # The last point where a signal still means "no report"; once writing starts the run is complete, and a
    # signal from here on changes nothing (each file is replaced whole, by rename).
    if stop.requested():
        raise drift_check.Incomplete("interrupted by %s" % stop.name(), stop.exit_code(), checked=report.get("node_names", {}))
    if (args.report or getattr(args, "html", None)) and not getattr(args, "no_explain", False):
        # the failing GPU pods, each with its cause, from this run's node audits: for the people who read the files
        report["explanations"] = explain.for_drift_report(report, extravars)
    if args.report:
        drift_report.write_atomically(args.report, json.dumps(report, indent=2, sort_keys=True) + "\n")
    if args.prometheus:
        drift_report.write_atomically(args.prometheus, drift_metrics.prometheus_text(report, drift_metrics.read_previous(args.prometheus)))
    if getattr(args, "html", None):
        drift_report.write_atomically(args.html, report_html.render(report))
    drift_terminal.show(report, args, out, stream)
    return drift_report.exit_code(report)


def add_parser(commands):
    parser = commands.add_parser("drift", help="check an inventory's GPU nodes for drift from the hardened state, and report it",
                                 description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    parser.add_argument("-i", "--inventory", required=True, help="Ansible inventory file or directory")
    parser.add_argument("-l", "--limit", metavar="PATTERN",
                        help="only these hosts of the playbook's (an Ansible host pattern, as for ansible-playbook -l; default: "
                             "every host of gpuharden_target_hosts, default gpu_nodes)")
    parser.add_argument("-f", "--forks", type=int, default=16, help="hosts checked in parallel (default 16)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="KEY=VALUE, JSON or @FILE, as for ansible-playbook (repeatable)")
    parser.add_argument("--report", metavar="FILE.json", help="write the JSON report here")
    parser.add_argument("--prometheus", metavar="FILE.prom", help="write Prometheus textfile-collector metrics here")
    parser.add_argument("--html", metavar="FILE.html", help="write a self-contained HTML page here: nodes x checks coloured by "
                        "the worst severity, a finding's details on click")
    parser.add_argument("--fail-severity", choices=SEVERITIES, default="warning",
                        help="findings at or above this severity make a node drifted (default: warning)")
    parser.add_argument("--remediate", action="store_true",
                        help="run harden_gpu_nodes.yml on the drifted nodes, only the stages with findings, then check again")
    parser.add_argument("--timeout", type=int, metavar="SECONDS",
                        help="give up after this many seconds for the whole command (check and --remediate): exit 3, "
                             "nothing written (default: no limit)")
    parser.add_argument("--slice", type=drift_slices.parse_slice, metavar="K/N",
                        help="check only slice K of N (1 <= K <= N) of the hosts: those whose sha256(inventory host name) mod N "
                             "is K-1, so N runs (N controllers, or the pods of an Indexed Job) share a fleet and never contact "
                             "each other's hosts; combine their --report files with gpuharden drift-merge")
    parser.add_argument("--cluster-check", choices=drift_check.CLUSTER_CHECK_CHOICES, default=drift_check.IN_PROCESS,
                        help="where the cluster-side consistency check runs: in-process (default: in this process, the "
                             "collection's code from the play's hand-over) or module (the gpu_consistency module in the "
                             "play, as ansible-playbook runs it); the report's cluster.ran_in says where it ran")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--no-explain", action="store_true", help="leave out of --report and --html the failing GPU pods' explanations "
                        "(gpuharden explain --failing over this run's node audits: one LIST of pods and one of Nodes more)")
    parser.add_argument("--wide", action="store_true", help="do not wrap the table to the terminal's width (COLUMNS): one line per field")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--playbook", default=drift_run.DRIFT_PLAYBOOK, help=argparse.SUPPRESS)
    parser.add_argument("--harden-playbook", default=drift_run.HARDEN_PLAYBOOK, help=argparse.SUPPRESS)
    parser.set_defaults(handler=main)
    return parser


def main(args):
    if args.forks < 1:
        print("gpuharden drift: --forks must be at least 1", file=sys.stderr)
        return drift_report.EXIT_USAGE
    if args.timeout is not None and args.timeout < 1:
        print("gpuharden drift: --timeout must be at least 1 second", file=sys.stderr)
        return drift_report.EXIT_USAGE
    try:
        return run(args)
    except KeyboardInterrupt:
        # only before run() installs its handlers (or after it put the previous ones back): nothing was written
        print("gpuharden drift: INCOMPLETE, interrupted by SIGINT: no report written", file=sys.stderr)
        return drift_report.EXIT_SIGNAL_BASE + signal.SIGINT
    except drift_run.DriftError as error:
        print("gpuharden drift: %s" % error, file=sys.stderr)
        return drift_report.EXIT_USAGE
    except OSError as error:
        print("gpuharden drift: %s" % error, file=sys.stderr)
        return drift_report.EXIT_USAGE
