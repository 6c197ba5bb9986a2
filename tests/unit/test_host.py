# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

import os
import stat

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _host


def test_cpu_list_compresses_ranges():
    assert _host.cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert _host.cpu_list([]) == ""
    assert _host.cpu_list([3]) == "3"


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [("00000000:07:00.0", "0000:07:00.0"), ("00000001:BD:00.0", "0001:bd:00.0"), ("0000:C1:00.0", "0000:c1:00.0")],
)
def test_sysfs_bdf(nvml, sysfs):
    assert _host.sysfs_bdf(nvml) == sysfs


def test_driver_params_parses_numbers_and_text(tmp_path):
    params = tmp_path / "proc/driver/nvidia/params"
    params.parent.mkdir(parents=True)
    params.write_text("ModifyDeviceFiles: 1\nDeviceFileMode: 438\nRegistryDwords: \"\"\n")
    parsed = _host.driver_params(str(tmp_path))
    assert parsed == {"ModifyDeviceFiles": 1, "DeviceFileMode": 438, "RegistryDwords": '""'}


def test_driver_params_absent_without_driver(tmp_path):
    assert _host.driver_params(str(tmp_path)) is None
    assert _host.driver_gpus(str(tmp_path)) is None


def test_char_majors_reads_only_character_section(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n\nBlock devices:\n259 blkext\n"
    )
    assert _host.char_majors(str(tmp_path)) == {"mem": 1, "nvidia-frontend": 195, "nvidia-uvm": 510}


def test_numa_node_from_sysfs(tmp_path):
    node = tmp_path / "sys/bus/pci/devices/0000:07:00.0/numa_node"
    node.parent.mkdir(parents=True)
    node.write_text("1\n")
    assert _host.numa_node(str(tmp_path), "00000000:07:00.0") == 1
    assert _host.numa_node(str(tmp_path), "00000000:08:00.0") is None


@pytest.mark.parametrize(
    ("mounts", "expected"),
    [
        ("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", 2),
        ("tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n", "hybrid"),
        ("tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n", 1),
        ("proc /proc proc rw 0 0\n", None),
    ],
)
def test_cgroup_version(mounts, expected):
    assert _host.cgroup_version("/", mounts_text=mounts) == expected


def test_cgroup_version_under_host_root():
    mounts = "cgroup2 /host/sys/fs/cgroup cgroup2 rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw 0 0\n"
    assert _host.cgroup_version("/host", mounts_text=mounts) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_node_inventory_reports_real_nodes(tmp_path):
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    os.mknod(dev / "nvidia0", stat.S_IFCHR | 0o600, os.makedev(195, 0))
    os.chmod(dev / "nvidia0", 0o600)
    os.mknod(dev / "nvidia-caps/nvidia-cap1", stat.S_IFCHR | 0o400, os.makedev(235, 1))
    os.chmod(dev / "nvidia-caps/nvidia-cap1", 0o400)
    (dev / "nvidiactl").write_text("not a device")
    (dev / "null").write_text("")
    inventory = _host.device_node_inventory(str(tmp_path))
    assert set(inventory) == {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1"}
    assert inventory["/dev/nvidia0"] == {
        "exists": True, "type": "char", "uid": 0, "gid": 0, "owner": "root", "group": "root",
        "mode": "0600", "major": 195, "minor": 0,
    }
    assert inventory["/dev/nvidiactl"]["type"] == "file"
    assert inventory["/dev/nvidia-caps/nvidia-cap1"]["major"] == 235
