# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Read-only views of what the NVIDIA driver exposes on a node: /dev, /proc, /sys.

Every reader takes ``root``: the path under which the node's filesystem is visible
("/" on the node itself, "/host" from a privileged pod that mounts the host there).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254


def host_path(root, path):
    """``path`` (absolute, as seen on the node) as seen from here."""
    return os.path.join(root, path.lstrip("/"))


def _name_of(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return None


def describe_path(path):
    """Type, numbers, owner and mode of one path, without following a final symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    mode = st.st_mode
    if stat.S_ISCHR(mode):
        kind = "char"
    elif stat.S_ISBLK(mode):
        kind = "block"
    elif stat.S_ISLNK(mode):
        kind = "link"
    elif stat.S_ISDIR(mode):
        kind = "directory"
    else:
        kind = "file"
    info = {
        "exists": True,
        "type": kind,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": _name_of(pwd.getpwuid, st.st_uid),
        "group": _name_of(grp.getgrgid, st.st_gid),
        "mode": "%04o" % stat.S_IMODE(mode),
    }
    if kind in ("char", "block"):
        info["major"] = os.major(st.st_rdev)
        info["minor"] = os.minor(st.st_rdev)
    if kind == "link":
        info["target"] = os.readlink(path)
    return info


def device_node_inventory(root):
    """Every /dev/nvidia* entry and /dev/nvidia-caps/* entry, keyed by its path on the node."""
    inventory = {}
    dev = host_path(root, "/dev")
    candidates = []
    try:
        candidates = [os.path.join("/dev", name) for name in os.listdir(dev) if name.startswith("nvidia")]
    except OSError:
        pass
    caps_dir = host_path(root, "/dev/nvidia-caps")
    if os.path.isdir(caps_dir):
        candidates.extend(os.path.join("/dev/nvidia-caps", name) for name in os.listdir(caps_dir))
    for node_path in sorted(candidates):
        info = describe_path(host_path(root, node_path))
        if info.get("type") == "directory":
            continue
        inventory[node_path] = info
    return inventory


def _parse_colon_table(text):
    """``Key: value`` lines as a dict; integers converted, the rest kept as text."""
    table = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()
        try:
            table[key.strip()] = int(value)
        except ValueError:
            table[key.strip()] = value
    return table


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def driver_params(root):
    """The running driver's parameters (/proc/driver/nvidia/params), or None without the driver."""
    text = read_text(host_path(root, "/proc/driver/nvidia/params"))
    if text is None:
        return None
    return _parse_colon_table(text)


def driver_gpus(root):
    """The driver's own list of GPUs (/proc/driver/nvidia/gpus/<bdf>/information), by PCI address."""
    base = host_path(root, "/proc/driver/nvidia/gpus")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    gpus = {}
    for bdf in names:
        text = read_text(os.path.join(base, bdf, "information")) or ""
        info = _parse_colon_table(text)
        gpus[bdf.lower()] = {"model": info.get("Model"), "minor": info.get("Device Minor")}
    return gpus


def char_majors(root):
    """Character-device majors from /proc/devices, by driver name."""
    text = read_text(host_path(root, "/proc/devices")) or ""
    majors = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Character devices"):
            in_char = True
            continue
        if stripped.startswith("Block devices"):
            in_char = False
            continue
        if in_char and stripped:
            number, _sep, name = stripped.partition(" ")
            if number.isdigit():
                majors[name.strip()] = int(number)
    return majors


def sysfs_bdf(nvml_bus_id):
    """NVML's ``00000000:07:00.0`` as sysfs spells it: ``0000:07:00.0``."""
    domain, _sep, rest = nvml_bus_id.partition(":")
    try:
        return "%04x:%s" % (int(domain, 16), rest.lower())
    except ValueError:
        return nvml_bus_id.lower()


def numa_node(root, nvml_bus_id):
    """The GPU's NUMA node from sysfs (NVML's own call is unsupported on x86); -1 = no hint."""
    text = read_text(host_path(root, "/sys/bus/pci/devices/%s/numa_node" % sysfs_bdf(nvml_bus_id)))
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def cgroup_version(root, mounts_text=None):
    """1, 2 or "hybrid", from how /sys/fs/cgroup is mounted."""
    if mounts_text is None:
        mounts_text = read_text("/proc/self/mounts") or ""
    cgroup_root = os.path.normpath(host_path(root, "/sys/fs/cgroup"))
    fstype_at = {}
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            fstype_at[fields[1]] = fields[2]
    top = fstype_at.get(cgroup_root)
    if top == "cgroup2":
        return 2
    if fstype_at.get(os.path.join(cgroup_root, "unified")) == "cgroup2":
        return "hybrid"
    if top is None and not any(path.startswith(cgroup_root + "/") for path in fstype_at):
        return None
    return 1


def cpu_list(cpus):
    """[0, 1, 2, 5] -> "0-2,5" (the kernel's cpulist format)."""
    ranges = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join("%d" % lo if lo == hi else "%d-%d" % (lo, hi) for lo, hi in ranges)
