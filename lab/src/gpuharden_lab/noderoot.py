# SPDX-License-Identifier: GPL-3.0-or-later
"""Lay out what the NVIDIA driver would show on a node, under a directory, from an NVML fixture.

The result is a directory tree with real character device nodes (mknod), the driver's /proc
files and the sysfs NUMA view.  Modules read it through their ``root`` option; the NVML double
opens the device nodes under it, so the kernel's permission checks are the real ones.  The lab's
network-namespace nodes bind-mount the same tree over /dev, /proc/driver and /sys/bus/pci/devices, and, where
the node declares its NUMA nodes, /sys/devices/system/node (what the real kubelet's cadvisor reads).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpuharden_lab import NVML_FIXTURES, NVML_LIBRARY_DIR

NVIDIA_MAJOR = 195
# Majors the kernel hands out dynamically; any free numbers do, these are common values.
UVM_MAJOR = 510
CAPS_MAJOR = 235

DRIVER_DEFAULT_PARAMS = {
    "ResmanDebugLevel": 4294967295,
    "RmLogonRC": 1,
    "ModifyDeviceFiles": 1,
    "DeviceFileUID": 0,
    "DeviceFileGID": 0,
    "DeviceFileMode": 438,
    "InitializeSystemMemoryAllocations": 1,
    "UsePageAttributeTable": 4294967295,
    "EnableMSI": 1,
}


@dataclass
class DeviceNode:
    path: str  # as seen on the node, e.g. /dev/nvidia0
    major: int
    minor: int
    mode: int = 0o666
    uid: int = 0
    gid: int = 0


@dataclass
class NodeRoot:
    """One node's driver view; ``env()`` is what a process needs to use its NVML double."""

    root: Path
    fixture: Path | None
    devices: list[DeviceNode] = field(default_factory=list)

    @property
    def state_file(self) -> Path:
        return self.root / "var" / "lib" / "nvml-double" / "state.json"

    def env(self) -> dict[str, str]:
        return {
            "LD_LIBRARY_PATH": str(NVML_LIBRARY_DIR),
            "NVML_DOUBLE_FIXTURE": str(self.fixture),
            "NVML_DOUBLE_STATE": str(self.state_file),
            "NVML_DOUBLE_DEV_DIR": str(self.root / "dev"),
        }


def load_fixture(name_or_path: str | os.PathLike | None) -> tuple[Path | None, dict]:
    """(path, data) of an NVML fixture; ``None`` is a CPU-only node (no GPUs, no driver)."""
    if name_or_path is None:
        return None, {"gpus": []}
    path = Path(name_or_path)
    if not path.exists():
        path = NVML_FIXTURES / (str(name_or_path) + ("" if str(name_or_path).endswith(".json") else ".json"))
    return path, json.loads(path.read_text())


def sysfs_bdf(nvml_bus_id: str) -> str:
    domain, _sep, rest = nvml_bus_id.partition(":")
    return "%04x:%s" % (int(domain, 16), rest.lower())


NUMA_NODE_DIR = "sys/devices/system/node"
HOST_ONLINE_CPUS = Path("/sys/devices/system/cpu/online")


def cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            low, _sep, high = part.partition("-")
            cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def numa_layout(numa: dict, gpus: list[dict], host_cpus: list[int]) -> dict[int, dict]:
    """{node id: {cpus, memory_kib}} of a declared NUMA topology: ``nodes`` NUMA nodes (0 to nodes-1); the
    ``cpu_nodes`` share the host's online CPUs in contiguous runs (a lab node runs on this host's CPUs); every other
    node is CPU-less, with the memory of the GPUs whose ``gpu_memory_numa_node`` it is (a Grace system's GPU memory),
    or none (the memory-only nodes Grace systems reserve for MIG).  CPU nodes get 1 GiB each (what the kubelet
    counts as the machine's memory comes from /proc/meminfo, not from here)."""
    count, cpu_nodes = int(numa["nodes"]), [int(node) for node in numa.get("cpu_nodes", [0])]
    if count < 1 or any(not 0 <= node < count for node in cpu_nodes + [int(n) for n in numa.get("gpu_memory_nodes", [])]):
        raise ValueError("numa: every node id must be below nodes=%d: %r" % (count, numa))
    layout = {node: {"cpus": [], "memory_kib": 0} for node in range(count)}
    share = -(-len(host_cpus) // max(len(cpu_nodes), 1))
    for position, node in enumerate(cpu_nodes):
        layout[node]["cpus"] = host_cpus[position * share:(position + 1) * share]
        layout[node]["memory_kib"] = 1 << 20
    for gpu in gpus:
        if gpu.get("gpu_memory_numa_node", -1) >= 0:
            layout[gpu["gpu_memory_numa_node"]]["memory_kib"] += gpu.get("memory", {}).get("total_mib", 0) * 1024
    return layout


def write_numa_nodes(root: Path, layout: dict[int, dict]) -> None:
    """/sys/devices/system/node as the kernel lays it out, for the node to bind over its own sysfs (node.py): a
    ``node<N>`` directory per NUMA node with ``cpu<M>`` links to ../../cpu/cpu<M> (the node's real CPUs), ``meminfo``
    and ``distance``, and the ``online``/``possible``/``has_cpu``/``has_memory`` lists."""
    top = root / NUMA_NODE_DIR
    ids = sorted(layout)
    for node in ids:
        directory = top / ("node%d" % node)
        directory.mkdir(parents=True)
        for cpu in layout[node]["cpus"]:
            (directory / ("cpu%d" % cpu)).symlink_to("../../cpu/cpu%d" % cpu)
        _write(directory / "meminfo", "Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\n"
               % (node, layout[node]["memory_kib"], node, layout[node]["memory_kib"]))
        _write(directory / "distance", " ".join(
            "10" if other == node else "20" if layout[node]["cpus"] and layout[other]["cpus"] else "80" for other in ids) + "\n")
    every = "0-%d\n" % ids[-1] if ids == list(range(len(ids))) else ",".join(map(str, ids)) + "\n"
    for name, members in (("online", ids), ("possible", ids),
                          ("has_cpu", [node for node in ids if layout[node]["cpus"]]),
                          ("has_memory", [node for node in ids if layout[node]["memory_kib"]]),
                          ("has_normal_memory", [node for node in ids if layout[node]["memory_kib"]])):
        _write(top / name, every if members == ids else ",".join(map(str, members)) + "\n")


def default_devices(fixture: dict) -> list[DeviceNode]:
    devices = [DeviceNode("/dev/nvidia%d" % gpu["minor"], NVIDIA_MAJOR, gpu["minor"]) for gpu in fixture["gpus"]]
    devices += [
        DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        DeviceNode("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        DeviceNode("/dev/nvidia-uvm", UVM_MAJOR, 0),
        DeviceNode("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ]
    if not fixture.get("modeset", True):  # nvidia-modeset not loaded (a headless VM, as the real H200 one was)
        devices = [device for device in devices if device.path != "/dev/nvidia-modeset"]
    if not fixture["gpus"]:
        return []
    if any("mig" in gpu for gpu in fixture["gpus"]):
        devices += [
            DeviceNode("/dev/nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1, mode=0o400),
            DeviceNode("/dev/nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2, mode=0o444),
        ]
    return devices


# /proc/driver/nvidia-caps/mig-minors as the driver writes it (static, NVIDIA MIG user guide "Device Nodes and
# Capabilities"): every GPU minor 0-31, GPU instance 0-14 and compute instance 0-7.
MIG_MINORS_GPUS, MIG_MINORS_GIS, MIG_MINORS_CIS = 32, 15, 8
MIG_CAP_MODE = {"config": 0o400, "monitor": 0o444, "access": 0o444}


def mig_gi_minor(gpu_minor: int, gi: int) -> int:
    """Capability minor of ``gpu<gpu_minor>/gi<gi>/access`` (its CIs follow: + 1 + ci)."""
    return 3 + MIG_MINORS_GIS * (MIG_MINORS_CIS + 1) * gpu_minor + (MIG_MINORS_CIS + 1) * gi


def mig_minors_text() -> str:
    lines = ["config 1", "monitor 2"]
    for gpu in range(MIG_MINORS_GPUS):
        for gi in range(MIG_MINORS_GIS):
            base = mig_gi_minor(gpu, gi)
            lines.append("gpu%d/gi%d/access %d" % (gpu, gi, base))
            lines += ["gpu%d/gi%d/ci%d/access %d" % (gpu, gi, ci, base + 1 + ci) for ci in range(MIG_MINORS_CIS)]
    return "\n".join(lines) + "\n"


# GPU-instance profile id -> memory slices, and the buddy-tree id of a placement (tests/fakes/nvml/README.md).
_GI_MEMORY_SLICES = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}
_GI_PROFILE_IDS = {"1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5,
                   "7g.80gb": 0}


def _fixture_mig_instances(gpu: dict) -> list[tuple[int, list[int]]]:
    """(GI id, [CI ids]) of a fixture GPU's initial MIG instances (none while its MIG mode is off)."""
    mig = gpu.get("mig") or {}
    if not mig.get("mode"):
        return []
    out = []
    for gi in mig.get("gpu_instances", []):
        pid = gi["profile_id"] if "profile_id" in gi else _GI_PROFILE_IDS[gi["profile"]]
        size, start = _GI_MEMORY_SLICES[pid], gi.get("start", 0)
        gid = gi.get("id", {8: 0, 4: 2 if start == 0 else 1, 2: 3 + start // 2}.get(size, 7 + start))
        cis = gi.get("compute_instances") or [{}]
        out.append((gid, [ci.get("id", k) for k, ci in enumerate(cis)]))
    return out


def _write_mig_capabilities(root: Path, gpus: list[dict]) -> None:
    """The driver's capability files of the MIG config/monitor and of the fixture's initial instances."""
    caps = root / "proc/driver/nvidia/capabilities"

    def cap(rel: str, minor: int, mode: int) -> None:
        _write(caps / rel, "DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n" % (minor, mode))

    cap("mig/config", 1, MIG_CAP_MODE["config"])
    cap("mig/monitor", 2, MIG_CAP_MODE["monitor"])
    for gpu in gpus:
        minor = gpu.get("minor", gpus.index(gpu))
        for gid, cis in _fixture_mig_instances(gpu):
            base = mig_gi_minor(minor, gid)
            cap("gpu%d/mig/gi%d/access" % (minor, gid), base, MIG_CAP_MODE["access"])
            for ci in cis:
                cap("gpu%d/mig/gi%d/ci%d/access" % (minor, gid, ci), base + 1 + ci, MIG_CAP_MODE["access"])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def proc_devices(kernel_module: str) -> str:
    """/proc/devices with the NVIDIA drivers' character majors.

    The open kernel module names major 195 twice, ``nvidia`` and ``nvidiactl``, and registers the NVSwitch,
    NVLink and IMEX-channel majors too (read on a real H200, open module 580.159.04, 2026-12-04); the proprietary
    one's multi-module frontend registers ``nvidia-frontend``.  The dynamic majors keep the lab's numbers.
    """
    if kernel_module == "open":
        nvidia = [(NVIDIA_MAJOR, "nvidia"), (NVIDIA_MAJOR, "nvidiactl"), (UVM_MAJOR, "nvidia-uvm"),
                  (UVM_MAJOR + 1, "nvidia-nvswitch"), (UVM_MAJOR + 2, "nvidia-nvlink"), (CAPS_MAJOR, "nvidia-caps"),
                  (UVM_MAJOR + 3, "nvidia-caps-imex-channels")]
    elif kernel_module == "proprietary":
        nvidia = [(NVIDIA_MAJOR, "nvidia-frontend"), (CAPS_MAJOR, "nvidia-caps"), (UVM_MAJOR, "nvidia-uvm")]
    else:
        raise ValueError("kernel_module %r is neither 'open' nor 'proprietary'" % kernel_module)
    lines = ["  1 mem", "  4 /dev/vc/0", "  5 /dev/tty"] + ["%3d %s" % entry for entry in nvidia]
    return "Character devices:\n" + "\n".join(lines) + "\n\nBlock devices:\n  7 loop\n  8 sd\n"


def build_node_root(
    root: Path,
    fixture: str | os.PathLike,
    *,
    device_overrides: dict[str, dict] | None = None,
    driver_params: dict | None = None,
    mig_capabilities: bool = False,
    numa: dict | None = None,
) -> NodeRoot:
    """(Re)create ``root`` as the driver view of the fixture's node.

    ``device_overrides`` maps a device path to attributes to change (``mode``, ``uid``, ``gid``,
    ``major``, ``minor``) or to ``None`` to leave that node out.

    Every driver-loaded node gets ``/proc/driver/nvidia-caps/mig-minors`` (static, like the driver's; the
    real device plugin reads it for its MIG strategies).  ``mig_capabilities`` also writes
    ``/proc/driver/nvidia/capabilities`` (mig/config, mig/monitor and the ``access`` files of the fixture's
    initial GPU and compute instances).  It is off by default: the tree is written once and does not follow
    later MIG changes in the state file, and the collection's modules read it (nvml_check compares its
    compute instances with NVML, nvidia_device_nodes derives capability device nodes from it).

    ``numa`` (else the fixture's ``numa``: ``{nodes, cpu_nodes, gpu_memory_nodes}``) lays out the node's
    ``/sys/devices/system/node`` (``write_numa_nodes``); without either the node sees the host's.
    """
    fixture_path, data = load_fixture(fixture)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "dev").mkdir()
    overrides = device_overrides or {}
    devices = []
    for device in default_devices(data):
        if device.path in overrides and overrides[device.path] is None:
            continue
        for key, value in (overrides.get(device.path) or {}).items():
            setattr(device, key, value)
        target = root / device.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, stat.S_IFCHR | device.mode, os.makedev(device.major, device.minor))
        os.chmod(target, device.mode)  # mknod applies the umask
        os.chown(target, device.uid, device.gid)
        devices.append(device)

    (root / "proc/driver").mkdir(parents=True)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "var/lib/nvml-double").mkdir(parents=True, exist_ok=True)
    numa = numa if numa is not None else data.get("numa")
    if numa:
        write_numa_nodes(root, numa_layout(numa, data["gpus"], cpu_list(HOST_ONLINE_CPUS.read_text())))
    if fixture_path is None:  # CPU-only: no driver loaded
        _write(root / "proc/devices", "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n\nBlock devices:\n  7 loop\n  8 sd\n")
        return NodeRoot(root=root, fixture=None, devices=devices)
    params = dict(DRIVER_DEFAULT_PARAMS, **data.get("driver_params", {}), **(driver_params or {}))
    _write(root / "proc/driver/nvidia/params", "".join("%s: %s\n" % item for item in params.items()))
    _write(root / "proc/devices", proc_devices(data.get("kernel_module", "proprietary")))
    _write(root / "proc/driver/nvidia-caps/mig-minors", mig_minors_text())
    if mig_capabilities and any("mig" in gpu for gpu in data["gpus"]):
        _write_mig_capabilities(root, data["gpus"])
    for name, cap in sorted(data.get("driver_capabilities", {}).items()):
        _write(root / "proc/driver/nvidia/capabilities" / name,
               "DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n" % (cap["minor"], cap["mode"]))
    for gpu in data["gpus"]:
        bdf = sysfs_bdf(gpu["pci_bus_id"])
        _write(
            root / "proc/driver/nvidia/gpus" / bdf / "information",
            "Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nBus Location: \t %s\nDevice Minor: \t %d\n"
            % (gpu["name"], gpu["uuid"], bdf, gpu["minor"]),
        )
        _write(root / "sys/bus/pci/devices" / bdf / "numa_node", "%d\n" % gpu.get("numa_node", -1))
    # The node keeps its own copy, where the double looks by default, readable by every user.
    node_fixture = root / "etc/nvml-double/fixture.json"
    _write(node_fixture, fixture_path.read_text())
    return NodeRoot(root=root, fixture=node_fixture, devices=devices)
