#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: device_cgroup_audit
short_description: Audit which containers the kernel lets open which GPU, from their eBPF device-cgroup programs
version_added: 0.1.0
description:
  - Finds every container cgroup under the kubelet's C(kubepods) hierarchy (systemd driver
    C(kubepods.slice/.../cri-containerd-<id>.scope), cgroupfs driver C(kubepods/<qos>/pod<uid>/<id>)), with the
    pod UID from the path, and the cgroups nested in them.
  - For each, reads its effective C(BPF_CGROUP_DEVICE) programs through bpf(2) (C(BPF_PROG_QUERY) with
    C(BPF_F_QUERY_EFFECTIVE), C(BPF_PROG_GET_FD_BY_ID), C(BPF_OBJ_GET_INFO_BY_FD) for the translated instructions)
    and runs them in a small eBPF interpreter for every device of interest and every access. The effective decision
    is the AND over the effective list, as in the kernel. Pure Python with ctypes; no compiler, headers or bcc.
  - On cgroup v1 and hybrid hosts the container's v1 C(devices.list) is read too and both layers are ANDed (both
    are enforced on hybrid hosts).
  - A program the kernel will not dump (constant blinding with raw dumps restricted), or one that calls helpers,
    reads maps or memory other than the 12-byte device context, is reported as C(unauditable_program); its
    verdicts are never guessed.
  - With O(allocations) from the cluster side, compares with the allocation, see O(severity_overrides) for the
    finding ids. Without it, reports which containers can open which GPU (C(gpu_access), info).
  - Read-only; it never loads, attaches or detaches a program.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._attributes.node_root
