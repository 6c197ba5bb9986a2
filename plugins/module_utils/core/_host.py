# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Read-only views of what the NVIDIA driver exposes on a node: /dev, /proc, /sys.

Every reader takes ``root``: the path under which the node's filesystem is visible
("/" on the node itself, "/host" from a privileged pod that mounts the host there).  Paths are resolved inside the
root (``_files.resolve_in_root``: links and ``..`` never leave it) and files are read with ``_files.read_text``:
regular files only (a FIFO never blocks), bounded in size, UTF-8.  What the driver's files hold is checked where a
later decision depends on it; a value outside what the driver can write is an error naming the file, field and value.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254
# Minors 0-247 are the driver's regular (GPU) devices, 254 the modeset and 255 the control device
# (NVIDIA/open-gpu-kernel-modules kernel-open/common/inc/nv-chardev-numbers.h, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX).
GPU_MINOR_MAX = 247
# /proc and /sys files are small; a bigger one is not what the driver wrote.
PROC_MAX_BYTES = 1024 * 1024


def host_path(root, path):
    """``path`` (absolute, as seen on the node) as seen from here.

    Below a root other than "/", its directories are resolved inside the root (``_files.resolve_in_root``: no link
    and no ``..`` leaves it); a final link is kept as it is, for the reader to follow inside the root or the writer to
    refuse.
    """
    if os.path.abspath(root or "/") == "/":
        return os.path.join("/", path.lstrip("/"))
    return _files.resolve_in_root(root, path, follow_final=False)


def read_node_text(root, path, max_bytes=PROC_MAX_BYTES):
    """The text of the node's file ``path`` (links resolved inside ``root``), or None when it does not exist."""
    return _files.read_text(os.path.join(root or "/", path.lstrip("/")), root=root or "/", max_bytes=max_bytes)


def list_node_dir(root, path):
    """The names in the node's directory ``path``, sorted, or None when it does not exist; anything else than a
    directory there is an error naming it."""
    here = _files.resolve_in_root(root or "/", path)
    try:
        return sorted(os.listdir(here))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise GpuhardenError("%s: is %s, expected a directory" % (_files.shown(path), _files.kind_of(os.stat(here).st_mode)),
                             fix="remove it: the driver creates this directory") from None
    except OSError as error:
        raise GpuhardenError("%s: cannot list it: %s" % (_files.shown(path), error.strerror)) from None


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
    """Every /dev/nvidia* entry and /dev/nvidia-caps/* entry, keyed by its path on the node.

    A /dev/nvidia-caps that is not a directory is listed as what it is (its ``type``), not looked into.
    """
    inventory = {}
    candidates = [os.path.join("/dev", name) for name in list_node_dir(root, "/dev") or [] if name.startswith("nvidia")]
    caps = host_path(root, "/dev/nvidia-caps")
    if os.path.isdir(caps) and not os.path.islink(caps):
        candidates.extend(os.path.join("/dev/nvidia-caps", name) for name in list_node_dir(root, "/dev/nvidia-caps") or [])
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


def read_text(path, root=None, max_bytes=None):
    """A file's text, or None when it does not exist (``_files.read_text``: regular files only, bounded, UTF-8);
    ``root``: the node root ``path`` lies below, links resolved inside it."""
    return _files.read_text(path, root=root, max_bytes=max_bytes)


def driver_params(root):
    """The running driver's parameters (/proc/driver/nvidia/params), or None without the driver."""
    text = read_node_text(root, "/proc/driver/nvidia/params")
    if text is None:
        return None
    return _parse_colon_table(text)


def _gpu_minor(value, where):
    """A GPU's ``Device Minor`` as the driver can write it (0-247), else an error naming the file, field and value."""
    if value is None:
        return None
    if isinstance(value, int) and 0 <= value <= GPU_MINOR_MAX:
        return value
    raise GpuhardenError("%s: Device Minor %s is not a GPU minor the driver hands out (0-%d; 254 and 255 are "
                         "nvidia-modeset and nvidiactl)" % (_files.shown(where), _files.shown(str(value))[:40], GPU_MINOR_MAX),
                         fix="this is not the NVIDIA driver's file: check what is mounted at /proc/driver/nvidia")


def driver_gpus(root):
    """The driver's own list of GPUs (/proc/driver/nvidia/gpus/<bdf>/information), by PCI address."""
    names = list_node_dir(root, "/proc/driver/nvidia/gpus")
    if names is None:
        return None
    gpus = {}
    for bdf in names:
        where = "/proc/driver/nvidia/gpus/%s/information" % bdf
        info = _parse_colon_table(read_node_text(root, where) or "")
        gpus[bdf.lower()] = {"model": info.get("Model"), "minor": _gpu_minor(info.get("Device Minor"), where)}
    return gpus


def char_majors(root):
    """Character-device majors from /proc/devices, by driver name."""
    text = read_node_text(root, "/proc/devices") or ""
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
    text = read_node_text(root, "/sys/bus/pci/devices/%s/numa_node" % sysfs_bdf(nvml_bus_id))
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def cgroup_version(root, mounts_text=None):
    """1, 2 or "hybrid", from how /sys/fs/cgroup is mounted."""
    if mounts_text is None:
        mounts_text = _files.read_text("/proc/self/mounts", max_bytes=_files.DEFAULT_MAX_BYTES) or ""
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
