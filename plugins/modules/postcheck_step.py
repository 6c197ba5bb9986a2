#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/postcheck_step.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: postcheck_step
short_description: One step of the post-check role (what proves a GPU node is fixed)
version_added: 0.1.0
description:
  - The engine of the role C(gpuharden.k8s.postcheck) (C(roles/postcheck/tasks/main.yml)), one task per step. Use the
    role, which runs the steps in order; this action is its private interface and reads the role's C(postcheck_*)
    variables (C(roles/postcheck/defaults/main.yml)) as the role's tasks see them.
  - V(preflight) fails on role variables that do not go together (the topology and consistency checks without the NVML
    check, expected counts that are not whole numbers), naming every rule broken.
  - V(node), on the node, reads it in one M(gpuharden.k8s.node_audit) run (NVML with the GPU processes' cgroups, the
    device cgroups, the kubelet's policies; with C(postcheck_lock), the run lock is given back in the same run), or takes
    this run's own audit (C(postcheck_node_audit)); what that read did not give is read by its own module as before
    (M(gpuharden.k8s.nvml_check), M(gpuharden.k8s.kubelet_config) in check mode, M(gpuharden.k8s.device_cgroup_audit),
    M(gpuharden.k8s.process_cgroup_info)). Shown as skipped where the run's audit had read everything.
  - V(cluster), once for the play's batch on the controller, runs M(gpuharden.k8s.gpu_consistency) over every node of
    the batch (it lists and weighs the GPU workloads in the same run), or without the consistency check
    M(gpuharden.k8s.gpu_workloads_info). A LIST that fails is no finding; the node's topology is then not checked
    against the workloads (RV(not_checked), with its cause and fix), which fails the host as a finding would.
  - V(verdict), per host on the controller, runs M(gpuharden.k8s.topology_check) for a node the cluster step did not
    weigh, gathers the node's findings, adds them to the run's statistics (C(gpuharden_postcheck_findings), as
    M(ansible.builtin.set_stats) with C(aggregate) would) and says whether the host fails at C(postcheck_fail_severity).
    The role registers it as C(postcheck_result).
  - V(fail), per host, fails the host with the verdict's RV(failure); skipped where there is none.
  - V(report), per host, shows the verdict's RV(report) (a check run that only reports), as M(ansible.builtin.debug)
    shows a message; skipped where there is none.
  - Each step reads what the step before it registered in the role (C(__postcheck_node_read) of every host of the
    batch, C(postcheck_result)) or, for the V(cluster) step, handed over to every host of the batch in this run, where
    the option that gives it is left out, and runs the
    controller modules of a step delegated to localhost on C(postcheck_controller_python).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
options:
  step:
    description: The step to run.
    type: str
    required: true
    choices: [preflight, node, cluster, verdict, fail, report]
  node_reads:
    description:
      - V(cluster) only. The V(node) step's results of the batch's hosts, in the batch's order.
      - Left out, each host's C(__postcheck_node_read) of C(ansible_play_batch).
    type: list
    elements: raw
  node_read:
    description: V(verdict) only. This host's V(node) step result; left out, C(__postcheck_node_read).
    type: dict
  cluster:
    description: V(verdict) only. The V(cluster) step's result; left out, what that step of this run handed over.
    type: dict
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
"""

EXAMPLES = r"""
# The role runs the steps; compose it rather than these tasks.
- name: Post-check the GPU nodes
  ansible.builtin.import_role:
    name: gpuharden.k8s.postcheck
"""

RETURN = r"""
nvml:
  description: V(node) and V(verdict). The NVML result of the node (M(gpuharden.k8s.nvml_check)'s, or the node audit's report).
  returned: success
  type: dict
findings:
  description: V(verdict). The node's findings, NVML, topology, device cgroups, consistency, in that order.
  returned: success
  type: list
  elements: dict
topology:
  description: V(verdict). The node's topology result (the workloads weighed against it), null without the topology check.
  returned: success
  type: dict
workloads_error:
  description: V(cluster) and V(verdict). Why the GPU workloads could not be listed; null where they were, or were not asked for.
  returned: success
  type: str
not_checked:
  description:
    - V(verdict). What the post-check of the node could not check, each with C(what), C(cause) and C(fix); never
      counted as clean or as a finding. A host with one fails (C(failure)) unless C(postcheck_fail_severity=never).
  returned: success
  type: list
  elements: dict
failing:
  description: V(verdict). The ids of the findings at or above C(postcheck_fail_severity).
  returned: success
  type: list
  elements: str
failure:
  description:
    - V(verdict). Why the host fails (the role's next task fails it with this message), its findings and what could not
      be checked; null where it does not.
  returned: success
  type: str
report:
  description: V(verdict). In check mode with C(postcheck_fail_in_check_mode=false), what a failing host has, reported only.
  returned: success
  type: str
modules:
  description: V(node). The modules this step ran on the node, in order.
  returned: success
  type: list
  elements: str
lock:
  description: V(node). The node audit's lock report (C(held), C(taken_over)), where its run held the lock.
  returned: when postcheck_lock is given
  type: dict
ran:
  description: V(cluster). The controller module the step ran, null where neither check was asked for.
  returned: success
  type: str
msg:
  description: V(fail) the verdict's failure; V(report) the verdict's report.
  returned: when the step is not skipped
  type: str
"""
