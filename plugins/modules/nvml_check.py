#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: nvml_check
short_description: Post-check a GPU node through NVML, as root and as an unprivileged user
version_added: 0.1.0
description:
  - Read-only. Initialises NVML as root and, in a forked child that drops to O(unprivileged_user), as an
    unprivileged user; that second run is the real test of a device-permission fix.
  - The child drops its privileges after C(pynvml) and the NVML library are loaded and before C(nvmlInit), so a node
    whose Python lives where the unprivileged user cannot read (for example under C(/root)) still works.
  - Compares the GPU count with the driver's own list (C(/proc/driver/nvidia/gpus)) and with O(expected_gpus), and
    the MIG device count with O(expected_mig_devices) and, where the driver shows it, with
    C(/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>/ci<id>).
  - Checks every GPU whose handle can be obtained (as root and as the unprivileged user; C(NO_PERMISSION) and
    C(UNKNOWN) are told apart, the latter being what a devices-cgroup denial looks like) for volatile uncorrectable ECC
    errors, pending or failed row remapping, a lost GPU, a PCIe link trained below its maximum generation or width
    (current and maximum bandwidth and their ratio), and NVLink links that are down on GPUs that have NVLink.
  - "PCIe bandwidth per direction is lanes x transfer rate x line-code efficiency / 8: 2.5, 5, 8, 16, 32 and 64 GT/s
    for generations 1 to 6, with 8b/10b for generations 1-2, 128b/130b for 3-5 and 242b/256b (FLIT) for 6."
  - Lists the compute processes on every GPU with their PID, used memory and MIG GPU/compute instance.
  - Returns structured findings (C(id), C(severity), C(node), C(gpu), C(pod), C(expected), C(found), C(hint)); fails
    only when O(fail_on) says so.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._attributes.node_root
options:
  node_name:
    description:
      - The node's name as findings report it (the Kubernetes node name). Default is the host name.
    type: str
  check_unprivileged:
    description:
      - Also run NVML as O(unprivileged_user). Needs root.
    type: bool
    default: true
  unprivileged_user:
    description:
      - User name or uid the unprivileged check runs as; its primary group is used.
    type: str
    default: nobody
  unprivileged_groups:
    description:
      - Supplementary groups (names or gids) the unprivileged check keeps, for example the device group that pods
        get through C(securityContext.supplementalGroups) under a restricted device policy.
    type: list
    elements: str
    default: []
  unprivileged_timeout:
    description:
      - Seconds the unprivileged check may take before it is killed and reported.
    type: int
    default: 60
  expected_gpus:
    description:
      - The number of GPUs the node should have (from the inventory). Not compared when not set.
    type: int
  expected_mig_devices:
    description:
      - The number of MIG devices the node should have. Not compared when not set.
    type: int
  fail_on:
    description:
      - Fail the task when a finding has this severity or a higher one; V(never) only reports.
    type: str
    choices: [never, info, warning, error, critical]
    default: never
requirements:
  - nvidia-ml-py (import name C(pynvml)) on the node's Python
notes:
  - Runs as root (C(become=true)), because the unprivileged check forks and calls C(setuid).
seealso:
  - module: gpuharden.k8s.gpu_facts
  - module: gpuharden.k8s.topology_check
"""

EXAMPLES = r"""
- name: Check NVML as root and as nobody; expect 8 GPUs
  gpuharden.k8s.nvml_check:
    node_name: "{{ inventory_hostname }}"
    expected_gpus: 8
  become: true
  register: nvml

- name: Under a restricted device policy, check as a user in the device group
  gpuharden.k8s.nvml_check:
    unprivileged_user: nobody
    unprivileged_groups: [video]
    fail_on: error
  become: true
