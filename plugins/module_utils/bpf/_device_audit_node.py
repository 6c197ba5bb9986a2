# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The node side of the device-cgroup audit: find the container cgroups, read their effective BPF device
programs through bpf(2), and hand them to the pure ``_device_audit``.  Shared by device_cgroup_audit and node_audit.

The allocation to compare with (``allocation_source``): the ``allocations`` option when given (``api-server``, what
the cluster side collected), else the kubelet's pod-resources API when its socket is on the node (``pod-resources``,
the device IDs the kubelet gave each container), else none (only which container can open which GPU).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import stat
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _bpf_syscalls, _device_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _findings, _host
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _cgroup_paths, _podresources

DEFAULT_BUNDLE_DIRS = ["/run/containerd/io.containerd.runtime.v2.task/k8s.io", "/run/containers/storage/overlay-containers"]
MAX_DEPTH = 8  # below a kubepods root: QoS, pod, container, and a few nested levels
# An OCI bundle's config.json is tens of KiB; one that is bigger is not read (the container's name stays unknown).
BUNDLE_MAX_BYTES = 4 * 1024 * 1024
# CGROUP_SUPER_MAGIC and CGROUP2_SUPER_MAGIC, include/uapi/linux/magic.h
CGROUP_FS_MAGICS = (0x27E0EB, 0x63677270)


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
        "node_name": {"type": "str"},
        "allocations": {
            "type": "list",
            "elements": "dict",
            "options": {
                "pod_uid": {"type": "str", "required": True},
                "container": {"type": "str"},
                "gpu_minors": {"type": "list", "elements": "int", "default": []},
                "gpu_uuids": {"type": "list", "elements": "str", "default": []},
                "privileged": {"type": "bool", "default": False},
                "pod": {"type": "str"},
            },
        },
        "devices": {"type": "list", "elements": "path"},
        "accesses": {"type": "list", "elements": "str", "choices": ["r", "w", "m", "rw"], "default": ["r", "w", "m"]},
        "bundle_dirs": {"type": "list", "elements": "path", "default": list(DEFAULT_BUNDLE_DIRS)},
        "severity_overrides": {"type": "dict", "default": {}},
        "pod_resources_socket": {"type": "path", "default": _podresources.DEFAULT_SOCKET},
    }


# ---------------------------------------------------------------------------------------------
# Reading the node


def cgroup_layout(base):
    """(layout, v2 root or None, v1 devices root or None) of a cgroup mount point."""
    v2 = None
    if os.path.exists(os.path.join(base, "cgroup.controllers")):
        v2 = base
    elif os.path.exists(os.path.join(base, "unified", "cgroup.controllers")):
        v2 = os.path.join(base, "unified")
    v1 = os.path.join(base, "devices")
    v1 = v1 if v2 != base and os.path.exists(os.path.join(v1, "devices.list")) else None
    if v2 is None and v1 is None:
        raise GpuhardenError(
            "device_cgroup_audit: cgroup_root: %s holds neither a cgroup2 hierarchy (%s) nor a v1 devices hierarchy (%s)"
            % (base, os.path.join(base, "cgroup.controllers"), os.path.join(base, "devices", "devices.list"))
        )
    layout = "v2" if v2 == base else ("hybrid" if v2 and v1 else ("v1" if v1 else "v2"))
    return layout, v2, v1


def _subdirs(path):
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []


