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
import datetime
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from gpuharden import ansible_output, coverage, kubeconfig, terminal
from gpuharden.severity import SEVERITIES, counted

# The JSON report's schema; drift-merge only combines reports of the version it writes.
REPORT_VERSION = 1
DRIFT_PLAYBOOK = "gpuharden.k8s.drift_check"
HARDEN_PLAYBOOK = "gpuharden.k8s.harden_gpu_nodes"
# Collection playbook names must be identifiers (ansible-core collection_loader); the hyphenated files beside them
# (harden-gpu-nodes.yml, ...) only import these for project-directory use.
PLAYBOOK_FILES = {DRIFT_PLAYBOOK: "drift_check.yml", HARDEN_PLAYBOOK: "harden_gpu_nodes.yml"}
# The variable the playbooks' hosts pattern comes from, and its default (playbooks/drift_check.yml, harden_gpu_nodes.yml).
TARGET_VARIABLE = ("gpuharden_target_hosts", "gpu_nodes")
AUDIT_ACTIONS = ("gpuharden.k8s.node_audit", "node_audit")
CONSISTENCY_ACTIONS = ("gpuharden.k8s.gpu_consistency", "gpu_consistency")
RUNTIME_CLASS_ACTIONS = ("gpuharden.k8s.runtime_class", "runtime_class")
GPU_PODS_ACTIONS = ("gpuharden.k8s.gpu_pods_info", "gpu_pods_info")
SET_FACT_ACTIONS = ("ansible.builtin.set_fact", "set_fact", "ansible.legacy.set_fact")
# drift_check.yml's facts: the host's Node name, and what the consistency check gpuharden drift runs itself takes
# (gpuharden/cluster_side.py)
NODE_NAME_FACT = "__drift_node"
CONSISTENCY_OPTIONS_FACT = "gpuharden_drift_consistency_options"
NODE_REPORTS_FACT = "__drift_node_reports"
# How often `gpuharden drift` looks for a signal or the --timeout while its cluster side runs
CLUSTER_SIDE_POLL = 0.2
EXIT_CLEAN, EXIT_DRIFT, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_NOT_CHECKED = 0, 1, 2, 3, 4
# A run stopped by a signal exits 128 + the signal's number, as a shell reports a process the signal killed.
EXIT_SIGNAL_BASE = 128
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# ansible-runner's Runner.status values of a run that got to its end (ansible-runner src/ansible_runner/runner.py,
# Runner.run: canceled, successful, timeout or failed).  Every other value (canceled, timeout, or a status the run
# never left such as starting/running) is a run that did not finish.
FINISHED_STATUSES = ("successful", "failed")
# How often ansible-runner polls the cancel callback and the job timeout: its pexpect loop wakes up on the child's
# output or after pexpect_timeout seconds (default 5; ansible-runner config/_base.py, read from env/settings).
RUNNER_SETTINGS = {"pexpect_timeout": 1}
LIST_HOSTS_TIMEOUT = 60
# --slice lists the play's hosts before the run: a dynamic inventory of a large fleet may take minutes.
SLICE_LIST_TIMEOUT = 600
# Every process a run starts on the controller (ansible-playbook, its workers, the modules and ssh clients they start)
# inherits this variable, with a value of its own run, so they can be found and stopped when the run ends, whatever
# session or process group they moved to.
RUN_MARKER = "GPUHARDEN_RUN_ID"
# Seconds the processes of an ended run get between SIGTERM and SIGKILL, and again to vanish after SIGKILL.
TERMINATE_GRACE = 3.0
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


class DriftError(Exception):
    """A usage or environment problem: nothing (more) can be checked."""


class Incomplete(Exception):
    """The run did not finish (a signal, the timeout, a canceled or cut-short playbook): nothing is reported.

    ``pending``: hosts without a final result; ``checked``: hosts that had one when the run stopped (not reported
    either, since the run's cluster-wide checks and the other hosts are missing); ``hosts_known``: False when the
    play's host list could not be read, so hosts not yet started may be missing from ``pending``; ``details``: the
    first error lines of ansible-playbook's output, when it stopped by itself."""

    def __init__(self, reason, code, pending=(), checked=(), hosts_known=True, details=""):
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.pending = sorted(pending)
        self.checked = sorted(checked)
        self.hosts_known = hosts_known
        self.details = details


