#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/container_runtime_wave.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: container_runtime_wave
short_description: One step of a run's containerd restarts, a canary first, then waves
version_added: 0.1.0
description:
  - C(playbooks/tasks/stage_container_runtime.yml) calls it for each step of the run's containerd restarts (one of
    M(gpuharden.k8s.harden_rollout)'s C(restart_steps), or V(null) - every node at once). C(tasks/stages.yml) includes
    that file once per step, looping over the step labels M(gpuharden.k8s.stage_steps) returns
    (C(container_runtime_waves)); the action takes the step, and the host's Node name, from that result (registered as
    C(__stages_run)) by the loop's item.
  - O(step=gate), once for the step and delegated to localhost, runs M(gpuharden.k8s.harden_rollout)'s wave step (the
    nodes the previous wave restarted are Ready again, and no node failed) on the controller's Python; it is skipped,
    with why, for the first step and for every node at once.
  - The gate hands its C(not_started) over to the host step of the same step in Python (the facts of a run_once task
    reach every host of the batch, stamped with this run and the step).
  - O(step=host), on each host, fails the host the gate stopped (its C(not_started)), else returns RV(run) - whether the
    container runtime stage runs on it in this step.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options:
  step:
    description: Which task of C(tasks/stage_container_runtime.yml) to run.
    type: str
    required: true
    choices: [gate, host]
attributes:
  check_mode:
    support: full
    description: Check mode restarts every node at once, so the gate has nothing to wait for.
  diff_mode:
    support: none
seealso:
  - module: gpuharden.k8s.harden_rollout
"""

EXAMPLES = r"""
- name: Stage | containerd restarts | has the previous wave come back (once for the step)
  gpuharden.k8s.container_runtime_wave:
    step: gate
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
not_started:
  description: O(step=gate) - the hosts that fail, and why (the restarts stopped), as M(gpuharden.k8s.harden_rollout)'s wave step.
  returned: step gate
  type: dict
run:
  description: O(step=host) - the container runtime stage runs on this host in this step.
  returned: step host
  type: bool
reason:
  description: O(step=host) - why it runs or not.
  returned: step host
  type: str
"""
