# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 2 on a lab: `gpuharden drift` with the consistency check in its own process (the default,
--cluster-check in-process) and with the gpu_consistency module in the play (--cluster-check module, as plain
ansible-playbook runs it) give the same report, field by field, but for where the check ran (cluster.ran_in) and the
timings (tests/drift_parity.py, IGNORED, names each).  mixed-fleet, not hardened: no device plugin, so the GPU nodes
advertise none of their GPUs (consistency findings on each), no RuntimeClass (a cluster finding), and a k3s node.
That the comparison catches a path that drops a finding: tests/unit/test_drift_parity.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ansible_runner
import pytest
from gpuharden_lab import REPO_ROOT

from tests.drift_parity import differences
from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def lab():
    with running_lab("mixed-fleet") as state:
        yield state


def _drift(state, *args):
    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", state["inventory"], "--json", "-q", *args],
                          cwd=REPO_ROOT, env=dict(os.environ, **ENV), capture_output=True, text=True, check=False, timeout=900)
    # 1: drift found, everything checked (a not-checked part, 4, would make the comparison weaker than it looks)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def reports(lab):
    """(in-process, module): the two paths' reports, one run each."""
    return _drift(lab), _drift(lab, "--cluster-check", "module")


def test_the_two_paths_of_the_consistency_check_report_the_same(reports):
    here, module = reports
    assert here["cluster"]["ran_in"] == "controller process"
    assert module["cluster"]["ran_in"] == "module"
    # a report worth comparing: the consistency check answered and found something on the nodes, and the
    # RuntimeClass dry run (folded into the same check) something in the cluster
    for report in (here, module):
        assert report["cluster"]["consistency_checked"] and report["cluster"]["runtime_class_checked"], report["cluster"]
        consistency = [entry["id"] for node in report["nodes"].values() for entry in node["findings"] if entry["check"] == "consistency"]
        assert "gpu_not_advertised" in consistency, consistency
        assert report["cluster"]["findings"], report["cluster"]
    assert differences(here, module) == []


def test_plain_ansible_playbook_runs_the_module_and_its_run_data_and_failed_hosts_agree(lab, reports, tmp_path):
    """ansible-playbook drift_check.yml, as AWX runs it: the module path (ran_in module), each host's run data (the
    gpuharden.k8s.drift_verdict lookup) holds the findings gpuharden drift reports for it, and the hosts it fails are
    the ones the report does not call clean, with the report's reason."""
    events = []
    runner = ansible_runner.run(private_data_dir=str(tmp_path), envvars=ENV, inventory=lab["inventory"], quiet=True,
                                playbook=str(REPO_ROOT / "playbooks" / "drift_check.yml"),
                                event_handler=lambda event: events.append(event) or True)
    assert runner.status in ("successful", "failed"), runner.stdout.read()[-3000:]
    ok = [event["event_data"] for event in events if event.get("event") == "runner_on_ok"]
    # the play's cluster side and each host's verdict are drift_play steps (plugins/action/drift_play.py): the cluster
    # step carries gpu_consistency's module result, each verdict the host's run data as the run's stats
    steps = [data["res"] for data in ok if data.get("task_action") == "gpuharden.k8s.drift_play"]
    assert [(res.get("consistency") or {}).get("ran_in") for res in steps if "consistency" in res] == ["module"]
    run_data = {}
    for res in steps:
        if "ansible_stats" in res:
            run_data.update(res["ansible_stats"]["data"]["gpuharden_drift"])
    failed = {event["event_data"]["host"]: event["event_data"]["res"]["msg"] for event in events if event.get("event") == "runner_on_failed"}
    here = reports[0]
    assert set(run_data) == set(here["nodes"]), (sorted(run_data), sorted(here["nodes"]))
    for host, node in here["nodes"].items():
        entry = run_data[host]
        assert entry["node"] == node["node"]
        assert sorted(finding["id"] for finding in entry["findings"] + entry["consistency_findings"]) == sorted(
            finding["id"] for finding in node["findings"]), (host, entry, node["findings"])
        reason = {"clean": None, "drift": "%s drifted: " % node["node"], "attention": "%s drifted: " % node["node"],
                  "not_checked": "%s not checked: " % node["node"]}[node["status"]]
        if reason is None:
            assert host not in failed, (host, failed[host])
        else:
            assert failed.get(host, "").startswith(reason), (host, node["status"], failed.get(host))
    assert runner.rc == (2 if failed else 0)
