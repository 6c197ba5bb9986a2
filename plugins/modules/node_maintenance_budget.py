#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/node_maintenance_budget.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: node_maintenance_budget
short_description: Check the fleet's disruption budget once for a batch of disruptive steps
version_added: 0.2.0
description:
  - The budget check of the C(node_maintenance) role (C(tasks/budget.yml)), once for the batch (C(run_once),
    delegated to localhost).
  - Reads, on each host of the batch, the fact C(gpuharden_budget_record) that C(budget.yml) sets
    (M(gpuharden.k8s.node_maintenance_step) with C(step=budget_record)) - its Node
    and whether the host wants a disruptive step now - and runs M(gpuharden.k8s.disruption_budget) once, outside check
    mode too (it only reads), with those Nodes as its batch, and with C(node_maintenance_controller_python) (else the
    playbook's Python) as its interpreter.
    Where no host of the batch wants a step it reads nothing and defers nothing.
  - With O(stop_on_failure), the Nodes of the hosts gone from the play (failed, or ended) stop the rollout, with those of O(stopped_by).
  - An option the task does not give is the role's variable (C(node_maintenance_kubeconfig),
    C(node_maintenance_kube_context), C(node_maintenance_max_unavailable), C(node_maintenance_fleet),
    C(node_maintenance_out_of_service_taints), C(node_maintenance_stopped_by), C(node_maintenance_stop_on_failure)), where
    the task runs in the role; C(budget.yml) gives none.
  - Returns M(gpuharden.k8s.disruption_budget)'s result, and per Node that may not start, the line the role fails it
    with (RV(not_started)) or, in check mode, the line it says (RV(would_defer)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
  - gpuharden.k8s._attributes.ACTION
options:
  kubeconfig:
    description: The kubeconfig; empty for the default (C(KUBECONFIG), in-cluster).
    type: str
    default: ""
  context:
    description: The kubeconfig context; empty for its current one.
    type: str
    default: ""
  max_unavailable:
    description:
      - The most GPU nodes unavailable at once, a count (V(1)) or a percentage of the fleet (V(25%)).
      - Required where the role's C(node_maintenance_max_unavailable) is not defined.
    type: str
  fleet:
    description: The GPU fleet's Node names (M(gpuharden.k8s.disruption_budget)'s O(gpuharden.k8s.disruption_budget#module:fleet)).
    type: list
    elements: str
    default: []
  out_of_service_taints:
    description: Taints that make a node count as unavailable (M(gpuharden.k8s.disruption_budget)'s).
    type: list
    elements: raw
    default: []
  stopped_by:
    description: Nodes whose failure stops the rollout, besides those of the hosts gone from the play.
    type: list
    elements: str
    default: []
  stop_on_failure:
    description: The Nodes of the hosts gone from the play stop the rollout.
    type: bool
    default: true
seealso:
  - module: gpuharden.k8s.disruption_budget
"""

EXAMPLES = r"""
- name: Decide which nodes of the batch may start their disruptive step (once per batch)
  gpuharden.k8s.node_maintenance_budget:
    max_unavailable: "1"
    fleet: [gpu-0, gpu-1]
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  delegate_to: localhost
  run_once: true
  register: budget
"""

RETURN = r"""
allowed:
  description: The Nodes of the batch that may start their disruptive step now.
  returned: always
  type: list
  elements: str
deferred:
  description: Per Node of the batch that may not start, why (M(gpuharden.k8s.disruption_budget)'s).
  returned: always
  type: dict
not_started:
  description: Outside check mode, per deferred Node, the line the role fails the host with.
  returned: always
  type: dict
would_defer:
  description: In check mode, per deferred Node, the line the role says.
  returned: always
  type: dict
"""
