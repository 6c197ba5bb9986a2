# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden drift: events -> outcomes -> report, exit codes, the Prometheus file and the table."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding as model_finding

from gpuharden import cli, drift_metrics, drift_report, drift_run, drift_terminal


def _finding(ident, check, severity, stage="device_permissions", remediable=True, **extra):
    return dict({"id": ident, "check": check, "stage": stage, "severity": severity, "expected": "e", "found": "f",
                 "hint": "h", "remediable": remediable}, **extra)


def _event(kind, host, action="gpuharden.k8s.node_stages", **res):
    return {"event": kind, "event_data": {"host": host, "task_action": action, "task": "Audit the node", "res": res}}


def _outcomes():
    outcomes = drift_report.Outcomes()
    hosts = ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.drift_play", node_names={host: host for host in hosts}))
    outcomes.feed(_event("runner_on_ok", "gpu-a", findings=[], summary={"findings": 0}, checks={}, seconds=0.1))
    outcomes.feed(_event("runner_on_ok", "gpu-b", findings=[
        _finding("device_node_permissions", "device_nodes", "error", path="/dev/nvidia0"),
        _finding("device_char_link", "device_nodes", "warning"),
        _finding("gpu_access", "device_cgroups", "info", stage="postcheck", remediable=False),
        _finding("kubelet_setting", "kubelet", "error", stage="kubelet_topology", subject='topology"Manager'),
    ], summary={"findings": 4, "max_severity": "error"}, checks={"device_nodes": {"status": "drift"}}, seconds=0.2))
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.gpu_consistency", findings=[
        model_finding("gpu_not_advertised", "error", 2, 0, "h", node="node-b", gpu=None, pod=None),
        model_finding("gpu_process_unattributed", "warning", "x", "y", "h", node="node-b", gpu={"index": 1}, pod=None),
        model_finding("gpu_not_advertised", "error", 1, 0, "h", node="elsewhere"),
    ], api_retries=2))
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.runtime_class", skipped=True, api_retries=1))
    outcomes.feed(_event("runner_on_unreachable", "gpu-c", msg="Failed to connect to the host via ssh: refused"))
    outcomes.feed(_event("runner_on_failed", "gpu-d", action="gpuharden.k8s.node_lock", msg="node_lock: the node is locked by harden@x"))
    # a later event for an already failed host does not change its outcome
    outcomes.feed(_event("runner_on_failed", "gpu-d", action="gpuharden.k8s.node_lock", msg="second"))
    return outcomes


def _report(outcomes=None, fail_severity="warning"):
    return drift_report.build_report(outcomes or _outcomes(), inventory="inv", limit=None, fail_severity=fail_severity,
                                     started=1000.0, finished=1012.5, node_names={"gpu-b": "node-b"})


def test_outcomes_and_report():
    report = _report()
    assert sorted(report["nodes"]) == ["gpu-a", "gpu-b"]
    assert report["nodes"]["gpu-a"]["status"] == "clean"
    assert report["nodes"]["gpu-b"]["status"] == "drift"
    assert report["nodes"]["gpu-b"]["node"] == "node-b"
    assert report["nodes"]["gpu-b"]["remediable_stages"] == ["device_permissions", "device_plugin", "kubelet_topology"]
    consistency = [entry for entry in report["nodes"]["gpu-b"]["findings"] if entry["check"] == "consistency"]
    assert [(entry["id"], entry["stage"], entry["remediable"]) for entry in consistency] == [
        ("gpu_not_advertised", "device_plugin", True), ("gpu_process_unattributed", "postcheck", False)]
    assert report["cluster"] == {"consistency_checked": True, "consistency_error": None, "runtime_class_checked": False,
                                 "checks": {"consistency": {"state": "checked"}}, "findings": [],
                                 # no cluster side's kubeconfig known to this report (tests/unit/test_kubeconfig.py reads one)
                                 "credential": None, "credential_expires_at": None,
                                 # the play ran gpu_consistency (its runner event): where the check ran
                                 "ran_in": "module",
                                 # the play's cluster-side modules' requests sent again (2 + 1), added up
                                 "api_retries": 3}
    assert report["unreachable"] == {"gpu-c": "Failed to connect to the host via ssh: refused"}
    assert "locked by harden@x" in report["failed"]["gpu-d"] and "second" not in report["failed"]["gpu-d"]
    assert report["summary"] == {"nodes": 4, "clean": 1, "drifted": 1, "attention": 0, "not_checked": 0, "nodes_not_checked_in_part": 0,
                                 "nodes_refused_in_part": 0, "unreachable": 1, "failed": 1, "findings": 6,
                                 "by_severity": {"error": 3, "warning": 2, "info": 1},
                                 "by_check": {"device_nodes": 2, "device_cgroups": 1, "kubelet": 1, "consistency": 2},
                                 "cluster_findings": 0, "cluster_not_checked": []}
    assert report["duration_seconds"] == 12.5
    # an unreachable and a failed node were not checked: the answer is partial, whatever the others show
    assert [(spot["node"], spot["check"]) for spot in report["not_checked"]] == [("gpu-c", "unreachable"), ("gpu-d", "failed")]
    assert drift_report.exit_code(report) == drift_report.EXIT_NOT_CHECKED


