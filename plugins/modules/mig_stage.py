#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/mig_stage.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_stage
short_description: One node-side step of role mig's apply, decided from the role's variables
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.mig) calls it in C(tasks/apply.yml), after C(tasks/plan.yml) registered C(__mig_plan) with
    M(gpuharden.k8s.mig_plan). Each step reads the role's variables and the results the steps before it registered, and
    decides itself whether it runs; a step with nothing to do says why.
  - O(step=apply) runs M(gpuharden.k8s.mig_layout) with the role's options where the plan is disruptive (else it is
    skipped). A mode change left pending (a busy GPU) fails the host where C(mig_reset_method) is C(none), outside check
    mode; else RV(reset) or RV(reboot) says how the reset is done. The role registers the result as C(__mig_apply).
  - O(step=reset) runs C(mig_reset_command) (C(mig_gpus_to_reset) holds the bus ids) where the apply left a mode change
    pending and C(mig_reset_method) is C(command); not in check mode.
  - O(step=reapply) runs M(gpuharden.k8s.mig_layout) again after a reset (the command, or the role's reboot), outside
    check mode, and fails the host when the mode change is still pending. It returns RV(mig_result) and RV(follow_up).
    The role registers the result as C(__mig_reapply).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options:
  step:
    description: Which step of C(tasks/apply.yml) to run.
    type: str
    required: true
    choices: [apply, reset, reapply]
attributes:
  check_mode:
    support: full
    description: The layout is applied in check mode; nothing is reset or applied again.
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.mig_layout).
seealso:
  - module: gpuharden.k8s.mig_plan
  - module: gpuharden.k8s.mig_layout
"""

EXAMPLES = r"""
- name: MIG | apply the layout
  gpuharden.k8s.mig_stage:
    step: apply
  register: __mig_apply
"""

RETURN = r"""
reset:
  description: O(step=apply) - a mode change waits for a reset by C(mig_reset_command).
  returned: step apply
  type: bool
reboot:
  description: O(step=apply) - a mode change waits for a reset by reboot (C(mig_reset_method=reboot)); the role reboots.
  returned: step apply
  type: bool
mig_result:
  description: O(step=reapply) - the last result of re-apply, apply and plan that ran (the role publishes it as C(mig_result)).
  returned: step reapply
  type: dict
follow_up:
  description:
    - O(step=reapply) - C(device_nodes) (the device nodes are made again; not where the run skips the
      device_permissions tag) and C(restart_device_plugin) (C(mig_restart_device_plugin)), where the layout changed.
  returned: step reapply
  type: dict
"""
