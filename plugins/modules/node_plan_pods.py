#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/node_plan_pods.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: node_plan_pods
short_description: List the GPU pods of a batch of nodes once, for the plan of harden and the drift check
version_added: 0.1.0
description:
  - The one LIST of the plan of C(harden_gpu_nodes.yml) and C(drift_check.yml) (C(playbooks/tasks/node_plan_inputs.yml)),
    handed over to every host of the batch (a fact stamped with this ansible-playbook run, never taken in another) and
    read there by M(gpuharden.k8s.node_stages) (the memory check's pods, the GPU Operator's reading),
    M(gpuharden.k8s.stage_steps) (the cgroup_limits stage's pods), M(gpuharden.k8s.harden_rollout) and
    M(gpuharden.k8s.cluster_stage_gate) (the dry runs) and M(gpuharden.k8s.drift_play) (the pods snapshot).
  - Runs M(gpuharden.k8s.gpu_pods_info) with options built from the roles' variables - the cgroup_limits role's
    cluster identity and resource prefixes, the GPU Operator's ClusterPolicy read for every node - outside check mode
    too (it only reads; a check run plans what a real run would).
  - With O(dry_runs), and where the play skips compliant stages (C(gpuharden_skip_compliant_stages)), the same module
    run also dry-runs the RuntimeClass stage (C(runtime_class_audit_options)) and the device plugin stage
    (C(device_plugin_audit_options), labelling every node of O(nodes) as a GPU node where C(device_plugin_label_nodes)),
    each only where its role uses the cluster identity and Python of the cgroup_limits role.
  - A LIST that fails does not fail the task; its C(msg) says why, and the audit leaves the memory check out.
  - Returns the play's C(gpuharden_gpu_pods_given) as it is where the caller made the reading already
    (C(gpuharden explain)), and nothing (skipped) where C(cgroup_limits_immediate) is false.
  - Use it with C(run_once=true), delegated to localhost, with the cgroup_limits role's Python
    (C(cgroup_limits_controller_python)).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
  - gpuharden.k8s._attributes.ACTION
options:
  nodes:
    description:
      - The Kubernetes names of the nodes whose GPU pods are listed (the play's, or the serial batch's).
      - Here or as C(__node_plan.nodes), the mapping the task importing C(playbooks/tasks/node_stages.yml) sets; else
        the nodes M(gpuharden.k8s.drift_play) C(step=start) handed over in this run;
        else the Nodes of the serial batch's hosts, each its C(gpuharden_k8s_node_name), else its inventory name.
    type: list
    elements: str
  pods_snapshot:
    description:
      - Also return the listed pods, for a M(gpuharden.k8s.gpu_consistency) run later in the play.
      - Default C(__node_plan.pods_snapshot), else that of M(gpuharden.k8s.drift_play) C(step=start)
        in this run, else V(false).
    type: bool
  dry_runs:
    description:
      - Also dry-run the RuntimeClass and device plugin stages (see above).
      - Default C(__node_plan.dry_runs), else V(false).
    type: bool
"""

EXAMPLES = r"""
- name: Plan | list the GPU pods of the nodes
  gpuharden.k8s.node_plan_pods:
    nodes: [gpu-a, gpu-b]
    dry_runs: true
  vars:
    ansible_python_interpreter: "{{ cgroup_limits_controller_python }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
pod_uids_by_node:
  description: The GPU pods' UIDs of each node (M(gpuharden.k8s.gpu_pods_info)'s).
  returned: success
  type: dict
  sample: {gpu-a: [0b6c5a2e-5d1f-4f0e-9d55-1c3c1a7e2f10]}
gpu_operator:
  description: The GPU Operator's reading (M(gpuharden.k8s.gpu_pods_info)'s C(gpu_operator)).
  returned: success
  type: dict
runtime_class_check:
  description: The dry run of the RuntimeClass stage, or null where it did not run.
  returned: success
  type: dict
device_plugin_check:
  description: The dry run of the device plugin stage, or null where it did not run.
  returned: success
  type: dict
msg:
  description: Why the LIST failed.
  returned: when the LIST failed
  type: str
"""
