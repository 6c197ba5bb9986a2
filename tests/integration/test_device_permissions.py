# SPDX-License-Identifier: GPL-3.0-or-later
"""Role device_permissions on the seed-failures lab, over SSH: non-root NVML fails before and works after,
the modprobe/udev files appear, check mode changes nothing, a second run changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuharden.lab import REPO_ROOT, layout, manager
from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab

PLAYBOOK = REPO_ROOT / "tests/integration/playbooks/device_permissions.yml"
NODE_PYTHON = layout.NODE_PYTHON / "bin/python"
MODPROBE = "/etc/modprobe.d/zz-gpuharden-nvidia.conf"
UDEV = "/etc/udev/rules.d/70-gpuharden-nvidia.rules"
PERM_NODE = "seed-dev-perm"
MIG_NODE = "seed-mig-strategy"

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
    with running_lab("seed-failures") as state:
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
    assert 'KERNEL=="nvidia-uvm", OWNER="root", GROUP="root", MODE="0666"' in _ssh(lab, PERM_NODE, "cat " + UDEV)
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
    assert _ssh(lab, PERM_NODE, "stat -c '%U:%G %a' /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm").split() == ["root:nogroup", "660"] * 3
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