"""

RETURN = r"""
findings:
  description:
    - Like every gpuharden check's findings, each also has C(check), C(stage) (the harden stage it belongs to, or
      V(postcheck)) and C(remediable).
    - One entry per problem, with C(id), C(severity) (V(info), V(warning), V(error), V(critical)), C(node), C(gpu)
      (index, minor, uuid, pci_bus_id) or V(null), C(pod) (always V(null) here), C(expected), C(found) and C(hint).
    - Ids are V(nvml_init_failed), V(nvml_unprivileged_init_failed), V(nvml_root_gpu_denied),
      V(nvml_unprivileged_gpu_denied), V(gpu_lost), V(gpu_count_driver_mismatch), V(gpu_count_unexpected),
      V(mig_device_count_unexpected), V(mig_device_count_driver_mismatch), V(ecc_uncorrectable),
      V(remapped_rows_pending), V(remapped_rows_failure), V(pcie_link_degraded), V(nvlink_down),
      V(gpu_health_unreadable), V(mig_mode_pending).
  returned: always
  type: list
  elements: dict
  sample: [{"id": "pcie_link_degraded", "severity": "error", "node": "gpu-1", "pod": null,
            "gpu": {"index": 3, "minor": 3, "uuid": "GPU-...", "pci_bus_id": "00000000:4E:00.0"},
            "expected": {"gen": 4, "width": 16, "bandwidth_gbps": 31.508},
            "found": {"gen": 3, "width": 8, "bandwidth_gbps": 7.877, "bandwidth_ratio": 0.25},
            "hint": "the PCIe link trained below its maximum ..."}]
max_severity:
  description: The highest severity among the findings, or V(null) without findings.
  returned: always
  type: str
gpu_count:
  description: GPUs counted by NVML as root, or V(null) when NVML could not be initialised.
  returned: always
  type: int
driver_gpu_count:
  description: GPUs in the driver's C(/proc/driver/nvidia/gpus), or V(null) when the driver shows none.
  returned: always
  type: int
mig_device_count:
  description: MIG devices NVML shows on all GPUs.
  returned: always
  type: int
gpus:
  description:
    - Per GPU index, C(minor), C(uuid), C(name), C(pci_bus_id), C(numa_node) (sysfs), C(cpu_affinity),
      C(memory_total_mib), C(memory_used_mib), C(mig), C(pcie) (with C(bandwidth_gbps_current),
      C(bandwidth_gbps_max), C(bandwidth_ratio)), C(ecc), C(remapped_rows), C(nvlink) (C(links), C(down)) or
      V(null), C(error) (root) and C(unprivileged_error). An entry with C(error) holds only C(index), C(error),
      C(unprivileged_error) and, when the driver lists as many GPUs as NVML counts, C(minor) and C(pci_bus_id) from
      the driver's list in PCI bus order (C(identified_by=pci_bus_order)).
  returned: always
  type: list
  elements: dict
processes:
  description:
    - Compute processes, with C(gpu) (index), C(gpu_uuid), C(pid), C(used_memory_mib), C(gpu_instance_id),
      C(compute_instance_id) and C(mig_device_uuid) (V(null) outside MIG).
  returned: always
  type: list
  elements: dict
  sample: [{"gpu": 1, "gpu_uuid": "GPU-8e0a...", "pid": 4242, "used_memory_mib": 1024, "gpu_instance_id": null,
            "compute_instance_id": null, "mig_device_uuid": null}]
unprivileged:
  description:
    - The unprivileged run, V(null) when O(check_unprivileged=false). C(user), C(uid), C(gid), C(groups),
      C(available), C(reason) (as in gpu_facts), C(gpu_count) and C(gpus) (C(index), C(uuid), C(error)).
  returned: always
  type: dict
topology:
  description:
    - C(numa_nodes) maps a NUMA node (sysfs; V(-1) = no hint) to GPU indexes; C(pairs) gives the PCIe path between
      two GPUs as nvml.h names it (V(SINGLE)/V(MULTIPLE) PCIe switch, V(HOSTBRIDGE), V(NODE), V(SYSTEM));
      C(nvlink_active) the active NVLinks per GPU index.
  returned: always
  type: dict
  sample: {"numa_nodes": {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}, "pairs": [{"gpus": [0, 1], "level": "SINGLE"}],
           "nvlink_active": {"0": 12}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml_node


def build_module():
    return AnsibleModule(argument_spec=_nvml_node.argument_spec(), supports_check_mode=True)


def main():
    _module_shell.run_module(
        build_module(), lambda module: _nvml_node.check(module.params), never_changed=True,
        fail_when=lambda params, result: _findings.fail_on_message("nvml_check", result["findings"], params["fail_on"]))


if __name__ == "__main__":
    main()
