# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.container_runtime_wave: one step of the run's containerd restarts
(playbooks/tasks/stage_container_runtime.yml; tasks/stages.yml loops over the steps as ``__stages_container_runtime_step``:
one of harden_rollout's restart_steps, or None where the importing playbook gives none: every node at once).

- ``gate`` (once for the step, delegated to the controller): before each step but the first, harden_rollout's wave step
  (has the previous wave come back, did no node fail), with the controller's Python; skipped, with why, for the first
  step and for every node at once.
- ``host`` (each host): fails the host the gate stopped (``__stages_container_runtime_gate``'s not_started), else says
  whether the container runtime stage runs on it in this step (``run``): its plan runs the stage (``__stages_run``) and
  its Node (``__stages_node_name``) is one of the step's.

The decisions are module_utils/cluster/_container_runtime_stage.py's and plugins/action/harden_rollout.py's.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.action import harden_rollout
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _container_runtime_stage as stage

ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": ["gate", "host"]}}
STEP = "__stages_container_runtime_step"
GATE = "__stages_container_runtime_gate"
RUNS = "__stages_run"
NODE = "__stages_node_name"


class ActionModule(harden_rollout.ActionModule):

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        step = self._templar.resolve_variable_expression(STEP)
        if args["step"] == "host":
            decided = stage.wave_host(step, boolean((self._templar.resolve_variable_expression(RUNS) or {}).get("container_runtime"), strict=False),
                                      self._templar.resolve_variable_expression(NODE), (task_vars.get(GATE) or {}).get("not_started"),
                                      task_vars.get("inventory_hostname"))
            if decided.get("failed"):
                raise AnsibleActionFail(decided["msg"])
            return dict(decided, changed=False)
        if not (step or {}).get("index"):
            return {"skipped": True, "changed": False, "not_started": {},
                    "skip_reason": "the first wave, or every node at once: nothing to wait for"}
        # harden_rollout's own wave step, as the task ``harden_rollout: {step: wave, wave: <step>}`` would run it
        self._task.args = {"step": "wave", "wave": step}
        return super().run(tmp, task_vars)