def filesystem_type(path):
    """statfs(2)'s f_type of ``path``, or None where it cannot be read."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc, as _bpf_syscalls loads it (no ldconfig run)
        buf = ctypes.create_string_buffer(256)  # struct statfs, f_type (a C long) first
        if libc.statfs(os.fsencode(path), buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _has_subdirs(path, nlink_counts_subdirs):
    """Whether the directory ``path`` has subdirectories.

    On cgroupfs a directory's link count is two plus its subdirectories (kernfs_refresh_inode in
    fs/kernfs/inode.c: ``set_nlink(inode, kn->dir.subdirs + 2)``), so one stat answers without listing the
    cgroup's dozens of control files; elsewhere, or when the stat fails, the directory is listed.
    """
    if nlink_counts_subdirs:
        try:
            return os.stat(path).st_nlink != 2
        except OSError:
            return True
    return True


def find_container_cgroups(hierarchy):
    """{container cgroup path: [nested cgroup paths]} below the kubepods roots of one hierarchy (paths relative to it)."""
    nlink_counts_subdirs = filesystem_type(hierarchy) in CGROUP_FS_MAGICS
    found = {}
    roots = []
    for top in _subdirs(hierarchy):
        if _cgroup_paths.is_kubepods_dir(top):
            roots.append("/" + top)
        else:
            roots.extend("/%s/%s" % (top, sub) for sub in _subdirs(os.path.join(hierarchy, top)) if _cgroup_paths.is_kubepods_dir(sub))
    stack = [(root, 0) for root in reversed(roots)]
    while stack:
        rel, depth = stack.pop()
        for name in _subdirs(hierarchy + rel):
            child = rel + "/" + name
            if _cgroup_paths.parse_container_path(child):
                nested = []
                inner = [child] if _has_subdirs(hierarchy + child, nlink_counts_subdirs) else []
                while inner:
                    current = inner.pop()
                    for sub in _subdirs(hierarchy + current):
                        nested.append(current + "/" + sub)
                        inner.append(current + "/" + sub)
                found[child] = sorted(nested)
            elif depth < MAX_DEPTH:
                stack.append((child, depth + 1))
    return found


def _read_bundle(bundle_dirs, container_id):
    for directory in bundle_dirs:
        for path in (os.path.join(directory, container_id, "config.json"), os.path.join(directory, container_id, "userdata", "config.json")):
            try:  # regular files only, bounded: a bundle that is a FIFO never blocks the audit
                config = json.loads(_files.read_text(path, max_bytes=BUNDLE_MAX_BYTES) or "null")
            except (GpuhardenError, ValueError):
                continue
            if config is None:
                continue
            annotations = config.get("annotations") or {} if isinstance(config, dict) else {}
            name = annotations.get("io.kubernetes.cri.container-name") or annotations.get("io.kubernetes.container.name")
            kind = annotations.get("io.kubernetes.cri.container-type") or annotations.get("io.kubernetes.cri-o.ContainerType")
            namespace = annotations.get("io.kubernetes.cri.sandbox-namespace") or annotations.get("io.kubernetes.pod.namespace")
            pod = annotations.get("io.kubernetes.cri.sandbox-name") or annotations.get("io.kubernetes.pod.name")
            return {
                "name": name if kind != "sandbox" else None,
                "sandbox": kind == "sandbox",
                "pod_name": "%s/%s" % (namespace, pod) if namespace and pod else None,
            }
    return {}


def _read_v1(v1_root, rel):
    path = v1_root + rel + "/devices.list"
    try:  # never through a link, never a FIFO: cgroupfs has neither
        text = _files.read_text(path, follow=False, max_bytes=_host.PROC_MAX_BYTES)
    except GpuhardenError as error:
        raise GpuhardenError("device_cgroup_audit: %s" % error.msg, fix="point cgroup_root at the node's cgroup hierarchy") from None
    return text, path


def describe_devices(root, paths):
    devices = []
    for path in paths:
        if not path.startswith("/"):
            raise GpuhardenError("device_cgroup_audit: devices: %r is not an absolute node path" % path)
        try:
            st = os.stat(_files.resolve_in_root(root, path))  # links followed inside the root, as the node sees them
        except OSError as error:
            raise GpuhardenError("device_cgroup_audit: devices: %s: %s" % (path, error.strerror)) from None
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise GpuhardenError("device_cgroup_audit: devices: %s is not a character or block device" % path)
        devices.append({"path": path, "type": "c" if stat.S_ISCHR(st.st_mode) else "b", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)})
    return devices


def default_devices(root):
    inventory = _host.device_node_inventory(root)
    return [
        {"path": path, "type": "c" if info["type"] == "char" else "b", "major": info["major"], "minor": info["minor"]}
        for path, info in sorted(inventory.items())
        if info.get("type") in ("char", "block") and _device_audit.is_default_device(path)
    ]


def gpu_uuids(root):
    """{GPU UUID: minor} from the driver's /proc/driver/nvidia/gpus/<bdf>/information."""
    mapping = {}
    for bdf in _host.list_node_dir(root, "/proc/driver/nvidia/gpus") or []:
        fields = {}
        for line in (_host.read_node_text(root, "/proc/driver/nvidia/gpus/%s/information" % bdf) or "").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields.get("GPU UUID") and fields.get("Device Minor", "").isdigit():
            mapping[fields["GPU UUID"]] = int(fields["Device Minor"])
    return mapping


