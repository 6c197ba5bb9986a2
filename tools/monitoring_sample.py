# SPDX-License-Identifier: GPL-3.0-or-later
"""Print the Prometheus textfile `gpuharden drift --prometheus` writes, for a sample fleet.

The report is built by the real code path (drift_report.Outcomes fed with ansible-runner events, drift_report.build_report,
drift_metrics.prometheus_text), so `make monitoring-check` lints exactly what the CLI writes (promtool check metrics) and
tests/unit/test_monitoring.py checks deploy/monitoring's alerts and dashboard against it.  The fleet has one node
in every state: clean, drift, attention with a GPU isolation breach, attention, unreachable and failed, plus a
cluster (RuntimeClass) finding and a token that expires in 20 days.

    python tools/monitoring_sample.py | promtool check metrics
"""

from __future__ import annotations

import sys

from gpuharden import drift_metrics, drift_report

STARTED, FINISHED = 1_700_000_000.0, 1_700_000_754.25
NODE_NAMES = {"gpu-b": "node-b"}


def _finding(ident, check, severity, stage, remediable, **extra):
    return dict({"id": ident, "check": check, "stage": stage, "severity": severity, "expected": "e", "found": "f",
                 "hint": "h", "remediable": remediable}, **extra)


def _event(kind, host, action="gpuharden.k8s.node_audit", **res):
    return {"event": kind, "event_data": {"host": host, "task_action": action, "task": "Audit the node", "res": res}}


def _audit(host, findings):
    return _event("runner_on_ok", host, findings=findings, summary={"findings": len(findings)}, checks={}, seconds=0.5)


def sample_outcomes():
    outcomes = drift_report.Outcomes()
    hosts = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f")
    for host in hosts:
        outcomes.feed(_event("runner_on_start", host))
    # clean: an informational finding only (below the default --fail-severity warning)
    outcomes.feed(_audit("gpu-a", [_finding("gpu_access", "device_cgroups", "info", "postcheck", False)]))
    # drift: what harden fixes
    outcomes.feed(_audit("gpu-b", [
        _finding("device_node_permissions", "device_nodes", "error", "device_permissions", True, path="/dev/nvidia0"),
        _finding("device_char_link", "device_nodes", "warning", "device_permissions", True, path="/dev/char/195:0"),
        _finding("kubelet_setting", "kubelet", "warning", "kubelet_topology", True, subject="topologyManagerPolicy"),
    ]))
    # attention, with a GPU isolation breach (device_cgroup_audit's default severity for it: critical)
    outcomes.feed(_audit("gpu-c", [
        _finding("isolation_breach", "device_cgroups", "critical", "postcheck", False, gpu=1, pod="uid-1"),
        _finding("privileged_container", "device_cgroups", "error", "postcheck", False, pod="uid-2"),
    ]))
    # attention: hardware
    outcomes.feed(_audit("gpu-d", [_finding("pcie_link_degraded", "nvml", "warning", "postcheck", False, gpu=0)]))
    outcomes.feed(_event("runner_on_unreachable", "gpu-e", msg="Failed to connect to the host via ssh: timed out"))
    outcomes.feed(_event("runner_on_failed", "gpu-f", action="gpuharden.k8s.node_lock",
                         msg="node_lock: the node is locked by harden@ctl"))
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.gpu_consistency", findings=[
        dict(_finding("gpu_not_advertised", "consistency", "error", "device_plugin", True, gpu=None, pod=None), node="node-b"),
    ]))
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.runtime_class", changed=True, findings=[
        _finding("runtime_class_handler_mismatch", "runtime_class", "error", "runtime_class", False, repair="recreate (force)",
                 subject="RuntimeClass nvidia"),
    ]))
    outcomes.feed({"event": "playbook_on_stats", "event_data": {"processed": dict.fromkeys(hosts, 1)}})
    return outcomes


# The cluster side's kubeconfig holds a token that expires 20 days after the run (its JWT exp).
CREDENTIAL_EXPIRES_AT = FINISHED + 20 * 86400


def sample_report():
    outcomes = sample_outcomes()
    outcomes.credential = {"kubeconfig": "/etc/gpuharden/kubeconfig", "kind": "token", "expires_at": CREDENTIAL_EXPIRES_AT, "note": None}
    return drift_report.build_report(outcomes, inventory="inventory", limit=None, fail_severity="warning",
                              started=STARTED, finished=FINISHED, node_names=NODE_NAMES)


# The sample fleet has an unreachable and a failed node, so its run is not a success: the textfile keeps the last
# success of an earlier run, an hour before this one finished.
PREVIOUS_SUCCESS = FINISHED - 3600


def sample_text():
    return drift_metrics.prometheus_text(sample_report(), "gpuharden_last_success_timestamp_seconds %.3f\n" % PREVIOUS_SUCCESS)


def main():
    sys.stdout.write(sample_text())


if __name__ == "__main__":
    main()
