#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/kubelet_topology_apply.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: kubelet_topology_apply
short_description: Write the kubelet stage of role kubelet_topology, restart the kubelet and wait for the node, in one task
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.kubelet_topology) calls it in C(tasks/apply.yml), after the drain its plan decided; the
    decisions are C(module_utils/cluster/_kubelet_stage.py)'s.
  - It runs M(gpuharden.k8s.kubelet_config) on the host with the plan's C(write_options). Where the plan is disruptive,
    the kubelet is stopped first and its checkpoints removed. The kubelet is restarted as the plan says, its healthz
    polled for C(kubelet_topology_health_timeout) seconds, and the files are put back when it does not come back.
  - After a restart, where C(kubelet_topology_kubeconfig) is set, it waits as long for the node's Ready condition, with
    C(kubectl) on the host and that kubeconfig; a node still not Ready fails the host.
  - The result is the module's, with RV(uncordon), RV(uncordon_tasks) and RV(ready). The role's variables (C(kubelet_topology_healthz_url),
    C(kubelet_topology_health_timeout), C(kubelet_topology_log_file), C(kubelet_topology_log_lines),
    C(kubelet_topology_kubeconfig), C(kubelet_topology_node_name), C(kubelet_topology_uncordon_tasks),
    C(kubelet_topology_drain)) are read as the role's tasks see them.
options:
  stage:
    description: The plan, the result of M(gpuharden.k8s.kubelet_topology_plan); by default the role's C(__kubelet_topology_stage).
    type: dict
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.kubelet_config); nothing is stopped, written or restarted, and no node is waited for.
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.kubelet_config).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
"""

EXAMPLES = r"""
- name: Kubelet | write the configuration, restart the kubelet and wait until healthy
  gpuharden.k8s.kubelet_topology_apply:
  register: __kubelet_topology_config
"""

RETURN = r"""
uncordon:
  description:
    - Who makes the node schedulable again after a disruptive write - V(tasks) (C(kubelet_topology_uncordon_tasks)),
      V(node_maintenance), or an empty string (no disruptive change, a check run, or C(kubelet_topology_drain=false)).
  returned: success
  type: str
uncordon_tasks:
  description:
    - The tasks file the role includes to make the node schedulable again - C(kubelet_topology_uncordon_tasks), the
      role's C(node_maintenance_uncordon.yml), or an empty string (nobody uncordons).
  returned: success
  type: str
ready:
  description: The wait for Node Ready (C(cmd), C(rc), C(stdout), C(stderr)), where it ran.
  returned: after a restart, with C(kubelet_topology_kubeconfig) set
  type: dict
"""
