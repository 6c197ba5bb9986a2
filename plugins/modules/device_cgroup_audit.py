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
  - "Compares with an allocation (see O(severity_overrides) for the finding ids) and says which in
    C(allocation_source): O(allocations) from the cluster side when given (V(api-server)); else the kubelet's
    pod-resources API (C(v1.PodResourcesLister/List) on O(pod_resources_socket), the device IDs the kubelet gave each
    container; V(pod-resources)); else none (V(none)), only which containers can open which GPU (C(gpu_access), info)."
  - "The pod-resources answer is used only when every container is tied to it (container and pod names from the
    runtime's bundles, O(bundle_dirs)), every C(nvidia.com/*) device ID is the UUID of a GPU of the node, no container
    holds a DRA claim, and every GPU of the node is one the kubelet's device manager holds (C(GetAllocatableResources)):
    a GPU reaching a container another way would show as a false isolation breach. Otherwise, or when the API does not
    answer, C(pod_resources.reason) says why and the audit runs without an allocation."
  - Read-only; it never loads, attaches or detaches a program. The pod-resources client is part of the collection
    (HTTP/2 and gRPC in the Python standard library); each of its two calls is bounded by 10 seconds.
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
  pod_resources_socket:
    description:
      - The kubelet's pod-resources socket, as a node path (read below O(root)). Read only when O(allocations) is
        not given.
    type: path
    default: /var/lib/kubelet/pod-resources/kubelet.sock
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
    - Like every gpuharden check's findings, each also has C(check), C(stage) (the harden stage it belongs to, or
      V(postcheck)) and C(remediable).
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
vanished_cgroups:
  description: Cgroups that disappeared while the audit read them (their containers ended); the audit goes on without them.
  returned: always
  type: list
  elements: str
programs:
  description: The programs read, by ID, with C(name), C(tag), C(insns) (count) and C(unauditable) (why not dumpable, or null).
  returned: always
  type: dict
allocation_source:
  description:
    - Where the allocation compared with came from, V(api-server) (O(allocations)), V(pod-resources) or V(none).
  returned: always
  type: str
  sample: pod-resources
pod_resources:
  description:
    - The pod-resources read, C(socket) (host path), C(pods) (pods in the answer, null when not read), C(unmatched)
      (C(namespace/pod/container) holding GPUs without a container cgroup here, such as containers started after the
      cgroups were read) and C(reason) (why the answer was not used, or null).
  returned: always
  type: dict
  sample: {"socket": "/var/lib/kubelet/pod-resources/kubelet.sock", "pods": 12, "unmatched": [], "reason": null}
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _device_audit_node
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell


def build_module():
    return AnsibleModule(argument_spec=_device_audit_node.argument_spec(), supports_check_mode=True)


def main():
    _module_shell.run_module(build_module(), lambda module: _device_audit_node.run(module.params), never_changed=True)


if __name__ == "__main__":
    main()
