# SPDX-License-Identifier: GPL-3.0-or-later
"""Role device_permissions on the seed-failures lab, over SSH: non-root NVML fails before and works after,
the modprobe options appear (no udev rule: it would never fire), check mode changes nothing, a second run changes
nothing; and after nvidia-modprobe recreates the nodes, what the policy keeps stays and the drift check reports what
regressed (issue 13 item 17)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from gpuharden_lab import REPO_ROOT, layout, manager

from tests.labfixtures import shared_lab
from tests.unit.test_device_nodes import nvidia_modprobe

pytestmark = pytest.mark.lab

PLAYBOOK = REPO_ROOT / "tests/integration/playbooks/device_permissions.yml"
NODE_PYTHON = layout.NODE_PYTHON / "bin/python"
MODPROBE = "/etc/modprobe.d/zz-gpuharden-nvidia.conf"
UDEV = "/etc/udev/rules.d/70-gpuharden-nvidia.rules"
PERM_NODE = "seed-dev-perm"
MIG_NODE = "seed-mig-strategy"
# Under policy restricted (group nogroup) on PERM_NODE (8 A100s with the MIG capabilities): the nodes whose permissions
# no setting keeps: uvm (root:root 0666) and the MIG monitor capability (root:root 0444; config is 0400 either way).
NOT_PERSISTABLE = ["/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]

# Imports pynvml as root (the node's Python lives under /root), then drops to nobody before NVML runs.
NVML_AS_NOBODY = r"""
import json, os, pynvml, ctypes.util
os.setgroups([]); os.setgid(65534); os.setuid(65534)
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as error:
    print(json.dumps({"init": error.value})); raise SystemExit
errors = []
for index in range(pynvml.nvmlDeviceGetCount()):
    try:
        pynvml.nvmlDeviceGetHandleByIndex(index); errors.append(None)
    except pynvml.NVMLError as error:
        errors.append(error.value)
