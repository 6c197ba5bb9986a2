# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia_device_nodes on hostile node roots (issue 47 phase 2): the node's own user database, reads inside the root,
driver numbers checked and every change checked before the first one is made."""

from __future__ import annotations

import os
import subprocess

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _device_nodes as dn

from tests.unit.conftest import tree_snapshot
from tests.unit.test_device_nodes import MODPROBE, UDEV, _node, _run


def _gpu_information(node):
    gpus = node.root / "proc/driver/nvidia/gpus"
    return sorted(gpus.iterdir())[0] / "information"


def _refused(node, needle, **args):
    before = tree_snapshot(node.root)
    for check in (True, False):
        result = _run(node, check=check, **args)
        assert result.get("failed") and needle in result["msg"], result
        assert "\n" not in result["msg"].strip(), result["msg"]
        assert tree_snapshot(node.root) == before
    return result["msg"]


# ---------------------------------------------------------------------------------------------
# Names from the node root's /etc files only


def test_the_group_is_the_node_roots_not_this_machines(world_tmp):
    node = _node(world_tmp)
    (node.root / "etc/group").write_text("root:x:0:\nvideo:x:1234:\n")
    result = _run(node, policy="restricted", group="video")
    assert result["policy"]["gid"] == 1234 and result["policy"]["group"] == "video", result
    assert os.stat(node.root / "dev/nvidia0").st_gid == 1234
    assert "NVreg_DeviceFileGID=1234" in (node.root / MODPROBE.lstrip("/")).read_text()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_an_unreadable_etc_group_is_refused_never_resolved_here(world_tmp, kind):
    node = _node(world_tmp)
    group = node.root / "etc/group"
    group.unlink()
    os.mkfifo(group) if kind == "fifo" else group.mkdir()
    msg = _refused(node, "etc/group: is a %s" % ("FIFO" if kind == "fifo" else "directory"), policy="restricted", group="video")
    assert str(node.root) in msg


def test_a_missing_passwd_refuses_a_user_name_but_not_numbers(world_tmp):
    node = _node(world_tmp)
    (node.root / "etc/passwd").unlink()
    _refused(node, "etc/passwd: does not exist, so the user name root cannot be resolved", policy="restricted", group="video")
    assert _run(node, check=True, policy="restricted", group="video", owner=0)["policy"]["uid"] == 0
    assert _run(node, check=True)["policy"]["owner"] is None  # policy default resolves no name


def test_an_unknown_group_names_the_nodes_file(world_tmp):
    node = _node(world_tmp)
    _refused(node, "option group=render: no such group in %s/etc/group" % node.root, policy="restricted", group="render")


def test_lookups_below_a_root_never_ask_this_machines_nss(world_tmp):
    node = _node(world_tmp)
    (node.root / "etc/passwd").write_text("")
    (node.root / "etc/group").write_text("")
    lookup_user, lookup_group, name_of = dn.id_lookups(str(node.root))
    with pytest.raises(GpuhardenError, match="no such user"):
        lookup_user("root")  # this machine has a root; the node's passwd has none
    assert name_of("user", 0) is None and name_of("group", 0) is None


# ---------------------------------------------------------------------------------------------
# Driver numbers: checked before the first change


@pytest.mark.parametrize(("field", "value"), [("DeviceFileMinor", "99999999999999999999999"), ("DeviceFileMinor", "8192"),
                                              ("DeviceFileMode", "4096"), ("DeviceFileMinor", "-1")])
def test_a_capability_number_the_driver_never_writes_is_refused(world_tmp, field, value):
    node = _node(world_tmp, "h100-mig-enabled", device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    config = node.root / "proc/driver/nvidia/capabilities/mig/config"
    config.parent.mkdir(parents=True)
    fields = {"DeviceFileMinor": "1", "DeviceFileMode": "256", "DeviceFileModify": "1"}
    fields[field] = value
    config.write_text("".join("%s: %s\n" % item for item in fields.items()))
    _refused(node, "mig/config: %s %s is not a value the NVIDIA driver writes" % (field, value[:40]))


def test_two_gpus_with_one_minor_are_refused(world_tmp):
    node = _node(world_tmp, "h100-mig-enabled", device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    second = sorted((node.root / "proc/driver/nvidia/gpus").iterdir())[1] / "information"
    lines = [("Device Minor: \t 0" if line.startswith("Device Minor") else line) for line in second.read_text().splitlines()]
    second.write_text("\n".join(lines) + "\n")
    _refused(node, "Device Minor 0 is also GPU")


def test_more_gpu_directories_than_the_driver_has_minors_are_refused_at_once(world_tmp):
    node = _node(world_tmp, "l4")
    gpus = node.root / "proc/driver/nvidia/gpus"
    for index in range(4000):
        (gpus / ("0000:%02x:%02x.%d" % (0x80 + index // 256, index % 256 // 8, index % 8))).mkdir(exist_ok=True)
    _refused(node, "/proc/driver/nvidia/gpus: 4001 entries, more than the 248 GPUs")


def test_a_link_where_a_device_node_belongs_is_refused_not_replaced(world_tmp):
    node = _node(world_tmp)
    (node.root / "dev/nvidia0").unlink()
    (node.root / "dev/nvidia0").symlink_to("/outside/nvidia0")
    _refused(node, "/dev/nvidia0: is a symbolic link (to /outside/nvidia0) where the character device 195:0 belongs")
    assert os.path.islink(node.root / "dev/nvidia0")


# ---------------------------------------------------------------------------------------------
# modprobe.d as modprobe reads it


def test_modprobe_d_entries_as_kmod_filters_them(world_tmp):
    node = _node(world_tmp)
    confd = node.root / "etc/modprobe.d"
    confd.mkdir(parents=True)
    (confd / "virtualbox-dkms.conf").mkdir()  # kmod: "Directories inside directories are not supported", skipped
    (confd / ".hidden.conf").write_text("options nvidia NVreg_DeviceFileMode=0600\n")  # kmod skips dot files
    (confd / "nvidia.alias").write_text("options nvidia NVreg_DeviceFileMode=0600\n")  # kmod reads .alias files too
    (confd / "notes.txt").write_text("options nvidia NVreg_DeviceFileMode=0600\n")
    result = _run(node, check=True)
    assert [c["file"] for c in result["conflicts"]] == ["/etc/modprobe.d/nvidia.alias"], result["conflicts"]


def test_a_fifo_in_modprobe_d_is_refused_not_waited_on(world_tmp):
    node = _node(world_tmp)
    confd = node.root / "etc/modprobe.d"
    confd.mkdir(parents=True)
    os.mkfifo(confd / "blocked.conf")
    _refused(node, "blocked.conf: is a FIFO")


# ---------------------------------------------------------------------------------------------
# Links and immutable files: refused before the first change


def test_a_modprobe_file_linked_out_of_the_root_is_read_inside_it_and_never_written(world_tmp):
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    outside = world_tmp / "outside.conf"
    outside.write_text("options nvidia NVreg_DeviceFileMode=0600\n")
    (node.root / "etc/modprobe.d").mkdir(parents=True)
    (node.root / MODPROBE.lstrip("/")).symlink_to(outside)
    _refused(node, "gpuharden does not write through links")
    assert outside.read_text() == "options nvidia NVreg_DeviceFileMode=0600\n"


def _chattr(path, flag):
    return subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False).returncode == 0


@pytest.mark.parametrize("what", ["modprobe_file", "char_dir"])
def test_immutable_file_or_directory_is_refused_before_any_device_node_changes(world_tmp, what):
    node = _node(world_tmp, device_overrides={"/dev/nvidia0": {"mode": 0o600}})
    (node.root / "etc/modprobe.d").mkdir(parents=True)
    (node.root / MODPROBE.lstrip("/")).write_text("options nvidia NVreg_DeviceFileMode=0600\n")
    target = node.root / (MODPROBE.lstrip("/") if what == "modprobe_file" else "dev/char")
    if not _chattr(target, "+i"):
        pytest.skip("this filesystem or user cannot set chattr +i")
    try:
        _refused(node, "is immutable (chattr +i)")
        assert oct(os.stat(node.root / "dev/nvidia0").st_mode & 0o777) == oct(0o600)
    finally:
        _chattr(target, "-i")


def test_udev_file_is_read_inside_the_root(world_tmp):
    node = _node(world_tmp)
    (node.root / "etc/udev/rules.d").mkdir(parents=True)
    os.mkfifo(node.root / UDEV.lstrip("/"))
    _refused(node, "70-gpuharden-nvidia.rules: is a FIFO")


def test_a_modprobe_file_with_a_nul_byte_is_refused(world_tmp):
    # found by make fuzz (seed 1047326081): the NUL was kept, and kmod reads a line only up to it
    node = _node(world_tmp)
    (node.root / "etc/modprobe.d").mkdir(parents=True)
    (node.root / MODPROBE.lstrip("/")).write_bytes(b"# site\noptions nvidia NVreg_Device\x00\x00FileMode=0600\n")
    _refused(node, "zz-gpuharden-nvidia.conf line 2: holds a NUL byte")


def test_a_huge_etc_group_is_refused(world_tmp):
    # found by make fuzz (seed 1047326081): a 5 MiB /etc/group was read and the group resolved from it
    node = _node(world_tmp)
    with open(node.root / "etc/group", "a") as handle:
        handle.write("padding padding padding\n" * (5 * 1024 * 1024 // 24))
    _refused(node, "etc/group: larger than", policy="restricted", group="video")


def test_a_path_option_with_a_newline_is_named_on_one_line(world_tmp):
    # found by make fuzz (seed 3366703918): the value was printed as it is, over two lines
    node = _node(world_tmp)
    _refused(node, "option modprobe_file=a\\x0ab: give an absolute path ending in .conf", modprobe_file="a\nb")


POLICY = {"uid": 0, "gid": 44, "mode": 0o660}


@pytest.mark.parametrize("text", [
    "# comment\n\noptions nvidia NVreg_DeviceFileUID=0 NVreg_EnableMSI\n",
    "blacklist nouveau\nsoftdep nvidia pre: ecdh_generic\ninstall nvidia /sbin/modprobe --ignore-install nvidia \\\n  && true\n",
    "options nvidia-drm modeset=1\nalias pci:v000010DE* nvidia\n",
])
def test_modprobe_lines_kmod_reads_are_kept(text):
    planned = dn.plan_modprobe("/etc/modprobe.d/x.conf", text, POLICY)
    assert "NVreg_DeviceFileGID=44" in planned and all(line in planned for line in text.splitlines() if "NVreg" not in line)


@pytest.mark.parametrize(("text", "needle"), [
    ("options nvidia NVreg_DeviceFileUID=0\n è\n", "line 2: è is not a modprobe.d command"),
    ("echo options nvidia NVreg_DeviceFileGID=1\n", "line 1: echo is not a modprobe.d command"),
    ("options nvidia NVreg_DeviceFileUID=0 =1\n", "line 1: =1 is not a module parameter"),
])
def test_a_modprobe_line_kmod_ignores_is_refused_before_the_edit(text, needle):
    # kmod libkmod-config.c skips an unknown command with "ignoring bad line starting with"; the kernel's
    # parse_args reads NAME or NAME=VALUE
    with pytest.raises(GpuhardenError) as refused:
        dn.plan_modprobe("/etc/modprobe.d/x.conf", text, POLICY)
    assert needle in refused.value.msg and refused.value.msg.startswith("/etc/modprobe.d/x.conf line")
