# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Where a process or a container sits in the kubelet's cgroup tree (pure: strings in, strings out).

Both sides read these paths: the node-side device-cgroup audit and process_cgroup_info on the node, gpu_consistency
on the controller.  They live here, with nothing but ``re``, so that a node module that needs them does not carry
the eBPF interpreter or the cluster-wide consistency check in its AnsiballZ payload.
"""

from __future__ import annotations

import re

_HEX_ID = re.compile(r"^[0-9a-f]{64}$")
_SYSTEMD_SCOPE = re.compile(r"^(?:cri-containerd|crio|docker|containerd)-([0-9a-f]{64})\.scope$")
_SYSTEMD_POD = re.compile(r"^(?:[a-z0-9_]+-)?kubepods(?:-(besteffort|burstable))?-pod([0-9a-f_]{36})\.slice$")
_CGROUPFS_POD = re.compile(r"^pod([0-9a-f-]{36})$")


def is_kubepods_dir(name):
    """kubepods (cgroupfs), kubepods.slice (systemd), <prefix>-kubepods.slice (a --cgroup-root slice)."""
    return name in ("kubepods", "kubepods.slice") or name.endswith("-kubepods.slice")


def parse_pod_dir(name):
    """(pod UID, driver, qos) from a pod cgroup's name, or None."""
    match = _SYSTEMD_POD.match(name)
    if match:
        return match.group(2).replace("_", "-"), "systemd", match.group(1) or "guaranteed"
    match = _CGROUPFS_POD.match(name)
    if match:
        return match.group(1), "cgroupfs", None
    return None


def parse_container_dir(name):
    """The container ID of a container cgroup's name (``cri-containerd-<id>.scope``, ``<id>``), or None."""
    match = _SYSTEMD_SCOPE.match(name)
    if match:
        return match.group(1)
    if _HEX_ID.match(name):
        return name
    return None


def parse_container_path(path):
    """{pod_uid, container_id, driver, qos} for a container cgroup path relative to the cgroup root, else None.

    systemd: ``.../kubepods.slice/[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid_>.slice/cri-containerd-<id>.scope``;
    cgroupfs: ``.../kubepods/[<qos>/]pod<uid>/<id>``.
    """
    parts = [part for part in path.split("/") if part]
    if len(parts) < 3:
        return None
    container_id = parse_container_dir(parts[-1])
    pod = parse_pod_dir(parts[-2])
    if not container_id or not pod or not any(is_kubepods_dir(part) for part in parts[:-2]):
        return None
    uid, driver, qos = pod
    if driver == "cgroupfs":
        qos = parts[-3] if parts[-3] in ("besteffort", "burstable") else "guaranteed"
    return {"pod_uid": uid, "container_id": container_id, "driver": driver, "qos": qos}


def process_cgroup_path(text):
    """The cgroup path of a process from a path or the text of /proc/<pid>/cgroup (v2 line ``0::``, else a
    v1 hierarchy that names a pod), or None."""
    if not isinstance(text, str) or not text.strip():
        return None
    lines = text.strip().splitlines()
    if len(lines) == 1 and ":" not in lines[0]:
        return lines[0].strip()
    fallback = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2].strip()
        if fallback is None and "kubepods" in parts[2]:
            fallback = parts[2].strip()
    return fallback