print(json.dumps({"init": None, "errors": errors}))
"""
# Files and device nodes whose bytes, owner, mode and times must not move when nothing is to change.
SNAPSHOT = (
    "stat -c '%n %F %t:%T %u:%g %a %y %z' /dev/nvidia* /dev/nvidia-caps/* /dev/char/* 2>/dev/null; "
    "for f in /etc/modprobe.d/* /etc/udev/rules.d/*; do [ -f \"$f\" ] && sha256sum \"$f\" && stat -c '%n %y' \"$f\"; done; true"
)


@pytest.fixture(scope="module")
def lab():
    with shared_lab("seed-failures", unit="node-roles") as state:
        yield state


def _ssh(state, node, command):
    result = manager.ssh(state["nodes"][node]["address"], command)
    assert result.returncode == 0, "%s: %s\n%s" % (node, command, result.stderr)
    return result.stdout


def _nvml_as_nobody(state, node):
    return json.loads(_ssh(state, node, "%s - <<'EOF'\n%s\nEOF" % (NODE_PYTHON, NVML_AS_NOBODY)))


def _snapshots(state):
    return {node: _ssh(state, node, SNAPSHOT) for node in state["nodes"]}


def _play(state, *args, hosts="gpu_nodes"):
    """Run the test playbook; returns ({host: saved result}, seconds)."""
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
        started = time.monotonic()
        completed = subprocess.run(
            ["ansible-playbook", "-i", state["inventory"], str(PLAYBOOK), "-e", "device_permissions_test_results=%s" % results,
             "-e", "device_permissions_test_hosts=%s" % hosts, *args],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
        saved = {name[:-5]: json.loads(Path(results, name).read_text()) for name in os.listdir(results)}
    assert saved, "no result saved: %s\n%s" % (completed.stdout[-3000:], completed.stderr[-3000:])
    return saved, elapsed


def _results(saved):
    failed = {host: entry["result"].get("msg") for host, entry in saved.items() if not entry["ok"]}
    assert not failed, failed
    return {host: entry["result"] for host, entry in saved.items()}


def test_before_the_role_nonroot_nvml_fails_on_the_0600_node(lab):
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0").split() == ["root:root", "600"]
    before = _nvml_as_nobody(lab, PERM_NODE)
    assert before == {"init": None, "errors": [4] + [None] * 7}, before  # NVMLError_NoPermission on GPU 0
    assert _nvml_as_nobody(lab, "seed-isolation")["errors"] == [None] * 8  # the same fixture, nodes at 0666


def test_check_mode_changes_nothing(lab):
    before = _snapshots(lab)
    saved, elapsed = _play(lab, "--check", "--diff")
    results = _results(saved)
    assert set(results) == set(lab["nodes"])
    assert all(result["changed"] for result in results.values())  # files and /dev/char links everywhere
    assert "/dev/nvidia0: char 195:0 root:root 0600 -> char 195:0 root:root 0666" in results[PERM_NODE]["actions"]
    assert _snapshots(lab) == before
    print("check-mode run on %d nodes: %.1fs" % (len(results), elapsed))


def test_apply_fixes_the_nodes_and_writes_the_files(lab):
    saved, elapsed = _play(lab)
    results = _results(saved)
    assert all(result["changed"] for result in results.values())
    assert results[PERM_NODE]["nodes"]["/dev/nvidia0"]["action"] == "fix"
    assert all(result["reboot_or_reload_required"] is False and result["conflicts"] == [] for result in results.values())
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0").split() == ["root:root", "666"]
    assert _ssh(lab, PERM_NODE, "readlink /dev/char/195:0 /dev/char/195:255").split() == ["../nvidia0", "../nvidiactl"]
    assert "options nvidia NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=0 NVreg_DeviceFileMode=0666" in _ssh(lab, PERM_NODE, "cat " + MODPROBE)
    assert _ssh(lab, PERM_NODE, "test -e %s && echo present || echo absent" % UDEV).split() == ["absent"]
    assert _ssh(lab, MIG_NODE, "stat -c '%a' /dev/nvidia-caps/nvidia-cap1 /dev/nvidia-caps/nvidia-cap2").split() == ["400", "444"]
    assert _nvml_as_nobody(lab, PERM_NODE) == {"init": None, "errors": [None] * 8}
    print("apply run on %d nodes: %.1fs" % (len(results), elapsed))


def test_second_run_changes_nothing(lab):
    before = _snapshots(lab)
    saved, elapsed = _play(lab)
    results = _results(saved)
    assert {host: result["changed"] for host, result in results.items()} == {host: False for host in lab["nodes"]}
    assert _snapshots(lab) == before  # checksums, mtimes and ctimes
    print("idempotent run on %d nodes: %.1fs" % (len(results), elapsed))


def test_restricted_policy_and_its_consequence(lab):
    # nogroup (65534) is the probe's own gid: it keeps access; video (44) is not: it loses it.
    saved, _elapsed = _play(lab, "-e", "device_permissions_policy=restricted", "-e", "device_permissions_group=nogroup", hosts=PERM_NODE)
    result = _results(saved)[PERM_NODE]
    assert result["changed"] and result["reboot_or_reload_required"] is True  # the driver still runs with 0666
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0 /dev/nvidiactl").split() == ["root:nogroup", "660"] * 2
    # nothing keeps another value on uvm: it stays what nvidia-modprobe makes it, and the result says so
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia-uvm /dev/nvidia-uvm-tools").split() == ["root:root", "666"] * 2
    assert sorted(entry["path"] for entry in result["not_persistable"]) == NOT_PERSISTABLE
    assert _nvml_as_nobody(lab, PERM_NODE) == {"init": None, "errors": [None] * 8}
    _results(_play(lab, "-e", "device_permissions_policy=restricted", "-e", "device_permissions_group=video", hosts=PERM_NODE)[0])
    assert _nvml_as_nobody(lab, PERM_NODE) == {"init": 4}  # pods without the group: Insufficient Permissions
    back = _results(_play(lab, hosts=PERM_NODE)[0])[PERM_NODE]
    assert back["changed"] and back["reboot_or_reload_required"] is False
    assert _nvml_as_nobody(lab, PERM_NODE) == {"init": None, "errors": [None] * 8}


def test_conflicting_modprobe_file_fails_and_changes_nothing(lab):
    _ssh(lab, PERM_NODE, "printf 'options nvidia NVreg_DeviceFileMode=0600\\n' > /etc/modprobe.d/zzz-site.conf; chmod 0600 /dev/nvidia0")
    before = _snapshots(lab)[PERM_NODE]
    saved, _elapsed = _play(lab, hosts=PERM_NODE)
    entry = saved[PERM_NODE]
    assert entry["ok"] is False
    assert "/etc/modprobe.d/zzz-site.conf line 1: NVreg_DeviceFileMode=0600 (wanted 0666)" in entry["result"]["msg"]
    assert _snapshots(lab)[PERM_NODE] == before
    _ssh(lab, PERM_NODE, "rm /etc/modprobe.d/zzz-site.conf")
    assert _results(_play(lab, hosts=PERM_NODE)[0])[PERM_NODE]["nodes"]["/dev/nvidia0"]["action"] == "fix"


def _nvidia_modprobe(state, node, recreate):
    """Run the unit tests' nvidia-modprobe stand-in on the node itself (its /dev and /proc/driver are the lab's)."""
    script = "%s\nimport json\nprint(json.dumps(nvidia_modprobe('/', recreate=%r)))\n" % (inspect.getsource(nvidia_modprobe), recreate)
    return json.loads(_ssh(state, node, "%s - <<'EOF'\n%s\nEOF" % (NODE_PYTHON, script)))


def _drift_device_findings(state, *extra):
    """The drift check (gpuharden drift) on PERM_NODE: its device_nodes findings as {id: sorted paths}."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"),
                   PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
        completed = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-q", "-i", state["inventory"], "--limit", PERM_NODE,
                                    "--report", str(report), *extra], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
        assert report.exists(), completed.stderr[-3000:]
        node = json.loads(report.read_text())["nodes"][PERM_NODE]
    found = {}
    for entry in node["findings"]:
        if entry["check"] == "device_nodes":
            found.setdefault(entry["id"], []).append(entry.get("path"))
    return {ident: sorted(paths, key=str) for ident, paths in found.items()}, node


