# SPDX-License-Identifier: GPL-3.0-or-later
"""kubelet_topology over SSH on the seed-failures lab, whose nodes run the real kubelet v1.36.

Flags that override the file, a stale checkpoint, check mode, apply, re-apply, and a configuration the real
kubelet's validation rejects (rolled back, host failed, kubelet healthy again).  What the kubelet runs with is read from
its own /configz.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import ansible_runner
import pytest
from gpuharden_lab import manager

from tests.integration.cluster_side import kubelet_configz
from tests.labfixtures import shared_lab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(__file__).parent / "playbooks" / "kubelet_topology.yml"
TOPOLOGY_NONE = "seed-topology-none"  # config none/none; we add a flag in /etc/default/kubelet
STALE = "seed-stale-cpu-state"  # config static, checkpoint none: kubelet failed at boot
FLAGGED = "seed-pcie"  # compliant config; we add --cpu-manager-policy=none to kubeadm-flags.env
NODES = (TOPOLOGY_NONE, STALE, FLAGGED)
# The durable route on these v1.36 kubeadm nodes: the settings go to gpuharden's drop-in, read through --config-dir in
# /etc/default/kubelet (plugins/module_utils/node/_kubelet.py KUBEADM_CONFIG_DIR); config.yaml stays kubeadm's.
DROPIN = "/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf"
CONFIG_DIR_FLAG = "--config-dir=/etc/kubernetes/kubelet.conf.d"
FILES = ("/var/lib/kubelet/config.yaml", "/var/lib/kubelet/kubeadm-flags.env", "/etc/default/kubelet", DROPIN,
         "/var/lib/kubelet/cpu_manager_state", "/var/lib/kubelet/memory_manager_state")
HOOK_LOG = "/var/log/gpuharden-test-drain-hook.log"


@pytest.fixture(scope="module")
def lab():
    with shared_lab("seed-failures", unit="node-roles") as state:
        sh(state, TOPOLOGY_NONE, "printf 'KUBELET_EXTRA_ARGS=--topology-manager-policy=best-effort --v=2\\n' "
                                 "> /etc/default/kubelet")
        sh(state, FLAGGED, "sed -i 's|^KUBELET_KUBEADM_ARGS=\"|&--cpu-manager-policy=none |' "
                           "/var/lib/kubelet/kubeadm-flags.env")
        yield state


def sh(state, node, command, check=True):
    done = manager.ssh(state["nodes"][node]["address"], command)
    if check:
        assert done.returncode == 0, "%s: %s: %s" % (node, command, done.stderr)
    return done


def playbook(state, *extra, check=False, limit=NODES):
    """Run the test playbook through ansible-runner; returns {rc, seconds, stats, results: {task: {host: res}}}."""
    cmdline = ["--limit", ",".join(limit), *extra] + (["--check", "--diff"] if check else [])
    envvars = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
               "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuharden-kubelet-test-") as private_data_dir:
        runner = ansible_runner.run(private_data_dir=private_data_dir, playbook=str(PLAYBOOK), inventory=state["inventory"],
                                    cmdline=shlex.join(cmdline), envvars=envvars, quiet=True, json_mode=False)
        task_results = {}
        for event in runner.events:
            data = event.get("event_data", {})
            if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped"):
                res = dict(data.get("res") or {})
                res.setdefault("failed", event["event"] == "runner_on_failed")
                task_results.setdefault(data.get("task", ""), {})[data["host"]] = res
        stats = runner.stats or {}
        report = {"rc": runner.rc, "seconds": round(time.monotonic() - started, 1), "results": task_results,
                  "stats": {host: {key: (stats.get(key) or {}).get(host, 0) for key in ("ok", "changed", "failures")}
                            for host in limit}}
        if not task_results:
            raise AssertionError("ansible did not run (%s, rc %s): %s" % (runner.status, runner.rc, runner.stdout.read()))
    return report


def results(report, task_suffix):
    found = {}
    for name, hosts in report["results"].items():
        if name.endswith(task_suffix):
            found.update(hosts)
    return found


def fingerprint(state, node):
    """sha256 and mtime of each kubelet file on the node ('-' when absent)."""
    script = "for f in %s; do if [ -e $f ]; then echo $f $(sha256sum < $f | cut -c1-64) $(stat -c %%Y.%%y $f); " \
             "else echo $f -; fi; done" % " ".join(FILES)
    return sh(state, node, script).stdout


def healthy(state, node):
    done = sh(state, node, "curl -sf --max-time 5 http://127.0.0.1:10248/healthz", check=False)
    return done.returncode == 0 and done.stdout == "ok"


def test_before_the_seeds_are_wrong(lab):
    assert not healthy(lab, STALE)  # the kubelet refused the stale checkpoint at boot
    # the flag in /etc/default/kubelet is read at the next start; until then the file's none is what runs
    assert kubelet_configz(lab, TOPOLOGY_NONE)["topologyManagerPolicy"] == "none"


def test_check_mode_changes_nothing(lab):
    before = {node: fingerprint(lab, node) for node in NODES}
    report = playbook(lab, check=True)
    assert report["rc"] == 0, report["stats"]
    for node in NODES:
        assert report["stats"][node]["changed"] >= 1, node
        assert report["stats"][node]["failures"] == 0
    written = results(report, "Kubelet | write the configuration, restart the kubelet and wait until healthy")
    assert written[TOPOLOGY_NONE]["changed"] is True
    paths = {entry["path"] for entry in written[TOPOLOGY_NONE]["files"] if entry["changed"]}
    # the policy changes to static, so the "none" checkpoint must go too (the kubelet is stopped first)
    assert paths == {DROPIN, "/etc/default/kubelet", "/var/lib/kubelet/cpu_manager_state"}
    assert written[TOPOLOGY_NONE]["persistence"] == "durable" and written[TOPOLOGY_NONE]["config_dir_route"]
    assert written[STALE]["stale_state_files"][0]["path"] == "/var/lib/kubelet/cpu_manager_state"
    assert {node: fingerprint(lab, node) for node in NODES} == before
    for node in NODES:
        assert sh(lab, node, "test -e %s" % HOOK_LOG, check=False).returncode != 0


def test_apply_fixes_flags_where_they_live_and_handles_the_stale_checkpoint(lab):
    report = playbook(lab)
    print("apply took %.1fs" % report["seconds"])
    assert report["rc"] == 0, json.dumps(report["stats"])
    for node in NODES:
        assert report["stats"][node]["changed"] >= 1
        assert healthy(lab, node), node
        effective = kubelet_configz(lab, node)
        policies = (effective["topologyManagerPolicy"], effective["cpuManagerPolicy"])
        assert policies == ("single-numa-node", "static"), (node, policies)
    plan = results(report, "Kubelet | plan the configuration (read-only)")
    source = plan[TOPOLOGY_NONE]["sources"]["topologyManagerPolicy"]["source_before"]
    assert (source["kind"], source["path"]) == ("flag", "/etc/default/kubelet")
    source = plan[FLAGGED]["sources"]["cpuManagerPolicy"]["source_before"]
    assert (source["kind"], source["path"]) == ("flag", "/var/lib/kubelet/kubeadm-flags.env")
    assert sh(lab, TOPOLOGY_NONE, "cat /etc/default/kubelet").stdout == "KUBELET_EXTRA_ARGS=--v=2 %s\n" % CONFIG_DIR_FLAG
    assert "--cpu-manager-policy" not in sh(lab, FLAGGED, "cat /var/lib/kubelet/kubeadm-flags.env").stdout
    config = sh(lab, TOPOLOGY_NONE, "cat %s" % DROPIN).stdout
    assert "topologyManagerPolicy: single-numa-node" in config and "reservedSystemCPUs: 0-1" in config
    # a policy change or a stale checkpoint went through the drain hook and a stopped kubelet
    for node in (TOPOLOGY_NONE, STALE, FLAGGED):
        assert "kubelet stopped next: True" in sh(lab, node, "cat %s" % HOOK_LOG).stdout, node
    assert '"policyName":"static"' in sh(lab, STALE, "cat /var/lib/kubelet/cpu_manager_state").stdout


def test_second_run_changes_nothing(lab):
    before = {node: fingerprint(lab, node) for node in NODES}
    hooks = {node: sh(lab, node, "cat %s" % HOOK_LOG).stdout for node in NODES}
    report = playbook(lab)
    print("re-apply took %.1fs" % report["seconds"])
    assert report["rc"] == 0
    for node in NODES:
        assert report["stats"][node]["changed"] == 0, node
    assert {node: fingerprint(lab, node) for node in NODES} == before
    assert {node: sh(lab, node, "cat %s" % HOOK_LOG).stdout for node in NODES} == hooks


def test_config_the_kubelet_rejects_is_rolled_back(lab):
    node = FLAGGED
    before = fingerprint(lab, node)
    bad = {"kubelet_topology_extra_settings": {"imageGCHighThresholdPercent": 10, "imageGCLowThresholdPercent": 50},
           "kubelet_topology_health_timeout": 20}
    report = playbook(lab, "-e", json.dumps(bad), limit=(node,))
    print("rollback run took %.1fs" % report["seconds"])
    assert report["rc"] != 0
    failures = {name: hosts[node] for name, hosts in report["results"].items()
                if hosts.get(node, {}).get("failed") and not hosts[node].get("ignore_errors")}
    # one task: kubelet_config wrote, restarted, saw the kubelet not come back, put the files back and failed the host
    assert list(failures) == ["Kubelet | write the configuration, restart the kubelet and wait until healthy"], failures
    assert report["stats"][node]["failures"] == 1
    failed = failures["Kubelet | write the configuration, restart the kubelet and wait until healthy"]
    assert failed["failed"] is True
    assert "did not become healthy" in failed["msg"]
    assert "imageGC" in failed["msg"], failed["msg"]
    assert DROPIN in failed["msg"]
    assert healthy(lab, node)
    after = fingerprint(lab, node)
    dropin_line = [line for line in after.splitlines() if line.startswith(DROPIN + " ")][0]
    assert dropin_line.split()[1] == [line for line in before.splitlines() if line.startswith(DROPIN + " ")][0].split()[1]
    assert "imageGC" not in sh(lab, node, "cat %s" % DROPIN).stdout
