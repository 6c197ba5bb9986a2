#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/node_stages.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: node_stages
short_description: Audit a GPU node once, plan its hardening stages and run those the engine owns, in one task
version_added: 0.1.0
description:
  - The stage engine of C(harden_gpu_nodes.yml) and C(bootstrap_gpu_node.yml), one task per node.
  - Runs M(gpuharden.k8s.node_audit) on the node once (every node-side check, the GPU facts and the node's run lock,
    as given in O(audit); it reads in check mode too), then plans the node's stages in their one order. A node-side
    stage runs where its check is not C(ok) (a check that could not run or was not asked runs its stage too), or
    always with O(skip_compliant=false).
  - Runs the stages it owns (the device permissions stage, M(gpuharden.k8s.nvidia_device_nodes)) through their
    modules, with the task's check mode and diff, and returns each one's result. The other stages are returned in
    RV(plan) with why they run or are left out; the play runs them (the containerd restarts in waves across the
    hosts, the kubelet's and MIG's plans and the drains within the disruption budget, the cluster-side stages once).
  - Stage selection by tag. Give the task the tag C(always); each stage the run's C(--tags) and C(--skip-tags) leave
    out (Ansible's own rule for a task with the stage's tags) is left out of the plan.
  - Fails a node that shows no NVIDIA GPU (no driver GPU, NVML counts none) unless O(allow_non_gpu_nodes=true),
    when O(audit) asks for the facts.
  - Prints one line per stage (the stages left out with C(-vv)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.FACTS
options:
  node_name:
    description:
      - The node's Kubernetes name (node_audit's O(gpuharden.k8s.node_audit#module:node_name)).
      - Default C(__node_plan.node) (the mapping the task importing C(playbooks/tasks/node_stages.yml) sets), else the
        host's C(gpuharden_k8s_node_name), else its inventory name.
    type: str
  audit:
    description:
      - The options of M(gpuharden.k8s.node_audit) but O(gpuharden.k8s.node_audit#module:node_name) (the desired state of each check, C(facts),
        C(lock), C(gpu_operator)). An option given here wins over the one O(audit_from_play) builds.
    type: dict
    default: {}
  audit_from_play:
    description:
      - The options of M(gpuharden.k8s.node_audit) to build from the play's variables, each from its role's
        C(<role>_audit_options) (the role's C(vars/main.yml), exposed by its C(tasks/audit_params.yml)).
      - C(kubelet) also merges C(cgroup_limits_audit_kubelet_settings) into the kubelet settings, at every depth.
      - C(cgroup_memory) is asked only with the plan's LIST of the GPU pods (M(gpuharden.k8s.node_plan_pods)'s, handed over), with the pods it
        found on the node. C(mig), C(nvml) and C(device_cgroups) are asked only where their role gives options.
      - C(gpu_operator) is the node's entry of the GPU Operator reading that LIST took, with the play's
        C(gpuharden_operator_takeover) and why the reading is missing.
      - A role variable that the play does not define fails the task before the node is read.
    type: list
    elements: str
    default: []
    choices: [gpu_operator, device_nodes, containerd, kubelet, mig, cgroup_memory, nvml, device_cgroups]
  stages:
    description:
      - Per stage the engine runs, the options of its module, keyed by stage name (C(device_permissions) takes those
        of M(gpuharden.k8s.nvidia_device_nodes)). Its C(gpu_operator) option gets the reading the audit took, with
        its own C(takeover) list.
      - A stage left out here takes its role's options from the play, C(<role>_audit_options) with C(<role>_backup)
        (C(device_permissions_audit_options), the role's C(vars/main.yml)).
    type: dict
    default: {}
  skip_compliant:
    description:
      - Leave out a node-side stage whose check is C(ok). V(false) runs every stage (MIG only where a layout is asked for).
      - Default the play's C(gpuharden_skip_compliant_stages), else V(true).
    type: bool
  allow_non_gpu_nodes:
    description: Run on a node that shows no NVIDIA GPU. Default the play's C(gpuharden_allow_non_gpu_nodes), else V(false).
    type: bool
  run_stages:
    description:
      - V(false) plans only (the drift check's reading of the node); no stage runs, no node is refused.
    type: bool
    default: true
  lock:
    description:
      - The node's run lock, taken by the audit (M(gpuharden.k8s.node_audit)'s
        O(gpuharden.k8s.node_audit#module:lock), built from these options). None in check mode, which changes
        nothing that needs serialising. Give either this or C(audit.lock).
      - Default C(__node_plan.lock); where C(__node_plan) has no C(lock), the lock M(gpuharden.k8s.drift_play)
        C(step=start) handed over in this run. C(__node_plan.facts) is C(audit.facts)
        where O(audit) does not set it.
    type: dict
    suboptions:
      owner:
        description:
          - Who holds the lock (unique per run).
          - Default the run M(gpuharden.k8s.harden_node) V(start) named on the host (C(harden_gpu_nodes.yml)); the task
            fails where that step did not run.
        type: str
      controller:
        description:
          - This run's controller process (the lookup C(gpuharden.k8s.controller_run)).
          - Default, where O(lock.owner) is left out, the one M(gpuharden.k8s.harden_node) V(start) recorded.
        type: dict
      path:
        description: The lock file on the node. Default the play's C(gpuharden_lock_path), else C(/run/gpuharden/run.lock).
        type: str
      timeout:
        description: Seconds to wait for another run's lock. Default the play's C(gpuharden_lock_timeout), else V(600).
        type: int
      hold:
        description: Keep the lock after the audit, for a run that gives it back itself.
        type: bool
        default: false
      release_if_nothing_cluster_side:
        description:
          - With O(lock.hold), give the lock back in the audit's run on a compliant node when nothing cluster-side
            will touch the node either - the plan's dry run of the device plugin stage (M(gpuharden.k8s.node_plan_pods)'s) ran and
            would change nothing, the play runs in one batch, and the host does not set C(gpuharden_gpu_node).
        type: bool
        default: false
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
  check_mode:
    support: full
    description: The stages run in check mode and change nothing; the audit still takes the run lock O(audit) asks for.
  diff_mode:
    support: full
    description: Each stage's diff, one after the other.
"""

EXAMPLES = r"""
- name: Plan and run the node's stages (the device permissions stage with the role's options)
  gpuharden.k8s.node_stages:
    audit:
      facts: true
    audit_from_play: [device_nodes, containerd]
  register: gpuharden_node_plan
  tags: [always]
"""

RETURN = r"""
plan:
  description:
    - The node's plan. C(stages) in their order, each with C(stage), C(side) (C(node) or C(cluster)), C(drains)
      (a step may drain the node), C(action) (C(run) by the engine now, C(play) by the play, C(left_out)) and
      C(why); C(runs) maps each node-side stage to whether the node needs it.
  returned: success
  type: dict
  sample:
    stages:
      - {stage: device_permissions, side: node, drains: false, action: run, why: "its check (device_nodes) is drift", changed: true}
      - {stage: container_runtime, side: node, drains: false, action: left_out, why: "compliant: its check (containerd) is ok"}
    runs: {device_permissions: true, container_runtime: false, kubelet_topology: false, mig: false, cgroup_limits: false}
stages:
  description:
    - Per stage the engine ran, C(changed), C(refused) and C(not_checked) (where the module returned them), C(msg) and
      C(failed) for a failed one, and the module's whole C(result).
  returned: success
  type: dict
  sample: {device_permissions: {changed: true, result: {changed: true, reboot_or_reload_required: false}}}
checks:
  description: The audit's checks (M(gpuharden.k8s.node_audit)'s RV(gpuharden.k8s.node_audit#module:checks)).
  returned: success
  type: dict
summary:
  description: The audit's summary (M(gpuharden.k8s.node_audit)'s RV(gpuharden.k8s.node_audit#module:summary)).
  returned: success
  type: dict
node_name:
  description: The node's Kubernetes name (O(node_name)), with its audit, for a reader of the run's results.
  returned: success
  type: str
  sample: gpu-a
"""
