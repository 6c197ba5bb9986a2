#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/cgroup_limits_immediate.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: cgroup_limits_immediate
short_description: Set memory.high on one node's GPU pods and record the report, in one task
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.cgroup_limits) calls it in C(tasks/immediate.yml). It runs M(gpuharden.k8s.cgroup_memory)
    on the host with O(options) and the UIDs of the node's GPU pods, and returns that module's result with RV(report).
    The report also goes to the run's statistics (C(gpuharden_cgroup_limits), keyed by inventory host).
  - An option left out is the role's variable, as the role's tasks see it - O(options) built from the role's variables,
    O(node_name) C(cgroup_limits_node_name), O(gpu_pods) C(cgroup_limits_gpu_pods); O(gpu_pods_listed) is what the
    V(list) step of this run handed over to every host of the batch.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options:
  options:
    description: The options of M(gpuharden.k8s.cgroup_memory) but C(pod_uids) (left out, built from the role's variables).
    type: dict
  node_name:
    description: The Kubernetes node name of the host.
    type: str
  gpu_pods:
    description: The batch's GPU pods as M(gpuharden.k8s.gpu_pods_info) returns them, listed earlier in the run; V(null) uses O(gpu_pods_listed).
    type: dict
  gpu_pods_listed:
    description: The result of M(gpuharden.k8s.gpu_pods_info) for the batch.
    type: dict
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.cgroup_memory).
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.cgroup_memory).
"""

EXAMPLES = r"""
- name: Immediate | set memory.high on this node's GPU pods and report it
  gpuharden.k8s.cgroup_limits_immediate:
    options: {cgroup_root: /sys/fs/cgroup, factor: 0.9}
    node_name: gpu-1
    gpu_pods_listed: "{{ listed_gpu_pods }}"
"""

RETURN = r"""
report:
  description: C(node), C(updated) (memory.high writes), C(unlimited_pods) and C(not_found) (namespace/name), C(findings).
  returned: success
  type: dict
"""