def test_exit_codes():
    clean = drift_report.Outcomes()
    clean.feed(_event("runner_on_ok", "gpu-a", findings=[_finding("gpu_access", "device_cgroups", "info")], summary={}, checks={}))
    assert drift_report.exit_code(_report(clean)) == drift_report.EXIT_CLEAN
    # an info finding counts once the threshold is lowered to info
    assert drift_report.exit_code(_report(clean, fail_severity="info")) == drift_report.EXIT_DRIFT
    hardware = drift_report.Outcomes()
    hardware.feed(_event("runner_on_ok", "gpu-a", findings=[_finding("pcie_link_degraded", "nvml", "warning", stage="postcheck",
                                                                     remediable=False)], summary={}, checks={}))
    report = _report(hardware)
    assert report["nodes"]["gpu-a"]["status"] == "attention" and report["summary"]["attention"] == 1
    assert report["nodes"]["gpu-a"]["remediable_stages"] == []
    assert drift_report.exit_code(report) == drift_report.EXIT_DRIFT
    assert 'gpuharden_drift_node_attention{node="gpu-a"} 1' in drift_metrics.prometheus_text(report)
    unreachable_only = drift_report.Outcomes()
    unreachable_only.feed(_event("runner_on_unreachable", "gpu-a", msg="x"))
    assert drift_report.exit_code(_report(unreachable_only)) == drift_report.EXIT_NOT_CHECKED


def test_prometheus_text_is_valid_exposition():
    text = drift_metrics.prometheus_text(_report())
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*",?)*\})? -?[0-9.e+]+$')
    names = set()
    for line in text.splitlines():
        if line.startswith("# HELP") or line.startswith("# TYPE"):
            names.add(line.split()[2])
            continue
        assert sample.match(line), line
        assert line.split("{")[0].split()[0] in names, line
    assert 'gpuharden_drift_findings{node="node-b",check="device_nodes",severity="error"} 1' in text
    assert 'gpuharden_drift_findings{node="node-b",check="device_nodes",severity="warning"} 1' in text
    assert 'gpuharden_drift_findings{node="node-b",check="kubelet",severity="error"} 1' in text
    assert 'gpuharden_drift_findings{node="node-b",check="consistency",severity="error"} 1' in text
    assert 'gpuharden_drift_node_drifted{node="gpu-a"} 0' in text
    assert 'gpuharden_drift_node_drifted{node="node-b"} 1' in text
    assert "gpuharden_nodes_unreachable 1" in text
    assert "gpuharden_nodes_failed 1" in text
    assert "gpuharden_last_run_timestamp_seconds 1012.500" in text
    assert text.endswith("\n")