def test_item17_nodes_recreated_like_nvidia_modprobe_keep_what_sticks_and_drift_reports_the_rest(lab):
    restricted = ("-e", "device_permissions_policy=restricted", "-e", "device_permissions_group=nogroup")
    nogroup = int(_ssh(lab, PERM_NODE, "getent group nogroup | cut -d: -f3"))
    gpus = ["/dev/nvidia%d" % minor for minor in range(8)]
    _results(_play(lab, *restricted, hosts=PERM_NODE)[0])
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0").split() == ["root:nogroup", "660"]

    # 1. The driver still runs with root:root 0666 (not reloaded): nvidia-modprobe, at the next container start or
    #    after a reboot, makes the nodes anew from the running values.  The drift check reports exactly that.
    touched = _nvidia_modprobe(lab, PERM_NODE, recreate=True)
    assert set(gpus + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]) <= set(touched)
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0 /dev/nvidia-uvm").split() == ["root:root", "666"] * 2
    found, node = _drift_device_findings(lab, *restricted)
    assert set(found["device_node_permissions"]) == set(gpus + ["/dev/nvidiactl", "/dev/nvidia-modeset"]), found
    assert "driver_params_stale" in found and node["status"] == "drift"
    assert found["device_permissions_not_persistable"] == NOT_PERSISTABLE

    # 2. The driver reloaded with the options the role wrote (the lab's params file shows them): after the
    #    role and another re-creation, nvidia<N> and nvidiactl keep the policy, uvm keeps nvidia-modprobe's values,
    #    and the drift check has no regression to report, only what cannot stick (info, not remediable).
    options = _ssh(lab, PERM_NODE, "cat " + MODPROBE)
    assert "NVreg_DeviceFileGID=%d NVreg_DeviceFileMode=0660" % nogroup in options
    params = "/proc/driver/nvidia/params"
    original = _ssh(lab, PERM_NODE, "cat " + params)
    _ssh(lab, PERM_NODE, "sed -i -e 's/^DeviceFileGID: .*/DeviceFileGID: %d/' -e 's/^DeviceFileMode: .*/DeviceFileMode: %d/' %s"
         % (nogroup, 0o660, params))
    try:
        result = _results(_play(lab, *restricted, hosts=PERM_NODE)[0])[PERM_NODE]
        assert result["reboot_or_reload_required"] is False
        _nvidia_modprobe(lab, PERM_NODE, recreate=True)
        assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0 /dev/nvidia7 /dev/nvidiactl").split() == ["root:nogroup", "660"] * 3
        assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia-uvm /dev/nvidia-uvm-tools").split() == ["root:root", "666"] * 2
        assert _nvidia_modprobe(lab, PERM_NODE, recreate=False) == []  # the next container start changes nothing
        found, node = _drift_device_findings(lab, *restricted)
        assert found == {"device_permissions_not_persistable": NOT_PERSISTABLE}, found
        assert node["checks"]["device_nodes"]["status"] == "findings"
        assert _nvml_as_nobody(lab, PERM_NODE) == {"init": None, "errors": [None] * 8}  # nobody is in nogroup
    finally:
        _ssh(lab, PERM_NODE, "cat > %s <<'EOF'\n%sEOF" % (params, original))
        _results(_play(lab, hosts=PERM_NODE)[0])
