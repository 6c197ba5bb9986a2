#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/unharden_rollout.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: unharden_rollout
short_description: Plan the uninstall's drained pass, the kubelets that need a drain, in budgeted batches
version_added: 0.2.0
description:
  - Once for the play (C(run_once), delegated to localhost with C(delegate_facts)), after the first pass of the
    uninstall (M(gpuharden.k8s.unharden_files) with C(defer_disruptive)), reads each play host's first-pass result,
    as that task handed it over (or the variable O(first_pass) names).
  - O(kubeconfig) and O(max_unavailable) follow the play's C(gpuharden_kubeconfig) and C(gpuharden_max_unavailable)
    where the task does not give them.
  - The hosts whose kubelet files were deferred (C(deferred)) need a drain. When there are any, it reads the fleet's
    disruption budget once with M(gpuharden.k8s.disruption_budget), in check mode too, since it only reads (the fleet is every host of the play, by Node name -
    C(gpuharden_k8s_node_name), else the inventory name).
  - Returns the rollout as the fact C(__unharden_rollout) of localhost - C(hosts) in rollout order (those whose Node
    is unavailable already first, then the others in the play's order), C(serial) (V([1, batch]), a canary, then
    batches of the budget less the fleet's nodes unavailable outside the rollout, at least 1) and C(fleet), for the
    next play's C(hosts) and C(serial).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.FACTS
  - gpuharden.k8s._attributes.INFO_MODULE
  - gpuharden.k8s._attributes.ACTION
options:
  first_pass:
    description:
      - The name of the variable under which each host registered its first-pass M(gpuharden.k8s.unharden_files) result.
      - Default what M(gpuharden.k8s.unharden_files) with C(defer_disruptive) handed over in this run.
    type: str
  kubeconfig:
    description:
      - The kubeconfig the budget is read with; empty for the default (C(KUBECONFIG), in-cluster).
      - Default C(gpuharden_kubeconfig), else empty.
    type: str
  max_unavailable:
    description:
      - The most GPU nodes unavailable at once, as a count (V(1)) or a percentage of the fleet (V(25%)).
      - Default C(gpuharden_max_unavailable), else V(1).
    type: str
seealso:
  - module: gpuharden.k8s.unharden_files
  - module: gpuharden.k8s.disruption_budget
"""

EXAMPLES = r"""
- name: Plan the budgeted rollout of the kubelets that need a drain (once)
  gpuharden.k8s.unharden_rollout:
    first_pass: unharden
    max_unavailable: 25%
  delegate_to: localhost
  delegate_facts: true
  run_once: true
"""

RETURN = r"""
rollout:
  description: The rollout, also the fact C(__unharden_rollout) - C(hosts), C(nodes), C(serial), C(fleet), C(budget_needed).
  returned: always
  type: dict
  sample: {"hosts": ["gpu-3", "gpu-0"], "nodes": ["gpu-3", "gpu-0"], "serial": [1, 2], "fleet": ["gpu-0", "gpu-1", "gpu-3"],
           "budget_needed": true}
budget:
  description: The result of M(gpuharden.k8s.disruption_budget), or V(null) where no host needs a drain.
  returned: always
  type: dict
"""
