#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/node_maintenance_step.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: node_maintenance_step
short_description: One step of role node_maintenance, with the role's variables
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.node_maintenance) calls it in its task files. It reads the role's C(node_maintenance_*)
    variables itself and runs M(gpuharden.k8s.node_maintenance) with the task's check mode (delegate it to the
    controller, with the controller's Python).
  - O(step=cordon_drain) cordons the node and evicts its pods (C(node_maintenance_state=cordoned) only cordons). The role
    hands its result over to O(step=uncordon) of this run itself (no registered variable).
  - O(step=uncordon) makes the node schedulable again, waiting C(node_maintenance_ready_timeout) for Ready. It is skipped,
    with the reason, where C(node_maintenance_keep_preexisting_cordon) keeps a cordon that someone else made before the
    drain (C(preexisting_cordon) in the result the drain of this run handed over).
  - O(step=restart_device_plugin) evicts the node's device plugin pods (their DaemonSets start them again).
  - O(step=budget_verdict) is this host's part of the batch's budget (what M(gpuharden.k8s.node_maintenance_budget) of
    this run handed over). It fails the host with the budget's line where its disruptive step may not start
    now, warns in check mode that a real run would defer it, and returns RV(allowed_in). It opens no connection.
  - O(step=budget_record) sets this host's fact C(gpuharden_budget_record) (C(node), C(wanted) from
    C(node_maintenance_budget_wanted)), which M(gpuharden.k8s.node_maintenance_budget) reads for the batch. It opens no
    connection.
  - The module runs with C(node_maintenance_controller_python) (else the playbook's Python) as its interpreter; the task
    need not name one.
options:
  step:
    description: Which step of the role to run (its task file is named above).
    type: str
    required: true
    choices: [cordon_drain, uncordon, restart_device_plugin, budget_verdict, budget_record]
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.node_maintenance).
  diff_mode:
    support: none
seealso:
  - module: gpuharden.k8s.node_maintenance
  - module: gpuharden.k8s.node_maintenance_budget
"""

EXAMPLES = r"""
- name: Uncordon the node
  gpuharden.k8s.node_maintenance_step:
    step: uncordon
  delegate_to: localhost
  become: false
"""

RETURN = r"""
nodes:
  description: M(gpuharden.k8s.node_maintenance)'s result per node (steps cordon_drain, uncordon, restart_device_plugin).
  returned: when the module ran
  type: dict
allowed_in:
  description:
    - O(step=budget_verdict) - the play name and batch in which this host's disruptive step may start (C(cordon_drain.yml)
      does not check the budget again there), or an empty list.
  returned: step budget_verdict
  type: list
  elements: raw
"""
