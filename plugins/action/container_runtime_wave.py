# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.container_runtime_wave: one step of the run's containerd restarts
(playbooks/tasks/stage_container_runtime.yml; tasks/stages.yml includes it once per step, looping over the step labels
of step stages' result: one of harden_rollout's restart_steps, or None where the importing playbook gives none: every
node at once).  The step itself is taken from that result (registered as ``__stages_run``) by the loop's item, the
label: no step travels through a variable of the YAML.

- ``gate`` (once for the step, delegated to the controller): before each step but the first, harden_rollout's wave step
  (has the previous wave come back, did no node fail), with the controller's Python; its not_started (the hosts that
  fail, and why) is handed over as GATE to every host of the batch (the facts of a run_once task), stamped with this
  run and the step's label.  Skipped, with why, for the first step and for every node at once.
- ``host`` (each host): fails the host the gate stopped, else says whether the container runtime stage runs on it in
  this step (``run``, ``reason``: its plan runs the stage and its Node, the node_name of step stages' result, is one of
  the step's; the include of the role tests the same rule, step stages' container_runtime_here).

The decisions are module_utils/cluster/_container_runtime_stage.py's, module_utils/core/_stage_steps.py's (the step of
a label) and plugins/action/harden_rollout.py's.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.action import harden_rollout
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _container_runtime_stage as stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_steps
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": ["gate", "host"]}}
# the gate's hand-over to the host step of the same step (plugin_utils/_handover.py): {"step": label, "not_started": ...}
GATE = "__stages_container_runtime_gate"
# step stages' result (gpuharden.k8s.stage_steps, tasks/stages.yml): the plan's runs, the Node name, the restarts' steps
RUNS = "__stages_run"


class ActionModule(harden_rollout.ActionModule):

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        runs = self._templar.resolve_variable_expression(RUNS) if RUNS in task_vars else None
        # the include's loop item (ansible_loop_var names its variable: Ansible's "item" unless a loop_control renames it)
        label = task_vars.get(task_vars.get("ansible_loop_var") or "item")
        try:
            step = _stage_steps.wave_step(runs, label)
        except GpuhardenError as error:
            raise AnsibleActionFail("container_runtime_wave: %s" % error.msg) from None
        waits = bool((step or {}).get("index"))
        if args["step"] == "host":
            gate = _handover.taken_over(task_vars, GATE) or {}
            if waits and gate.get("step") != label:
                raise AnsibleActionFail("container_runtime_wave: the gate of step %r did not run before the host step" % label)
            decided = stage.wave_host(step, boolean(runs.get("container_runtime"), strict=False), runs.get("node_name"),
                                      gate.get("not_started") if waits else None, task_vars.get("inventory_hostname"))
            if decided.get("failed"):
                raise AnsibleActionFail(decided["msg"])
            return dict(decided, changed=False)
        if not waits:
            return {"skipped": True, "changed": False, "not_started": {},
                    "skip_reason": "the first wave, or every node at once: nothing to wait for"}
        # harden_rollout's own wave step, as the task ``harden_rollout: {step: wave, wave: <step>}`` would run it
        self._task.args = {"step": "wave", "wave": step}
        result = super().run(tmp, task_vars)
        result["ansible_facts"] = _handover.handed_over(GATE, {"step": label, "not_started": result.get("not_started") or {}})
        return result