class StopRequest:
    """SIGINT and SIGTERM while a run is under way: remembered, not acted on where they land.

    Handed to ansible-runner as its cancel callback: given one, ansible-runner installs no signal handlers of its own
    (ansible-runner src/ansible_runner/interface.py, init_runner; its own ones are never uninstalled) and polls the
    callback in its pexpect loop, then SIGKILLs ansible-playbook's process group and ends with status ``canceled``
    (src/ansible_runner/runner.py, Runner.run and Runner.handle_termination).  That group is not the whole run: see
    stop_processes, which run_playbook calls after every run.  Used as a context manager: installs the handlers in
    the main thread and puts the previous ones back on exit."""

    def __init__(self):
        self.signum = None
        self.count = 0
        self._previous = {}

    def __call__(self, signum, _frame=None):
        self.count += 1
        if self.signum is None:
            self.signum = signum

    def requested(self):
        return self.signum is not None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self)
        return self

    def __exit__(self, *_exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        return False

    def exit_code(self):
        return EXIT_SIGNAL_BASE + int(self.signum)

    def name(self):
        return signal.Signals(self.signum).name


# ---------------------------------------------------------------------------------------------
# Turning ansible-runner events into per-host outcomes (pure: tested without Ansible)


class Outcomes:
    """Folds runner events into audited / unreachable / failed hosts, and calls ``progress`` as hosts finish."""

    def __init__(self, progress=None):
        self.audited = {}
        self.unreachable = {}
        self.failed = {}
        self.consistency = None
        self.consistency_error = None
        # why the cluster could not be read, as the collection's k8s layer names it ({kind, fix}), where it did
        self.consistency_access = None
        # {node: why harden's admission check keeps it on its policy} (gpu_consistency's kept)
        self.kept = {}
        self.runtime_class = None
        # the play's LIST of GPU pods failed ({cause, access}): the nodes' memory check did not run
        self.pods_error = None
        # drift_check.yml's facts: each host's Node name, and the hand-over to run_cluster_side (gpu_consistency's
        # options and the node reports)
        self.node_names = {}
        self.consistency_options = None
        self.node_reports = None
        # the consistency check's module arguments, where the play ran it (kubeconfig and context: its identity)
        self.consistency_invocation = None
        # the cluster side's credential and when it expires (gpuharden.kubeconfig.credential_expiry), where it ran
        self.credential = None
        self.seen = set()
        self.stats = None  # the playbook_on_stats event's data: the play got to its end
        self.plays = PlayTracker()
        self.progress = progress

    def done(self):
        return set(self.audited) | set(self.unreachable) | set(self.failed)

    def feed(self, event):
        data = event.get("event_data") or {}
        host = data.get("host")
        kind = event.get("event")
        if kind == "playbook_on_stats":
            self.stats = data
            return True
        if self.plays.feed(event):
            return True
        if host and kind == "runner_on_start":
            self.seen.add(host)
            return True
        if not host or kind not in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            return True
        self.seen.add(host)
        result = data.get("res") or {}
        if kind == "runner_on_unreachable" and host not in self.done():
            self.unreachable[host] = _message(result) or "unreachable"
            self._report(host, "UNREACHABLE: %s" % self.unreachable[host])
        elif kind == "runner_on_failed" and not data.get("ignore_errors") and host not in self.done():
            self.failed[host] = "%s: %s" % (data.get("task", "task"), _message(result) or "failed")
            self._report(host, "FAILED: %s" % self.failed[host])
        elif kind == "runner_on_ok" and data.get("task_action") in RUNTIME_CLASS_ACTIONS:
            if not result.get("skipped"):
                self.runtime_class = result
        elif kind == "runner_on_ok" and data.get("task_action") in CONSISTENCY_ACTIONS:
            if result.get("skipped"):
                return True
            self.consistency_invocation = (result.get("invocation") or {}).get("module_args") or {}
            if result.get("failed_when_result") or "findings" not in result:
                self.consistency_error = _message(result) or "gpu_consistency failed"
                self.consistency_access = result.get("access")
            else:
                self.take_consistency(result)
        elif kind == "runner_on_ok" and data.get("task_action") in GPU_PODS_ACTIONS:
            if not result.get("skipped") and "pod_uids_by_node" not in result:
                self.pods_error = {"cause": _message(result) or "gpu_pods_info failed", "access": result.get("access")}
        elif kind == "runner_on_ok" and data.get("task_action") in SET_FACT_ACTIONS:
            facts = result.get("ansible_facts") or {}
            if NODE_NAME_FACT in facts:
                self.node_names[host] = facts[NODE_NAME_FACT]
            if CONSISTENCY_OPTIONS_FACT in facts:
                self.consistency_options = facts[CONSISTENCY_OPTIONS_FACT]
            if NODE_REPORTS_FACT in facts:
                self.node_reports = facts[NODE_REPORTS_FACT]
        elif kind == "runner_on_ok" and data.get("task_action") in AUDIT_ACTIONS:
            self.audited[host] = {"findings": result.get("findings", []), "summary": result.get("summary", {}),
                                  "checks": result.get("checks", {}), "seconds": result.get("seconds"),
                                  "cpu_seconds": result.get("cpu_seconds")}
            summary = result.get("summary", {})
            self._report(host, "%d finding(s)%s" % (summary.get("findings", 0),
                                                     (", max " + summary["max_severity"]) if summary.get("max_severity") else ""))
        return True

    def take_consistency(self, result):
        """A gpu_consistency result that answered, from the module run or from run_cluster_side."""
        self.consistency = result["findings"]
        self.kept = result.get("kept") or {}
        # the RuntimeClass dry run, when the drift check folded it into the consistency run (its runtime_class option)
        if result.get("runtime_class_check") is not None:
            self.runtime_class = result["runtime_class_check"]

    def finished(self):
        """True when ansible-playbook got to the end of the play (it sends its stats last)."""
        return self.stats is not None

    def play_hosts(self):
        """Every host this run saw, from its events and from the closing stats."""
        hosts = set(self.seen)
        for key in ("processed", "ok", "failures", "dark", "skipped"):
            hosts.update((self.stats or {}).get(key) or {})
        return hosts

    def close(self):
        """At the end of a finished play: a host with no node_audit result is failed, never silently left out."""
        for host in sorted(self.play_hosts() - self.done()):
            self.failed[host] = "no result: the play ended without a node_audit result for this host"
            self._report(host, "FAILED: %s" % self.failed[host])

    def _report(self, host, text):
        if self.progress:
            self.progress(len(self.done()), len(self.seen), host, text)


class PlayTracker:
    """The hosts pattern of each play of a run, and the plays that matched no host (ansible-runner's
    playbook_on_play_start and playbook_on_no_hosts_matched events, ``play_pattern``)."""

    def __init__(self):
        self.plays = []  # [pattern, matched]

    def feed(self, event):
        """True when ``event`` was one of the two."""
        data = event.get("event_data") or {}
        if event.get("event") == "playbook_on_play_start":
            self.plays.append([data.get("play_pattern", data.get("pattern", "?")), True])
            return True
        if event.get("event") == "playbook_on_no_hosts_matched":
            if not self.plays:
                self.plays.append([data.get("play_pattern", "?"), True])
            self.plays[-1][1] = False
            return True
        return False

    def unmatched(self):
        """The patterns of the plays that matched no host, but for a play with no pattern at all, which targets nothing
        by design (drift_check.yml's run-data play, which gpuharden drift turns off)."""
        return [pattern or "?" for pattern, matched in self.plays if not matched and pattern != ""]

    def first_unmatched(self):
        """True when the run's first play matched no host (then nothing of the playbook ran on a node)."""
        return bool(self.plays) and not self.plays[0][1]


def _message(result):
    message = result.get("msg") or result.get("stderr") or ""
    return " ".join(str(message).split())[:500]


# ---------------------------------------------------------------------------------------------
# The report


def remediable_stages(findings):
    return sorted({entry["stage"] for entry in findings if entry.get("remediable") and entry.get("stage")})


# The findings of the kubelet fields harden's admission check leaves as they are on a node it keeps (gpu_consistency's
# kept names the fields; a kubelet_setting's subject is its field, a kubelet_reverts_on_kubeadm_upgrade's the fields the
# stage would move out of config.yaml), and the stale checkpoint that only the kept policy change would make stale.
KEPT_IDS = ("kubelet_setting", "kubelet_reverts_on_kubeadm_upgrade", "kubelet_stale_checkpoint")


def _kept(entry, fields):
    if entry.get("id") not in KEPT_IDS:
        return False
    if entry["id"] == "kubelet_stale_checkpoint":
        return True
    # kept only where harden leaves every field named as it is: with one it still moves, the next harden changes the node
    return all(name.split(".")[0] in fields for name in str(entry.get("subject") or "").split(", "))


def apply_kept(findings, kept):
    """The node's findings with those harden's admission check keeps marked: not remediable, with the reason
    (``kept``: gpu_consistency's entry for the node, or None).  A --remediate would only retry them."""
    if not kept:
        return findings
    fields = set(kept.get("fields") or ())
    return [dict(entry, remediable=False, kept=kept["reason"]) if _kept(entry, fields) else entry for entry in findings]


def consistency_findings(findings, node):
    """The controller-side gpu_consistency findings of one node (the node is the report's key, so not repeated)."""
    return [{key: value for key, value in entry.items() if key != "node"} for entry in findings or [] if entry.get("node") == node]


# What drift reports of a RuntimeClass dry run that would change the object without a finding; check, stage and
# remediable as in the collection's findings catalogue (plugins/module_utils/core/_findings.py; tests/unit/test_findings.py
# pins them).  A dry run that did not answer is not a finding: the cluster's runtime_class check is not checked
# (coverage.cluster_checks).
RUNTIME_CLASS_DIFFERS = {"check": "runtime_class", "stage": "runtime_class", "remediable": True}


def runtime_class_findings(result):
    """The RuntimeClass dry run as findings of the cluster (not of a node)."""
    if result is None:
        return []
    findings = list(result.get("findings") or [])
    if result.get("changed") and not findings and not result.get("failed"):
        name = ((result.get("runtime_class") or {}).get("metadata") or {}).get("name", "")
        findings.append(dict(RUNTIME_CLASS_DIFFERS, id="runtime_class_differs", severity="error",
                             expected="RuntimeClass as the runtime_class stage applies it", found=result.get("action"),
                             hint="pods with this runtimeClassName are refused or run on the wrong handler",
                             subject="RuntimeClass %s" % name))
    return findings


def node_status(failing, not_checked):
    """drift: something harden fixes; attention: only what no playbook fixes (hardware, workloads); not_checked: no
    finding, but a check (or a part of one) could not run, so the node is not known to be clean; else clean."""
    if any(entry.get("remediable") for entry in failing):
        return "drift"
    return "attention" if failing else ("not_checked" if not_checked else "clean")


def build_report(outcomes, *, inventory, limit, fail_severity, started, finished, node_names=None):
    cluster_checks = coverage.cluster_checks(outcomes.consistency is not None, outcomes.consistency_error,
                                             outcomes.consistency_access, outcomes.runtime_class, outcomes.pods_error)
    nodes = {}
    for host, audit in sorted(outcomes.audited.items()):
        node_name = (node_names or {}).get(host, host)
        audit = dict(audit, findings=apply_kept(audit["findings"], outcomes.kept.get(node_name))
                     + consistency_findings(outcomes.consistency, node_name))
        not_checked = coverage.node_parts(audit["checks"], coverage.NOT_CHECKED, cluster_checks.get("gpu_pods"))
        stages = remediable_stages(audit["findings"])
        nodes[host] = {
            "node": node_name,
            "status": node_status(counted(audit["findings"], fail_severity), not_checked),
            "findings": audit["findings"],
            coverage.NOT_CHECKED: not_checked,
            coverage.REFUSED: coverage.node_parts(audit["checks"], coverage.REFUSED),
            "remediable_stages": stages,
            "checks": audit["checks"],
            # the GPUs the kubelet allocated to each pod's containers (its pod-resources API, as node_audit read it),
            # or None where it was not read: gpuharden explain --from-report matches a GPU's health to its pods with it
            "pod_resources": ((outcomes.node_reports or {}).get(node_name) or {}).get("pod_resources"),
            "audit_seconds": audit["seconds"],
            # the audit module's whole process on the node (interpreter, imports, checks): its CPU cost there
            "audit_cpu_seconds": audit.get("cpu_seconds"),
        }
    # Findings of no single node (pending pods asking for a resource no node advertises) belong to the cluster.
    cluster = runtime_class_findings(outcomes.runtime_class) + [
        dict(entry, subject=entry.get("subject") or entry.get("resource")) for entry in consistency_findings(outcomes.consistency, None)]
    unreachable, failed = dict(sorted(outcomes.unreachable.items())), dict(sorted(outcomes.failed.items()))
    cluster_section = {"consistency_checked": outcomes.consistency is not None, "consistency_error": outcomes.consistency_error,
                       "runtime_class_checked": cluster_checks.get("runtime_class", {}).get("state") == coverage.CHECKED,
                       "checks": cluster_checks, "findings": cluster, "credential": outcomes.credential,
                       "credential_expires_at": kubeconfig.iso((outcomes.credential or {}).get("expires_at"))}
    report = {
        "version": REPORT_VERSION,
        "generated_at": datetime.datetime.fromtimestamp(finished, datetime.UTC).isoformat(),
        "timestamp": finished,
        "duration_seconds": round(finished - started, 3),
        "inventory": inventory,
        "limit": limit,
        "fail_severity": fail_severity,
        "summary": summarize(nodes, unreachable, failed, cluster_section, fail_severity),
        "nodes": nodes,
        "unreachable": unreachable,
        "failed": failed,
        # the node label of every host of the run, unreachable and failed ones included (their set_fact ran on the
        # controller), so their per-node metrics carry the same label as when they answer
        "node_names": {host: (node_names or {}).get(host, host)
                       for host in sorted(set(nodes) | set(outcomes.unreachable) | set(outcomes.failed))},
        "cluster": cluster_section,
    }
    report[coverage.NOT_CHECKED] = coverage.blind_spots(report)
    return report


def summarize(nodes, unreachable, failed, cluster, fail_severity):
    """A report's summary, from its sections (``cluster``: the report's cluster section): the one place the counts come
    from (a run, --remediate, a merge).  clean + drifted + attention + not_checked + unreachable + failed = nodes."""
    by_severity, by_check = {}, {}
    for node in nodes.values():
        for entry in node["findings"]:
            by_severity[entry["severity"]] = by_severity.get(entry["severity"], 0) + 1
            by_check[entry["check"]] = by_check.get(entry["check"], 0) + 1
    statuses = [node["status"] for node in nodes.values()]
    return {
        "nodes": len(nodes) + len(unreachable) + len(failed),
        "clean": statuses.count("clean"),
        "drifted": statuses.count("drift"),
        "attention": statuses.count("attention"),
        "not_checked": statuses.count("not_checked"),
        # audited nodes with a check, or a part of one, not checked (whatever their status) and with one refused
        "nodes_not_checked_in_part": sum(1 for node in nodes.values() if node.get(coverage.NOT_CHECKED)),
        "nodes_refused_in_part": sum(1 for node in nodes.values() if node.get(coverage.REFUSED)),
        "unreachable": len(unreachable),
        "failed": len(failed),
        "findings": sum(len(node["findings"]) for node in nodes.values()),
        "by_severity": by_severity,
        "by_check": by_check,
        "cluster_findings": len(counted(cluster.get("findings") or [], fail_severity)),
        "cluster_not_checked": [check for check, entry in (cluster.get("checks") or {}).items() if entry.get("state") == coverage.NOT_CHECKED],
    }


def exit_code(report):
    """4 when the run could not check something it was asked to (a blind cluster side, a node check that could not
    run, an unreachable or failed node): whatever else it found, the answer is partial.  Else 1 for drift, attention
    or a cluster finding, else 0."""
    summary = report["summary"]
    if (summary.get("nodes_not_checked_in_part", 0) + summary["unreachable"] + summary["failed"]
            + len(summary.get("cluster_not_checked", []))):
        return EXIT_NOT_CHECKED
    problems = summary["drifted"] + summary.get("attention", 0) + summary.get("cluster_findings", 0)
    return EXIT_DRIFT if problems else EXIT_CLEAN


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


LAST_SUCCESS_METRIC = "gpuharden_last_success_timestamp_seconds"
CREDENTIAL_EXPIRY_METRIC = "gpuharden_credential_expiry_timestamp_seconds"


def previous_last_success(text):
    """The gpuharden_last_success_timestamp_seconds of an earlier textfile (its text, or None), or None."""
    for line in (text or "").splitlines():
        name, _sep, value = line.partition(" ")
        if name == LAST_SUCCESS_METRIC:
            try:
                return float(value.split()[0])
            except (ValueError, IndexError):
                return None
    return None


def check_coverage(report):
    """{(scope, check): nodes not checked} of the checks this run asked for: scope cluster (0 or 1) and node (the
    number of audited nodes where the check, or a part of it, did not run); a check no node ran is absent."""
    covered = {("cluster", check): int(entry.get("state") == coverage.NOT_CHECKED)
               for check, entry in (report.get("cluster") or {}).get("checks", {}).items()}
    for node in report["nodes"].values():
        for name, result in (node.get("checks") or {}).items():
            if (result or {}).get("status") not in (None, "skipped") or name in {part["check"] for part in node.get(coverage.NOT_CHECKED) or []}:
                covered.setdefault(("node", name), 0)
        for name in {part["check"] for part in node.get(coverage.NOT_CHECKED) or []}:
            covered[("node", name)] = covered.get(("node", name), 0) + 1
    return covered


def prometheus_text(report, previous=None):
    """The textfile-collector exposition: findings per node/check/severity, per-node totals, what was checked, run
    metadata.  ``previous``: the text of the file this replaces; a run that could not check something keeps its
    gpuharden_last_success_timestamp_seconds (none if it had none), so that the age of that series says how long
    gpuharden has not seen everything it was asked to."""
    lines = [
        "# HELP gpuharden_drift_findings Findings of the last gpuharden drift run, by node, check and severity.",
        "# TYPE gpuharden_drift_findings gauge",
    ]
    for _host, node in sorted(report["nodes"].items()):
        counts = {}
        for entry in node["findings"]:
            key = (entry["check"], entry["severity"])
            counts[key] = counts.get(key, 0) + 1
        for (check, severity), count in sorted(counts.items()):
            lines.append('gpuharden_drift_findings{node="%s",check="%s",severity="%s"} %d'
                         % (_label(node["node"]), _label(check), _label(severity), count))
    lines += [
        "# HELP gpuharden_drift_cluster_findings Findings of the last drift run about cluster objects (the RuntimeClass).",
        "# TYPE gpuharden_drift_cluster_findings gauge",
    ]
    cluster_counts = {}
    for entry in report.get("cluster", {}).get("findings", []):
        key = (entry["check"], entry["severity"])
        cluster_counts[key] = cluster_counts.get(key, 0) + 1
    for (check, severity), count in sorted(cluster_counts.items()):
        lines.append('gpuharden_drift_cluster_findings{check="%s",severity="%s"} %d' % (_label(check), _label(severity), count))
    lines += [
        "# HELP gpuharden_drift_node_drifted 1 when the node has findings at or above the run's fail severity, else 0.",
        "# TYPE gpuharden_drift_node_drifted gauge",
    ]
    for _host, node in sorted(report["nodes"].items()):
        lines.append('gpuharden_drift_node_drifted{node="%s"} %d' % (_label(node["node"]), node["status"] == "drift"))
    lines += [
        "# HELP gpuharden_drift_node_attention 1 when the node's only findings at or above the fail severity are ones no "
        "playbook fixes (hardware, workloads), else 0.",
        "# TYPE gpuharden_drift_node_attention gauge",
    ]
    for _host, node in sorted(report["nodes"].items()):
        lines.append('gpuharden_drift_node_attention{node="%s"} %d' % (_label(node["node"]), node["status"] == "attention"))
    # Every host of the run gets a 0/1 sample, so an unreachable or failed node keeps a per-node series to alert on.
    others = {host: report.get("node_names", {}).get(host, host) for host in list(report["unreachable"]) + list(report["failed"])}
    labels = sorted({node["node"] for node in report["nodes"].values()} | set(others.values()))
    for metric, section, text in (
            ("gpuharden_drift_node_unreachable", "unreachable", "1 when the last complete drift run could not reach the node, else 0."),
            ("gpuharden_drift_node_failed", "failed", "1 when the node's drift check failed in the last complete run (for example "
                                                      "locked by another run, or no result), else 0.")):
        hit = {others[host] for host in report[section]}
        lines += ["# HELP %s %s" % (metric, text), "# TYPE %s gauge" % metric]
        lines += ['%s{node="%s"} %d' % (metric, _label(label), label in hit) for label in labels]
    lines += [
        "# HELP gpuharden_drift_node_not_checked 1 when a check of the node, or a part of one, could not run in the last "
        "complete drift run (the report names the cause and the fix), else 0.",
        "# TYPE gpuharden_drift_node_not_checked gauge",
    ]
    lines += ['gpuharden_drift_node_not_checked{node="%s"} %d' % (_label(node["node"]), bool(node.get(coverage.NOT_CHECKED)))
              for _host, node in sorted(report["nodes"].items())]
    covered = check_coverage(report)
    lines += [
        "# HELP gpuharden_drift_checked 1 when the check ran wherever the last complete drift run asked for it, 0 when it "
        "could not run somewhere (scope cluster: the cluster side; scope node: on at least one audited node).",
        "# TYPE gpuharden_drift_checked gauge",
    ]
    lines += ['gpuharden_drift_checked{scope="%s",check="%s"} %d' % (_label(scope), _label(check), not blind)
              for (scope, check), blind in sorted(covered.items())]
    lines += [
        "# HELP gpuharden_drift_check_nodes_not_checked Audited nodes where the check, or a part of it, could not run in "
        "the last complete drift run.",
        "# TYPE gpuharden_drift_check_nodes_not_checked gauge",
    ]
    lines += ['gpuharden_drift_check_nodes_not_checked{check="%s"} %d' % (_label(check), blind)
              for (scope, check), blind in sorted(covered.items()) if scope == "node"]
    blind = exit_code(report) == EXIT_NOT_CHECKED
    lines += [
        "# HELP gpuharden_drift_not_checked 1 when the last complete drift run could not check something it was asked to "
        "(a blind cluster side, a node check that could not run, an unreachable or failed node), else 0.",
        "# TYPE gpuharden_drift_not_checked gauge",
        "gpuharden_drift_not_checked %d" % blind,
        "# HELP gpuharden_nodes_unreachable Nodes the last drift run could not reach.",
        "# TYPE gpuharden_nodes_unreachable gauge",
        "gpuharden_nodes_unreachable %d" % report["summary"]["unreachable"],
        "# HELP gpuharden_nodes_failed Nodes whose drift check failed (for example locked by another run).",
        "# TYPE gpuharden_nodes_failed gauge",
        "gpuharden_nodes_failed %d" % report["summary"]["failed"],
        "# HELP gpuharden_last_run_timestamp_seconds When the last complete drift run finished (Unix time); runs that "
        "do not finish write nothing.",
        "# TYPE gpuharden_last_run_timestamp_seconds gauge",
        "gpuharden_last_run_timestamp_seconds %.3f" % report["timestamp"],
        "# HELP %s When the last drift run that completed and checked everything it was asked to finished (Unix time). "
        "An interrupted, timed-out or canceled run leaves this file as it was, and a run that could not check something "
        "keeps the earlier value, so this stops advancing: alert on its age." % LAST_SUCCESS_METRIC,
        "# TYPE %s gauge" % LAST_SUCCESS_METRIC,
    ]
    last_success = previous_last_success(previous) if blind else report["timestamp"]
    if last_success is not None:
        lines.append("%s %.3f" % (LAST_SUCCESS_METRIC, last_success))
    lines += [
        "# HELP gpuharden_last_run_duration_seconds How long the last drift run took.",
        "# TYPE gpuharden_last_run_duration_seconds gauge",
        "gpuharden_last_run_duration_seconds %.3f" % report["duration_seconds"],
        "# HELP %s When the credential of the kubeconfig the drift run's cluster side used expires (Unix time): its "
        "token's JWT exp, or its client certificate's notAfter. Absent when it has none the client can read (a static "
        "token, an exec plugin, the in-cluster ServiceAccount the kubelet renews)." % CREDENTIAL_EXPIRY_METRIC,
        "# TYPE %s gauge" % CREDENTIAL_EXPIRY_METRIC,
    ]
    expires_at = ((report.get("cluster") or {}).get("credential") or {}).get("expires_at")
    if expires_at is not None:
        lines.append("%s %.3f" % (CREDENTIAL_EXPIRY_METRIC, expires_at))
    return "\n".join(lines) + "\n"


def write_atomically(path, text):
    """Temp file in the target's directory, then rename: the collector never reads half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def table(report, width=terminal.DEFAULT_WIDTH):
    """The report for a terminal: what could not be checked first, each finding's reason wrapped to ``width`` (None:
    unwrapped, --wide)."""
    return terminal.render(report, width)


# ---------------------------------------------------------------------------------------------
# Slices: one part of the fleet per run (--slice K/N), and the merge of their reports (drift-merge)


class MergeError(Exception):
    """A set of reports drift-merge refuses to combine; the message names the file."""


def parse_slice(text):
    """--slice K/N as (K, N): K counts from 1, as AWX numbers its job slices; argparse shows the error."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise argparse.ArgumentTypeError("%r is not K/N (this run's slice K of N, whole numbers, 1 <= K <= N)" % text)
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise argparse.ArgumentTypeError("%r: K must be between 1 and N, and N at least 1 (slices are numbered 1..N)" % text)
    return index, count


def slice_of(host, count):
    """The 0-based slice of an inventory host name among ``count``.  sha256, not hash(): Python salts str hashes per
    process, and every pod of an Indexed Job (and every later run) must cut the fleet the same way.  A host keeps its
    slice while others come and go, so a slice's hosts change only by the hosts added or removed."""
    return int.from_bytes(hashlib.sha256(host.encode("utf-8")).digest(), "big") % count


def slice_hosts(hosts, index, count):
    """The hosts of slice ``index`` (1-based) of ``count``, sorted."""
    return sorted(host for host in hosts if slice_of(host, count) == index - 1)


def fleet_digest(hosts):
    """Names the host list a slice was cut from, so the merge can tell slices of different lists apart."""
    return hashlib.sha256("\n".join(sorted(hosts)).encode("utf-8")).hexdigest()


def slice_section(index, count, fleet, hosts):
    return {"index": index, "count": count, "hosts": list(hosts), "fleet_hosts": len(fleet), "fleet_sha256": fleet_digest(fleet)}


def _hosts_of(report):
    return set(report["nodes"]) | set(report["unreachable"]) | set(report["failed"])


def report_error(path, report):
    """The MergeError for what is not a drift report of this schema version, else None.  A report written without
    --slice is one: only drift-merge needs the slice section (to see every slice once), `gpuharden report` does not."""
    if not isinstance(report, dict) or "version" not in report or not all(
            isinstance(report.get(key), dict) for key in ("summary", "nodes", "unreachable", "failed")):
        return MergeError("%s is not a gpuharden drift report (no version, summary, nodes, unreachable and failed)" % path)
    if report["version"] != REPORT_VERSION:
        return MergeError("%s has report schema version %r; this gpuharden reads version %d only" % (path, report["version"], REPORT_VERSION))
    return None


def _check_mergeable(path, report, first):
    """The MergeError for a report that cannot join ``first`` (the first input's (path, report)), else None."""
    error = report_error(path, report)
    if error:
        return error
    if first is not None and report["version"] != first[1]["version"]:
        return MergeError("%s has report schema version %r, %s version %r" % (path, report["version"], first[0], first[1]["version"]))
    part = report.get("slice")
    if not isinstance(part, dict) or not {"index", "count", "hosts", "fleet_sha256"} <= set(part):
        return MergeError("%s is not a slice report (written without --slice): drift-merge combines the reports of "
                          "gpuharden drift --slice 1/N .. N/N" % path)
    if first is None:
        return None
    other = first[1]
    if part["count"] != other["slice"]["count"]:
        return MergeError("%s is slice %d/%d, %s is of %d slices" % (path, part["index"], part["count"], first[0], other["slice"]["count"]))
    if part["fleet_sha256"] != other["slice"]["fleet_sha256"]:
        return MergeError("%s was cut from another host list than %s (%d and %d hosts): the inventory, -l or "
                          "gpuharden_target_hosts changed between the slices" % (path, first[0], part.get("fleet_hosts", -1),
                                                                                    other["slice"].get("fleet_hosts", -1)))
    if report.get("fail_severity") != other.get("fail_severity"):
        return MergeError("%s was checked with --fail-severity %s, %s with %s" % (path, report.get("fail_severity"), first[0],
                                                                                  other.get("fail_severity")))
    return None


def merge_reports(inputs):
    """One report from the slice reports ``inputs`` [(path, report)]: what one unsliced run would have written, but
    for the timings.  Refuses (MergeError) anything else: not a drift report, another schema version, a report without
    --slice, slices of different N, fail severity or host lists, a slice twice or missing, a host in two reports.

    Every slice runs the cluster-side checks (the RuntimeClass dry run, pending pods asking for a resource no node
    advertises), against the same API server, so their cluster findings are kept once per identity (the finding's
    whole content); findings that differ (the cluster changed between the slices' runs) are all kept."""
    if not inputs:
        raise MergeError("no report to merge")
    first, seen_index, owner = None, {}, {}
    for path, report in inputs:
        error = _check_mergeable(path, report, first)
        if error:
            raise error
        first = first or (path, report)
        index = report["slice"]["index"]
        if index in seen_index:
            raise MergeError("%s is slice %d/%d again (also %s)" % (path, index, report["slice"]["count"], seen_index[index]))
        seen_index[index] = path
        for host in sorted(_hosts_of(report) | set(report["slice"]["hosts"])):
            if host in owner:
                raise MergeError("%s and %s both report host %s: slices must not overlap" % (owner[host], path, host))
            owner[host] = path
    count = first[1]["slice"]["count"]
    missing = [index for index in range(1, count + 1) if index not in seen_index]
    if missing:
        raise MergeError("slice(s) %s of %d missing: the merged report would leave their hosts out (given: %s)"
                         % (", ".join(map(str, missing)), count, ", ".join(path for path, _report in inputs)))
    reports = [report for _path, report in sorted(inputs, key=lambda item: item[1]["slice"]["index"])]
    merged = {key: value for key, value in json.loads(json.dumps(reports[0])).items() if key not in ("slice", "remediation")}
    for section in ("nodes", "unreachable", "failed", "node_names"):
        merged[section] = dict(sorted((host, value) for report in reports for host, value in report.get(section, {}).items()))
    merged["cluster"] = merge_cluster([report.get("cluster") or {} for report in reports])
    merged["summary"] = summarize(merged["nodes"], merged["unreachable"], merged["failed"], merged["cluster"], merged["fail_severity"])
    merged[coverage.NOT_CHECKED] = coverage.blind_spots(merged)
    finished = max(report["timestamp"] for report in reports)
    started = min(report["timestamp"] - report["duration_seconds"] for report in reports)
    merged.update(timestamp=finished, generated_at=datetime.datetime.fromtimestamp(finished, datetime.UTC).isoformat(),
                  duration_seconds=round(finished - started, 3))
    remediated = [report for report in reports if "remediation" in report]
    if remediated:
        merged["remediation"] = {"runs": [run for report in remediated for run in report["remediation"]["runs"]],
                                 "before": _sum_summaries([report["remediation"]["before"] for report in remediated])}
    return merged


def merge_cluster(sections):
    """The cluster sections of the slices as one: findings once per identity, checked when any slice checked."""
    findings, seen = [], set()
    for section in sections:
        for entry in section.get("findings") or []:
            identity = json.dumps(entry, sort_keys=True)
            if identity not in seen:
                seen.add(identity)
                findings.append(entry)
    errors = list(dict.fromkeys(section["consistency_error"] for section in sections if section.get("consistency_error")))
    checks = coverage.merge_cluster_checks(sections)
    # every slice used the same kubeconfig, normally: the credential that expires first is the one to renew
    expiring = sorted((section for section in sections if (section.get("credential") or {}).get("expires_at") is not None),
                      key=lambda section: section["credential"]["expires_at"])
    credential = (expiring or [section for section in sections if section.get("credential")] or [{}])[0].get("credential")
    return {"credential": credential, "credential_expires_at": kubeconfig.iso((credential or {}).get("expires_at")),
            "consistency_checked": any(section.get("consistency_checked") for section in sections),
            "consistency_error": "; ".join(errors) or None,
            "runtime_class_checked": checks.get("runtime_class", {}).get("state") == coverage.CHECKED,
            "checks": checks, "findings": findings}


def _sum_summaries(summaries):
    """The --remediate "before" summaries of the slices added up; the cluster's findings, which every slice counts,
    once (the largest count)."""
    total = {}
    for summary in summaries:
        for key, value in summary.items():
            if key == "cluster_findings":
                total[key] = max(total.get(key, 0), value)
            elif isinstance(value, list):
                total[key] = sorted(set(total.get(key, [])) | set(value))
            elif isinstance(value, dict):
                inner = total.setdefault(key, {})
                for name, number in value.items():
                    inner[name] = inner.get(name, 0) + number
            else:
                total[key] = total.get(key, 0) + value
    return total


def read_report(path):
    """A JSON file for drift-merge, or the MergeError naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as error:
        raise MergeError("%s: %s" % (path, error.strerror or error)) from None
    except ValueError as error:
        raise MergeError("%s is not a gpuharden drift report (not JSON: %s)" % (path, error)) from None


# ---------------------------------------------------------------------------------------------
# Running Ansible


def _runner_env():
    """ansible-runner starts ansible-playbook from PATH in a scratch directory: prefer the one beside this Python,
    and keep the ansible.cfg of the directory the user ran us from.  No colour: ansible-runner runs ansible on a
    pseudo-terminal, so ansible would colour its output, and an error read from it (ansible_output) must be plain
    text (ANSIBLE_FORCE_COLOR, from the caller's environment, would win over ANSIBLE_NOCOLOR: it is turned off)."""
    env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    if "ANSIBLE_CONFIG" not in os.environ and os.path.exists("ansible.cfg"):
        env["ANSIBLE_CONFIG"] = os.path.abspath("ansible.cfg")
    return env


def collection_bases():
    """Where Ansible looks for collections, in its order: its collections paths (ansible.cfg, ANSIBLE_COLLECTIONS_PATH),
    then sys.path."""
    if "ANSIBLE_CONFIG" not in os.environ and os.path.exists("ansible.cfg"):
        os.environ["ANSIBLE_CONFIG"] = os.path.abspath("ansible.cfg")
    from ansible import constants  # noqa: PLC0415 (reads ansible.cfg like ansible-playbook does)

    return [os.path.expanduser(base) for base in list(constants.COLLECTIONS_PATHS) + sys.path if base]


def resolve_playbook(name):
    """A playbook path, or the installed collection's playbook file for one of PLAYBOOK_FILES's names."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    if name not in PLAYBOOK_FILES:
        raise DriftError("playbook %s: no such file" % name)
    searched = []
    for base in collection_bases():
        candidate = os.path.join(base, "ansible_collections", "gpuharden", "k8s", "playbooks", PLAYBOOK_FILES[name])
        searched.append(base)
        if os.path.isfile(candidate):
            return candidate
    raise DriftError("the gpuharden.k8s collection is not installed (no playbooks/%s below %s); install it with "
                     "ansible-galaxy collection install" % (PLAYBOOK_FILES[name], ", ".join(searched[:4])))


def _marked_processes(marker):
    """The pids of the live processes of the run ``marker`` (RUN_MARKER=marker in their environment, as read from
    /proc/PID/environ: Linux; elsewhere none are found).  Skipped: processes of other users (unreadable), zombies (an
    empty environ, or gone by the time it is read) and OpenSSH ControlPersist masters (``ssh: PATH [mux]``: they serve
    every run using that socket, hold no lock, and exit on their own when idle)."""
    entry = ("%s=%s" % (RUN_MARKER, marker)).encode()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    pids = []
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as handle:
                environ = handle.read().split(b"\0")
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if entry in environ and not (cmdline.startswith(b"ssh: ") and b"[mux]" in cmdline):
            pids.append(int(name))
    return pids


def _signal_processes(pids, signum):
    """``signum`` to each pid and, for a process group leader (an ansible-playbook worker), to its whole group."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid and pid != os.getpgrp():
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
        except OSError:
            pass  # gone meanwhile, or not ours


def stop_processes(marker, grace=TERMINATE_GRACE):
    """Ends whatever the run ``marker`` left running: SIGTERM, SIGKILL to what is still there ``grace`` seconds later,
    then waits up to ``grace`` more for it to be gone.  Returns the pids found at first (none after a run that ended
    by itself).

    ansible-runner kills only ansible-playbook's process group on cancel or timeout, with SIGKILL, so ansible-playbook
    cannot pass the signal on.  Since ansible-core 2.19 each WorkerProcess calls os.setsid() when it starts (ansible-core
    lib/ansible/executor/process/worker.py, WorkerProcess._detach; a process group of its own at least when 2.21's
    WORKER_SESSION_ISOLATION is off): the workers, and the modules or ssh clients they run, are outside ansible-playbook's
    process group, which only ansible-playbook's own SIGINT/SIGTERM handler reaches
    (lib/ansible/executor/task_queue_manager.py, TaskQueueManager._signal_handler: "the children become process
    leaders").  Orphaned, a worker waiting for its parent (a pause, a prompt, a queue) waits forever, and one running
    a module goes on with it, holding its connection (and a node's run lock) meanwhile.  A worker's SIGTERM handler passes the
    signal on to its own group and exits (WorkerProcess._term)."""
    found = _marked_processes(marker)
    pids = found
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not pids:
            break
        _signal_processes(pids, signum)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _marked_processes(marker)  # again: also the processes a dying one started meanwhile
    return found


def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
    """One ansible-runner run; (status, rc, stats, stdout).  ``cancel``: a callable that says stop (then the status is
    ``canceled``); ``timeout``: seconds, after which ansible-runner kills the run (status ``timeout``).  Whichever way
    it ends, no process of the run is left when this returns (stop_processes)."""
    import ansible_runner  # noqa: PLC0415 (keeps `gpuharden --help` fast)

    marker = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="gpuharden-drift-") as private_data_dir:
        cmdline = []
        if tags:
            cmdline += ["--tags", ",".join(tags)]
        # ansible-runner 2.4 drops a settings= argument when env/settings does not exist (config/_base.py,
        # prepare_env), so the settings go in the file.
        os.makedirs(os.path.join(private_data_dir, "env"))
        with open(os.path.join(private_data_dir, "env", "settings"), "w", encoding="utf-8") as handle:
            json.dump(RUNNER_SETTINGS, handle)
        options = {"cancel_callback": cancel} if cancel is not None else {}
        try:
            runner = ansible_runner.run(
                private_data_dir=private_data_dir,
                envvars=dict(_runner_env(), **{RUN_MARKER: marker}),
                inventory=inventory,
                playbook=playbook,
                limit=limit,
                forks=forks,
                extravars=extravars,
                cmdline=" ".join(cmdline) or None,
                quiet=True,
                event_handler=event_handler,
                timeout=timeout,
                **options,
            )
        finally:
            stop_processes(marker)
        stdout = runner.stdout.read() if runner.stdout else ""
        stats = runner.stats or {}
    return runner.status, runner.rc, stats, stdout


def parse_list_hosts(text):
    """The hosts of `ansible-playbook --list-hosts` output, every play together (the ``hosts (N):`` blocks,
    ansible-core lib/ansible/cli/playbook.py, PlaybookCLI.run)."""
    hosts, inside = set(), False
    for line in text.splitlines():
        if re.match(r"^\s+hosts \(\d+\):\s*$", line):
            inside = True
        elif inside and line.startswith("      ") and line.strip():
            hosts.add(line.strip())
        else:
            inside = False
    return hosts


def play_hosts(playbook, inventory, *, limit, extravars, stop=None, timeout=LIST_HOSTS_TIMEOUT):
    """The hosts the playbook's plays target, as ansible-playbook --list-hosts resolves them (the templated hosts
    pattern, the inventory, --limit); None when that cannot be read.  Only for naming the hosts of a run that did
    not finish, so a further SIGINT/SIGTERM (``stop.count`` grows) or the timeout abandons it, and stops everything
    it started (its session, and any process of it that left the session: stop_processes)."""
    listed = list_hosts(playbook, inventory, limit=limit, extravars=extravars, stop=stop, timeout=timeout)
    return parse_list_hosts(listed[1]) if listed is not None and listed[0] == 0 else None


def list_hosts(playbook, inventory, *, limit, extravars, stop=None, timeout=LIST_HOSTS_TIMEOUT):
    """``ansible-playbook --list-hosts``: (returncode, stdout, stderr), or None when it could not be started or was
    abandoned (a further SIGINT/SIGTERM, or ``timeout`` seconds).  Whichever way it ends, nothing it started is left."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, **_runner_env(), **{RUN_MARKER: marker})
    executable = shutil.which("ansible-playbook", path=env["PATH"])
    if not executable:
        return None
    command = [executable, "--list-hosts", "-i", inventory, "-e", json.dumps(extravars), playbook]
    if limit:
        command += ["--limit", limit]
    signals = stop.count if stop else 0
    deadline = time.monotonic() + timeout
    try:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
    except OSError:
        return None
    output = None
    try:
        while output is None:
            try:
                output = process.communicate(timeout=0.2)
            except subprocess.TimeoutExpired:
                if (stop and stop.count > signals) or time.monotonic() > deadline:
                    break
    finally:
        if output is None:
            # abandoned: its group (start_new_session made it the leader), then what of it is elsewhere, then what
            # of its group stayed without the marker
            _signal_processes([process.pid], signal.SIGTERM)
            stop_processes(marker)
            _signal_processes([process.pid], signal.SIGKILL)
            # a survivor holding a pipe must not keep the wait from returning
            process.stdout.close()
            process.stderr.close()
            process.wait()
        else:
            stop_processes(marker)
    return None if output is None else (process.returncode, output[0], output[1])


def parse_extra_vars(values):
    """-e KEY=VALUE, -e '{"json": 1}' or -e @file.yml/json, like ansible-playbook (later wins)."""
    result = {}
    for value in values or []:
        if value.startswith("@"):
            import yaml  # noqa: PLC0415

            path = value[1:]
            try:
                with open(path, encoding="utf-8") as handle:
                    data = yaml.safe_load(handle) or {}
            except (OSError, yaml.YAMLError) as error:
                raise DriftError("-e %s: %s" % (value, error)) from None
            if not isinstance(data, dict):
                raise DriftError("-e %s: the file must hold a mapping of variables" % value)
            result.update(data)
        elif value.lstrip().startswith("{"):
            try:
                data = json.loads(value)
            except ValueError as error:
                raise DriftError("-e %s: not valid JSON: %s" % (value, error)) from None
            result.update(data)
        else:
            for pair in value.split():
                key, sep, item = pair.partition("=")
                if not sep or not key:
                    raise DriftError("-e %r: give KEY=VALUE, JSON or @FILE" % value)
                result[key] = item
    return result


class _Progress:
    """The run's progress on ``stream`` (stderr), a line per host as it finishes ("[done/seen] host: result").  On a
    terminal, also a status line at once, before any host has finished (a slow fleet can take many seconds to the
    first result), kept below the host lines and rewritten as hosts finish, and cleared by end() before the report is
    printed.  Not in a log or a pipe (not a TTY, or TERM=dumb): there carriage returns and escape codes would be noise,
    so only the host lines go there, as before."""

    CLEAR_LINE = "\r\x1b[K"

    def __init__(self, stream):
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"
        self.started = time.monotonic()
        self.done = self.seen = 0
        if self.live:
            self._write(self._status())

    def __call__(self, done, seen, host, text):
        line = "[%d/%d] %s: %s\n" % (done, seen, host, text)
        if self.live:
            self.done, self.seen = done, seen
            self._write(self.CLEAR_LINE + line + self._status())
        else:
            self._write(line)

    def _status(self):
        seconds = int(time.monotonic() - self.started)
        if not self.seen:
            text = "gpuharden drift: checking, no host finished yet (%d s)" % seconds
        else:
            text = "gpuharden drift: %d of %d host(s) started so far finished (%d s)" % (self.done, self.seen, seconds)
        # one terminal row, or the carriage return would rewrite only its last row
        return text[:max(1, shutil.get_terminal_size((80, 24)).columns - 1)]

    def end(self):
        """Clear the status line (the report comes next); later host lines are plain ones."""
        if self.live:
            self._write(self.CLEAR_LINE)
            self.live = False

    def _write(self, text):
        self.stream.write(text)
        self.stream.flush()


def _progress(stream):
    return _Progress(stream)


def stopped(args, stop, deadline, status=None):
    """(reason, exit code) when the run must end here without a report, else None.  Before a playbook (``status``
    None): a signal came or the --timeout is used up; after one: a signal, or a runner status of a run that did not
    get to its end (timeout, canceled, anything but successful/failed)."""
    if stop is not None and stop.requested():
        return "interrupted by %s" % stop.name(), stop.exit_code()
    if status == "timeout" or (status is None and deadline is not None and time.monotonic() >= deadline):
        return "timed out (--timeout %s s)" % args.timeout, EXIT_INCOMPLETE
    if status is not None and status not in FINISHED_STATUSES:
        return "ansible-runner ended the run with status %s" % status, EXIT_INCOMPLETE
    return None


def runner_timeout(deadline):
    """ansible-runner's timeout= for a playbook started now: the whole seconds left of --timeout (at least 1)."""
    return None if deadline is None else max(1, math.ceil(deadline - time.monotonic()))


def incomplete(args, extravars, limit, outcomes, stop, reason, code):
    """The Incomplete of a drift check that stopped: every host of the play without a final result named, from the
    run's events and, for hosts not started yet, from the play's host list."""
    listed = play_hosts(args.playbook, args.inventory, limit=limit, extravars=extravars, stop=stop)
    done = outcomes.done()
    return Incomplete(reason, code, pending=(outcomes.play_hosts() | (listed or set())) - done, checked=done,
                      hosts_known=listed is not None)


def check(args, extravars, stream, limit, stop=None, deadline=None):
    progress = None if args.quiet else _progress(stream)
    outcomes = Outcomes(progress=progress)
    try:
        return _check(args, extravars, stream, limit, stop, deadline, outcomes)
    finally:
        if progress is not None:
            progress.end()


def _check(args, extravars, stream, limit, stop, deadline, outcomes):
    before = stopped(args, stop, deadline)
    if before:
        raise incomplete(args, extravars, limit, outcomes, stop, *before)
    started = time.time()
    cluster = cluster_side_runner()
    if cluster is not None:
        extravars = dict(extravars, gpuharden_drift_cluster_in_process=True)
    status, rc, _stats, stdout = run_playbook(args.playbook, args.inventory, limit=limit, forks=args.forks,
                                              extravars=extravars, event_handler=outcomes.feed,
                                              cancel=stop.requested if stop is not None else None, timeout=runner_timeout(deadline))
    finished = time.time()
    after = stopped(args, stop, deadline, status)
    if after:
        raise incomplete(args, extravars, limit, outcomes, stop, *after)
    if not outcomes.seen:
        raise not_run("the drift check", args.inventory, limit, outcomes.plays.unmatched(), status, rc, stdout)
    if not outcomes.finished():
        # killed, crashed or stopped by a play-wide error: the hosts it had not got to have no result, and the
        # cluster-wide checks at the end of the play did not run for any host
        error = incomplete(args, extravars, limit, outcomes, stop, "ansible-playbook stopped before the end of the play "
                           "(%s)" % ansible_output.describe_exit(status, rc), EXIT_INCOMPLETE)
        error.details = ansible_output.error_excerpt(stdout)
        raise error
    outcomes.close()
    if cluster is not None and outcomes.consistency_options is not None:
        run_cluster_side(cluster, outcomes, lambda: stopped(args, stop, deadline) is not None)
        interrupted = stopped(args, stop, deadline)
        if interrupted:
            # the play is complete, but not the cluster-wide checks: no report, as for a play cut short
            raise Incomplete(*interrupted, checked=outcomes.done())
        finished = time.time()
    outcomes.credential = cluster_credential(outcomes)
    return build_report(outcomes, inventory=args.inventory, limit=limit, fail_severity=args.fail_severity,
                        started=started, finished=finished, node_names=outcomes.node_names)


def cluster_credential(outcomes):
    """The credential the run's cluster side used (its kubeconfig, from the play's hand-over or the module's
    arguments) and when it expires; None where no cluster side ran."""
    options = outcomes.consistency_options if outcomes.consistency_options is not None else outcomes.consistency_invocation
    if not isinstance(options, dict):
        return None
    path = options.get("kubeconfig")
    if path is not None and not isinstance(path, str):
        return {"kubeconfig": None, "kind": "unknown", "expires_at": None, "note": "a kubeconfig given as a dictionary"}
    return kubeconfig.credential_expiry(path, options.get("context"))


def cluster_side_runner():
    """A cluster_side.Runner for the installed collection (its import starts now, beside the play), or None where the
    collection is not below Ansible's collections paths: the playbook then runs the gpu_consistency module itself."""
    from gpuharden import cluster_side  # noqa: PLC0415

    base = cluster_side.collection_base(collection_bases())
    return cluster_side.Runner(base) if base else None


def run_cluster_side(cluster, outcomes, interrupted=lambda: False, poll=CLUSTER_SIDE_POLL):
    """The consistency check (and the RuntimeClass dry run in it) here, from the play's hand-over in ``outcomes``.  A
    check that cannot run is the report's consistency_error, and its RuntimeClass dry run a failed check, as when the
    module run fails.

    It runs in a thread while this one polls ``interrupted()`` (a signal, --timeout): then it is left behind (its
    requests end with the process) and ``outcomes`` is not touched; the caller reports the run as incomplete."""
    from gpuharden import cluster_side  # noqa: PLC0415

    done = {}

    def work():
        try:
            done["result"] = cluster.run(outcomes.consistency_options, outcomes.node_reports)
        except cluster_side.ClusterSideError as error:
            done["error"] = error

    thread = threading.Thread(target=work, name="gpuharden-cluster-side", daemon=True)
    thread.start()
    while thread.is_alive():
        if interrupted():
            return
        thread.join(poll)
    try:
        if "result" not in done:
            raise done.get("error") or cluster_side.ClusterSideError("the consistency check ended without a result")
        outcomes.take_consistency(done["result"])
    except cluster_side.ClusterSideError as error:
        outcomes.consistency_error = " ".join(str(error).split())[:500]
        outcomes.consistency_access = error.access
        if (outcomes.consistency_options or {}).get("runtime_class") is not None and outcomes.runtime_class is None:
            # the dry run rides in the consistency check's run: it did not run either, for the same reason
            outcomes.runtime_class = {"failed": True, "msg": outcomes.consistency_error, "access": error.access}


def check_slice(args, extravars, stream, stop=None, deadline=None):
    """The drift check of --slice K/N's hosts only: the play's hosts (its pattern, -l) from ansible-playbook
    --list-hosts, cut by slice_of, and handed to the run as its --limit, so the other slices' hosts are never contacted.
    A slice without hosts is an empty report; a fleet without hosts is the usual "no host to check" (exit 2)."""
    index, count = args.slice
    stopped_before = stopped(args, stop, deadline)
    if stopped_before:
        raise Incomplete(*stopped_before, hosts_known=False)
    listed = list_hosts(args.playbook, args.inventory, limit=args.limit, extravars=extravars, stop=stop,
                        timeout=runner_timeout(deadline) or SLICE_LIST_TIMEOUT)
    if listed is None:
        reason = stopped(args, stop, deadline) or ("listing the play's hosts took over %d s" % SLICE_LIST_TIMEOUT, EXIT_INCOMPLETE)
        raise Incomplete(reason[0] + " (listing the hosts to slice)", reason[1], hosts_known=False)
    returncode, stdout, stderr = listed
    output = ansible_output.strip_ansi(stderr + "\n" + stdout)
    if returncode != 0 and any(text in output for text in ansible_output.NO_HOSTS_TEXTS):
        # -l matched no host: nothing to contact, and the ordinary run says so in its words
        return check(args, extravars, stream, args.limit, stop, deadline)
    if returncode != 0:
        excerpt = ansible_output.error_excerpt(output)
        raise DriftError("--slice %d/%d: ansible-playbook --list-hosts could not list the hosts to slice (exit %d)%s" % (
            index, count, returncode, (":\n" + ansible_output.indent(excerpt)) if excerpt else ""))
    fleet = parse_list_hosts(stdout)
    if not fleet:
        # nothing to contact: the ordinary run says which pattern or -l matched no host
        return check(args, extravars, stream, args.limit, stop, deadline)
    hosts = slice_hosts(fleet, index, count)
    part = slice_section(index, count, fleet, hosts)
    if not hosts:
        stream.write("gpuharden drift: slice %d/%d has no host (the fleet has %d): an empty report, nothing checked; "
                     "the other slices check the fleet\n" % (index, count, len(fleet)))
        stream.flush()
        now = time.time()
        report = build_report(Outcomes(), inventory=args.inventory, limit=args.limit, fail_severity=args.fail_severity,
                              started=now, finished=now)
        return dict(report, slice=part)
    if not args.quiet:
        stream.write("gpuharden drift: slice %d/%d: %d of %d host(s)\n" % (index, count, len(hosts), len(fleet)))
        stream.flush()
    with tempfile.TemporaryDirectory(prefix="gpuharden-slice-") as scratch:
        # a file, not a comma list: a slice of a large fleet outgrows one command-line argument (128 KiB on Linux)
        limit_file = os.path.join(scratch, "limit")
        with open(limit_file, "w", encoding="utf-8") as handle:
            handle.write("".join(host + "\n" for host in hosts))
        report = check(args, extravars, stream, "@" + limit_file, stop, deadline)
    return dict(report, limit=args.limit, slice=part)


def not_run(what, inventory, limit, unmatched, status, rc, stdout):
    """The DriftError of a playbook run that ran nothing on any host: no host to work on (which pattern or -l matched
    nothing; ``unmatched``: the hosts patterns of the plays that matched no host), or ansible-playbook's first error
    lines, with its exit code in words."""
    found = ansible_output.no_hosts(stdout, inventory=inventory, limit=limit, unmatched_plays=unmatched,
                                    pattern_variable=TARGET_VARIABLE)
    if found:
        kind, reason = found
        hint = {"inventory": "check -i and ansible's warnings about it",
                "limit": "give -l hosts or groups of the inventory",
                "pattern": "put the GPU nodes in the group %s names (default %s), or set it: -e %s=GROUP%s"
                           % (TARGET_VARIABLE[0], TARGET_VARIABLE[1], TARGET_VARIABLE[0], ", or widen -l" if limit else "")}[kind]
        return DriftError("no host to run %s on: %s.  Nothing was checked or changed; %s" % (what, reason, hint))
    excerpt = ansible_output.error_excerpt(stdout)
    return DriftError("ansible-playbook ran %s on no host (%s)%s" % (
        what, ansible_output.describe_exit(status, rc), (":\n" + ansible_output.indent(excerpt)) if excerpt else ", and printed nothing"))


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
        reason = stopped(args, stop, deadline, status)
        if reason:
            # the remediated hosts' state is unknown until they are checked again; the others' results are final
            # but the report is not written without them
            raise Incomplete(reason[0] + " during --remediate (harden_gpu_nodes.yml may have stopped part way)", reason[1],
                             pending=set(hosts), checked=set(report["nodes"]) - set(hosts))

    stop_here()
    if not args.quiet:
        stream.write("remediating %s: stages %s\n" % (", ".join(hosts), ", ".join(stages)))
    changed = {}
    plays = PlayTracker()

    def handler(event):
        plays.feed(event)
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and (data.get("res") or {}).get("changed"):
            changed[data["host"]] = changed.get(data["host"], 0) + 1
        return True

    status, rc, stats, stdout = run_playbook(args.harden_playbook, args.inventory, limit=",".join(hosts), forks=args.forks,
                                             extravars=dict(base_vars, gpuharden_skip_compliant_stages=True), tags=stages,
                                             event_handler=handler, cancel=stop.requested if stop is not None else None,
                                             timeout=runner_timeout(deadline))
    stop_here(status)
    if plays.first_unmatched():
        # the drift check just ran on these hosts: harden's own pattern (gpuharden_target_hosts) leaves them out
        raise not_run("harden_gpu_nodes.yml (--remediate)", args.inventory, ",".join(hosts), plays.plays[0][:1], status, rc, stdout)
    entry = {"hosts": hosts, "stages": stages, "stages_by_host": dict(sorted(by_host.items())), "status": status, "rc": rc, "changed_tasks": changed,
             "failures": sorted(set(stats.get("failures", {})) | set(stats.get("dark", {})))}
    if rc:
        entry["error"] = ansible_output.error_excerpt(stdout)
        stream.write("gpuharden drift: harden_gpu_nodes.yml on %s failed (%s)%s\n" % (
            ", ".join(hosts), ansible_output.describe_exit(status, rc),
            (":\n" + ansible_output.indent(entry["error"])) if entry["error"] else ""))
        stream.flush()
    return [entry]


def explain_incomplete(error, args, stream):
    """What an incomplete run says on stderr: why, that nothing was written, and the hosts without a final result.
    Never a table or a summary line (a consumer of stdout must not mistake it for a report)."""
    files = [path for path in (args.report, args.prometheus, getattr(args, "html", None)) if path]
    lines = ["gpuharden drift: INCOMPLETE, %s: no report written%s" % (
        error.reason, (" (left as they were: %s)" % ", ".join(files)) if files else "")]
    if error.details:
        lines.append("gpuharden drift: ansible-playbook said:\n" + ansible_output.indent(error.details))
    if error.pending:
        lines.append("gpuharden drift: no final result for %d host(s): %s" % (len(error.pending), ", ".join(error.pending)))
    elif error.hosts_known:
        lines.append("gpuharden drift: every host had answered, but the run was stopped before its report")
    if not error.hosts_known:
        lines.append("gpuharden drift: the play's host list could not be read: hosts the run had not started are not named")
    if error.checked:
        lines.append("gpuharden drift: answered before the stop, not reported: %s" % ", ".join(error.checked))
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def run(args, stream=None, out=None):
    stream, out = stream or sys.stderr, out or sys.stdout  # looked up now: tests and callers may have replaced them
    with StopRequest() as stop:
        try:
            return _run(args, stream, out, stop)
        except Incomplete as error:
            explain_incomplete(error, args, stream)
            return error.code


def _run(args, stream, out, stop):
    deadline = time.monotonic() + args.timeout if getattr(args, "timeout", None) else None
    if not os.path.exists(args.inventory):
        raise DriftError("inventory %s does not exist" % args.inventory)
    try:
        import ansible_runner  # noqa: F401, PLC0415
    except ImportError:
        raise DriftError("gpuharden drift needs ansible-runner (pip install ansible-runner)") from None
    extravars = parse_extra_vars(args.extra_vars)
    args.playbook = resolve_playbook(args.playbook)
    if args.remediate:
        args.harden_playbook = resolve_playbook(args.harden_playbook)
    args.inventory = os.path.abspath(args.inventory)
    owner = "drift@%s:%d:%s" % (socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8])
    # the run data play of drift_check.yml is for ansible-playbook and AWX: the results come from the events here
    extravars.update(gpuharden_drift_fail=False, gpuharden_drift_run_data=False, gpuharden_run_owner=owner)
    report = check_slice(args, extravars, stream, stop, deadline) if getattr(args, "slice", None) else \
        check(args, extravars, stream, args.limit, stop, deadline)
    if args.remediate:
        before = report
        base = dict(extravars)
        base.pop("gpuharden_drift_fail")
        base.pop("gpuharden_drift_run_data")
        base["gpuharden_run_owner"] = owner.replace("drift@", "remediate@")
        runs = remediate(args, before, base, stream, stop, deadline)
        if runs:
            hosts = sorted({host for entry in runs for host in entry["hosts"]})
            after = check(args, extravars, stream, ",".join(hosts), stop, deadline)
            report = merge_after_remediation(before, after)
        report["remediation"] = {"runs": runs, "before": before["summary"]}
    # The last point where a signal still means "no report"; once writing starts the run is complete, and a
    # signal from here on changes nothing (each file is replaced whole, by rename).
    if stop.requested():
        raise Incomplete("interrupted by %s" % stop.name(), stop.exit_code(), checked=report.get("node_names", {}))
    if (args.report or getattr(args, "html", None)) and not getattr(args, "no_explain", False):
        # the failing GPU pods, each with its cause, from this run's node audits: for the people who read the files
        from gpuharden import explain  # noqa: PLC0415 (explain imports this module)

        report["explanations"] = explain.for_drift_report(report, extravars)
    if args.report:
        write_atomically(args.report, json.dumps(report, indent=2, sort_keys=True) + "\n")
    if args.prometheus:
        write_atomically(args.prometheus, prometheus_text(report, read_previous(args.prometheus)))
    if getattr(args, "html", None):
        from gpuharden import report_html  # noqa: PLC0415 (report_html imports this module)

        write_atomically(args.html, report_html.render(report))
    show(report, args, out, stream)
    return exit_code(report)