options:
  cgroup_root:
    description:
      - Where the node's cgroup file system is mounted, as a node path (read below O(root)).
      - A cgroup2 mount there is a pure v2 host; a C(unified) cgroup2 mount below it is a hybrid host, whose v1
        C(devices) hierarchy is read too; without cgroup2 only the v1 C(devices) hierarchy is read.
    type: path
    default: /sys/fs/cgroup
  node_name:
    description:
      - The node name put in every finding. Defaults to the host name.
    type: str
  allocations:
    description:
      - What the device plugin allocated, from the cluster side (for example the pod resources API or
        C(NVIDIA_VISIBLE_DEVICES) of the running containers). Omit it to only report which containers can open
        which GPU.
      - Containers without an entry are treated as allocated no GPU.
    type: list
    elements: dict
    suboptions:
      pod_uid:
        description: The pod's UID.
        type: str
        required: true
      container:
        description:
          - The container's ID (at least 12 hex digits of it) or name. Names are resolved through the runtime's
            bundle annotations (O(bundle_dirs)); omitted, the pod's only container.
        type: str
      gpu_minors:
        description: Minor numbers of the allocated GPUs (C(/dev/nvidia<minor>)).
        type: list
        elements: int
        default: []
      gpu_uuids:
        description: UUIDs of the allocated GPUs, mapped to minors through C(/proc/driver/nvidia/gpus).
        type: list
        elements: str
        default: []
      privileged:
        description: The container is privileged (from its pod spec).
        type: bool
        default: false
      pod:
        description: The pod's C(namespace/name), for the findings.
        type: str
  devices:
    description:
      - Device nodes to audit (node paths). Default every C(/dev/nvidia<N>), C(nvidiactl), C(nvidia-uvm),
        C(nvidia-uvm-tools) and C(/dev/nvidia-caps/*) found on the node.
    type: list
    elements: path
  accesses:
    description:
      - Accesses to decide for each device; V(r), V(w) and V(m) (mknod) are single bits, V(rw) is one read-write open.
    type: list
    elements: str
    choices: [r, w, m, rw]
    default: [r, w, m]
  bundle_dirs:
    description:
      - Directories holding the runtime's per-container bundles (C(<dir>/<id>/config.json) or
        C(<dir>/<id>/userdata/config.json)), read for container names and sandbox (pause) containers. Node paths.
    type: list
    elements: path
    default: [/run/containerd/io.containerd.runtime.v2.task/k8s.io, /run/containers/storage/overlay-containers]
  severity_overrides:
    description:
      - Severity per finding id, replacing the default. Ids and defaults are C(isolation_breach) critical,
        C(broken_allocation) error, C(privileged_container) error, C(unauditable_program) warning,
        C(allocation_unmatched) warning, C(gpu_access) info. Severities are info, warning, error, critical.
    type: dict
    default: {}
requirements:
  - Linux with bpf(2) on x86_64 or aarch64
notes:
  - Needs root on the node (CAP_SYS_ADMIN, or CAP_BPF with CAP_NET_ADMIN) to query and dump programs; without it
    the module fails with a message saying so.
  - On cgroup v1 a devices cgroup that allows by default lists only C(a *:* rwm), hiding its deny exceptions, so
    such a cgroup is read as allowing everything.
seealso:
  - module: gpuharden.k8s.gpu_facts
"""

EXAMPLES = r"""
- name: Which containers can open which GPU
  gpuharden.k8s.device_cgroup_audit:
  become: true
  register: devcg

- name: Compare with the allocation the cluster side collected
  gpuharden.k8s.device_cgroup_audit:
    node_name: "{{ gpuharden_k8s_node_name | default(inventory_hostname) }}"
    allocations:
      - pod_uid: 0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162
        container: main
        gpu_minors: [1]
      - pod_uid: 6a1b9f1c-2d4e-4f60-8a7b-9c0d1e2f3a4b
        gpu_uuids: [GPU-6d9d1a3c-7a4e-1f2b-9c3d-0e1f2a3b4c5d]
    severity_overrides:
      privileged_container: warning
  become: true
  register: devcg

- name: Fail on an isolation breach
  ansible.builtin.assert:
    that: devcg.findings | selectattr('severity', 'equalto', 'critical') | list | length == 0
"""

RETURN = r"""
findings:
  description:
    - One entry per problem, most severe first, with C(id), C(severity), C(node), C(pod) (UID), C(pod_name),
      C(container) (name, else ID), C(container_id), C(cgroup), C(gpu) (minor), C(gpu_uuid), C(device),
      C(expected), C(found) and C(hint).
    - Ids are C(isolation_breach), C(broken_allocation), C(privileged_container), C(unauditable_program),
      C(allocation_unmatched) and C(gpu_access).
  returned: always
  type: list
  elements: dict
  sample: [{"id": "isolation_breach", "severity": "critical", "node": "gpu-1", "pod": "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162",
            "pod_name": "ml/sneaky", "container": "main", "container_id": "3f9a...", "cgroup": "/kubepods.slice/...",
            "gpu": 3, "gpu_uuid": "GPU-...", "device": "/dev/nvidia3", "expected": "no access to /dev/nvidia3 (not allocated)",
            "found": "r+w allowed", "hint": "..."}]
containers:
  description:
    - Every container cgroup found, with C(cgroup), C(pod_uid), C(container_id), C(container) (name or null),
      C(driver), C(qos), C(sandbox), C(privileged), C(programs) (effective program IDs), C(v1) (a devices.list was
      read), C(nested) (cgroups below it), C(gpus) (minors it can open), C(allowed) and C(unauditable) (device path
      to the accesses allowed / undecided).
  returned: always
  type: list
  elements: dict
cgroup_layout:
  description: V(v2), V(hybrid) or V(v1).
  returned: always
  type: str
devices:
  description: The audited device nodes with C(path), C(type), C(major), C(minor).
  returned: always
  type: list
  elements: dict
skipped:
  description: Cgroups that disappeared while the audit read them.
  returned: always
  type: list
  elements: str
programs:
  description: The programs read, by ID, with C(name), C(tag), C(insns) (count) and C(unauditable) (why not dumpable, or null).
  returned: always
  type: dict
summary:
  description: Counts of containers, programs and findings per severity, and C(max_severity) (null without findings).
  returned: always
  type: dict
  sample: {"containers": 4, "programs": 4, "findings": {"critical": 8, "error": 2}, "max_severity": "critical"}
timings:
  description: Seconds spent reading (cgroups, bpf(2)) and deciding.
  returned: always
  type: dict
"""

import json
import os
import platform
import stat
import time
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils import _bpf_syscalls, _device_audit, _host
from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError

DEFAULT_BUNDLE_DIRS = ["/run/containerd/io.containerd.runtime.v2.task/k8s.io", "/run/containers/storage/overlay-containers"]
MAX_DEPTH = 8  # below a kubepods root: QoS, pod, container, and a few nested levels


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
    }


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


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
            "device_cgroup_audit: cgroup_root: %s holds neither a cgroup2 hierarchy (cgroup.controllers) nor a v1 devices "
            "hierarchy (devices/devices.list)" % base
        )
    layout = "v2" if v2 == base else ("hybrid" if v2 and v1 else ("v1" if v1 else "v2"))
    return layout, v2, v1


def _subdirs(path):
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []


def find_container_cgroups(hierarchy):
    """{container cgroup path: [nested cgroup paths]} below the kubepods roots of one hierarchy (paths relative to it)."""
    found = {}
    roots = []
    for top in _subdirs(hierarchy):
        if _device_audit.is_kubepods_dir(top):
            roots.append("/" + top)
        else:
            roots.extend("/%s/%s" % (top, sub) for sub in _subdirs(os.path.join(hierarchy, top)) if _device_audit.is_kubepods_dir(sub))
    stack = [(root, 0) for root in reversed(roots)]
    while stack:
        rel, depth = stack.pop()
        for name in _subdirs(hierarchy + rel):
            child = rel + "/" + name
            if _device_audit.parse_container_path(child):
                nested = []
                inner = [child]
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
            try:
                with open(path, encoding="utf-8") as handle:
                    config = json.load(handle)
            except (OSError, ValueError):
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
    text = _host.read_text(path)
    return text, path


def describe_devices(root, paths):
    devices = []
    for path in paths:
        if not path.startswith("/"):
            raise GpuhardenError("device_cgroup_audit: devices: %r is not an absolute node path" % path)
        try:
            st = os.stat(_host.host_path(root, path))
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
    base = _host.host_path(root, "/proc/driver/nvidia/gpus")
    mapping = {}
    try:
        names = os.listdir(base)
    except OSError:
        return mapping
    for bdf in names:
        fields = {}
        for line in (_host.read_text(os.path.join(base, bdf, "information")) or "").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields.get("GPU UUID") and fields.get("Device Minor", "").isdigit():
            mapping[fields["GPU UUID"]] = int(fields["Device Minor"])
    return mapping


def collect(root, cgroup_root, bundle_dirs):
    """The containers with their effective programs / devices.list, and the programs' dumps."""
    base = _host.host_path(root, cgroup_root)
    if not os.path.isdir(base):
        raise GpuhardenError("device_cgroup_audit: cgroup_root: %s is not a directory" % base)
    layout, v2_root, v1_root = cgroup_layout(base)
    paths = {}
    for hierarchy in (v2_root, v1_root):
        if hierarchy:
            for rel, nested in find_container_cgroups(hierarchy).items():
                paths.setdefault(rel, set()).update(nested)
    bundle_dirs = [_host.host_path(root, d) for d in bundle_dirs if os.path.isdir(_host.host_path(root, d))]
    containers, prog_ids, skipped = [], set(), []
    for rel in sorted(paths):
        parsed = _device_audit.parse_container_path(rel)
        cgroups = []
        for path in [rel] + sorted(paths[rel]):
            entry = {"path": path, "programs": [], "v1": None}
            if v2_root and os.path.isdir(v2_root + path):
                try:
                    entry["programs"], _flags = _bpf_syscalls.query_programs(v2_root + path, effective=True)
                except _bpf_syscalls.BpfError as error:
                    if error.errno == 2:  # ENOENT: removed while we read
                        skipped.append(path)
                        continue
                    raise
            if v1_root and os.path.isdir(v1_root + path):
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
    return layout, containers, programs, skipped


def run(params):
    root = params["root"]
    if not os.path.isdir(root):
        raise GpuhardenError("device_cgroup_audit: root: %s is not a directory" % root)
    _device_audit.check_options(params["accesses"], params["severity_overrides"], params["allocations"])
    started = time.monotonic()
    devices = describe_devices(root, params["devices"]) if params["devices"] is not None else default_devices(root)
    layout, containers, programs, skipped = collect(root, params["cgroup_root"], params["bundle_dirs"])
    collected = time.monotonic()
    result = _device_audit.audit(
        params["node_name"] or platform.node(),
        containers,
        programs,
        devices,
        accesses=params["accesses"],
        allocations=params["allocations"],
        uuid_to_minor=gpu_uuids(root),
        severity_overrides=params["severity_overrides"],
    )
    decided = time.monotonic()
    counts = {}
    for finding in result["findings"]:
        counts[finding["severity"]] = counts.get(finding["severity"], 0) + 1
    max_severity = next((s for s in reversed(_device_audit.SEVERITIES) if s in counts), None)
    return {
        "findings": result["findings"],
        "containers": result["containers"],
        "cgroup_layout": layout,
        "devices": devices,
        "skipped": skipped,
        "programs": {
            str(pid): {
                "name": info.get("name"),
                "tag": info.get("tag"),
                "insns": len(info["xlated"]) // 8 if info.get("xlated") else info.get("xlated_len", 0) // 8,
                "unauditable": info.get("unauditable"),
            }
            for pid, info in programs.items()
        },
        "summary": {"containers": len(containers), "programs": len(programs), "findings": counts, "max_severity": max_severity},
        "timings": {"read_s": round(collected - started, 4), "decide_s": round(decided - collected, 4)},
    }


def main():
    module = build_module()
    try:
        result = run(module.params)
    except GpuhardenError as error:
        module.fail_json(msg=error.msg, exception=traceback.format_exc(), **error.result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
