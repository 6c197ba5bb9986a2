#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/device_plugin_stage.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: device_plugin_stage
short_description: One step of role device_plugin, decided from the role's variables
version_added: 0.1.0
description:
  - The engine of the role C(gpuharden.k8s.device_plugin) (C(roles/device_plugin/tasks/main.yml)), one task per step.
    Use the role, which runs the steps in order; this action is its private interface and reads the role's
    C(device_plugin_*) variables as the role's tasks see them.
  - V(node), per host, says whether the host is a GPU node. C(device_plugin_gpu_node) where it is set, else the
    driver's GPU list of the run's GPU facts (C(ansible_facts.gpuharden.driver_gpus), null where the driver shows
    none), else a stat of C(/proc/driver/nvidia/gpus) on the host (M(ansible.builtin.stat), read-only, in check mode
    too). The role registers the result as C(__device_plugin_node).
  - V(apply), once for the play on the controller (run_once, delegated to localhost), runs M(gpuharden.k8s.device_plugin)
    with the role's options map (C(device_plugin_audit_options)) on C(device_plugin_controller_python). Where
    C(device_plugin_label_nodes) is true, the same run labels the play's GPU nodes (each host's C(__device_plugin_node))
    and, with C(device_plugin_unlabel_cpu_nodes), takes the label off its CPU-only hosts. The module's result is the
    task's; the role registers it as C(device_plugin_result).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options:
  step:
    description: Which step of C(tasks/main.yml) to run.
    type: str
    required: true
    choices: [node, apply]
attributes:
  check_mode:
    support: full
    description: The stat reads in check mode too; M(gpuharden.k8s.device_plugin) runs in the task's check mode.
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.device_plugin).
seealso:
  - module: gpuharden.k8s.device_plugin
"""

EXAMPLES = r"""
# The role runs the steps; compose it rather than these tasks.
- name: Install or repair the device plugin and label the GPU nodes
  ansible.builtin.import_role:
    name: gpuharden.k8s.device_plugin
"""

RETURN = r"""
node_name:
  description: V(node). The host's Kubernetes node name (C(device_plugin_node_name)).
  returned: step node
  type: str
gpu_node:
  description: V(node). Whether the host is a GPU node.
  returned: step node
  type: bool
source:
  description: V(node). What said so, C(device_plugin_gpu_node), C(ansible_facts.gpuharden.driver_gpus) or C(/proc/driver/nvidia/gpus).
  returned: step node
  type: str
node_labels:
  description: V(apply). As M(gpuharden.k8s.device_plugin) returns it (the nodes labelled and unlabelled).
  returned: step apply, where the role labels nodes
  type: dict
"""
