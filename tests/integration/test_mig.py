# SPDX-License-Identifier: GPL-3.0-or-later
"""Role mig over SSH on the real-nodes lab, node real-c17-0 (4x H100, MIG on for GPUs 0-2 with a layout, fixture
h100-mig-enabled), on the real kubelet, containerd 1.7 and device plugin v0.18.2 (migStrategy mixed): the fleet is
hardened first, as an adopter's would be.

1. The role: check mode (plan, the NVML state file byte-identical) -> apply (drain, apply, the node's plugin pods
   restarted, uncordon) -> re-apply (nothing changes, state file checksum and mtime unchanged, nothing restarted) ->
   the real kubelet's allocatable nvidia.com/mig-<profile> counts, from the real plugin, match the layout.
2. The real plugin enumerates the MIG devices only when it starts (k8s-device-plugin cmd/nvidia-device-plugin/main.go,
   start: at start-up, on SIGHUP, on a new kubelet socket, 30 s after a failed start): with the restart switched off
   (mig_restart_device_plugin=false, the role before it had one), a harden run that changes the layout leaves the real
   kubelet advertising the destroyed GPU instances, and its post-check fails the node with mig_not_advertised.
3. A busy GPU whose mode must change, with force: the mode change stays pending, the role runs the reset step and
   re-applies, and the node converges.
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
import yaml
from gpuharden_lab import NVML_DOUBLE_DIR, manager
from gpuharden_lab.cluster import api_client
from kubernetes import client

from tests.integration.test_real_nodes import C17, real_nodes_lab, restart_plugin_pods
from tests.integration.test_real_nodes_harden import EXTRA_VARS, H100_MIG_MIXED, drift

# real_nodes: they need `make real-components` (which `make integration` builds first); `make real-nodes` runs only these.
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(__file__).parent / "playbooks" / "mig.yml"
NODE = C17
STATE = "/var/lib/nvml-double/state.json"
FIXTURE = "/etc/nvml-double/fixture.json"
CTL = str(NVML_DOUBLE_DIR / "nvml_double_ctl.py")
# GPU0 keeps its 7x 1g.10gb (a process runs there: untouched GPUs may be busy); GPU1 goes from
# 3g.40gb(3x 1c CIs) + 2x 2g.20gb to 3x 2g.20gb; GPU2 from empty to 2x 3g.40gb; GPU3 stays without MIG.
LAYOUT = {"0": {"1g.10gb": 7}, "1": {"2g.20gb": 3}, "2": {"3g.40gb": 2}, "3": "disabled"}
EXPECTED = {"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-2g.20gb": 3, "nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 1}
# Then GPU2 goes to 7x 1g.10gb.
SECOND_LAYOUT = dict(LAYOUT, **{"2": {"1g.10gb": 7}})
SECOND_EXPECTED = {"nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-2g.20gb": 3, "nvidia.com/gpu": 1}


@pytest.fixture(scope="module")
def lab():
    labs = real_nodes_lab()
    state = next(labs)
    try:
        hardened = manager.run_harden(state["inventory"], EXTRA_VARS, timeout=900)
        assert hardened.returncode == 0, hardened.stdout[-6000:]
        yield state
    finally:
        labs.close()


def sh(state, command):
    done = manager.ssh(state["nodes"][NODE]["address"], command)
    assert done.returncode == 0, "%s: %s: %s" % (NODE, command, done.stderr)
    return done.stdout


def state_file(state):
    """sha256 and mtime of the node's NVML state file (the double's whole MIG state)."""
    sha, mtime = sh(state, "sha256sum %s | cut -d' ' -f1; stat -c %%Y.%%y %s" % (STATE, STATE)).split()[:2]
    return sha, mtime


def playbook(state, variables, check=False):
    """Run the test playbook; returns {rc, seconds, results: {task name: result of NODE}}."""
    with tempfile.TemporaryDirectory(prefix="gpuharden-mig-test-") as private_data_dir:
        extra = Path(private_data_dir) / "extra.json"
        extra.write_text(json.dumps(variables))
        cmdline = ["--limit", NODE, "-e", "mig_test_hosts=%s" % NODE, "-e", "@%s" % extra] + (["--check", "--diff"] if check else [])
        envvars = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                   "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
        started = time.monotonic()
        runner = ansible_runner.run(private_data_dir=private_data_dir, playbook=str(PLAYBOOK),
                                    inventory=state["inventory"], cmdline=shlex.join(cmdline), envvars=envvars,
                                    quiet=True, json_mode=False)
        results = {}
        for event in runner.events:
            data = event.get("event_data", {})
            if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped") and data.get("host") == NODE:
                res = dict(data.get("res") or {})
                res.setdefault("failed", event["event"] == "runner_on_failed")
                res["skipped"] = event["event"] == "runner_on_skipped" or res.get("skipped", False)
                results[data.get("task", "")] = res
        if not results:
            raise AssertionError("ansible did not run (%s, rc %s): %s" % (runner.status, runner.rc, runner.stdout.read()))
        return {"rc": runner.rc, "seconds": round(time.monotonic() - started, 1), "results": results}


RESTART = "Device plugin restart | evict the node's device plugin pods (their DaemonSets start them again)"


def task(report, suffix):
    found = [res for name, res in report["results"].items() if name.endswith(suffix)]
    assert found, "no task ending with %r in %s" % (suffix, sorted(report["results"]))
    return found[-1]


def node_status(state):
    api = client.CoreV1Api(api_client(state["cluster"]["admin_kubeconfig"]))
    return api.read_node(NODE)


def wait_for_allocatable(state, expected, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        allocatable = node_status(state).status.allocatable or {}
        nvidia = {key: int(value) for key, value in allocatable.items() if key.startswith("nvidia.com/")}
        nvidia = {key: value for key, value in nvidia.items() if value}
        if nvidia == expected or time.monotonic() > deadline:
            return nvidia
        time.sleep(2)


def test_role_applies_layout_restarts_the_plugin_and_the_real_kubelet_advertises_it(lab):
    fixture_layout = {key: int(value) for key, value in H100_MIG_MIXED.items()}  # what the hardened fleet advertises
    assert wait_for_allocatable(lab, fixture_layout, timeout=60) == fixture_layout  # ends at once when settled
    variables = {"mig_layout": LAYOUT, "mig_strategy": "mixed"}

    before = state_file(lab)
    checked = playbook(lab, variables, check=True)
    assert checked["rc"] == 0, checked["results"]
    plan = task(checked, "MIG | plan (no NVML mutation)")
    assert plan["changed"] is True and {step["gpu"] for step in plan["plan"]} == {1, 2}
    assert state_file(lab) == before  # check mode: the node's MIG state is byte-identical

    applied = playbook(lab, variables)
    assert applied["rc"] == 0, applied["results"]
    result = task(applied, "MIG | apply the layout")
    assert result["changed"] is True and result["reset_required"] is False
    assert result["after"]["1"] == {"mig_enabled": True, "mig_devices": {"2g.20gb": 3}}
    assert result["after"]["2"] == {"mig_enabled": True, "mig_devices": {"3g.40gb": 2}}
    assert result["advertised_resources"]["mixed"] == EXPECTED
    for name in ("Cordon drain | cordon the node and evict its pods, PodDisruptionBudgets honoured",
                 "Uncordon | make the node schedulable again"):
        ran = task(applied, name)
        assert not ran["skipped"] and not ran["failed"], (name, ran)
    restarted = task(applied, RESTART)
    assert [(pod["node"], pod["controller"]) for pod in restarted["evicted"]] == [(NODE, "DaemonSet/nvidia-device-plugin-daemonset")]
    assert not node_status(lab).spec.unschedulable
    print("mig role apply: %.1fs" % applied["seconds"])
    # The new instances' capability entries want /dev/nvidia-caps nodes, made in the same run (the device_permissions
    # stage again): the drift check finds none missing.
    nodes = task(applied, "Repair the NVIDIA device nodes and persist their permissions")
    assert not nodes["skipped"] and nodes["changed"] is True, nodes
    report = drift(lab, "-l", NODE, "--json")
    assert report.returncode in (0, 1), report.stderr[-3000:]
    findings = json.loads(report.stdout)["nodes"][NODE]["findings"]
    assert [f.get("path") for f in findings if f["id"] == "device_node_missing"] == [], findings

    settled = state_file(lab)
    again = playbook(lab, variables)
    assert again["rc"] == 0
    assert task(again, "MIG | plan (no NVML mutation)")["changed"] is False
    assert task(again, "MIG | apply the layout")["skipped"] is True
    assert task(again, "MIG | cordon and drain the node")["skipped"] is True  # nothing to change: no drain
    assert task(again, "MIG | restart the node's device plugin pods, which would go on advertising the old layout")["skipped"] is True
    assert state_file(lab) == settled  # checksum and mtime
    print("mig role re-apply: %.1fs" % again["seconds"])

    assert wait_for_allocatable(lab, EXPECTED) == EXPECTED


def test_without_the_restart_the_real_plugin_advertises_the_old_layout_and_the_post_check_fails(lab):
    # the post-check's wait for the node to advertise the new layout, shortened: it cannot end well here
    stale = manager.run_harden(lab["inventory"], dict(EXTRA_VARS, gpuharden_mig_layout=SECOND_LAYOUT, mig_restart_device_plugin=False,
                                                      gpuharden_postcheck_settle_seconds=30),
                               timeout=900, limit=NODE)
    assert stale.returncode != 0 and "MIG | apply the layout" in stale.stdout and "mig_not_advertised" in stale.stdout, stale.stdout[-8000:]
    assert wait_for_allocatable(lab, EXPECTED, timeout=5) == EXPECTED  # the old layout, 30 s and more after the change
    restart_plugin_pods(lab, NODE)
    assert wait_for_allocatable(lab, SECOND_EXPECTED, timeout=120) == SECOND_EXPECTED


def test_busy_gpu_pending_mode_is_reset_by_the_role(lab):
    sh(lab, "%s %s set-processes --state %s --fixture %s --gpu 3 --json '[{\"pid\": 4711, \"used_memory_mib\": 64}]'"
       % (lab_python(lab), CTL, STATE, FIXTURE))
    layout = dict(LAYOUT, **{"3": {"1g.10gb": 7}})
    refused = playbook(lab, {"mig_layout": layout})
    assert refused["rc"] != 0
    assert "GPU 3 (00000000:5D:00.0) pids 4711" in task(refused, "MIG | plan (no NVML mutation)")["msg"]

    reset = [lab_python(lab), CTL, "reset", "--state", STATE, "--fixture", FIXTURE, "--gpu", "3", "--force"]
    report = playbook(lab, {"mig_layout": layout, "mig_force": True, "mig_reset_command": reset})
    assert report["rc"] == 0, report["results"]
    first = task(report, "MIG | apply the layout")
    assert first["reset_required"] is True and first["gpus_to_reset"] == ["00000000:5D:00.0"]
    assert task(report, "MIG | reset the GPUs whose mode change is pending")["changed"] is True
    final = task(report, "MIG | apply again after the reset")
    assert final["reset_required"] is False
    assert final["after"]["3"] == {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}}
    expected = dict(EXPECTED, **{"nvidia.com/mig-1g.10gb": 14})
    del expected["nvidia.com/gpu"]
    assert wait_for_allocatable(lab, expected, timeout=120) == expected
    assert task(playbook(lab, {"mig_layout": layout}), "MIG | plan (no NVML mutation)")["changed"] is False


def lab_python(state):
    inventory = yaml.safe_load(Path(state["inventory"]).read_text())
    return inventory["all"]["vars"]["ansible_python_interpreter"]