def test_item05_unreachable_and_failed_nodes_keep_per_node_series():
    """An unreachable or failed node has a per-node series (1), every other node of the run a 0, so an alert on the
    node does not resolve while it cannot be checked; and the run's success time beside its run time."""
    report = _report()
    # gpu-c and gpu-d were named by drift_play (on the controller) before they failed: the same label as when they answer
    assert report["node_names"] == {"gpu-a": "gpu-a", "gpu-b": "node-b", "gpu-c": "gpu-c", "gpu-d": "gpu-d"}
    text = drift_metrics.prometheus_text(report)
    for node, unreachable, failed in (("gpu-a", 0, 0), ("node-b", 0, 0), ("gpu-c", 1, 0), ("gpu-d", 0, 1)):
        assert 'gpuharden_drift_node_unreachable{node="%s"} %d' % (node, unreachable) in text.splitlines()
        assert 'gpuharden_drift_node_failed{node="%s"} %d' % (node, failed) in text.splitlines()
    assert "# TYPE gpuharden_drift_node_unreachable gauge" in text and "# TYPE gpuharden_drift_node_failed gauge" in text
    # two nodes not checked: the run is complete but not a success, so the success time is the earlier file's
    assert "gpuharden_last_run_timestamp_seconds 1012.500" in text.splitlines()
    assert "gpuharden_drift_not_checked 1" in text.splitlines()
    assert not [line for line in text.splitlines() if line.startswith("gpuharden_last_success_timestamp_seconds")]
    earlier = "gpuharden_last_success_timestamp_seconds 900.250\n"
    assert "gpuharden_last_success_timestamp_seconds 900.250" in drift_metrics.prometheus_text(report, earlier).splitlines()
    named = drift_report.build_report(_outcomes(), inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0,
                               node_names={"gpu-b": "node-b", "gpu-c": "node-c"})
    assert 'gpuharden_drift_node_unreachable{node="node-c"} 1' in drift_metrics.prometheus_text(named)
    # after --remediate the re-checked hosts' names join the first check's
    after = drift_report.build_report(drift_report.Outcomes(), inventory="inv", limit="gpu-c", fail_severity="warning", started=3.0, finished=4.0)
    after["unreachable"], after["node_names"] = {"gpu-c": "still down"}, {"gpu-c": "node-c"}
    merged = drift_report.merge_after_remediation(report, after)
    assert merged["node_names"]["gpu-c"] == "node-c" and merged["node_names"]["gpu-b"] == "node-b"


def test_label_escaping():
    assert drift_metrics._label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_write_atomically_replaces_whole_file(tmp_path):
    target = tmp_path / "textfile" / "gpuharden.prom"
    drift_report.write_atomically(str(target), "one\n")
    drift_report.write_atomically(str(target), "two\n")
    assert target.read_text() == "two\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert os.listdir(target.parent) == ["gpuharden.prom"]


def test_table_lists_nodes_findings_and_summary():
    text = drift_terminal.table(_report())
    assert re.search(r"gpu-b\s+drift\s+3 error, 2 warning, 1 info\s+device_permissions, device_plugin, kubelet_topology", text)
    assert re.search(r"gpu-c\s+unreachable", text) and re.search(r"gpu-d\s+failed", text)
    assert "device_node_permissions /dev/nvidia0" in text
    assert "gpu_access" not in text  # below the fail severity: counted, not listed
    assert text.splitlines()[0].startswith("NOT CHECKED: every check (unreachable) on node gpu-c: Failed to connect to the host via ssh: refused. Fix: ")
    summary = " ".join(line for line in text[text.rindex("\n\n"):].split("\n") if line)
    assert summary.startswith("4 node(s): 1 clean, 1 drifted, 0 need attention (hardware, workloads or a setting to choose), 0 not checked "
                              "(in part), 1 unreachable, 1 failed; 6 finding(s)")


def test_extra_vars_forms(tmp_path):
    varsfile = tmp_path / "vars.yml"
    varsfile.write_text("a: 1\nb: [x]\n")
    assert drift_run.parse_extra_vars(["k=v other=2", '{"j": true}', "@%s" % varsfile]) == {"k": "v", "other": "2", "j": True, "a": 1, "b": ["x"]}
    with pytest.raises(drift_run.DriftError, match="KEY=VALUE"):
        drift_run.parse_extra_vars(["novalue"])
    with pytest.raises(drift_run.DriftError, match="No such file"):
        drift_run.parse_extra_vars(["@%s" % (tmp_path / "missing.yml")])


def test_merge_after_remediation_replaces_rechecked_hosts():
    before = _report()
    fixed = drift_report.Outcomes()
    fixed.feed(_event("runner_on_ok", "gpu-b", findings=[], summary={}, checks={}))
    after = drift_report.build_report(fixed, inventory="inv", limit="gpu-b", fail_severity="warning", started=2000.0, finished=2003.0)
    merged = drift_report.merge_after_remediation(before, after)
    assert merged["nodes"]["gpu-b"]["status"] == "clean"
    assert merged["summary"]["drifted"] == 0 and merged["summary"]["unreachable"] == 1
    assert merged["timestamp"] == 2003.0


