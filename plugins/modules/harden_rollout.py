#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/harden_rollout.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: harden_rollout
short_description: Decide harden's rollout once for the batch - the containerd restarts, the cordons a run left, the budgeted drains
version_added: 0.2.0
description:
  - Once for the first play's batch of C(harden_gpu_nodes.yml) (C(run_once), delegated to localhost), from every play
    host's plan (C(gpuharden_node_plan)), its Node name (M(gpuharden.k8s.harden_node) V(start)'s) and what its stages
    planned and restarted.
  - O(step=restarts), before the stages, reads the fleet once with M(gpuharden.k8s.disruption_budget) - the containerd
    restarts' canary and waves (RV(restart_steps)), the hosts whose restart the budget does not allow at all
    (RV(restart_not_allowed)) and the cordons an ended gpuharden run left (RV(left_cordoned)). It reads nothing where
    the run's C(--tags) select no node stage. In check mode nothing restarts in waves (RV(restart_steps) is V([null]))
    and no host is refused its restart. It also decides, once for the batch, whether the RuntimeClass stage runs
    (RV(runtime_class), RV(runtime_class_why)) - unless the plan's dry run of it would change and report nothing and no
    node's containerd changes (the hosts refused their restart aside). RV(restart_steps), RV(restart_not_allowed),
    RV(runtime_class) and RV(left_cordoned) are handed over to every host of the batch (a fact stamped with this
    ansible-playbook run), where M(gpuharden.k8s.stage_steps), M(gpuharden.k8s.harden_node) and O(step=rollout) take
    them.
  - O(step=wave), before each wave of containerd restarts but the first (O(wave), one of RV(restart_steps)), waits
    for the nodes the previous wave restarted to be Ready again (up to O(settle_seconds)) and stops the restarts at a
    host gone from the play whose Node restarted before; RV(not_started) names the hosts that fail then, with why.
    The first wave, or O(wave=null) (every node at once), reads nothing.
  - O(step=rollout), after the stages, first decides which of the cordons an ended run left (O(left_cordoned), by
    default those O(step=restarts) handed over in this run) this
    run releases (RV(release), the node has nothing to drain it for) and releases them once Ready with
    M(gpuharden.k8s.node_maintenance) (one run per lock owner of the hosts; RV(release_failed)
    names the hosts whose release failed, for the play to fail), and which stay (RV(kept), with why - a draining stage
    the node needs was left out by C(--tags); a warning each). Then, where a host of the batch has a step that drains
    its node (a kubelet CPU or Memory Manager policy change or stale checkpoint, a MIG layout change), reads the budget
    again (the nodes the stages restarted settle first), and returns each host's group of the budgeted rollout
    (RV(groups)) and, as the fact C(__harden_rollout_plan) (with C(delegate_facts)), the next play's hosts (the
    unavailable nodes first, the hosts whose release failed left out; the batches of the first play add up) and
    serial (a canary, then the batch size), the fleet and the failed releases.
  - O(step=stopped), in the second play, returns the Nodes of the hosts whose disruptive step failed (their
    M(gpuharden.k8s.harden_node) V(failed)'s hand-over) as RV(stopped_by), and sets them and the fleet as the facts C(node_maintenance_stopped_by) and
    C(node_maintenance_fleet) of the batch's hosts, for the role C(node_maintenance)'s budget.
  - The modules it runs on the controller take the controller's C(ansible_playbook_python), never the play's node
    Python - its tasks need no C(ansible_python_interpreter).
  - O(step=postcheck), per host in the last play, returns the post-check role's inputs from what this run did to the
    node as facts of the host (C(postcheck_node_audit) - the plan's audit where no stage touched the node or in check
    mode, C(postcheck_lock), C(postcheck_advertise_settle_seconds) from C(gpuharden_postcheck_settle_seconds),
    C(postcheck_advertise_settle_this_node) where the device plugin, the kubelet or the MIG layout changed,
    C(postcheck_kubelet_restarted_at)); it reads no other host and contacts none.
  - The budget options default to the play's C(gpuharden_kubeconfig), C(gpuharden_max_unavailable) (V(1)) and
    C(gpuharden_restart_settle_seconds) (V(60)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.FACTS
  - gpuharden.k8s._attributes.INFO_MODULE
  - gpuharden.k8s._attributes.ACTION
options:
  step:
    description: Which decision of the rollout to make.
    type: str
    required: true
    choices: [restarts, wave, rollout, stopped, postcheck]
  wave:
    description: For O(step=wave), the step of the containerd restarts (C(index), C(nodes), C(settle), C(before)), or null.
    type: dict
  left_cordoned:
    description:
      - For O(step=rollout), RV(left_cordoned) of the O(step=restarts) run.
      - Default that O(step=restarts) handed over in this run.
    type: list
    elements: dict
  kubeconfig:
    description: The kubeconfig the budget is read with. Default the play's C(gpuharden_kubeconfig), else the default (C(KUBECONFIG), in-cluster).
    type: str
  max_unavailable:
    description: The most GPU nodes unavailable at once, a count or a percentage of the fleet. Default the play's C(gpuharden_max_unavailable), else V(1).
    type: str
  settle_seconds:
    description:
      - For O(step=rollout) and O(step=wave), how long a node the stages restarted may take to be Ready again.
      - Default the play's C(gpuharden_restart_settle_seconds), else V(60).
    type: int
seealso:
  - module: gpuharden.k8s.disruption_budget
  - module: gpuharden.k8s.node_stages
"""

EXAMPLES = r"""
- name: Read the fleet once, before the stages
  gpuharden.k8s.harden_rollout:
    step: restarts
  delegate_to: localhost
  run_once: true

- name: Put the nodes with disruptive steps into the budgeted rollout
  gpuharden.k8s.harden_rollout:
    step: rollout
  delegate_to: localhost
  delegate_facts: true
  run_once: true
"""

RETURN = r"""
restart_steps:
  description: With O(step=restarts), the containerd restarts' steps (M(gpuharden.k8s.disruption_budget)'s), or V([null]) for every node at once.
  returned: when O(step=restarts)
  type: list
  elements: raw
restart_not_allowed:
  description: With O(step=restarts), per host whose containerd restart the budget does not allow at all, why.
  returned: when O(step=restarts)
  type: dict
runtime_class:
  description: With O(step=restarts), whether the RuntimeClass stage runs for the batch.
  returned: when O(step=restarts)
  type: bool
runtime_class_why:
  description: With O(step=restarts), why the RuntimeClass stage runs or not.
  returned: when O(step=restarts)
  type: str
left_cordoned:
  description: With O(step=restarts), the fleet's nodes an ended gpuharden run left cordoned, each with its record.
  returned: when O(step=restarts)
  type: list
  elements: dict
stopped_by:
  description: With O(step=stopped), the Nodes of the hosts whose disruptive step failed.
  returned: when O(step=stopped)
  type: list
  elements: str
not_started:
  description: With O(step=wave), per host that fails before its containerd restart, why.
  returned: when O(step=wave)
  type: dict
release:
  description: With O(step=rollout), the hosts whose cordon an ended run left is released.
  returned: when O(step=rollout)
  type: list
  elements: str
kept:
  description: With O(step=rollout), per host whose cordon an ended run left stays, why.
  returned: when O(step=rollout)
  type: dict
released:
  description: With O(step=rollout), the Nodes whose cordon an ended run left was released.
  returned: when O(step=rollout)
  type: list
  elements: str
release_results:
  description: With O(step=rollout), per host whose cordon was to be released, the result of M(gpuharden.k8s.node_maintenance).
  returned: when O(step=rollout)
  type: dict
release_failed:
  description: With O(step=rollout), per host whose cordon could not be released, why.
  returned: when O(step=rollout)
  type: dict
groups:
  description: With O(step=rollout), each host's group - C(gpuharden_rollout_first) (unavailable already), C(gpuharden_rollout_then), C(gpuharden_no_rollout).
  returned: when O(step=rollout)
  type: dict
  sample: {"gpu-0": gpuharden_rollout_then, "gpu-1": gpuharden_no_rollout}
disruptive:
  description: With O(step=rollout), the Nodes with a step that drains them.
  returned: when O(step=rollout)
  type: list
  elements: str
batch:
  description:
    - With O(step=rollout), how many nodes drain at a time (the budget less the nodes unavailable outside the rollout, at least 1).
    - Null where the budget was not read.
  returned: when O(step=rollout)
  type: int
budget:
  description: The result of M(gpuharden.k8s.disruption_budget), or V(null) where it was not read.
  returned: when O(step=restarts) or O(step=rollout)
  type: dict
"""
