#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/unharden_report.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: unharden_report
short_description: One node's verdict at the end of the uninstall - what was left in conflict, and why it fails
version_added: 0.2.0
description:
  - Reads this host's results by the variable names its options give (by default what the steps of
    playbooks/unharden_gpu_nodes.yml handed over in this run), on the controller (no connection to the node).
  - A node whose drained pass failed (O(failed)) gets that step's message in RV(failure), and nothing else.
  - Otherwise what was left in conflict on it - the files of every pass in O(passes), and its Node's labels and taints in the
    O(cluster) result - goes to the run's stats as C(gpuharden_unharden_conflicts) (per inventory host, aggregated),
    and RV(failure) says why the node fails - its drained pass was not started (O(deferred), or the rollout of
    M(gpuharden.k8s.unharden_rollout) took it but its play ended before it), or something was left in
    conflict. V(null) when it does not.
  - It never fails itself (Ansible records stats only from a successful result); the next task fails the node on
    RV(failure) (M(gpuharden.k8s.unharden_node) with O(gpuharden.k8s.unharden_node#module:then_fail=report)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
  - gpuharden.k8s._attributes.ACTION
options:
  passes:
    description:
      - The names of the variables holding this host's M(gpuharden.k8s.unharden_files) results, the first pass first
        (one that is undefined is skipped).
      - Default what the two passes of M(gpuharden.k8s.unharden_files) handed over.
    type: list
    elements: str
  cluster:
    description:
      - The name of the variable holding the M(gpuharden.k8s.unharden_cluster) result (its conflicts of this node count).
      - Default what M(gpuharden.k8s.unharden_node) with O(gpuharden.k8s.unharden_node#module:step=cluster) handed over.
    type: str
  failed:
    description:
      - The name of the variable that holds why this node's drained pass failed, where it did (a message, or the
        result of M(gpuharden.k8s.unharden_node) with O(gpuharden.k8s.unharden_node#module:step=failed)).
      - Default what M(gpuharden.k8s.unharden_node) with O(gpuharden.k8s.unharden_node#module:step=failed) handed over.
    type: str
  deferred:
    description:
      - The name of the variable that holds why this node's drained pass was not started, where it was not (a message,
        or the result of M(gpuharden.k8s.unharden_node) with O(gpuharden.k8s.unharden_node#module:step=deferred)).
      - Default V(__unharden_deferred).
    type: str
seealso:
  - module: gpuharden.k8s.unharden_files
  - module: gpuharden.k8s.unharden_cluster
  - module: gpuharden.k8s.unharden_node
"""

EXAMPLES = r"""
- name: Report what was left in conflict, and why the node fails if it does
  gpuharden.k8s.unharden_report:
    passes: [first_pass, drained_pass]
    cluster: cluster_pass
  register: report

- name: Fail the node with something left in conflict
  ansible.builtin.fail:
    msg: "{{ report.failure }}"
  when: report.failure is not none
"""

RETURN = r"""
node:
  description: The Node name (C(gpuharden_k8s_node_name), else the inventory name).
  returned: always
  type: str
conflicts:
  description: What was left in conflict on this node, each with C(path) (a file) or C(node) and C(label) or C(taint), and C(reason).
  returned: always
  type: list
  elements: dict
failure:
  description: Why the node fails, or V(null).
  returned: always
  type: str
"""
