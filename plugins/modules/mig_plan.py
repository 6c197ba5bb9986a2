#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/mig_plan.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_plan
short_description: Plan the MIG stage of role mig, or say why the layout is left alone
version_added: 0.1.0
description:
  - Read-only; run it with C(check_mode=true). Role C(gpuharden.k8s.mig) calls it in C(tasks/plan.yml).
  - Where O(refused) is not empty (the plan's node_audit refused its mig check, as the GPU Operator's MIG manager owns
    the layout), nothing is planned, the refusal is the result and a warning says it; else
    M(gpuharden.k8s.mig_layout) runs on the host in check mode with O(options), and its result is this task's.
  - Either way RV(disruptive) says whether the change is disruptive (the layout changes, or a mode change waits for a
    reset), and RV(drain) whether the role drains the node for it (disruptive, and C(mig_drain)).
  - A plan that did not fail hands RV(disruptive) over to the later tasks of the same run (a fact stamped with the run,
    read by C(gpuharden.k8s.harden_node), C(gpuharden.k8s.harden_rollout) and C(gpuharden.k8s.stage_steps) - handed over
    means the MIG plan ran).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
options:
  options:
    description: The options of M(gpuharden.k8s.mig_layout); by default the role's C(__mig_module_options).
    type: dict
  refused:
    description: The plan's refusal of the mig check (C(what), C(why), C(fix) each); by default the role's C(__mig_operator_refused).
    type: list
    elements: dict
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
  check_mode:
    support: full
    description: Runs only in check mode; it changes nothing.
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.mig_layout).
"""

EXAMPLES = r"""
- name: MIG | plan (no NVML mutation)
  gpuharden.k8s.mig_plan:
    options: {layout: {"0": {"3g.40gb": 2}}, strategy: mixed}
  check_mode: true
"""

RETURN = r"""
disruptive:
  description: The layout changes or a mode change waits for a reset.
  returned: success
  type: bool
drain:
  description: RV(disruptive) and C(mig_drain) - role mig cordons and drains the node before the change and uncordons it after.
  returned: success
  type: bool
refused:
  description: O(refused), where the layout is left alone.
  returned: when refused
  type: list
  elements: dict
"""
