#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/unharden_node.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: unharden_node
short_description: The uninstall's steps around the node files - the run lock, the cluster side, a deferral, the verdict
version_added: 0.2.0
description:
  - The steps of playbooks/unharden_gpu_nodes.yml besides the node files (M(gpuharden.k8s.unharden_files)), each
    reading the play's variables itself, so that the playbook passes none of them.
  - V(lock) takes the node's run lock (M(gpuharden.k8s.node_lock)) for this run - C(gpuharden_run_owner), else
    C(unharden@<UTC time>-<random number>) - at C(gpuharden_lock_path), waiting up to C(gpuharden_lock_timeout)
    seconds (600), and returns the owner, the path and the Node name (C(gpuharden_k8s_node_name), else the inventory
    name), and hands them over to the later steps (a fact of the host, stamped with this run; a lock not taken hands
    nothing over).
  - V(cluster), once for the play, delegated to localhost - M(gpuharden.k8s.unharden_cluster) for the Nodes of the
    play's hosts with C(gpuharden_unharden_force), C(gpuharden_unharden_cluster_objects) as its C(remove_objects),
    C(device_plugin_namespace) and C(gpuharden_kubeconfig); nothing (RV(ran) false, RV(why)) where
    C(gpuharden_unharden_cluster) is false. Its conflicts are handed over to each host's report.
  - V(deferred), in the rescue of the drained pass's disruption budget - says why the pass was not started (RV(why),
    the budget's failure), for M(gpuharden.k8s.unharden_report).
  - V(failed), in the rescue of the drained pass - says which step failed and why (RV(why)), with the Node name
    (RV(node)); the node stays in the play, stops the rollout and fails in the report (a host failed in a serial
    play's batch of one would end the whole run, before the report and the locks given back); handed over to the
    V(stopped) step and the report.
  - V(stopped), once per batch of the drained pass, delegated to localhost - the Nodes of the hosts whose drained pass
    failed (RV(stopped_by)) and the fleet M(gpuharden.k8s.unharden_rollout) read (RV(fleet)), as the facts
    C(node_maintenance_stopped_by) and C(node_maintenance_fleet) of the batch's hosts, for the disruption budget of
    the role gpuharden.k8s.node_maintenance.
  - V(release) gives the run lock back (none where the lock step did not run). With O(then_fail=failed_step) (a rescue)
    the node then fails with the step that failed and its message; with O(then_fail=report) it fails with the
    C(failure) M(gpuharden.k8s.unharden_report) handed over, where there is one.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
attributes:
  check_mode:
    support: full
    details:
      - The run lock is taken and given back in check mode too; the cluster side reports what it would change.
  diff_mode:
    support: full
    details:
      - That of M(gpuharden.k8s.unharden_cluster).
options:
  step:
    description: The step.
    type: str
    required: true
    choices: [lock, cluster, deferred, failed, stopped, release]
  then_fail:
    description: For O(step=release), what the node fails with after its lock is given back.
    type: str
    choices: [never, failed_step, report]
    default: never
seealso:
  - module: gpuharden.k8s.unharden_files
  - module: gpuharden.k8s.unharden_cluster
  - module: gpuharden.k8s.unharden_report
  - module: gpuharden.k8s.node_lock
"""

EXAMPLES = r"""
- name: Take the node's run lock
  gpuharden.k8s.unharden_node:
    step: lock

- name: Remove gpuharden's cluster objects and put back the labels and taints it set (once)
  gpuharden.k8s.unharden_node:
    step: cluster
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  delegate_to: localhost
  run_once: true

- name: Give the node's run lock back and fail the node with the report's failure
  gpuharden.k8s.unharden_node:
    step: release
    then_fail: report
"""

RETURN = r"""
owner:
  description: For V(lock), the run's name in the lock.
  returned: when O(step=lock)
  type: str
path:
  description: For V(lock), the lock file.
  returned: when O(step=lock)
  type: str
node:
  description: The Node name.
  returned: when O(step=lock), O(step=failed) or O(step=release)
  type: str
stopped_by:
  description: For V(stopped), the Nodes whose drained pass failed in this run (they stop the later batches).
  returned: when O(step=stopped)
  type: list
  elements: str
fleet:
  description: For V(stopped), the fleet the rollout read the disruption budget of, by Node name.
  returned: when O(step=stopped)
  type: list
  elements: str
ran:
  description: For V(cluster), whether M(gpuharden.k8s.unharden_cluster) ran; its result's keys come with it.
  returned: when O(step=cluster)
  type: bool
why:
  description: For V(cluster), why it did not run; for V(deferred), why the drained pass was not started; for V(failed), which step failed and why.
  returned: when O(step=deferred) or O(step=failed), or RV(ran) is false
  type: str
lock:
  description: For V(lock) and V(release), the result of M(gpuharden.k8s.node_lock) (V(null) where there was no lock to give back).
  returned: when O(step=lock) or O(step=release)
  type: dict
"""
