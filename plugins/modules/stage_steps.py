#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/stage_steps.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: stage_steps
short_description: Decide which steps of the stage order run on a host
version_added: 0.1.0
description:
  - Used by C(playbooks/tasks/stages.yml), which C(harden_gpu_nodes.yml) and C(bootstrap_gpu_node.yml) import; each
    include of that file then tests one value of this task's result.
  - With O(step=stages) it reads the importing task's mapping C(__stages) - C(plan), the result of
    M(gpuharden.k8s.node_stages) for the node, and C(inline_disruptive), C(container_runtime_steps), C(runtime_class),
    C(device_plugin_later), C(audited_kubelet_plan), C(node_name) - and the plan's LIST of GPU pods
    (M(gpuharden.k8s.node_plan_pods)'s, handed over) where the playbook made one. Where C(__stages) gives no C(plan),
    it takes the plan a task before handed over in this run (M(gpuharden.k8s.bootstrap_node)'s O(step=plan)); where it
    gives no C(container_runtime_steps) or C(runtime_class), those M(gpuharden.k8s.harden_rollout) O(step=restarts)
    handed over in this run (C(restart_steps), C(runtime_class)), else every node at once and V(true).
    C(stages.yml) registers the result as C(__stages_run).
  - With O(step=drains), once the kubelet and MIG plans ran, it reads C(__stages_run) and whether each plan drains the
    node, as M(gpuharden.k8s.kubelet_topology_plan) and M(gpuharden.k8s.mig_plan) hand it over in this run (not
    handed over where a plan did not run), and says which steps that depend on a drain run.
  - No module runs and the host is not contacted; a C(__stages) with an unknown key, a missing one or a value of the
    wrong type fails the task, naming it.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
options:
  step:
    description: Which decision, see above.
    type: str
    choices: [stages, drains]
    default: stages
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
  check_mode:
    support: full
    description: It changes nothing; the same decisions in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Stage | the steps of this node
  gpuharden.k8s.stage_steps:
  vars:
    __stages: {plan: "{{ gpuharden_node_plan }}", inline_disruptive: true}
  register: __stages_run
"""

RETURN = r"""
device_permissions:
  description: The node needs the device_permissions stage (the plan's C(plan.runs.device_permissions)).
  returned: O(step=stages)
  type: bool
container_runtime:
  description: The node needs the container_runtime stage (the plan's C(plan.runs.container_runtime)).
  returned: O(step=stages)
  type: bool
kubelet_topology:
  description: The node needs the kubelet_topology stage (the plan's C(plan.runs.kubelet_topology)).
  returned: O(step=stages)
  type: bool
mig:
  description: The node needs the mig stage (the plan's C(plan.runs.mig)).
  returned: O(step=stages)
  type: bool
cgroup_limits:
  description: The node needs the cgroup_limits stage (the plan's C(plan.runs.cgroup_limits)).
  returned: O(step=stages)
  type: bool
container_runtime_steps:
  description: The containerd restarts' steps of the container runtime stage; V([null]) is every node at once.
  returned: O(step=stages)
  type: list
  elements: raw
container_runtime_waves:
  description:
    - One label per step of RV(container_runtime_steps), in their order (V(every node), V(wave 1 - gpu-b, gpu-c) with a
      colon after the index); C(stages.yml) loops over them, and M(gpuharden.k8s.container_runtime_wave) takes the step
      of a label from this result.
  returned: O(step=stages)
  type: list
  elements: str
container_runtime_here:
  description:
    - The labels of the steps whose containerd restarts include this host (its plan runs the container runtime stage and
      its Node is one of the step's); C(stage_container_runtime.yml) includes the role in those.
  returned: O(step=stages)
  type: list
  elements: str
node_name:
  description: The host's Node name, for the containerd waves.
  returned: O(step=stages)
  type: str
runtime_class:
  description: The RuntimeClass stage runs here.
  returned: O(step=stages)
  type: bool
kubelet_audited_plan:
  description: The kubelet plan of the node's audit, which the kubelet stage plans from, or null (it reads the node).
  returned: O(step=stages)
  type: dict
budget:
  description: The disruption budget of the drains to come is checked here (the drains run inline).
  returned: O(step=stages)
  type: bool
cgroup_limits_gpu_pods:
  description: The plan's LIST of GPU pods the cgroup_limits stage takes, or null (the stage lists the pods itself).
  returned: O(step=stages)
  type: dict
device_plugin:
  description: The device plugin stage runs here (not later in the playbook).
  returned: O(step=stages)
  type: bool
inline_disruptive:
  description: The steps that drain the node run here, in order.
  returned: O(step=stages)
  type: bool
budget_wanted:
  description: This host wants a step that drains it (the kubelet or MIG plan says so).
  returned: O(step=drains)
  type: bool
kubelet_apply:
  description: The kubelet settings are written here (all of them inline, else only those that need just a restart).
  returned: O(step=drains)
  type: bool
mig_apply:
  description: The MIG layout is applied here (inline only).
  returned: O(step=drains)
  type: bool
"""