def read_previous(path):
    """The text of the metrics file a run is about to replace, or None (none yet, unreadable)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None


def show(report, args, out, stream):
    """The report on stdout: JSON, or the table, which opens with what could not be checked.  With --json, that line
    goes to stderr, so that it still comes first where a person reads."""
    if args.json:
        line = coverage.headline(report.get(coverage.NOT_CHECKED) or [])
        if line:
            stream.write("gpuharden drift: %s\n" % line)
            stream.flush()
        out.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        out.write(table(report, None if getattr(args, "wide", False) else terminal.terminal_width()) + "\n")


def merge_after_remediation(before, after):
    """The report after --remediate: the re-checked hosts replaced, everything else as first seen."""
    merged = json.loads(json.dumps(before))
    for section in ("nodes", "unreachable", "failed"):
        for host in list(after["nodes"]) + list(after["unreachable"]) + list(after["failed"]):
            merged[section].pop(host, None)
        merged[section].update(after[section])
    merged["node_names"] = dict(sorted(dict(before.get("node_names", {}), **after.get("node_names", {})).items()))
    merged["cluster"] = after.get("cluster", merged.get("cluster"))
    merged["summary"] = summarize(merged["nodes"], merged["unreachable"], merged["failed"], merged.get("cluster") or {}, merged["fail_severity"])
    merged[coverage.NOT_CHECKED] = coverage.blind_spots(merged)
    merged["timestamp"] = after["timestamp"]
    merged["generated_at"] = after["generated_at"]
    merged["duration_seconds"] = round(after["timestamp"] - before["timestamp"] + before["duration_seconds"], 3)
    return merged


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
    parser.add_argument("--slice", type=parse_slice, metavar="K/N",
                        help="check only slice K of N (1 <= K <= N) of the hosts: those whose sha256(inventory host name) mod N "
                             "is K-1, so N runs (N controllers, or the pods of an Indexed Job) share a fleet and never contact "
                             "each other's hosts; combine their --report files with gpuharden drift-merge")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--no-explain", action="store_true", help="leave out of --report and --html the failing GPU pods' explanations "
                        "(gpuharden explain --failing over this run's node audits: one LIST of pods and one of Nodes more)")
    parser.add_argument("--wide", action="store_true", help="do not wrap the table to the terminal's width (COLUMNS): one line per field")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--playbook", default=DRIFT_PLAYBOOK, help=argparse.SUPPRESS)
    parser.add_argument("--harden-playbook", default=HARDEN_PLAYBOOK, help=argparse.SUPPRESS)
    parser.set_defaults(handler=main)
    return parser


def main(args):
    if args.forks < 1:
        print("gpuharden drift: --forks must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.timeout is not None and args.timeout < 1:
        print("gpuharden drift: --timeout must be at least 1 second", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except KeyboardInterrupt:
        # only before run() installs its handlers (or after it put the previous ones back): nothing was written
        print("gpuharden drift: INCOMPLETE, interrupted by SIGINT: no report written", file=sys.stderr)
        return EXIT_SIGNAL_BASE + signal.SIGINT
    except DriftError as error:
        print("gpuharden drift: %s" % error, file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        print("gpuharden drift: %s" % error, file=sys.stderr)
        return EXIT_USAGE


MERGE_DESCRIPTION = """\
Combine the JSON reports of `gpuharden drift --slice 1/N` .. `N/N` into the report one unsliced run would have
written (only the timings differ: the merged run started with the earliest slice and finished with the latest), and
write it as JSON, Prometheus textfile-collector metrics and HTML, as gpuharden drift does.

