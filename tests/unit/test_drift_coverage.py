# SPDX-License-Identifier: GPL-3.0-or-later
"""The three states of every check in a drift report: checked, could not check (cause and fix, exit 4, its own metric
and cell, never clean or drift) and refused; and the terminal output that shows them, wrapped to the width."""

from __future__ import annotations

import io
import json
import re
import types

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding as model_finding
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_access

from gpuharden import coverage, drift_metrics, drift_report, drift_terminal, report_html, terminal

LONG_HINT = ("the kubelet reads topologyManagerPolicy from the file /var/lib/kubelet/config.yaml, where kubeadm upgrade "
             "rewrites it; the stage sets it in a drop-in of --config-dir that outlives the upgrade, and the last words")


def _event(kind, host, action="gpuharden.k8s.node_audit", **res):
    return {"event": kind, "event_data": {"host": host, "task_action": action, "task": "t", "res": res}}


def _checks(**status):
    return {name: ({"status": value} if isinstance(value, str) else value) for name, value in status.items()}


def _drifted_finding():
    return model_finding("kubelet_setting", "error", "single-numa-node", "none", LONG_HINT, subject="topologyManagerPolicy")


def _outcomes(pods_failed=False, consistency=None, pods_action="gpuharden.k8s.node_plan_pods"):
    outcomes = drift_report.Outcomes()
    outcomes.feed(_event("runner_on_ok", "gpu-a", findings=[], summary={}, seconds=0.1,
                         checks=_checks(kubelet="ok", cgroup_memory="skipped",
                                        nvml={"status": "not_checked", "not_checked": [
                                            {"what": "nvml", "cause": "node_audit: the nvml check needs nvidia-ml-py", "fix": "install it"}]})))
    outcomes.feed(_event("runner_on_ok", "gpu-b", findings=[_drifted_finding()], summary={}, seconds=0.1,
                         checks=_checks(kubelet="drift", cgroup_memory="skipped")))
    if pods_failed:
        outcomes.feed(_event("runner_on_ok", "gpu-a", action=pods_action, failed=False,
                             msg="gpu_pods_info: list pods (API group \"\" (core)) at cluster scope: API server answered 401 "
                                 "Unauthorized: the credentials were not accepted: Unauthorized",
                             access=_k8s.access("credentials")))
    if consistency is not None:
        outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.gpu_consistency", **consistency))
    return outcomes


def _report(outcomes):
    return drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=0.0, finished=10.0)


def test_a_node_check_that_could_not_run_is_not_checked_never_clean():
    report = _report(_outcomes(consistency={"findings": []}))
    node = report["nodes"]["gpu-a"]
    assert node["status"] == "not_checked" and node["findings"] == []
    assert node["not_checked"] == [{"check": "nvml", "what": "nvml", "cause": "node_audit: the nvml check needs nvidia-ml-py",
                                    "fix": "install it"}]
    # cgroup_memory was left out of the run (no pods LIST asked for it): skipped, not blind
    assert report["nodes"]["gpu-b"]["status"] == "drift" and report["nodes"]["gpu-b"]["not_checked"] == []
    summary = report["summary"]
    assert (summary["clean"], summary["drifted"], summary["not_checked"], summary["nodes_not_checked_in_part"]) == (0, 1, 1, 1)
    assert drift_report.exit_code(report) == drift_report.EXIT_NOT_CHECKED == 4
    text = drift_metrics.prometheus_text(report, "gpuharden_last_success_timestamp_seconds 5.000\n").splitlines()
    assert 'gpuharden_drift_checked{scope="node",check="nvml"} 0' in text
    assert 'gpuharden_drift_checked{scope="node",check="kubelet"} 1' in text
    assert 'gpuharden_drift_checked{scope="cluster",check="consistency"} 1' in text
    assert 'gpuharden_drift_check_nodes_not_checked{check="nvml"} 1' in text
    assert 'gpuharden_drift_node_not_checked{node="gpu-a"} 1' in text and 'gpuharden_drift_node_not_checked{node="gpu-b"} 0' in text
    assert "gpuharden_drift_not_checked 1" in text
    assert "gpuharden_last_success_timestamp_seconds 5.000" in text and "gpuharden_last_run_timestamp_seconds 10.000" in text
    # cgroup_memory skipped everywhere: no coverage series at all for it
    assert not [line for line in text if 'check="cgroup_memory"' in line]


