#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: cgroup_memory
short_description: Set memory.high on running GPU pods' cgroups (cgroup v2)
version_added: 0.1.0
description:
  - The immediate fix for GPU pods that run without MemoryQoS. Without it a pod's cgroup has C(memory.max) set
    to its limit and C(memory.high) left at V(max), so the kernel never throttles or reclaims before the OOM
    killer ends the pod, which on a GPU node also ends a long GPU job.
  - For each pod in O(pod_uids), finds the pod's cgroup as the kubelet made it under O(cgroup_root) (systemd
    driver C(kubepods.slice/kubepods[-<qos>].slice/kubepods[-<qos>]-pod<uid with _>.slice/<container>.scope),
    cgroupfs driver C(kubepods/[<qos>/]pod<uid>/<container>)), and on the pod cgroup and each of its container
    cgroups where C(memory.max) is a number and C(memory.high) is V(max), writes C(memory.high) =
    floor(C(memory.max) x O(factor) / O(page_size)) x O(page_size), the value a kubelet with MemoryQoS derives
    for a container without a memory request.
  - A C(memory.high) that is already a number is left alone. Pods whose cgroups have no memory limit at all are
    reported in RV(unlimited_pods), pods without a cgroup on this node in RV(not_found).
  - Refuses on cgroup v1 (C(memory.high) exists only on cgroup v2) and on a cgroup v2 hierarchy without the
    memory controller, with a message saying so, before reading any pod.
  - Every value is decided before the first write; a C(memory.max) or C(memory.high) that holds neither
    V(max) nor a byte count stops the run with nothing written.
  - cgroup files are read and written only when they are regular files. A symbolic link, FIFO or device where a
    cgroup file should be is refused with nothing written. A C(memory.high) that changed since it was read is refused,
    not overwritten; when the kernel refuses a value, the values already written are put back.
  - The durable fix is the kubelet's MemoryQoS (role C(gpuharden.k8s.cgroup_limits)); this module does not
    survive a pod restart, the kubelet setting does.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.node_root
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - One entry per C(memory.high) file written, old and new value.
options:
  cgroup_root:
    description:
      - Where the node's cgroup v2 hierarchy is mounted, as seen on the node (below O(root)).
    type: path
    default: /sys/fs/cgroup
  pod_uids:
    description:
      - UIDs of the pods to fix, usually the GPU pods bound to this node from M(gpuharden.k8s.gpu_pods_info).
      - Each is a UUID, or the 32 hex digits of a static pod's UID. Case is ignored, duplicates are dropped.
      - An empty list only checks that O(cgroup_root) is cgroup v2 with the memory controller.
    type: list
    elements: str
    default: []
  factor:
    description:
      - The kubelet's C(memoryThrottlingFactor); greater than 0 and at most 1.
    type: float
    default: 0.9
  page_size:
    description:
      - Page size in bytes, a power of two; C(memory.high) is rounded down to a multiple of it.
      - Default is the node's page size (C(os.sysconf("SC_PAGE_SIZE"))).
    type: int
requirements:
  - cgroup v2 with the memory controller
notes:
  - cgroup files are kernel interfaces, not files. C(memory.high) is written in place and read back, not
    through a temporary file and a rename, and no backup is kept. The old values are returned in RV(updated).
  - Must run as root on the node (or in a privileged pod that sees the node's cgroup hierarchy).
seealso:
  - module: gpuharden.k8s.gpu_pods_info
"""

EXAMPLES = r"""
- name: List the GPU pods of these nodes
  gpuharden.k8s.gpu_pods_info:
    nodes: "{{ ansible_play_batch }}"
  delegate_to: localhost
  run_once: true
  register: gpu_pods

- name: Throttle GPU pods before the OOM killer does
  gpuharden.k8s.cgroup_memory:
    pod_uids: "{{ gpu_pods.pod_uids_by_node[inventory_hostname] }}"
    factor: 0.9

- name: Only check that the node has cgroup v2 with the memory controller
  gpuharden.k8s.cgroup_memory:
  check_mode: true
"""

RETURN = r"""
cgroup_root:
  description: The cgroup v2 hierarchy that was read.
  returned: always
  type: str
  sample: /sys/fs/cgroup
page_size:
  description: Page size used for rounding.
  returned: always
  type: int
  sample: 4096
pods:
  description:
    - One entry per pod found, with its cgroup (relative to RV(cgroup_root)), cgroup driver, QoS class,
      C(memory_max) and C(memory_high) (byte counts or V(max); C(memory_high) is the value after the run),
      C(action) (V(set), V(already_set), V(unlimited), V(no_memory_files), V(limit_below_one_page)),
      whether it C(changed), and the same per container cgroup.
  returned: always
  type: list
  elements: dict
  sample: [{"uid": "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162", "driver": "systemd", "qos": "burstable",
            "cgroup": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f3c2a1e_5b7d_4c8e_9a6f_1d2e3f405162.slice",
            "memory_max": 17179869184, "memory_high": 15461879808, "action": "set", "changed": true, "containers": []}]
updated:
  description: Every C(memory.high) file written (in check mode, to be written), with its old and new value.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/sys/fs/cgroup/kubepods.slice/.../memory.high", "before": "max", "after": "15461879808"}]
unlimited_pods:
  description: UIDs of pods whose cgroups have no memory limit at all (C(memory.max) V(max) everywhere).
  returned: always
  type: list
  elements: str
not_found:
  description: UIDs from O(pod_uids) with no pod cgroup on this node.
  returned: always
  type: list
  elements: str
vanished:
  description:
    - C(memory.high) files planned but gone when their turn to be written came (the pod ended meanwhile), with the
      value that was to be written. Not written, not an error.
  returned: always
  type: list
  elements: dict
  sample: []
findings:
  description:
    - Report entries C({id, check, stage, severity, expected, found, hint, remediable, subject}). C(id) is V(gpu-pod-memory-high-unset) for a
      C(memory.high) that was (or, in check mode, would be) set, V(gpu-pod-no-memory-limit) for an unlimited pod.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _host, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _cgroup_memory


def build_module():
    return AnsibleModule(argument_spec=_cgroup_memory.argument_spec(), supports_check_mode=True)


def run(module):
    planned = _cgroup_memory.decide(module.params)
    changes = [change for change in planned["changes"] if change.changed]
    vanished = []
    if not module.check_mode:
        _written, vanished = _cgroup_memory.write_values(changes, module.params["root"], _host.host_path)
        changes = [change for change in changes if change not in vanished]
    for uid in planned["unlimited_pods"]:
        module.warn("GPU pod %s has no memory limit: nothing bounds its memory on this node" % uid)
    result = {
        "changed": bool(changes),
        "cgroup_root": planned["cgroup_root"],
        "page_size": planned["page_size"],
        "pods": planned["pods"],
        "updated": [_cgroup_memory.change_record(change) for change in changes],
        "unlimited_pods": planned["unlimited_pods"],
        "not_found": planned["not_found"],
        "vanished": [_cgroup_memory.change_record(change) for change in vanished],
        "findings": planned["findings"],
    }
    if module._diff:
        result["diff"] = _files.diffs(changes)
    return result


def main():
    _module_shell.run_module(build_module(), run)


if __name__ == "__main__":
    main()
