#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/bootstrap_node.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: bootstrap_node
short_description: The deciding steps of bootstrap_gpu_node.yml, one task each
version_added: 0.2.0
description:
  - The steps of C(bootstrap_gpu_node.yml) that decide something; the decisions are in
    C(module_utils/cluster/_bootstrap_plan.py), unit-tested there.
  - O(step=settings) reads the play's variables (C(gpuharden_bootstrap_*), C(gpuharden_k8s_node_name),
    C(gpuharden_kubeconfig), C(gpuharden_lock_*), C(gpuharden_run_owner), C(gpuharden_postcheck_settle_seconds),
    C(gpuharden_allow_non_gpu_nodes), C(gpuharden_device_plugin_tolerations)) with their defaults, and fails naming the
    variable and its value where one is wrong. It contacts no host. Register its result as C(__bootstrap), which the other
    steps read.
  - O(step=connect) waits for SSH on a new node (the action of M(ansible.builtin.wait_for_connection), with
    C(gpuharden_bootstrap_connect_timeout) and C(gpuharden_bootstrap_connect_delay)), with the host's own Python
    (C(__gpuharden_host_python) from the playbooks' C(vars/node_python.yml)); skipped in check mode.
  - O(step=python) gathers the Python facts of the node's module Python and, with
    C(gpuharden_bootstrap_ship_pynvml), asks that Python whether it imports pynvml (also in check mode, as it only reads);
    RV(pynvml) says whether C(pynvml.py) goes to the node, from where and to where. Where it goes, the step copies it
    (the action of M(ansible.builtin.copy), RV(copied)) and, outside check mode, fails unless the Python imports it then.
  - O(step=facts) runs M(gpuharden.k8s.gpu_facts) and fails a host that shows no NVIDIA GPU unless
    C(gpuharden_allow_non_gpu_nodes).
  - O(step=lock) and O(step=unlock) take and give back the node's run lock with M(gpuharden.k8s.node_lock), as this run's
    owner, at C(gpuharden_lock_path) (C(gpuharden_lock_timeout)).
  - O(step=plan) runs the stage engine M(gpuharden.k8s.node_stages) for a new node (every stage planned, MIG only where
    a layout is asked for, with the role's options) and the stages it owns, with the task's check mode and diff; its
    result is this task's, and the node stages' plan is handed over to M(gpuharden.k8s.stage_steps), the first step of
    C(playbooks/tasks/stages.yml).
  - O(step=admit), delegated to the controller for each node that passed the post-check (the task follows it), labels
    the node with M(gpuharden.k8s.gpu_node_labels), removes its bootstrap taint and uncordons it with
    M(gpuharden.k8s.node_maintenance) (with C(gpuharden_bootstrap_uncordon)), and adds it to the run's stats
    C(gpuharden_bootstrap_ready).
  - O(step=keep_out), delegated to the controller in the rescue of a failed node, keeps the node tainted (value
    C(failed)) and cordoned, reports it in the run's stats C(gpuharden_bootstrap_failed) (the failed step, why, the
    post-check's findings of severity error and above, whether it was kept tainted and cordoned) and returns
    RV(failure). It does not fail itself (Ansible records stats only from a successful result).
  - O(step=fail), after O(step=keep_out), fails the node with that message.
  - The delegated steps run their modules with the controller's Python (C(ansible_playbook_python)), whatever the play's
    interpreter is.
  - O(step=targeted), the run's first task (once, delegated to localhost with C(delegate_facts)), records on localhost
    that the first play had nodes to bootstrap, stamped with this run.
  - O(step=no_target) fails a run whose first play matched no host (no record of this run on localhost; one a fact
    cache kept from an earlier run does not count).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.FACTS
  - gpuharden.k8s._attributes.ACTION
options:
  step:
    description: Which step runs (see the description).
    type: str
    required: true
    choices: [targeted, settings, connect, python, facts, lock, plan, admit, keep_out, fail, unlock, no_target]
attributes:
  check_mode:
    support: full
    description: The modules a step runs run in check mode; O(step=python)'s question to the node's Python runs anyway.
  diff_mode:
    support: partial
    description: O(step=plan) returns the diffs of the stages the engine runs (M(gpuharden.k8s.node_stages)'s); the other steps none.
seealso:
  - module: gpuharden.k8s.node_stages
  - module: gpuharden.k8s.stage_steps
  - module: gpuharden.k8s.gpu_facts
  - module: gpuharden.k8s.gpu_node_labels
  - module: gpuharden.k8s.node_maintenance
  - module: gpuharden.k8s.node_lock
"""

EXAMPLES = r"""
- name: The play's settings
  gpuharden.k8s.bootstrap_node:
    step: settings
  register: __bootstrap

- name: Put the node that passed into service
  gpuharden.k8s.bootstrap_node:
    step: admit
  delegate_to: localhost
  become: false
"""

RETURN = r"""
settings:
  description: O(step=settings) - the play's settings, checked, with the run's lock C(owner).
  returned: success
  type: dict
device_plugin_tolerations:
  description: O(step=settings) - the device plugin's tolerations with the bootstrap taint's.
  returned: success
  type: list
  elements: dict
python:
  description: O(step=python) - the node's module Python.
  returned: success
  type: str
pynvml:
  description: O(step=python) - C(ship), C(why), and when shipped C(src) and C(dest); C(check_import) outside check mode.
  returned: success
  type: dict
copied:
  description: O(step=python) - the copy of C(pynvml.py), where it was shipped.
  returned: when pynvml.py is shipped
  type: dict
nodes:
  description: O(step=admit) - the Node name put into service.
  returned: success
  type: list
  elements: str
plan:
  description: O(step=plan) - the stage engine's plan of the node, as M(gpuharden.k8s.node_stages) returns it (with its
    other keys - the audit, C(stages), C(kubelet_plan)).
  returned: step plan
  type: dict
report:
  description: O(step=keep_out) - the failed node's report.
  returned: success
  type: dict
failure:
  description: O(step=keep_out) - the message the node fails with.
  returned: success
  type: str
"""