def test_a_complete_run_that_checked_everything_advances_the_success_time():
    outcomes = drift_report.Outcomes()
    outcomes.feed(_event("runner_on_ok", "gpu-a", findings=[], summary={}, checks=_checks(kubelet="ok"), seconds=0.1))
    report = _report(outcomes)
    assert drift_report.exit_code(report) == drift_report.EXIT_CLEAN and report["not_checked"] == []
    text = drift_metrics.prometheus_text(report, "gpuharden_last_success_timestamp_seconds 5.000\n").splitlines()
    assert "gpuharden_last_success_timestamp_seconds 10.000" in text and "gpuharden_drift_not_checked 0" in text


@pytest.mark.parametrize("pods_action", ["gpuharden.k8s.node_plan_pods", "gpuharden.k8s.gpu_pods_info"])
def test_the_pods_list_failing_blinds_every_node_s_memory_check_and_names_the_fix(pods_action):
    """The plan's LIST (node_plan_pods, tasks/node_plan_inputs.yml; gpu_pods_info's own result for an older collection)."""
    report = _report(_outcomes(pods_failed=True, consistency={"findings": []}, pods_action=pods_action))
    gpu_pods = report["cluster"]["checks"]["gpu_pods"]
    assert gpu_pods["state"] == "not_checked" and "401 Unauthorized" in gpu_pods["cause"]
    assert gpu_pods["fix"] == _k8s.ACCESS_FIXES["credentials"]
    for host in ("gpu-a", "gpu-b"):
        parts = {part["check"]: part for part in report["nodes"][host]["not_checked"]}
        assert parts["cgroup_memory"]["cause"] == gpu_pods["cause"] and "LIST of GPU pods failed" in parts["cgroup_memory"]["what"]
    assert report["nodes"]["gpu-b"]["status"] == "drift"  # drift stays drift; the blind part is named beside it
    assert drift_report.exit_code(report) == drift_report.EXIT_NOT_CHECKED


def test_a_blind_consistency_module_run_is_not_checked_with_no_cluster_finding():
    failure = {"failed_when_result": False, "msg": "k8s auth: option kubeconfig=/nonexistent/kubeconfig: no such file on the controller",
               "access": _k8s.access("kubeconfig")}
    outcomes = _outcomes(consistency=failure)
    # the separate RuntimeClass task failed the same way (the module's failure, kept by failed_when: false)
    outcomes.feed(_event("runner_on_ok", "gpu-a", action="gpuharden.k8s.runtime_class", changed=False, failed_when_result=False,
                         msg=failure["msg"], access=failure["access"]))
    report = _report(outcomes)
    assert report["cluster"]["findings"] == []  # no runtime_class_check_failed, nothing a RuntimeClass alert reads
    for check in ("consistency", "runtime_class"):
        assert report["cluster"]["checks"][check] == {"state": "not_checked", "cause": failure["msg"],
                                                      "fix": _k8s.ACCESS_FIXES["kubeconfig"]}
    assert report["summary"]["cluster_not_checked"] == ["consistency", "runtime_class"]
    line = coverage.headline(report["not_checked"])
    assert line.startswith("NOT CHECKED: the cluster side (consistency, runtime_class): k8s auth: option "
                           "kubeconfig=/nonexistent/kubeconfig: no such file on the controller. Fix: give the controller a readable kubeconfig")
    text = drift_metrics.prometheus_text(report)
    assert "gpuharden_drift_cluster_findings{" not in text
    assert 'gpuharden_drift_checked{scope="cluster",check="consistency"} 0' in text.splitlines()
    assert 'gpuharden_drift_checked{scope="cluster",check="runtime_class"} 0' in text.splitlines()
    page = report_html.render(report)
    assert "not checked: k8s auth: option kubeconfig=/nonexistent/kubeconfig: no such file on the controller" in page
    assert "RuntimeClass: not checked: k8s auth" in page


