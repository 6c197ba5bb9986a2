#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: process_cgroup_info
short_description: Read the cgroup of given processes on a node (which pod and container a GPU process belongs to)
version_added: 0.1.0
description:
  - Read-only, node side. Reads C(/proc/<pid>/cgroup) for each of O(pids) and returns the cgroup path (the cgroup v2
    line, else the v1 hierarchy that names a pod), and the pod UID and container ID when the path is a kubelet container
    cgroup (systemd or cgroupfs driver).
  - Feeds M(gpuharden.k8s.gpu_consistency) - give it the PIDs M(gpuharden.k8s.nvml_check) lists in C(processes).
  - The paths are relative to the reader's cgroup namespace; run it in the host's (as Ansible over SSH does).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.info_module
  - gpuharden.k8s._attributes.node_root
options:
  pids:
    description:
      - Process IDs, as the node's PID namespace numbers them (NVML's).
    type: list
    elements: int
    required: true
requirements: []
seealso:
  - module: gpuharden.k8s.gpu_consistency
  - module: gpuharden.k8s.nvml_check
"""

EXAMPLES = r"""
- name: GPU processes
  gpuharden.k8s.nvml_check:
    check_unprivileged: false
  become: true
  register: nvml

- name: Their cgroups
  gpuharden.k8s.process_cgroup_info:
    pids: "{{ nvml.processes | map(attribute='pid') | list }}"
  become: true
  register: cgroups
"""

RETURN = r"""
cgroups:
  description: The cgroup path per PID (keys are strings); PIDs that exited are left out.
  returned: always
  type: dict
  sample: {"4242": "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f3c_2a1e.slice/cri-containerd-ab12.scope"}
containers:
  description: Per PID whose cgroup is a kubelet container cgroup, C(pod_uid), C(container_id), C(driver) and C(qos).
  returned: always
  type: dict
missing:
  description: PIDs without a C(/proc/<pid>/cgroup) (the process exited).
  returned: always
  type: list
  elements: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _process_cgroups


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "pids": {"type": "list", "elements": "int", "required": True},
    }


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def main():
    _module_shell.run_module(build_module(), lambda module: _process_cgroups.read(module.params["root"], module.params["pids"]), never_changed=True)


if __name__ == "__main__":
    main()