def collect(root, cgroup_root, bundle_dirs):
    """The containers with their effective programs / devices.list, and the programs' dumps."""
    base = _files.resolve_in_root(root, cgroup_root)
    if not os.path.isdir(base):
        raise GpuhardenError("device_cgroup_audit: cgroup_root: %s is not a directory" % base)
    layout, v2_root, v1_root = cgroup_layout(base)
    paths, found_in = {}, {}
    for hierarchy in (v2_root, v1_root):
        if hierarchy:
            found_in[hierarchy] = seen = set()
            for rel, nested in find_container_cgroups(hierarchy).items():
                paths.setdefault(rel, set()).update(nested)
                seen.add(rel)
                seen.update(nested)
    bundle_dirs = [here for here in (_files.resolve_in_root(root, d) for d in bundle_dirs) if os.path.isdir(here)]
    containers, prog_ids, vanished = [], set(), []
    for rel in sorted(paths):
        parsed = _cgroup_paths.parse_container_path(rel)
        cgroups = []
        for path in [rel] + sorted(paths[rel]):
            entry = {"path": path, "programs": [], "v1": None}
            if v2_root and path in found_in[v2_root]:
                try:
                    entry["programs"], _flags = _bpf_syscalls.query_programs(v2_root + path, effective=True)
                except _bpf_syscalls.BpfError as error:
                    if error.errno == 2:  # ENOENT: removed while we read
                        vanished.append(path)
                        continue
                    raise
            if v1_root and path in found_in[v1_root]:
                entry["v1"], entry["v1_file"] = _read_v1(v1_root, path)
            prog_ids.update(entry["programs"])
            cgroups.append(entry)
        if not cgroups or cgroups[0]["path"] != rel:
            continue
        container = dict(parsed, cgroup=rel, cgroups=cgroups)
        if bundle_dirs:
            container.update(_read_bundle(bundle_dirs, parsed["container_id"]))
        containers.append(container)
    programs = {}
    for prog_id in sorted(prog_ids):
        info = _bpf_syscalls.dump_program(prog_id)
        if info is None:
            programs[prog_id] = {"xlated": None, "unauditable": "the program disappeared while the audit ran"}
            continue
        if info["type"] != _bpf_syscalls.BPF_PROG_TYPE_CGROUP_DEVICE:
            info["xlated"], info["unauditable"] = None, "program type %d, not a device-cgroup program" % info["type"]
        programs[prog_id] = info
    return layout, containers, programs, vanished


# ---------------------------------------------------------------------------------------------
# The allocation from the kubelet's pod-resources API


def pod_resources_allocations(pods, containers, uuid_to_minor, allocatable):
    """The audit's ``allocations`` from a pod-resources ``List`` answer: (allocations, unmatched, None) or
    (None, [], why they cannot be used).

    pod-resources names containers by namespace, pod and container name, the cgroups by pod UID and container ID;
    the runtime's bundle annotations (``bundle_dirs``) tie the two.  Every container is either tied or the whole
    answer is set aside: a container left without its entry would count as allocated no GPU, and every GPU it
    can open would be a false isolation breach.  For the same reason the answer is set aside when a GPU may reach
    a container another way than the kubelet's device manager says: device IDs that are not the UUID of a GPU of
    this node (MIG devices, the device plugin's ``index`` ID strategy), DRA claims, or a GPU of the node that the
    device manager does not hold (``allocatable``, the GetAllocatableResources answer: a DRA driver, MIG mode, or
    no device plugin).
    """
    advertised = {ident.split("::", 1)[0] for device in allocatable["devices"] if device["resource_name"].startswith("nvidia.com/")
                  for ident in device["device_ids"]}  # fmt: skip
    outside = sorted(uuid for uuid in uuid_to_minor if uuid not in advertised)
    if outside:
        return None, [], "GPUs of this node that the kubelet's device manager does not hold (a DRA driver, MIG mode, no device plugin): %s" % (
            ", ".join(outside[:5]))  # fmt: skip
    claims = sorted("%s/%s/%s" % (pod["namespace"], pod["name"], c["name"]) for pod in pods for c in pod["containers"] if c.get("dynamic_resources"))
    if claims:
        return None, [], "containers with DRA claims, whose devices are not mapped to GPUs: %s" % ", ".join(claims[:5])
    untied = sorted(c["container_id"][:12] for c in containers if not c.get("sandbox") and not (c.get("name") and c.get("pod_name")))
    if untied:
        return None, [], "the names of %d container(s) are unknown (%s): bundle_dirs holds no readable bundle for them" % (
            len(untied), ", ".join(untied[:5]))  # fmt: skip
    by_name = {}
    for container in containers:
        if not container.get("sandbox"):
            by_name.setdefault((container["pod_name"], container["name"]), []).append(container)
    allocations, unmatched, unknown = [], [], []
    for pod in pods:
        pod_name = "%s/%s" % (pod["namespace"], pod["name"])
        for entry in pod["containers"]:
            # The NVIDIA device plugin's resources; time-slicing replicas carry a ::<n> suffix on the GPU's UUID.
            ids = sorted({ident.split("::", 1)[0] for device in entry["devices"] if device["resource_name"].startswith("nvidia.com/")
                          for ident in device["device_ids"]})  # fmt: skip
            unknown.extend(ident for ident in ids if ident not in uuid_to_minor)
            matches = by_name.get((pod_name, entry["name"]), [])
            if not matches and ids:
                unmatched.append("%s/%s" % (pod_name, entry["name"]))
            for container in matches:
                allocations.append({"pod_uid": container["pod_uid"], "container": container["container_id"], "gpu_minors": [],
                                    "gpu_uuids": ids, "privileged": False, "pod": pod_name})  # fmt: skip
    if unknown:
        return None, [], "device IDs that are no GPU UUID of this node (/proc/driver/nvidia/gpus): %s" % ", ".join(sorted(set(unknown))[:5])
    return allocations, unmatched, None