The cluster-side findings (the RuntimeClass, pods asking for a resource no node advertises), which every slice
checks against the same API server, appear once: findings with the same content are one finding.

Refused, with nothing written: a file that is not a gpuharden drift report or was written without --slice, reports
of another schema version, slices of different N, --fail-severity or host lists (the inventory or -l changed
between the slices), a slice given twice or missing, a host in two reports.
"""
MERGE_EPILOG = """\
examples:
  the slices of an Indexed Job, on a shared volume, as one report and one metrics file:
    gpuharden drift-merge /var/lib/gpuharden/slices/*.json --report /var/lib/gpuharden/drift-report.json \\
        --prometheus /var/lib/gpuharden/gpuharden.prom

exit codes:
  0    merged: every node of every slice answered and is clean, no cluster finding
  1    merged: some node drifted or needs attention, or a cluster finding (as for gpuharden drift)
  4    merged: something was not checked in some slice (a blind cluster side, a node check, a node unreachable or
       failed), as for gpuharden drift
  2    refused (the message names the file and why) or a file could not be read or written: nothing written
"""


def add_merge_parser(commands):
    parser = commands.add_parser("drift-merge", help="merge the JSON reports of gpuharden drift --slice runs into one report",
                                 description=MERGE_DESCRIPTION, epilog=MERGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", metavar="REPORT.json", help="the --report files of every slice, 1/N to N/N")
    parser.add_argument("--report", metavar="FILE.json", help="write the merged JSON report here")
    parser.add_argument("--prometheus", metavar="FILE.prom", help="write the merged Prometheus textfile-collector metrics here")
    parser.add_argument("--html", metavar="FILE.html", help="write the merged report as a self-contained HTML page here")
    parser.add_argument("--json", action="store_true", help="print the merged JSON report instead of the table")
    parser.add_argument("--wide", action="store_true", help="do not wrap the table to the terminal's width (COLUMNS)")
    parser.set_defaults(handler=merge_main)
    return parser


def merge_main(args, out=None):
    out = out or sys.stdout
    try:
        merged = merge_reports([(path, read_report(path)) for path in args.reports])
        # every output rendered before the first is written: a refusal or a rendering error leaves all as they were
        outputs = [(args.report, lambda: json.dumps(merged, indent=2, sort_keys=True) + "\n"),
                   (args.prometheus, lambda: prometheus_text(merged, read_previous(args.prometheus)))]
        if args.html:
            from gpuharden import report_html  # noqa: PLC0415 (report_html imports this module)

            outputs.append((args.html, lambda: report_html.render(merged)))
        texts = [(path, render()) for path, render in outputs if path]
        for path, text in texts:
            write_atomically(path, text)
    except MergeError as error:
        print("gpuharden drift-merge: %s; nothing written" % error, file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        print("gpuharden drift-merge: %s" % error, file=sys.stderr)
        return EXIT_USAGE
    show(merged, args, out, sys.stderr)
    return exit_code(merged)
