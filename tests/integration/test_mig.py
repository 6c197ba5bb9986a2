# SPDX-License-Identifier: GPL-3.0-or-later
"""Role mig over SSH on the seed-failures lab, node seed-mig-strategy (4x H100, MIG on for GPUs 0-2 with a
layout, fixture h100-mig-enabled) whose device plugin runs migStrategy none.

The test switches the plugin's ConfigMap to migStrategy mixed (as admin), then: check mode (plan, the
NVML state file byte-identical) -> apply (drain, apply, uncordon) -> re-apply (nothing changes, state
file checksum and mtime unchanged) -> the Node's allocatable nvidia.com/mig-<profile> counts (kubelet
stand-in mirroring the plugin) match the layout.  Then a busy GPU whose mode must change, with force:
the mode change stays pending, the role runs the reset step and re-applies, and the node converges.
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

from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(__file__).parent / "playbooks" / "mig.yml"
NODE = "seed-mig-strategy"
STATE = "/var/lib/nvml-double/state.json"
FIXTURE = "/etc/nvml-double/fixture.json"
CTL = str(NVML_DOUBLE_DIR / "nvml_double_ctl.py")
# GPU0 keeps its 7x 1g.10gb (a process runs there: untouched GPUs may be busy); GPU1 goes from
# 3g.40gb(3x 1c CIs) + 2x 2g.20gb to 3x 2g.20gb; GPU2 from empty to 2x 3g.40gb; GPU3 stays without MIG.
LAYOUT = {"0": {"1g.10gb": 7}, "1": {"2g.20gb": 3}, "2": {"3g.40gb": 2}, "3": "disabled"}
EXPECTED = {"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-2g.20gb": 3, "nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 1}


@pytest.fixture(scope="module")
def lab():
    with running_lab("seed-failures") as state:
        yield state


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
        cmdline = ["--limit", NODE, "-e", "@%s" % extra] + (["--check", "--diff"] if check else [])
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


def task(report, suffix):
    found = [res for name, res in report["results"].items() if name.endswith(suffix)]
    assert found, "no task ending with %r in %s" % (suffix, sorted(report["results"]))
    return found[-1]


def set_mig_strategy(state, strategy):
    api = client.CoreV1Api(api_client(state["cluster"]["admin_kubeconfig"]))
    cm = api.read_namespaced_config_map("nvidia-plugin-config", "kube-system")
    config = yaml.safe_load(cm.data["config.yaml"])
    config["flags"]["migStrategy"] = strategy
    api.patch_namespaced_config_map("nvidia-plugin-config", "kube-system",
                                    {"data": {"config.yaml": yaml.safe_dump(config, sort_keys=False)}})


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


def test_role_applies_layout_and_node_advertises_it(lab):
    set_mig_strategy(lab, "mixed")
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
    assert not node_status(lab).spec.unschedulable
    print("mig role apply: %.1fs" % applied["seconds"])

    settled = state_file(lab)
    again = playbook(lab, variables)
    assert again["rc"] == 0
    assert task(again, "MIG | plan (no NVML mutation)")["changed"] is False
    assert task(again, "MIG | apply the layout")["skipped"] is True
    assert task(again, "MIG | cordon and drain the node")["skipped"] is True  # nothing to change: no drain
    assert state_file(lab) == settled  # checksum and mtime
    print("mig role re-apply: %.1fs" % again["seconds"])

    assert wait_for_allocatable(lab, EXPECTED) == EXPECTED


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
    assert wait_for_allocatable(lab, expected) == expected
    assert task(playbook(lab, {"mig_layout": layout}), "MIG | plan (no NVML mutation)")["changed"] is False


def lab_python(state):
    inventory = yaml.safe_load(Path(state["inventory"]).read_text())
    return inventory["all"]["vars"]["ansible_python_interpreter"]