def allocation(params, containers, uuid_to_minor):
    """(allocations or None, allocation_source, pod_resources report, the List answer or None)."""
    socket_path = _host.host_path(params["root"], params["pod_resources_socket"])
    report = {"socket": socket_path, "pods": None, "unmatched": [], "reason": None}
    if params["allocations"] is not None:
        report["reason"] = "allocations given"
        return params["allocations"], "api-server", report, None
    try:
        pods = _podresources.list_pod_resources(socket_path)
    except _podresources.PodResourcesError as error:
        report["reason"] = error.msg
        return None, "none", report, None
    report["pods"] = len(pods)
    try:
        allocatable = _podresources.get_allocatable_resources(socket_path)
    except _podresources.PodResourcesError as error:
        report["reason"] = error.msg
        return None, "none", report, pods
    allocations, report["unmatched"], report["reason"] = pod_resources_allocations(pods, containers, uuid_to_minor, allocatable)
    return allocations, ("none" if allocations is None else "pod-resources"), report, pods


def gpu_allocations(pods):
    """The List answer cut to what gpu_consistency's ``pod_resources`` takes: the C(nvidia.com/*) devices per container."""
    return [
        {"namespace": pod["namespace"], "name": pod["name"], "containers": [
            {"name": c["name"], "devices": [{"resource_name": d["resource_name"], "device_ids": d["device_ids"]}
                                            for d in c["devices"] if d["resource_name"].startswith("nvidia.com/")]}
            for c in pod["containers"]]}
        for pod in pods
    ]  # fmt: skip


def run(params, keep_answer=False):
    """The audit's result; with ``keep_answer``, ``pod_resources_answer`` is the pod-resources List cut to the GPUs
    (``gpu_allocations``), or None when it was not read."""
    root = params["root"]
    if not os.path.isdir(root):
        raise GpuhardenError("device_cgroup_audit: root: %s is not a directory" % root)
    _device_audit.check_options(params["accesses"], params["severity_overrides"], params["allocations"])
    for option in ("cgroup_root", "bundle_dirs"):
        for value in params[option] if isinstance(params[option], list) else [params[option]]:
            if not value.startswith("/") or "\x00" in value:
                raise GpuhardenError("device_cgroup_audit: option %s: %s is not an absolute node path" % (option, _files.shown(value)[:200]),
                                     fix="name directories as the node sees them, from /")
    started = time.monotonic()
    devices = describe_devices(root, params["devices"]) if params["devices"] is not None else default_devices(root)
    layout, containers, programs, vanished = collect(root, params["cgroup_root"], params["bundle_dirs"])
    uuid_to_minor = gpu_uuids(root)
    # After the cgroups: a container that starts in between is in the answer, not left out of it.
    allocations, source, pod_resources, answer = allocation(params, containers, uuid_to_minor)
    collected = time.monotonic()
    result = _device_audit.audit(
        params["node_name"] or platform.node(),
        containers,
        programs,
        devices,
        accesses=params["accesses"],
        allocations=allocations,
        uuid_to_minor=uuid_to_minor,
        severity_overrides=params["severity_overrides"],
    )
    decided = time.monotonic()
    counts = _findings.by_severity(result["findings"])
    max_severity = _findings.max_severity(result["findings"])
    extra = {"pod_resources_answer": None if answer is None else gpu_allocations(answer)} if keep_answer else {}
    return {
        **extra,
        "findings": result["findings"],
        "containers": result["containers"],
        "cgroup_layout": layout,
        "devices": devices,
        # not "skipped": Ansible reads a truthy skipped in a result as a skipped task (ansible-core 2.19
        # executor/task_result.py is_skipped), findings and all
        "vanished_cgroups": vanished,
        "programs": {
            str(pid): {
                "name": info.get("name"),
                "tag": info.get("tag"),
                "insns": len(info["xlated"]) // 8 if info.get("xlated") else info.get("xlated_len", 0) // 8,
                "unauditable": info.get("unauditable"),
            }
            for pid, info in programs.items()
        },
        "allocation_source": source,
        "pod_resources": pod_resources,
        "summary": {"containers": len(containers), "programs": len(programs), "findings": counts, "max_severity": max_severity},
        "timings": {"read_s": round(collected - started, 4), "decide_s": round(decided - collected, 4)},
    }
