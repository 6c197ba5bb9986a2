# SPDX-License-Identifier: GPL-3.0-or-later
"""drift_check.yml's run-data play, decided in Python (issue 45: its two assert tasks and the copy of the severity
scale left the Jinja): plugins/module_utils/audit/_drift_verdict.py and the gpuharden.k8s.drift_verdict lookup."""

from __future__ import annotations

import json
import os
import sys

import ansible_runner
import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit._drift_verdict import drift_verdict
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

from tests.unit.conftest import REPO_ROOT


def _finding(ident, severity, node=None):
    return {"id": ident, "severity": severity, "check": "kubelet", "node": node}


def _plan(findings=(), stages=(), checks=None):
    return {"findings": list(findings), "summary": {"findings": len(findings), "stages": list(stages)}, "checks": checks or {}}


def test_a_clean_host_passes_and_its_run_data_is_the_audit_and_its_node_s_consistency_findings():
    mine, other = _finding("gpu_not_advertised", "info", "gpu-a"), _finding("gpu_not_advertised", "error", "gpu-b")
    verdict = drift_verdict(_plan(checks={"kubelet": {"status": "ok"}}), {"findings": [mine, other]}, "gpu-a")
    assert verdict["failure"] == ""
    assert verdict["run_data"] == {"node": "gpu-a", "summary": {"findings": 0, "stages": []}, "checks": {"kubelet": {"status": "ok"}},
                                   "findings": [], "consistency_findings": [mine]}


def test_findings_at_or_above_the_fail_severity_fail_the_host_naming_ids_once_and_the_stages():
    plan = _plan([_finding("kubelet_setting", "error"), _finding("kubelet_setting", "warning"), _finding("pcie", "info")], ["kubelet_topology"])
    assert drift_verdict(plan, {}, "gpu-a")["failure"] == "gpu-a drifted: kubelet_setting (stages to run: kubelet_topology)"
    assert drift_verdict(plan, {}, "gpu-a", "critical")["failure"] == ""
    assert drift_verdict(plan, {}, "gpu-a", "info")["failure"] == "gpu-a drifted: kubelet_setting, pcie (stages to run: kubelet_topology)"
    # the consistency check's finding about this Node counts too; nothing to run for it
    consistency = {"findings": [_finding("gpu_process_without_allocation", "critical", "gpu-a")]}
    assert drift_verdict(_plan(), consistency, "gpu-a", "critical")["failure"] == (
        "gpu-a drifted: gpu_process_without_allocation (stages to run: none, not remediable)")


def test_a_check_that_could_not_run_fails_the_host_with_its_cause_before_drift():
    checks = {"containerd": {"status": "not_checked", "not_checked": [{"what": "containerd", "cause": "no config", "fix": "f"}]}}
    plan = _plan([_finding("kubelet_setting", "error")], ["kubelet_topology"], checks)
    assert drift_verdict(plan, {}, "gpu-a")["failure"] == "gpu-a not checked: no config"
    # the cluster side blind: every host's report needs it
    failed = {"failed_when_result": False, "msg": "gpu_consistency: forbidden"}
    assert drift_verdict(_plan(), failed, "gpu-a")["failure"] == "gpu-a not checked: gpu_consistency: forbidden"
    assert drift_verdict(plan, failed, "gpu-a")["failure"] == "gpu-a not checked: no config; gpu_consistency: forbidden"
    # a consistency check that did not run (skipped: gpuharden drift runs it, or it is not wanted) is no cause
    assert drift_verdict(_plan(), {"skipped": True, "changed": False}, "gpu-a")["failure"] == ""


@pytest.mark.parametrize(("plan", "severity", "named"), [
    (_plan(), "high", "gpuharden_drift_fail_severity='high'"),
    (None, "warning", "gpuharden_node_plan of gpu-a"),
    ({"summary": {}}, "warning", "gpuharden_node_plan of gpu-a"),
])
def test_bad_input_is_an_error_naming_the_variable(plan, severity, named):
    with pytest.raises(GpuhardenError, match=named.replace("(", r"\(")):
        drift_verdict(plan, {}, "gpu-a", severity)


PLAYBOOK = """
- name: The lookup as drift_check.yml's run-data play calls it
  hosts: localhost
  gather_facts: false
  vars:
    plan: %s
    level: critical
  tasks:
    - name: Default severity
      ansible.builtin.debug:
        msg: "{{ lookup('gpuharden.k8s.drift_verdict', plan, {}, 'gpu-a', gpuharden_drift_fail_severity | d('warning')) }}"
    - name: The play's gpuharden_drift_fail_severity, itself a template
      ansible.builtin.debug:
        msg: "{{ lookup('gpuharden.k8s.drift_verdict', plan, {}, 'gpu-a', gpuharden_drift_fail_severity | d('warning')) }}"
      vars:
        gpuharden_drift_fail_severity: "{{ level }}"
    - name: A severity off the scale
      ansible.builtin.debug:
        msg: "{{ lookup('gpuharden.k8s.drift_verdict', plan, {}, 'gpu-a', gpuharden_drift_fail_severity | d('warning')) }}"
      vars:
        gpuharden_drift_fail_severity: high
      ignore_errors: true
"""


def test_the_lookup_in_a_play_as_drift_check_calls_it(tmp_path):
    plan = _plan([_finding("kubelet_setting", "error")], ["kubelet_topology"])
    playbook = tmp_path / "verdict.yml"
    playbook.write_text(PLAYBOOK % json.dumps(plan))
    results = []

    def keep(event):
        if event.get("event") in ("runner_on_ok", "runner_on_failed"):
            results.append(dict(event["event_data"]["res"], failed=event["event"] == "runner_on_failed"))
        return True

    envvars = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "ANSIBLE_LOCALHOST_WARNING": "false",
               "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    (tmp_path / "runner").mkdir()
    runner = ansible_runner.run(private_data_dir=str(tmp_path / "runner"), playbook=str(playbook), envvars=envvars, quiet=True,
                                event_handler=keep)
    assert runner.status == "successful" and len(results) == 3, runner.stdout.read()[-3000:]
    assert results[0]["msg"]["failure"] == "gpu-a drifted: kubelet_setting (stages to run: kubelet_topology)", results[0]
    assert results[0]["msg"]["run_data"]["findings"] == plan["findings"]
    assert results[1]["msg"]["failure"] == "", results[1]
    assert results[2].get("failed") and "fail_severity" in results[2]["msg"], results[2]