def test_access_kinds_come_from_the_k8s_layer():
    with pytest.raises(GpuhardenError) as missing:
        _k8s.auth_settings({"kubeconfig": "/nonexistent/kubeconfig"}, environ={})
    assert missing.value.result["access"]["kind"] == "kubeconfig"
    target = _k8s_access.Target("list", "pods")
    for status, kind in ((401, "credentials"), (403, "forbidden"), (500, "api")):
        error = _k8s.ApiException(status=status, reason="x")
        error.body = json.dumps({"message": 'pods is forbidden: User "system:serviceaccount:a:b" cannot list'})
        assert _k8s_access.failure("m", target, error).result["access"]["kind"] == kind
    assert _k8s_access.failure("m", target, ConnectionRefusedError("refused")).result["access"]["kind"] == "unreachable"
    assert set(_k8s.ACCESS_FIXES) >= {"kubeconfig", "credentials", "forbidden", "unreachable", "api"}


def test_merged_slices_are_blind_where_any_slice_was():
    checked = {"checks": {"consistency": {"state": "checked"}}}
    blind = {"checks": {"consistency": {"state": "not_checked", "cause": "401", "fix": "token"}}}
    assert coverage.merge_cluster_checks([checked, blind])["consistency"]["state"] == "not_checked"
    assert coverage.merge_cluster_checks([blind, checked])["consistency"]["state"] == "not_checked"
    assert coverage.merge_cluster_checks([checked, checked])["consistency"] == {"state": "checked"}
    other = {"checks": {"consistency": {"state": "not_checked", "cause": "403", "fix": "rbac"}}}
    assert coverage.merge_cluster_checks([blind, other])["consistency"]["cause"] == "401; 403"


# ---------------------------------------------------------------------------------------------
# The terminal


def _blind_report():
    failure = {"failed_when_result": False, "msg": "gpu_consistency: list pods at cluster scope: forbidden: "
               "system:serviceaccount:gpuharden-system:gpuharden may not list pods", "access": _k8s.access("forbidden")}
    report = _report(_outcomes(consistency=failure))
    report["unreachable"]["gpu-z"] = "Failed to connect to the host via ssh: " + "x" * 150
    report["summary"] = drift_report.summarize(report["nodes"], report["unreachable"], report["failed"], report["cluster"], "warning")
    report["not_checked"] = coverage.blind_spots(report)
    return report


@pytest.mark.parametrize("width", [80, 250])
def test_the_table_shows_every_reason_wrapped_to_the_width(width):
    report = _blind_report()
    text = drift_terminal.table(report, width)
    lines = text.splitlines()
    # the first line names the cause and the fix, whole (a log reader or `head -1` gets all of it)
    assert lines[0] == coverage.headline(report["not_checked"])
    assert lines[0].startswith("NOT CHECKED: the cluster side (consistency): gpu_consistency: list pods") and "Fix: grant" in lines[0]
    assert all(len(line) <= width for line in lines[1:]), [line for line in lines[1:] if len(line) > width]
    flat = " ".join(text.split())
    # every finding's reason, expected and found, whole, and every not-checked cause and fix
    assert " ".join(LONG_HINT.split()) in flat
    assert "expected: single-numa-node" in flat and "found: none" in flat
    assert _k8s.ACCESS_FIXES["forbidden"] in flat and coverage.UNREACHABLE_FIX in flat
    assert "x" * 150 in text.replace("\n", "").replace(" ", "")
    if width == 250:
        assert re.search(r"^ +why: +" + re.escape(LONG_HINT) + "$", text, re.M)


def test_wide_writes_each_field_on_one_line():
    text = drift_terminal.table(_blind_report(), None)
    assert re.search(r"^ +why: +" + re.escape(LONG_HINT) + "$", text, re.M)


def test_the_width_comes_from_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert terminal.terminal_width() == 250
    monkeypatch.setenv("COLUMNS", "80")
    assert terminal.terminal_width() == 80
    monkeypatch.setenv("COLUMNS", "10")
    assert terminal.terminal_width() == terminal.MIN_WIDTH


def test_json_output_puts_the_headline_on_stderr():
    report = _blind_report()
    out, err = io.StringIO(), io.StringIO()
    drift_terminal.show(report, types.SimpleNamespace(json=True, wide=False), out, err)
    assert json.loads(out.getvalue())["not_checked"] == report["not_checked"]
    assert err.getvalue().startswith("gpuharden drift: NOT CHECKED: the cluster side (consistency)")
    out, err = io.StringIO(), io.StringIO()
    drift_terminal.show(report, types.SimpleNamespace(json=False, wide=True), out, err)
    assert out.getvalue().startswith("NOT CHECKED: ") and err.getvalue() == ""
