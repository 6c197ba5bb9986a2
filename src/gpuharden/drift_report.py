# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden drift`'s report model: ansible-runner events folded into per-host outcomes (Outcomes, PlayTracker:
pure, tested without Ansible), the JSON report built from them (build_report, summarize, the kept and cluster
findings), the exit code a report stands for, and the report after --remediate.  Written with write_atomically.

Imports no other drift module: the HTML page, the terminal, the metrics and the merge all build on it.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile

from gpuharden import coverage, kubeconfig
from gpuharden.severity import counted

# The JSON report's schema; drift-merge only combines reports of the version it writes.
REPORT_VERSION = 1
# The audit of a node: drift_check.yml runs it through the stage engine, plan only (node_stages: node_audit's result with
# the plan and the node's name); node_audit's own result is an audit too (a run of an older collection, the tests' events).
AUDIT_ACTIONS = ("gpuharden.k8s.node_stages", "node_stages", "gpuharden.k8s.node_audit", "node_audit")
CONSISTENCY_ACTIONS = ("gpuharden.k8s.gpu_consistency", "gpu_consistency")
RUNTIME_CLASS_ACTIONS = ("gpuharden.k8s.runtime_class", "runtime_class")
# the plan's one LIST of the GPU pods: node_plan_pods (playbooks/tasks/node_plan_inputs.yml) runs gpu_pods_info; the module's own
# result is that LIST too (a run of an older collection, the tests' events)
GPU_PODS_ACTIONS = ("gpuharden.k8s.node_plan_pods", "node_plan_pods", "gpuharden.k8s.gpu_pods_info", "gpu_pods_info")
# drift_check.yml's decisions (the collection's drift_play action): its start step names each host's Node, its cluster
# step carries the consistency check's module result, or the hand-over to run_cluster_side, and the RuntimeClass dry run
DRIFT_PLAY_ACTIONS = ("gpuharden.k8s.drift_play", "drift_play")
# Where the consistency check ran, as its result says (the collection's module_utils/cluster/_consistency_run.py,
# RAN_IN_MODULE and RAN_IN_CONTROLLER; tests/unit/test_drift_parity.py pins them equal): the report's cluster.ran_in.
RAN_IN_MODULE = "module"
RAN_IN_CONTROLLER = "controller process"
EXIT_CLEAN, EXIT_DRIFT, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_NOT_CHECKED = 0, 1, 2, 3, 4
# A run stopped by a signal exits 128 + the signal's number, as a shell reports a process the signal killed.
EXIT_SIGNAL_BASE = 128



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
        # where the consistency check ran (its result's ran_in): RAN_IN_MODULE, RAN_IN_CONTROLLER, or None where it did not
        self.consistency_ran_in = None
        # the requests to the API server the cluster-side checks sent again (throttled, failed or broken: their
        # results' api_retries, _k8s.RESULT_COUNTERS), in the play's modules and in this process
        self.api_retries = 0
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
        if isinstance(result.get("api_retries"), int):
            self.api_retries += result["api_retries"]
        if kind == "runner_on_unreachable" and host not in self.done():
            self.unreachable[host] = event_message(result) or "unreachable"
            self._report(host, "UNREACHABLE: %s" % self.unreachable[host])
        elif kind == "runner_on_failed" and not data.get("ignore_errors") and host not in self.done():
            self.failed[host] = "%s: %s" % (data.get("task", "task"), event_message(result) or "failed")
            self._report(host, "FAILED: %s" % self.failed[host])
        elif kind == "runner_on_ok" and data.get("task_action") in RUNTIME_CLASS_ACTIONS:
            if not result.get("skipped"):
                self.runtime_class = result
        elif kind == "runner_on_ok" and data.get("task_action") in CONSISTENCY_ACTIONS:
            if result.get("skipped"):
                return True
            self.take_module_consistency(result, (result.get("invocation") or {}).get("module_args") or {})
        elif kind == "runner_on_ok" and data.get("task_action") in DRIFT_PLAY_ACTIONS:
            self.take_drift_play(result)
        elif kind == "runner_on_ok" and data.get("task_action") in GPU_PODS_ACTIONS:
            if not result.get("skipped") and "pod_uids_by_node" not in result:
                self.pods_error = {"cause": event_message(result) or "gpu_pods_info failed", "access": result.get("access")}
        elif kind == "runner_on_ok" and data.get("task_action") in AUDIT_ACTIONS:
            self.audited[host] = {"findings": result.get("findings", []), "summary": result.get("summary", {}),
                                  "checks": result.get("checks", {}), "seconds": result.get("seconds"),
                                  "cpu_seconds": result.get("cpu_seconds")}
            summary = result.get("summary", {})
            self._report(host, "%d finding(s)%s" % (summary.get("findings", 0),
                                                     (", max " + summary["max_severity"]) if summary.get("max_severity") else ""))
        return True

    def take_drift_play(self, result):
        """A drift_play step's result: the Node names (step=start); the consistency check's module result, or its
        options and the node reports handed over, and the RuntimeClass dry run run by itself (step=cluster)."""
        if isinstance(result.get("node_names"), dict):
            self.node_names.update(result["node_names"])
        if result.get("consistency_options") is not None:
            self.consistency_options = result["consistency_options"]
            self.node_reports = result.get("node_reports")
        if isinstance(result.get("consistency"), dict):
            self.take_module_consistency(result["consistency"], result.get("consistency_identity") or {})
        if isinstance(result.get("runtime_class"), dict):
            self.runtime_class = result["runtime_class"]

    def take_module_consistency(self, result, identity):
        """gpu_consistency's result where the play ran the module (``identity``: its kubeconfig and context), answered
        or failed (failed_when: false, or a failed run inside drift_play's cluster step)."""
        self.consistency_invocation = identity
        self.consistency_ran_in = RAN_IN_MODULE
        if result.get("failed_when_result") or result.get("failed") or "findings" not in result:
            self.consistency_error = event_message(result) or "gpu_consistency failed"
            self.consistency_access = result.get("access")
        else:
            self.take_consistency(result)

    def take_consistency(self, result):
        """A gpu_consistency result that answered, from the module run or from run_cluster_side."""
        self.consistency = result["findings"]
        self.consistency_ran_in = result.get("ran_in") or self.consistency_ran_in
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


def event_message(result):
    message = result.get("msg") or result.get("stderr") or ""
    return " ".join(str(message).split())[:500]



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
                       "ran_in": outcomes.consistency_ran_in, "api_retries": outcomes.api_retries,
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
        # the node label of every host of the run, unreachable and failed ones included (drift_play named them on the
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