def test_usage_errors_exit_2(tmp_path, capsys):
    assert cli.main(["drift", "-i", str(tmp_path / "missing.yml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    assert cli.main(["drift", "-i", str(inventory), "--forks", "0"]) == 2
    assert cli.main(["drift", "-i", str(inventory), "-e", "broken"]) == 2
    with pytest.raises(SystemExit) as exited:
        cli.main(["drift", "-i", str(inventory), "--fail-severity", "fatal"])
    assert exited.value.code == 2
    json.dumps(_report())  # the report is plain JSON


def test_runtime_class_dry_run_becomes_cluster_findings():
    outcomes = drift_report.Outcomes()
    outcomes.feed(_event("runner_on_ok", "gpu-a", findings=[], summary={}, checks={}))
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.runtime_class", changed=False, failed_when_result=False,
                         msg="handler is immutable: run with force=true", findings=[
                             model_finding("runtime_class_handler_mismatch", "error", "nvidia", "nvidia-legacy", "m",
                                           subject="RuntimeClass nvidia", repair="recreate (force)"),
                             model_finding("runtime_class_overhead_gpu", "error", "none", {"nvidia.com/gpu": "1"}, "m",
                                           subject="RuntimeClass x", repair="manual")]))
    report = _report(outcomes)
    cluster = report["cluster"]["findings"]
    assert [(entry["id"], entry["remediable"], entry["found"]) for entry in cluster] == [
        ("runtime_class_handler_mismatch", False, "nvidia-legacy"), ("runtime_class_overhead_gpu", False, {"nvidia.com/gpu": "1"})]
    assert report["nodes"]["gpu-a"]["status"] == "clean" and report["summary"]["cluster_findings"] == 2
    # a refusal with its findings is an answer: checked
    assert report["cluster"]["checks"]["runtime_class"] == {"state": "checked"}
    assert drift_report.exit_code(report) == drift_report.EXIT_DRIFT
    assert 'gpuharden_drift_cluster_findings{check="runtime_class",severity="error"} 2' in drift_metrics.prometheus_text(report)
    assert "(cluster)" in drift_terminal.table(report)
    missing = drift_report.runtime_class_findings({"changed": True, "action": "create", "findings": [], "runtime_class": {"metadata": {"name": "nvidia"}}})
    assert [(entry["id"], entry["remediable"]) for entry in missing] == [("runtime_class_differs", True)]
    assert drift_report.runtime_class_findings({"changed": False, "findings": []}) == []


def test_item05_consistency_findings_of_no_node_are_cluster_findings():
    outcomes = drift_report.Outcomes()
    outcomes.audited["gpu-a"] = {"findings": [], "summary": {}, "checks": {}, "seconds": 0.1}
    outcomes.consistency = [
        model_finding("requested_resource_not_advertised", "error", "a resource some node advertises", {"pods": ["ml/train-0"]}, "nvidia.com/gpu?",
                      node=None, resource="nvidia.com/gpus"),
        model_finding("gpu_not_advertised", "error", 2, 0, "", node="gpu-a"),
    ]
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=0.0, finished=1.0)
    [cluster] = report["cluster"]["findings"]
    assert cluster["id"] == "requested_resource_not_advertised" and cluster["subject"] == "nvidia.com/gpus"
    assert cluster["remediable"] is False and cluster["check"] == "consistency"
    assert [entry["id"] for entry in report["nodes"]["gpu-a"]["findings"]] == ["gpu_not_advertised"]
    assert report["summary"]["cluster_findings"] == 1 and drift_report.exit_code(report) == drift_report.EXIT_DRIFT


def test_each_node_s_audit_time_and_cpu_come_from_its_node_audit_result():
    outcomes = drift_report.Outcomes()
    outcomes.feed(_event("runner_on_ok", "gpu-a", findings=[], summary={"findings": 0}, checks={}, seconds=0.02, cpu_seconds=0.31))
    outcomes.feed(_event("runner_on_ok", "gpu-b", findings=[], summary={"findings": 0}, checks={}, seconds=0.05))  # an older collection
    nodes = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=0.0, finished=1.0)["nodes"]
    assert (nodes["gpu-a"]["audit_seconds"], nodes["gpu-a"]["audit_cpu_seconds"]) == (0.02, 0.31)
    assert (nodes["gpu-b"]["audit_seconds"], nodes["gpu-b"]["audit_cpu_seconds"]) == (0.05, None)


