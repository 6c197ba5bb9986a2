#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/harden_node.py does the work.

from __future__ import annotations

DOCUMENTATION = r"""
module: harden_node
short_description: The harden run's steps around the stages, for one node - its name in the locks, its verdicts, its lock given back
version_added: 0.2.0
description:
  - The steps of playbooks/harden_gpu_nodes.yml around the stages, each reading the play's variables itself, so that
    the playbook builds no message or condition of them.
  - V(start) names the run for the node's run lock, as facts of the host - C(__harden_owner) (C(gpuharden_run_owner),
    else C(harden@<UTC time>-<random number>)), C(__harden_node) (C(gpuharden_k8s_node_name), else the inventory
    name) and C(__harden_controller) (this run's ansible-playbook process, as the lookup
    P(gpuharden.k8s.controller_run#lookup) names it).
  - V(verdict) fails the node where the run decided so - O(of=restarts) where the disruption budget does not allow its
    containerd restart at all (M(gpuharden.k8s.harden_rollout) V(restarts), handed over in this run),
    O(of=cordons) where the cordon an ended run left could not be released (V(rollout), a fact of localhost),
    O(of=failed) where its draining step failed, O(of=deferred) where its draining step was not started.
  - V(rescue), in the first play's rescue, gives the node's run lock back (M(gpuharden.k8s.node_lock)) and fails the
    node with the step that failed and its message.
  - V(deferred) and V(failed), in the second play's rescues, hand over why the node's draining step was not started, or
    which one failed, as facts of the host stamped with this run (a fact cache's from an earlier run counts for nothing),
    which V(draining), V(verdict), M(gpuharden.k8s.harden_rollout) and M(gpuharden.k8s.cluster_stage_gate) read
    themselves; V(failed) also adds the node to the run's stat C(gpuharden_rollout_failed). The host does not fail
    there, so the other nodes' run locks are still given back.
  - V(draining) says which draining steps run on the node (RV(kubelet_topology), RV(mig)) - those its plans drain it for,
    none where the budget did not start them - and sets C(node_maintenance_owner) to the run's owner for the cordons.
  - V(release) gives the node's run lock back, skipped where the plan's audit or the post-check's read already did.
  - V(targeted), at the run's end, fails a run whose first play matched no host, naming C(gpuharden_target_hosts) and
    the C(--limit); skipped where a host of this play was named by V(start) in this run.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
attributes:
  check_mode:
    support: full
    details:
      - The verdicts are the same; M(gpuharden.k8s.node_lock) runs in check mode (no lock was taken there).
  diff_mode:
    support: none
options:
  step:
    description: The step.
    type: str
    required: true
    choices: [start, verdict, rescue, deferred, failed, draining, release, targeted]
  of:
    description: For O(step=verdict) (and only there), which decision fails the node.
    type: str
    choices: [restarts, cordons, failed, deferred]
seealso:
  - module: gpuharden.k8s.harden_rollout
  - module: gpuharden.k8s.node_lock
"""

EXAMPLES = r"""
- name: Name this run and this node for the node locks
  gpuharden.k8s.harden_node:
    step: start

- name: Fail the node whose draining step was not started
  gpuharden.k8s.harden_node:
    step: verdict
    of: deferred

- name: Give the node's run lock back
  gpuharden.k8s.harden_node:
    step: release
"""

RETURN = r"""
node:
  description: The Node name.
  returned: when O(step=start) or O(step=failed)
  type: str
owner:
  description: The run's name in the node's run lock.
  returned: when O(step=start)
  type: str
why:
  description: Why the draining step was not started (V(deferred)), or which one failed and why (V(failed)).
  returned: when O(step=deferred) or O(step=failed)
  type: str
kubelet_topology:
  description: Whether the kubelet's draining step runs on the node.
  returned: when O(step=draining)
  type: bool
mig:
  description: Whether the MIG layout's draining step runs on the node.
  returned: when O(step=draining)
  type: bool
lock:
  description: The result of M(gpuharden.k8s.node_lock) giving the lock back.
  returned: when O(step=rescue) or O(step=release) gave the lock back
  type: dict
"""
