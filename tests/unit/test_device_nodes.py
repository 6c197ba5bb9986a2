# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia_device_nodes: the pure planner, module runs on temp node roots, malformed input, and NVML as nobody."""

from __future__ import annotations

import ctypes.util  # noqa: F401 (loaded before a child drops to nobody, who cannot read the stdlib here)
import os
import stat

import pynvml
import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _device_nodes as dn
from gpuharden_lab.noderoot import build_node_root

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
    assert not (node.root / UDEV.lstrip("/")).exists()

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
    st = os.stat(node.root / "dev/nvidia-uvm")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o666)  # nothing keeps another value there


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


# ---------------------------------------------------------------------------------------------
# Issue 13 item 17: what really sets the permissions of the nodes, and what can stick


def nvidia_modprobe(root, recreate=False):
    """Do to the node view under ``root`` what nvidia-modprobe does when libnvidia-container starts a container
    (NVIDIA/libnvidia-container src/nvc.c load_kernel_modules: nvidiactl, every nvidia<N>, the MIG capabilities,
    nvidia-uvm*, nvidia-modeset), one node at a time as mknod_helper in NVIDIA/nvidia-modprobe
    modprobe-utils/nvidia-modprobe-utils.c does: read uid, gid, mode and the modify flag from the node's proc file
    (none for uvm: root:root 0666), leave a node alone that is right or when modification is off, remove a node of
    the wrong type or numbers, mknod a missing one, then chmod and chown.  ``recreate`` first removes every node, as
    after a reboot or a driver reload.  Self-contained (the lab test runs its source on a lab node); returns the
    paths it touched."""
    import os
    import stat

    def under(path):
        return os.path.join(root, path.lstrip("/"))

    def values(proc_path):
        found = {"DeviceFileUID": 0, "DeviceFileGID": 0, "DeviceFileMode": 0o666, "DeviceFileModify": 1}
        if proc_path is None or not os.path.exists(under(proc_path)):
            return found
        with open(under(proc_path)) as handle:
            for line in handle:  # like fscanf("%31[^:]: %u\n"): stop at the first line that is not "Name: number"
                name, sep, value = line.partition(":")
                if not sep or not value.strip().isdigit():
                    break
                found["DeviceFileModify" if name == "ModifyDeviceFiles" else name] = int(value)
        return found

    def mknod(path, major, minor, proc_path):
        wanted = values(proc_path)
        uid, gid, mode = wanted["DeviceFileUID"], wanted["DeviceFileGID"], wanted["DeviceFileMode"]
        if wanted["DeviceFileModify"] != 1:
            return None
        target = under(path)
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        device_ok = st is not None and stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor)
        if device_ok and (stat.S_IMODE(st.st_mode) & 0o777, st.st_uid, st.st_gid) == (mode, uid, gid):
            return None
        if st is not None and not device_ok:
            os.remove(target)
        if not device_ok:
            os.mknod(target, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(target, mode)
        os.chown(target, uid, gid)
        return path

    majors = {}
    with open(under("/proc/devices")) as handle:
        for line in handle:
            fields = line.split()
            if len(fields) == 2 and fields[0].isdigit():
                majors.setdefault(fields[1], int(fields[0]))
    nodes = [("/dev/nvidiactl", 195, 255, "/proc/driver/nvidia/params")]
    gpus = under("/proc/driver/nvidia/gpus")
    for bdf in sorted(os.listdir(gpus)) if os.path.isdir(gpus) else []:
        with open(os.path.join(gpus, bdf, "information")) as handle:
            minor = int(next(line for line in handle if line.startswith("Device Minor:")).split(":")[1])
        nodes.append(("/dev/nvidia%d" % minor, 195, minor, "/proc/driver/nvidia/params"))
    caps = under("/proc/driver/nvidia/capabilities")
    for directory, _dirs, names in sorted(os.walk(caps)):
        for name in sorted(names):
            with open(os.path.join(directory, name)) as handle:
                minor = int(handle.readline().split(":")[1])
            os.makedirs(under("/dev/nvidia-caps"), 0o755, exist_ok=True)
            proc = "/" + os.path.relpath(os.path.join(directory, name), root)
            nodes.append(("/dev/nvidia-caps/nvidia-cap%d" % minor, majors["nvidia-caps"], minor, proc))
    if "nvidia-uvm" in majors:
        nodes += [("/dev/nvidia-uvm", majors["nvidia-uvm"], 0, None), ("/dev/nvidia-uvm-tools", majors["nvidia-uvm"], 1, None)]
    nodes.append(("/dev/nvidia-modeset", 195, 254, "/proc/driver/nvidia/params"))
    if recreate:
        for path, *_rest in nodes:
            if os.path.lexists(under(path)):
                os.remove(under(path))
    return [path for path in (mknod(*node) for node in nodes) if path]


CAP_FILES = {"mig/config": (1, 0o400), "mig/monitor": (2, 0o444)}
# The udev file the module wrote before item 17 (restricted to video on a MIG node).
OLD_UDEV = ("# Managed by gpuharden.k8s (module nvidia_device_nodes, role device_permissions).\n"
            "# nvidia-uvm and nvidia-caps have no NVreg_ option: udev keeps their owner, group and mode.\n"
            'KERNEL=="nvidia-uvm", OWNER="root", GROUP="video", MODE="0660"\n'
            'KERNEL=="nvidia-uvm-tools", OWNER="root", GROUP="video", MODE="0660"\n'
            'KERNEL=="nvidia-cap1", OWNER="root", GROUP="video", MODE="0400"\n'
            'KERNEL=="nvidia-cap2", OWNER="root", GROUP="video", MODE="0440"\n')


def _mig_node(world_tmp, **params):
    """An H100 MIG node whose driver announces the two MIG capabilities, running with ``params``."""
    node = _node(world_tmp, "h100-mig-enabled", driver_params=params or None)
    for name, (minor, mode) in CAP_FILES.items():
        path = node.root / "proc/driver/nvidia/capabilities" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n" % (minor, mode))
    return node


def _ids_mode(path):
    st = os.stat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_item17_no_udev_rule_is_written(world_tmp):
    node = _node(world_tmp)
    result = _run(node, policy="restricted", group="video")
    assert result["changed"] is True
    assert not (node.root / UDEV.lstrip("/")).exists()  # these devices send no uevent: a rule would never fire
    assert [entry["path"] for entry in result["files"]] == [str(node.root / MODPROBE.lstrip("/"))]


def test_item17_old_udev_rules_are_removed_and_site_lines_kept(world_tmp):
    node = _node(world_tmp)
    rules = node.root / UDEV.lstrip("/")
    rules.parent.mkdir(parents=True)
    rules.write_text(OLD_UDEV)
    before = tree_snapshot(node.root)
    checked = _run(node, check=True)
    assert checked["changed"] is True and tree_snapshot(node.root) == before
    assert {"path": str(rules), "changed": True, "action": "remove"}.items() <= checked["files"][1].items()
    audit = run_module("node_audit", {"root": str(node.root), "device_nodes": {}}, {})
    assert [(f["id"], f["remediable"]) for f in audit["findings"] if f["check"] == "device_nodes" and "udev" in f["id"]] == [
        ("device_udev_rules_obsolete", True)]
    assert _run(node)["changed"] is True and not rules.exists()
    # a site's own lines stay, only the lines the module wrote go
    site = 'SUBSYSTEM=="net", ACTION=="add", NAME="eth0"\n'
    rules.write_text(OLD_UDEV + site)
    assert _run(node)["changed"] is True and rules.read_text() == site
    assert _run(node)["changed"] is False and rules.read_text() == site


def test_item17_uvm_and_caps_keep_nvidia_modprobe_values_under_every_policy(world_tmp):
    node = _mig_node(world_tmp)
    result = _run(node, policy="restricted", group="video")
    assert _ids_mode(node.root / "dev/nvidia0") == (0, 44, 0o660)
    assert _ids_mode(node.root / "dev/nvidiactl") == (0, 44, 0o660)
    assert _ids_mode(node.root / "dev/nvidia-uvm") == _ids_mode(node.root / "dev/nvidia-uvm-tools") == (0, 0, 0o666)
    assert _ids_mode(node.root / "dev/nvidia-caps/nvidia-cap1") == (0, 0, 0o400)
    assert _ids_mode(node.root / "dev/nvidia-caps/nvidia-cap2") == (0, 0, 0o444)
    # said plainly: what keeps each node's permissions, and where the policy cannot stick
    assert result["nodes"]["/dev/nvidia0"]["kept_by"] == dn.KEPT_BY_NVREG
    assert result["nodes"]["/dev/nvidia-uvm"]["kept_by"] == dn.KEPT_BY_UVM
    assert result["nodes"]["/dev/nvidia-caps/nvidia-cap2"]["kept_by"] == dn.KEPT_BY_CAP % "mig/monitor"
    assert sorted(result["not_persistable"], key=lambda entry: entry["path"]) == [
        {"path": "/dev/nvidia-caps/nvidia-cap2", "wanted": "root:video 0440", "kept": "root:root 0444", "kept_by": dn.KEPT_BY_CAP % "mig/monitor"},
        {"path": "/dev/nvidia-uvm", "wanted": "root:video 0660", "kept": "root:root 0666", "kept_by": dn.KEPT_BY_UVM},
        {"path": "/dev/nvidia-uvm-tools", "wanted": "root:video 0660", "kept": "root:root 0666", "kept_by": dn.KEPT_BY_UVM},
    ]
    assert "cannot stick for /dev/nvidia-caps/nvidia-cap2, /dev/nvidia-uvm, /dev/nvidia-uvm-tools" in str(result["warnings"])
    assert _run(node)["not_persistable"] == []  # policy default is exactly what nvidia-modprobe makes


def test_item17_after_nvidia_modprobe_recreates_the_nodes_the_policy_still_holds(world_tmp):
    # The driver was loaded with the options the module writes (the params file shows them).
    node = _mig_node(world_tmp, DeviceFileGID=44, DeviceFileMode=0o660)
    assert _run(node, policy="restricted", group="video")["reboot_or_reload_required"] is False
    settled = tree_snapshot(node.root)
    assert nvidia_modprobe(str(node.root)) == []  # a container start changes nothing: every node is what it keeps
    assert tree_snapshot(node.root) == settled
    nvidia_modprobe(str(node.root), recreate=True)  # a reboot or driver reload: every node made anew
    again = _run(node, check=True, policy="restricted", group="video")
    assert again["changed"] is False and again["actions"] == [], again["actions"]
    assert _ids_mode(node.root / "dev/nvidia3") == (0, 44, 0o660)


def test_item17_drift_check_catches_what_nvidia_modprobe_undoes(world_tmp):
    # The driver still runs with root:root 0666: each container start puts that back on nvidia<N> and nvidiactl.
    node = _mig_node(world_tmp)
    options = {"policy": "restricted", "group": "video"}
    _run(node, **options)
    reset = ["/dev/nvidiactl"] + ["/dev/nvidia%d" % minor for minor in range(4)] + ["/dev/nvidia-modeset"]
    assert nvidia_modprobe(str(node.root)) == reset  # uvm and caps were left at nvidia-modprobe's values
    assert _ids_mode(node.root / "dev/nvidia0") == (0, 0, 0o666)
    audit = run_module("node_audit", {"root": str(node.root), "device_nodes": options}, {})
    findings = [entry for entry in audit["findings"] if entry["check"] == "device_nodes"]
    regressed = sorted(entry["path"] for entry in findings if entry["id"] == "device_node_permissions")
    assert regressed == sorted(reset)
    assert audit["checks"]["device_nodes"]["status"] == "drift"
    stale = [entry for entry in findings if entry["id"] == "driver_params_stale"]
    assert stale and "DeviceFileMode=438" in stale[0]["found"]
    # reported on every run, never as something the stage fixes
    not_persistable = [entry for entry in findings if entry["id"] == "device_permissions_not_persistable"]
    assert sorted(entry["path"] for entry in not_persistable) == [
        "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert {(entry["severity"], entry["remediable"], entry["found"]) for entry in not_persistable if "uvm" in entry["path"]} == {
        ("info", False, "root:root 0666")}
    # a regression on uvm is drift too: someone narrows it, CUDA breaks for everyone else
    os.chmod(node.root / "dev/nvidia-uvm", 0o600)
    audit = run_module("node_audit", {"root": str(node.root), "device_nodes": options}, {})
    assert "/dev/nvidia-uvm" in [entry.get("path") for entry in audit["findings"] if entry["id"] == "device_node_permissions"]


def test_a_capability_nobody_made_yet_is_left_alone_and_fixed_once_it_exists(world_tmp):
    """A real H200 (open module 580.159.04) announced fabric-imex-mgmt (minor 4323) with no /dev node: the IMEX daemon
    makes it with nvidia-modprobe -f when it needs it.  Harden creates only MIG capability nodes, and the audit calls the
    missing IMEX one no drift; once it exists, its numbers and mode are kept as for every capability."""
    node = _node(world_tmp, "h200-vm", mig_capabilities=True)
    imex = node.root / "dev/nvidia-caps/nvidia-cap4323"
    assert (node.root / "proc/driver/nvidia/capabilities/fabric-imex-mgmt").is_file() and not imex.exists()
    assert dn.is_mig_capability("mig/config") and dn.is_mig_capability("gpu0/mig/gi1/ci0/access")
    assert not dn.is_mig_capability("fabric-imex-mgmt") and not dn.is_mig_capability("gpu0/imex")
    (node.root / "dev/nvidia-caps/nvidia-cap1").unlink()
    result = _run(node)
    assert "/dev/nvidia-caps/nvidia-cap4323" not in result["nodes"] and not imex.exists()
    assert result["nodes"]["/dev/nvidia-caps/nvidia-cap1"]["action"] == "create"  # a MIG capability is made
    audit = run_module("node_audit", {"root": str(node.root), "device_nodes": {}}, {})
    assert [entry for entry in audit["findings"] if "4323" in str(entry.get("path"))] == []
    assert audit["checks"]["device_nodes"]["status"] == "ok", audit["findings"]
    os.mknod(imex, stat.S_IFCHR | 0o644, os.makedev(235, 4323))  # made by its user, with a wider mode
    os.chmod(imex, 0o644)
    fixed = _run(node)
    assert fixed["nodes"]["/dev/nvidia-caps/nvidia-cap4323"]["action"] == "fix"
    assert stat.S_IMODE(imex.stat().st_mode) == 0o400