def test_kubelet_settings_the_admission_check_keeps_are_reported_as_kept_not_remediable():
    """Issue 43, item 8: every --remediate retried a node harden's admission check keeps on its policy.  The manager
    fields the check leaves as they are are kept (not remediable, with the reason); the node's other drift stays."""
    kept = {"policy": "single-numa-node", "scope": "container", "fields": ["topologyManagerPolicy", "cpuManagerPolicy"],
            "workloads": [{"kind": "Deployment", "namespace": "train", "name": "train-8g"}], "reason": "kept by the admission check: ..."}
    outcomes = drift_report.Outcomes()
    outcomes.feed(_event("runner_on_ok", "dgx", action="gpuharden.k8s.drift_play", node_names={"dgx": "dgx"}))
    outcomes.feed(_event("runner_on_ok", "dgx", findings=[
        _finding("kubelet_setting", "kubelet", "error", stage="kubelet_topology", subject="topologyManagerPolicy"),
        _finding("kubelet_setting", "kubelet", "error", stage="kubelet_topology", subject="cpuManagerPolicy"),
        _finding("kubelet_stale_checkpoint", "kubelet", "error", stage="kubelet_topology"),
    ], summary={"findings": 3, "max_severity": "error"}, checks={"kubelet": {"status": "drift"}}, seconds=0.2))
    outcomes.feed(_event("runner_on_ok", "dgx", action="gpuharden.k8s.gpu_consistency", findings=[], kept={"dgx": kept}))
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)
    node = report["nodes"]["dgx"]
    assert node["status"] == "attention" and node["remediable_stages"] == [], node
    assert all(finding["remediable"] is False and finding["kept"] == kept["reason"] for finding in node["findings"])
    # another field of the same stage is still drift that harden fixes
    outcomes.audited["dgx"]["findings"].append(
        _finding("kubelet_setting", "kubelet", "error", stage="cgroup_limits", subject="memoryThrottlingFactor"))
    again = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)
    assert again["nodes"]["dgx"]["status"] == "drift" and again["nodes"]["dgx"]["remediable_stages"] == ["cgroup_limits"]


def test_a_kubeadm_revert_of_only_the_kept_fields_is_kept_one_of_a_field_harden_moves_stays_remediable():
    """The seed-failures DGX after harden kept its managers: kubeadm's config.yaml still holds them, and harden, which
    leaves those fields as they are there, never moves them to its drop-in (a second harden changed nothing: lab test
    test_admission_and_restarts).  So kubelet_reverts_on_kubeadm_upgrade is kept; with a field harden still moves
    (memoryThrottlingFactor), the next harden changes the node, and it stays remediable."""
    kept = {"policy": "single-numa-node", "scope": "container", "fields": ["topologyManagerPolicy", "topologyManagerScope", "cpuManagerPolicy"],
            "workloads": [{"kind": "Deployment", "namespace": "train", "name": "train-8g"}], "reason": "kept by the admission check: ..."}

    def report(subject):
        outcomes = drift_report.Outcomes()
        outcomes.feed(_event("runner_on_ok", "dgx", findings=[
            _finding("kubelet_reverts_on_kubeadm_upgrade", "kubelet", "warning", stage="kubelet_topology", subject=subject,
                     path="/var/lib/kubelet/config.yaml"),
        ], summary={"findings": 1, "max_severity": "warning"}, checks={"kubelet": {"status": "drift"}}, seconds=0.2))
        outcomes.feed(_event("runner_on_ok", "dgx", action="gpuharden.k8s.gpu_consistency", findings=[], kept={"dgx": kept}))
        return drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)["nodes"]["dgx"]

    node = report("cpuManagerPolicy, topologyManagerPolicy, topologyManagerScope")
    [revert] = node["findings"]
    assert revert["remediable"] is False and revert["kept"] == kept["reason"] and node["remediable_stages"] == [], node
    node = report("cpuManagerPolicy, memoryThrottlingFactor")
    [revert] = node["findings"]
    assert revert["remediable"] is True and "kept" not in revert and node["remediable_stages"] == ["kubelet_topology"], node
    # an older collection's finding names no field: never taken as kept
    assert report(None)["findings"][0]["remediable"] is True
