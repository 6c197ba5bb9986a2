#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/kubelet_topology_plan.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: kubelet_topology_plan
short_description: Plan the kubelet stage of role kubelet_topology, with its admission gate
version_added: 0.1.0
description:
  - Read-only; run it with C(check_mode=true). Role C(gpuharden.k8s.kubelet_topology) calls it in C(tasks/plan.yml) and
    C(tasks/admission.yml); the decisions are C(module_utils/cluster/_kubelet_stage.py)'s.
  - Without O(stage), the plan. It runs M(gpuharden.k8s.kubelet_config) on the host in check mode with O(options), or
    takes O(audited_plan), and returns that plan with what it means for the run, RV(disruptive), RV(restart),
    RV(gated) and RV(write_options).
  - With O(stage), the admission gate. It weighs O(workloads_listed) against the node's GPUs under the policy the
    plan switches to, as the drift check does. A node whose GPU workloads could no longer be admitted, or could not
    be listed, keeps its Topology, CPU and Memory Manager fields, unless O(ignore_unadmittable_workloads). The node is
    then planned again without them, and the workloads that keep it go to the run's statistics (C(gpuharden_topology_blocked)).
  - With O(gate), the gate's inputs not given are the role's variables - C(__kubelet_topology_stage),
    C(kubelet_topology_node_name), the node's GPUs from the facts (read with M(gpuharden.k8s.gpu_facts) on the host
    where none are set yet, and returned as facts), the listing registered by the batch's first host whose plan is
    gated, and C(kubelet_topology_ignore_unadmittable_workloads). Where workloads keep the node on its policy, or a
    forced change leaves some unadmittable, the gate's message is the task's warning. The plan reads
    C(__kubelet_topology_module_options), C(__kubelet_topology_audited_plan) and C(kubelet_topology_admission_check)
    where O(options), O(audited_plan) and O(admission_check) are not given.
  - With O(workloads) (delegate the task to the controller), the batch's listing for the gate - M(gpuharden.k8s.gpu_workloads_info)
    with C(kubelet_topology_gpu_resources) and C(kubelet_topology_controller_kubeconfig), run outside check mode (it only
    reads) with C(kubelet_topology_controller_python). Only the batch's first host whose plan is gated lists, the others
    skip. A listing that fails does not fail the task (RV(listing_failed)) - the gate keeps the node's policy and says why.
  - Both return RV(drain), who drains the node before the write, from C(kubelet_topology_drain_tasks),
    C(kubelet_topology_drain) and the run's check mode.
  - The plan and the gate hand RV(disruptive) over to the later tasks of the same run (a fact stamped with the run, the
    gate's replacing the plan's, read by C(gpuharden.k8s.harden_node), C(gpuharden.k8s.harden_rollout) and
    C(gpuharden.k8s.stage_steps) - handed over means the kubelet plan ran).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options:
  options:
    description: The options of M(gpuharden.k8s.kubelet_config); by default the role's C(__kubelet_topology_module_options).
    type: dict
  audited_plan:
    description: The plan of node_audit's kubelet check (C(details.plan)), made earlier in the run; taken instead of reading the node again.
    type: raw
  admission_check:
    description:
      - Whether a switch to a policy that can refuse GPU pods goes through the admission gate (RV(gated)).
      - By default the role's C(kubelet_topology_admission_check), else V(true).
    type: bool
  gate:
    description: The admission gate, with the inputs not given read from the role's variables.
    type: bool
    default: false
  workloads:
    description: The batch's listing of the GPU workloads for the gate, by the batch's first host whose plan is gated.
    type: bool
    default: false
  stage:
    description: The plan task's result; given, the task is the admission gate.
    type: dict
  node_name:
    description: The Kubernetes node name (required with O(stage) when it is gated).
    type: str
  gpus:
    description: The node's GPUs, each with C(index) and C(numa_node) (M(gpuharden.k8s.gpu_facts)).
    type: list
    elements: dict
  workloads_listed:
    description: The result of M(gpuharden.k8s.gpu_workloads_info) for the batch, or its failure.
    type: dict
  ignore_unadmittable_workloads:
    description: Switch the policy even where GPU workloads could no longer be admitted (said in RV(admission)); by default V(false).
    type: bool
attributes:
  check_mode:
    support: full
    description: Runs only in check mode; it changes nothing.
  diff_mode:
    support: none
    description: No diff of its own.
"""

EXAMPLES = r"""
- name: Kubelet | plan the configuration (read-only)
  gpuharden.k8s.kubelet_topology_plan:
  check_mode: true
  register: __kubelet_topology_stage
"""

RETURN = r"""
listing_failed:
  description: O(workloads) - the listing failed (its C(msg) is in the result); the gate keeps the node's policy.
  returned: O(workloads), on the lister
  type: bool
disruptive:
  description: A CPU or Memory Manager policy change or a stale checkpoint - the node is drained and the kubelet stopped.
  returned: always
  type: bool
restart:
  description: The O(gpuharden.k8s.kubelet_config#module:restart) of the write, V(always) after a stop, else V(if_required).
  returned: always
  type: str
gated:
  description: The plan switches to a policy that can refuse GPU pods, so the admission gate runs.
  returned: always
  type: bool
switch:
  description: The policy and scope switched to (C(policy), C(scope)), or V(null).
  returned: always
  type: dict
write_options:
  description: The options of the role's write (O(options), less the manager fields where the gate keeps them).
  returned: always
  type: dict
would_change:
  description: The write would change a file.
  returned: always
  type: bool
drain:
  description:
    - Who drains the node before the write - V(tasks) (C(kubelet_topology_drain_tasks)), V(node_maintenance), or an
      empty string (no disruptive change, a check run, or C(kubelet_topology_drain=false)).
  returned: always
  type: str
drain_tasks:
  description:
    - The tasks file the role includes to drain the node - C(kubelet_topology_drain_tasks), the role's
      C(node_maintenance_drain.yml), or an empty string (nobody drains).
  returned: always
  type: str
admission:
  description: With O(stage), the gate's verdict - C(kept), C(blocked), C(managers) and C(message) (the task's warning).
  returned: with O(stage)
  type: dict
"""
