#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: Gather NVIDIA GPU facts from NVML, /dev, /proc and /sys
version_added: 0.1.0
description:
  - Reads the node's NVIDIA GPUs through NVML (the C(pynvml) module of the C(nvidia-ml-py) dist) and
    the driver's files, and returns them as C(ansible_facts.gpuharden). Read-only.
  - The NUMA node of each GPU comes from C(/sys/bus/pci/devices/<bdf>/numa_node), because NVML's own
    NUMA call is not supported on x86 systems.
  - When NVML cannot be used (library not found, driver not loaded, no permission on
    C(/dev/nvidiactl), C(pynvml) not installed) the module still succeeds and reports a structured
    reason in C(ansible_facts.gpuharden.nvml.reason), together with everything that does not
    need NVML. A failure on one GPU only (for example no permission on C(/dev/nvidia3), or a GPU that
    fell off the bus) is reported on that GPU and the others are still read.
  - "Air-gapped nodes: C(nvidia-ml-py) is one pure-Python file with no dependencies. Download the wheel
    once (C(pip download --no-deps nvidia-ml-py)), copy it to the node with M(ansible.builtin.copy) and
    install it with M(ansible.builtin.pip) using C(name: /tmp/nvidia_ml_py-<version>-py3-none-any.whl);
    the bootstrap playbook does exactly this."
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.facts
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._attributes.node_root
requirements:
  - nvidia-ml-py (import name C(pynvml)) on the node's Python, for every NVML fact
  - the NVIDIA driver's C(libnvidia-ml.so.1) on the node
notes:
  - Runs as any user. As an unprivileged user, NVML may fail with C(no_permission); that is the
    signal that the device-node permissions need fixing, so it is reported, not raised.
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpuharden.k8s.gpu_facts:

- name: Show each GPU's model and NUMA node
  ansible.builtin.debug:
    msg: "{{ item.index }}: {{ item.name }} on NUMA {{ item.numa_node }}"
  loop: "{{ ansible_facts.gpuharden.gpus }}"
  when: ansible_facts.gpuharden.nvml.available

- name: Read the host's view from a privileged pod that mounts it at /host
  gpuharden.k8s.gpu_facts:
    root: /host
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to C(ansible_facts).
  returned: always
  type: dict
  contains:
    gpuharden:
      description: Everything known about the node's NVIDIA GPUs.
      returned: always
      type: dict
      contains:
        nvml:
          description: Whether NVML could be used, and why not.
          type: dict
          returned: always
          contains:
            available:
              description: NVML initialised and was read.
              type: bool
              returned: always
            reason:
              description:
                - Why NVML could not be used, or V(null).
                - C(code) is one of V(pynvml_missing), V(library_not_found), V(driver_not_loaded),
                  V(no_permission), V(function_not_found), V(nvml_error); C(nvml_return) is the NVML
                  return code; C(message) and C(hint) are human text.
              type: dict
              returned: always
              sample: {"code": "no_permission", "nvml_return": 4, "message": "Insufficient Permissions",
                       "hint": "The calling user cannot open /dev/nvidiactl ..."}
            version:
              description: NVML library version.
              type: str
              returned: always
              sample: "12.550.54.15"
        driver_version:
          description: NVIDIA driver version from NVML.
          type: str
          returned: always
          sample: "550.54.15"
        cuda_driver_version:
          description: Highest CUDA version the driver supports.
          type: str
          returned: always
          sample: "12.4"
        gpu_count:
          description: Number of GPUs NVML counts (including ones whose handle cannot be obtained).
          type: int
          returned: always
        gpus:
          description:
            - One entry per GPU, by NVML index. An entry whose C(error) is set holds only C(index) and C(error).
          type: list
          elements: dict
          returned: always
          contains:
            index:
              description: NVML index.
              type: int
            minor:
              description: Minor number; the device node is C(/dev/nvidia<minor>).
              type: int
            uuid:
              description: GPU UUID.
              type: str
            name:
              description: Product name.
              type: str
            pci_bus_id:
              description: PCI address as NVML spells it.
              type: str
              sample: "00000000:07:00.0"
            pci_device_id:
              description: PCI device and vendor id.
              type: str
              sample: "0x20B210DE"
            memory_total_mib:
              description: Framebuffer size in MiB.
              type: int
            memory_used_mib:
              description: Framebuffer in use in MiB.
              type: int
            numa_node:
              description: NUMA node from sysfs; V(-1) means the platform gives no hint, V(null) unreadable.
              type: int
            cpu_affinity:
              description: CPUs close to the GPU, in cpulist format, from NVML.
              type: str
              sample: "0-63"
            pcie:
              description: PCIe link generation and width, current and maximum.
              type: dict
              sample: {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16}
            mig:
              description:
                - MIG state. C(capable) false on GPUs without MIG. C(mode_current)/C(mode_pending) are
                  V(enabled) or V(disabled); they differ while a mode change waits for a GPU reset.
                - C(layout) maps profile name to GPU-instance count, in the form the MIG layout input uses.
                - C(gpu_instances) lists C(id), C(profile_id), C(profile), C(start), C(size); C(devices) lists the
                  MIG devices with C(uuid), C(gpu_instance_id), C(compute_instance_id), C(memory_total_mib).
              type: dict
              sample: {"capable": true, "mode_current": "enabled", "mode_pending": "enabled",
                       "layout": {"1g.10gb": 7}, "gpu_instances": [], "devices": []}
            error:
              description: Why this GPU could not be read (same shape as C(nvml.reason)), else V(null).
              type: dict
        driver_gpus:
          description:
            - The driver's own list of GPUs from C(/proc/driver/nvidia/gpus), keyed by PCI address, with
              C(model) and C(minor); V(null) when the driver exposes none.
          type: dict
          returned: always
        device_nodes:
          description:
            - Every C(/dev/nvidia*) and C(/dev/nvidia-caps/*) entry, keyed by path, with C(type)
              (char, block, link, file), C(major), C(minor), C(uid), C(gid), C(owner), C(group) and C(mode).
          type: dict
          returned: always
          sample: {"/dev/nvidiactl": {"exists": true, "type": "char", "major": 195, "minor": 255, "uid": 0,
                   "gid": 0, "owner": "root", "group": "root", "mode": "0666"}}
        driver_params:
          description: The running driver's C(/proc/driver/nvidia/params), or V(null) without a driver.
          type: dict
          returned: always
          sample: {"ModifyDeviceFiles": 1, "DeviceFileUID": 0, "DeviceFileGID": 0, "DeviceFileMode": 438}
        char_majors:
          description: Character-device majors of the NVIDIA drivers from C(/proc/devices).
          type: dict
          returned: always
          sample: {"nvidia-frontend": 195, "nvidia-uvm": 510, "nvidia-caps": 235}
        cgroup_version:
          description: V(1), V(2) or V(hybrid), from how C(/sys/fs/cgroup) is mounted; V(null) if not mounted.
          type: raw
          returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _gpu_facts


def argument_spec():
    return {"root": {"type": "path", "default": "/"}}


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def main():
    _module_shell.run_module(build_module(), lambda module: {"ansible_facts": {"gpuharden": _gpu_facts.gather(module.params["root"])}}, never_changed=True)


if __name__ == "__main__":
    main()
