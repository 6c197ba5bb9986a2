#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/drift_play.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: drift_play
short_description: The decisions of the drift check playbook, one task each - the run's start, its cluster side, a host's verdict
version_added: 0.2.0
description:
  - Reads the play's variables (the roles' options, the C(gpuharden_*) settings, the hosts' plans from hostvars) on the
    controller and decides in Python (C(plugins/module_utils/audit/_drift_play.py)).
  - O(step=start), once for the play before the audits - each host's Node name (C(gpuharden_k8s_node_name), else its
    inventory name), the play's nodes, the node run lock's options for M(gpuharden.k8s.node_audit) (owner from
    C(gpuharden_run_owner) or made up, path from C(gpuharden_lock_path), timeout from C(gpuharden_lock_timeout),
    default 60, and this run's controller process), and whether the plan's one LIST of the GPU pods is kept for the
    consistency check. Contacts no host. Handed over to every host (a fact stamped with this ansible-playbook run) -
    M(gpuharden.k8s.node_plan_pods) takes the nodes and the snapshot, M(gpuharden.k8s.node_stages) the lock, where
    C(__node_plan) leaves them out, and O(step=cluster) the Node names.
  - O(step=cluster), once for the play after the audits, delegated to localhost - runs M(gpuharden.k8s.gpu_consistency)
    on the plans' node reports where C(postcheck_consistency) and C(postcheck_nvml) are on (harden's admission check
    predicted where C(kubelet_topology_admission_check) is on), with the RuntimeClass dry run folded into that run
    where both use the same kubeconfig, context and controller Python, and M(gpuharden.k8s.runtime_class) in check
    mode by itself where that run did not check it (C(gpuharden_drift_cluster_objects)). Each module runs with its
    role's controller Python. With C(gpuharden_drift_cluster_in_process) (set by C(gpuharden drift)) the consistency
    check's options and the node reports are returned instead, for the caller to run the same check itself.
  - O(step=verdict), on each host - the host's run data (its plan's findings and the consistency check's about its
    Node) as the run's stats C(gpuharden_drift) (aggregated), and why the host fails in RV(failure) (a check that
    could not run, or findings at or above C(gpuharden_drift_fail_severity); V("") where C(gpuharden_drift_fail) is
    off). It never fails itself, since Ansible records stats only from a successful result.
  - O(step=fail), on each host after O(step=verdict) (registered as C(__drift_verdict)) - fails the host with that
    verdict's RV(failure) where there is one.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
options:
  step:
    description: Which decision to make.
    type: str
    required: true
    choices: [start, cluster, verdict, fail]
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
seealso:
  - module: gpuharden.k8s.node_stages
  - module: gpuharden.k8s.gpu_consistency
  - module: gpuharden.k8s.runtime_class
"""

EXAMPLES = r"""
- name: The Node names, the run's lock and the pods snapshot, decided once
  gpuharden.k8s.drift_play:
    step: start
  run_once: true

- name: The cluster side of the drift check, once for the play
  gpuharden.k8s.drift_play:
    step: cluster
  delegate_to: localhost
  run_once: true
  become: false
  register: __drift_cluster
"""

RETURN = r"""
node_names:
  description: O(step=start) - each host's Node name.
  returned: success
  type: dict
nodes:
  description: O(step=start) - the Node names of the play's hosts.
  returned: success
  type: list
  elements: str
lock:
  description: O(step=start) - the lock option of M(gpuharden.k8s.node_audit) (owner, path, timeout, controller).
  returned: success
  type: dict
pods_snapshot:
  description: O(step=start) - whether the plan's LIST of pods is kept for the consistency check.
  returned: success
  type: bool
consistency:
  description: O(step=cluster) - the result of M(gpuharden.k8s.gpu_consistency) where it ran as a module, else V(null).
  returned: success
  type: dict
consistency_options:
  description: O(step=cluster) - with C(gpuharden_drift_cluster_in_process), the consistency check's options but node_reports, else V(null).
  returned: success
  type: dict
consistency_identity:
  description: O(step=cluster) - the kubeconfig and context of the consistency check, where it runs.
  returned: success
  type: dict
node_reports:
  description: O(step=cluster) - with C(gpuharden_drift_cluster_in_process), the node reports of the plans, else V(null).
  returned: success
  type: dict
runtime_class:
  description: O(step=cluster) - the dry run of M(gpuharden.k8s.runtime_class) where it ran by itself, else V(null).
  returned: success
  type: dict
api_retries:
  description: O(step=cluster) - the requests the module runs sent again.
  returned: success
  type: int
run_data:
  description: O(step=verdict) - the host's run data (node, summary, checks, findings, consistency_findings).
  returned: success
  type: dict
failure:
  description: O(step=verdict) - why the host fails, or V("").
  returned: success
  type: str
"""
