# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia_device_nodes: the pure planner, module runs on temp node roots, malformed input, and NVML as nobody."""

from __future__ import annotations

import ctypes.util  # noqa: F401 (loaded before a child drops to nobody, who cannot read the stdlib here)
import os
import stat

import pynvml
import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils import _device_nodes as dn
from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError

from gpuharden.lab.noderoot import build_node_root
from tests.unit.conftest import UNPRIVILEGED_UID, run_as, run_module, tree_snapshot

MODPROBE = "/etc/modprobe.d/zz-gpuharden-nvidia.conf"
UDEV = "/etc/udev/rules.d/70-gpuharden-nvidia.rules"
DEFAULT = dn.resolve_policy("default")


def _node(world_tmp, fixture="l4", **kwargs):
    node = build_node_root(world_tmp / "node", fixture, **kwargs)
    (node.root / "dev/char").mkdir()
    for name, text in (("passwd", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"),
                       ("group", "root:x:0:\nvideo:x:44:\ngpu:x:2000:\nnogroup:x:65534:\n")):
        (node.root / "etc" / name).write_text(text)
    return node


def _run(node, check=False, diff=True, **args):
    return run_module("nvidia_device_nodes", dict({"root": str(node.root), "_ansible_check_mode": check, "_ansible_diff": diff}, **args), {})


# ---------------------------------------------------------------------------------------------
# Pure planner


def test_policy_resolution():
    assert DEFAULT["uid"] == 0 and DEFAULT["gid"] == 0 and DEFAULT["mode"] == 0o666
    restricted = dn.resolve_policy("restricted", group="44")
    assert (restricted["uid"], restricted["gid"], restricted["mode"]) == (0, 44, 0o660)
    assert dn.resolve_policy("restricted", group="gpu", lookup_group={"gpu": 2000}.get)["gid"] == 2000
    assert dn.resolve_policy("custom", mode=0o640, owner=5, group=7)["mode"] == 0o640  # YAML 0640 unquoted
    assert dn.parse_mode("660") == dn.parse_mode("0660") == 0o660


def test_cap_modes_never_widen():
    assert dn.cap_mode(0o444, DEFAULT) == 0o444
    assert dn.cap_mode(0o400, DEFAULT) == 0o400
    restricted = dn.resolve_policy("restricted", group="44")
    assert dn.cap_mode(0o444, restricted) == 0o440
    assert dn.cap_mode(0o400, restricted) == 0o400


def test_modprobe_plan_keeps_comments_and_other_parameters():
    text = "# site file\noptions nvidia NVreg_PreserveVideoMemoryAllocations=1 NVreg_DeviceFileMode=0600\n# end\n"
    after = dn.plan_modprobe("/x.conf", text, DEFAULT)
    assert after == ("# site file\noptions nvidia NVreg_PreserveVideoMemoryAllocations=1 NVreg_DeviceFileMode=0666"
                     " NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=0\n# end\n")
    assert dn.plan_modprobe("/x.conf", after, DEFAULT) == after
    # Decimal 438 is the same mode: left alone.
    same = "options nvidia NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=0 NVreg_DeviceFileMode=438\n"
    assert dn.plan_modprobe("/x.conf", same, DEFAULT) == same
    assert dn.plan_modprobe("/x.conf", "# only a comment", DEFAULT).startswith("# only a comment\noptions nvidia ")


def test_udev_plan_replaces_only_its_lines():
    rules = dn.udev_rules(DEFAULT, {1: 0o400, 2: 0o444})
    text = '# mine\nKERNEL=="nvidia-uvm", MODE="0600"\nKERNEL=="sda", GROUP="disk"\n'
    after = dn.plan_udev("/x.rules", text, rules)
    lines = after.splitlines()
    assert lines[0] == "# mine" and lines[2] == 'KERNEL=="sda", GROUP="disk"'
    assert lines[1] == 'KERNEL=="nvidia-uvm", OWNER="root", GROUP="root", MODE="0666"'
    assert 'KERNEL=="nvidia-cap2", OWNER="root", GROUP="root", MODE="0444"' in lines
    assert dn.plan_udev("/x.rules", after, rules) == after


def test_conflicts_ordering_and_cmdline():
    others = [("/etc/modprobe.d/nvidia.conf", "options nvidia NVreg_DeviceFileMode=0600\n"),
              ("/etc/modprobe.d/zzz.conf", "options nvidia \\\n  NVreg_DeviceFileGID=44\n"),
              ("/etc/modprobe.d/zzzz.conf", "options nvidia NVreg_DeviceFileUID=0 NVreg_ModifyDeviceFiles=0\n")]
    found = dn.find_conflicts(others, MODPROBE, None, "quiet nvidia.NVreg_DeviceFileMode=0660", DEFAULT)
    summary = [(c["file"], c["line"], c["parameter"], c["overrides"]) for c in found]
    assert summary == [
        ("/etc/modprobe.d/nvidia.conf", 1, "NVreg_DeviceFileMode", False),
        ("/etc/modprobe.d/zzz.conf", 1, "NVreg_DeviceFileGID", True),
        ("/etc/modprobe.d/zzzz.conf", 1, "NVreg_ModifyDeviceFiles", True),
        ("/proc/cmdline", None, "NVreg_DeviceFileMode", True),
    ]


def test_plan_on_seed_dev_perm_layout(world_tmp):
    node = _node(world_tmp, "dgx-a100-80gb", device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    observed = dn.observe(str(node.root), MODPROBE, UDEV)
    planned = dn.plan(observed, DEFAULT, root=str(node.root))
    assert [a["path"] for a in planned["node_actions"]] == ["/dev/nvidia0"]
    assert planned["nodes"]["/dev/nvidia0"]["action"] == "fix"
    assert "/dev/nvidia0: char 195:0 root:root 0600 -> char 195:0 root:root 0666" in planned["actions"]
    assert len(planned["link_actions"]) == 8 + 4 + 2  # 8 GPUs, ctl, modeset, uvm, uvm-tools, MIG config/monitor caps
    assert planned["reboot_or_reload_required"] is False
    restricted = dn.plan(observed, dn.resolve_policy("restricted", group="44"), root=str(node.root))
    assert restricted["reboot_or_reload_required"] is True
    assert restricted["driver_params"]["desired"]["DeviceFileMode"] == 0o660


def test_no_driver_plans_files_only(world_tmp):
    node = build_node_root(world_tmp / "node", None)
    planned = dn.plan(dn.observe(str(node.root), MODPROBE, UDEV), DEFAULT, root=str(node.root))
    assert planned["driver_loaded"] is False and planned["nodes"] == {} and planned["node_actions"] == []
    assert all(change.changed for change in planned["changes"])


# ---------------------------------------------------------------------------------------------
# Module runs


def test_check_apply_reapply(world_tmp):
    node = _node(world_tmp, "h100-mig-enabled", device_overrides={
        "/dev/nvidia0": {"mode": 0o600}, "/dev/nvidia1": None, "/dev/nvidia2": {"minor": 7},
        "/dev/nvidia-uvm": {"uid": 65534, "gid": 44}})
    before = tree_snapshot(node.root)
    checked = _run(node, check=True)
    assert checked["changed"] is True, checked
    assert tree_snapshot(node.root) == before
    assert {path: node_["action"] for path, node_ in checked["nodes"].items() if node_["action"] != "ok"} == {
        "/dev/nvidia0": "fix", "/dev/nvidia1": "create", "/dev/nvidia2": "replace", "/dev/nvidia-uvm": "fix"}
    assert checked["diff"][0]["before_header"] == "device nodes (before)"
    assert "/dev/nvidia0: char 195:0 root:root 0600\n" in checked["diff"][0]["before"]

    applied = _run(node, backup=True)
    assert applied["changed"] is True and applied["actions"] == checked["actions"]
    for minor in range(4):
        st = os.stat(node.root / ("dev/nvidia%d" % minor))
        assert stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == minor and stat.S_IMODE(st.st_mode) == 0o666
    assert os.readlink(node.root / "dev/char/235:1") == "../nvidia-caps/nvidia-cap1"
    assert stat.S_IMODE(os.stat(node.root / "dev/nvidia-caps/nvidia-cap1").st_mode) == 0o400
    assert "NVreg_DeviceFileMode=0666" in (node.root / MODPROBE.lstrip("/")).read_text()
    assert 'KERNEL=="nvidia-uvm-tools"' in (node.root / UDEV.lstrip("/")).read_text()

    after = tree_snapshot(node.root)
    again = _run(node)
    assert again["changed"] is False and again["actions"] == [] and again["diff"] == []
    assert tree_snapshot(node.root) == after


def test_restricted_policy_and_backup(world_tmp):
    node = _node(world_tmp)
    (node.root / "etc/modprobe.d").mkdir(parents=True)
    (node.root / MODPROBE.lstrip("/")).write_text("# keep me\noptions nvidia NVreg_DeviceFileMode=0666\n")
    result = _run(node, policy="restricted", group="video", backup=True)
    assert result["changed"] is True and result["reboot_or_reload_required"] is True
    st = os.stat(node.root / "dev/nvidia0")
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (44, 0o660)
    text = (node.root / MODPROBE.lstrip("/")).read_text()
    assert text == "# keep me\noptions nvidia NVreg_DeviceFileMode=0660 NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=44\n"
    assert list(result["backup_files"]) == [str(node.root / MODPROBE.lstrip("/"))]
    assert 'KERNEL=="nvidia-uvm", OWNER="root", GROUP="video", MODE="0660"' in (node.root / UDEV.lstrip("/")).read_text()


def test_nvml_as_nobody_fails_before_and_works_after(world_tmp, make_node):
    node = make_node("dgx-a100-80gb", device_overrides={"/dev/nvidiactl": {"mode": 0o600}, "/dev/nvidia3": {"mode": 0o600}})
    (node.root / "dev/char").mkdir()

    def probe():
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            return {"init": error.value}
        errors = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                pynvml.nvmlDeviceGetHandleByIndex(index)
                errors.append(None)
            except pynvml.NVMLError as error:
                errors.append(error.value)
        pynvml.nvmlShutdown()
        return {"init": None, "errors": errors}

    assert run_as(UNPRIVILEGED_UID, probe) == {"init": 4}
    result = _run(node)
    assert result["changed"] is True, result
    assert run_as(UNPRIVILEGED_UID, probe) == {"init": None, "errors": [None] * 8}


# ---------------------------------------------------------------------------------------------
# Malformed input: a clear message and nothing on the node changed

BAD_MODPROBE = {
    "not-a-number": ("options nvidia NVreg_DeviceFileMode=abc\n", "NVreg_DeviceFileMode='abc' is not a number"),
    "no-value": ("options nvidia NVreg_DeviceFileUID\n", "NVreg_DeviceFileUID has no value"),
    "empty-value": ("options nvidia NVreg_DeviceFileGID=\n", "NVreg_DeviceFileGID has no value"),
    "mode-range": ("options nvidia NVreg_DeviceFileMode=99999\n", "NVreg_DeviceFileMode=99999 is not a permission mode"),
    "bad-octal": ("options nvidia NVreg_DeviceFileMode=0999\n", "NVreg_DeviceFileMode='0999' is not a number"),
    "continued": ("options nvidia \\\n NVreg_DeviceFileMode=0666\n", "a continued 'options nvidia' line"),
}
BAD_UDEV = {
    "unbalanced-quote": ('KERNEL=="nvidia-uvm", MODE="0666\n', 'cannot parse the rule for KERNEL=="nvidia-uvm"'),
    "no-operator": ('KERNEL=="nvidia-cap1" MODE "0400"\n', 'cannot parse the rule for KERNEL=="nvidia-cap1"'),
}
BAD_OPTIONS = {
    "unknown-policy": ({"policy": "permissive"}, "value of policy must be one of"),
    "restricted-no-group": ({"policy": "restricted"}, "policy=restricted needs option group"),
    "restricted-world": ({"policy": "restricted", "group": "video", "mode": "0666"}, "gives others no access"),
    "restricted-group-ro": ({"policy": "restricted", "group": "video", "mode": "0640"}, "the group needs read and write"),
    "default-with-mode": ({"mode": "0660"}, "policy=default is the driver's default"),
    "custom-no-mode": ({"policy": "custom", "group": "video"}, "policy=custom needs option mode"),
    "mode-letters": ({"policy": "custom", "mode": "rw-rw----"}, "option mode='rw-rw----' is not a permission mode"),
    "mode-nine": ({"policy": "custom", "mode": "0999"}, "option mode='0999' is not a permission mode"),
    "mode-setuid": ({"policy": "custom", "mode": "4666"}, "option mode='4666' is not a permission mode"),
    "mode-decimal-int": ({"policy": "custom", "mode": 660}, "option mode=660 is not a permission mode"),
    "mode-bool": ({"policy": "custom", "mode": True}, "option mode=True is not a mode"),
    "group-unknown": ({"policy": "restricted", "group": "nosuchgroup"}, "option group=nosuchgroup: no such group"),
    "owner-unknown": ({"policy": "custom", "mode": "0600", "owner": "nosuchuser"}, "option owner=nosuchuser: no such user"),
    "group-too-big": ({"policy": "restricted", "group": "4294967295"}, "option group=4294967295: ids go up to"),
    "group-list": ({"policy": "restricted", "group": ["video"]}, "option group=['video']: give a name or a numeric id"),
    "group-bad-name": ({"policy": "restricted", "group": "vid eo"}, "neither a numeric id nor a valid group name"),
    "modprobe-suffix": ({"modprobe_file": "/etc/modprobe.d/gpuharden"},
                        "option modprobe_file=/etc/modprobe.d/gpuharden: give an absolute path ending in .conf"),
    "udev-suffix": ({"udev_rules_file": "/etc/udev/rules.d/70-nvidia"}, "ending in .rules"),
    "root-missing": ({"root": "/nonexistent/gpuharden"}, "option root=/nonexistent/gpuharden is not a directory"),
}


def _assert_refused(node, args, expected, before):
    result = _run(node, **args)
    assert result.get("failed") is True, result
    assert expected in result["msg"], result["msg"]
    assert tree_snapshot(node.root) == before


@pytest.mark.parametrize("case", sorted(BAD_MODPROBE))
def test_malformed_modprobe_file(world_tmp, case):
    text, expected = BAD_MODPROBE[case]
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    path = node.root / MODPROBE.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("# site comment\n" + text)
    _assert_refused(node, {}, "%s line 2: %s" % (MODPROBE, expected), tree_snapshot(node.root))


@pytest.mark.parametrize("case", sorted(BAD_UDEV))
def test_malformed_udev_file(world_tmp, case):
    text, expected = BAD_UDEV[case]
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    path = node.root / UDEV.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    _assert_refused(node, {}, "%s line 1: %s" % (UDEV, expected), tree_snapshot(node.root))


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_malformed_options(world_tmp, case):
    args, expected = BAD_OPTIONS[case]
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    _assert_refused(node, args, expected, tree_snapshot(node.root))


@pytest.mark.parametrize("case", ["not-utf8", "directory"])
def test_unreadable_own_files(world_tmp, case):
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    path = node.root / MODPROBE.lstrip("/")
    path.parent.mkdir(parents=True)
    if case == "directory":
        path.mkdir()
        expected = "is a directory, expected a file"
    else:
        path.write_bytes(b"options nvidia NVreg_DeviceFileMode=0666 # caf\xe9\n")
        expected = "not UTF-8 text"
    _assert_refused(node, {}, expected, tree_snapshot(node.root))


@pytest.mark.parametrize("case", ["node-is-directory", "char-link-is-file", "char-dir-is-file"])
def test_unexpected_entries_in_dev(world_tmp, case):
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": None if case == "node-is-directory" else {"mode": 0o600}})
    if case == "node-is-directory":
        (node.root / "dev/nvidia0").mkdir()
        expected = "/dev/nvidia0: is a directory where the character device 195:0 belongs"
    elif case == "char-link-is-file":
        (node.root / "dev/char/195:0").write_text("")
        expected = "/dev/char/195:0: exists and is not a symlink"
    else:
        (node.root / "dev/char").rmdir()
        (node.root / "dev/char").write_text("")
        expected = "/dev/char: exists and is not a directory"
    _assert_refused(node, {}, expected, tree_snapshot(node.root))


def test_effective_conflict_fails_before_any_change(world_tmp):
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    other = node.root / "etc/modprobe.d/zzz-site.conf"
    other.parent.mkdir(parents=True)
    other.write_text("options nvidia NVreg_DeviceFileMode=0600\n")
    _assert_refused(node, {"on_conflict": "fail"},
                    "/etc/modprobe.d/zzz-site.conf line 1: NVreg_DeviceFileMode=0600 (wanted 0666)", tree_snapshot(node.root))
    warned = _run(node, check=True)
    assert warned["conflicts"][0]["overrides"] is True and "zzz-site.conf" in str(warned["warnings"])


def test_planner_raises_only_gpuharden_error():
    with pytest.raises(GpuhardenError):
        dn.resolve_policy("nonsense")
