#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/role_preflight.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: role_preflight
short_description: Check a gpuharden role's variables before the role touches a node
version_added: 0.1.0
description:
  - Reads the variables of the role named in O(role), templated as the role's tasks see them (the host's value, else the
    role default), and checks the rules the role needs beyond their types (its C(meta/argument_specs.yml)), such as
    consistent policies and reservations, and paths and names the kubelet, containerd and Kubernetes accept.
  - Fails with one line per broken rule, each naming the variable, its value and the rule; passes otherwise.
  - Each role's C(tasks/preflight.yml) runs it first. Runs on the controller only and contacts no host.
  - For C(runtime_class) it also checks that the play's hosts agree on containerd's runtime name (each host's
    C(container_runtime_handler), where set); use it with C(run_once=true) there.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
options:
  role:
    description: The role whose variables to check.
    type: str
    required: true
    choices: [cgroup_limits, container_runtime, device_permissions, device_plugin, kubelet_topology, mig, node_prerequisites, runtime_class]
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
"""

EXAMPLES = r"""
- name: Kubelet | check the role's variables
  gpuharden.k8s.role_preflight:
    role: kubelet_topology
"""

RETURN = r"""
problems:
  description: Each rule the variables break, one line each (empty when the task passes; on failure the message joins them).
  returned: always
  type: list
  elements: str
  sample: ["kubelet_topology_dropin_name='00-x.conf': must not start with 00- (the kubeadm drop-in sorts first)"]
"""
