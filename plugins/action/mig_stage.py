# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.mig_stage: the node-side steps of the MIG stage's apply (roles/mig/tasks/apply.yml), each one
task that decides for itself whether it runs, from the role's variables and what the steps before it registered.

- ``apply``: where the plan (``__mig_plan``) is disruptive, gpuharden.k8s.mig_layout applies the layout; a mode change
  left pending (a busy GPU) fails the host where mig_reset_method is none (outside check mode), else the result says
  how the reset is done (``reset``: the command, ``reboot``: the role's reboot task).
- ``reset``: runs mig_reset_command (templated with those bus ids) through ansible.legacy.command, where the apply left
  a mode change pending and mig_reset_method is command; not in check mode.
- ``reapply``: where a reset ran (command or reboot; not in check mode), mig_layout again, failing the host when the
  mode change is still pending; returns ``mig_result`` (the last of re-apply, apply and plan that ran: the role publishes
  it) and says in ``follow_up`` whether the device nodes are made again and the device plugin pods restarted (the layout
  changed; not the device nodes where the run skips the device_permissions tag).

A step with nothing to do is skipped with its reason (``apply``, ``reset``) or, for ``reapply`` (which publishes
mig_result), ends unchanged with it.  Upstream: the reset is NVIDIA's (nvidia-smi -r; NVML nvmlDeviceSetMigMode leaves
the mode pending while processes use the GPU); the follow-ups are explained in roles/mig/tasks/apply.yml.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.action.node_stages import run_tags
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction

MIG_LAYOUT = "gpuharden.k8s.mig_layout"
COMMAND = "ansible.legacy.command"
ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": ["apply", "reset", "reapply"]}}
NOT_PLANNED = "the plan changes nothing (the layout holds, or the GPU Operator's MIG manager owns it): nothing to apply"


def decide_apply(plan, reset_method, check_mode, run_mig_layout):
    """The apply step's result.  Raises GpuhardenError where a pending mode change has no reset configured."""
    if not plan.get("disruptive"):
        return {"skipped": True, "changed": False, "reset": False, "reboot": False, "skip_reason": NOT_PLANNED}
    result = run_mig_layout()
    if result.get("failed"):
        return result
    gpus = list(result.get("gpus_to_reset") or [])
    if gpus and reset_method == "none" and not check_mode:
        raise GpuhardenError("MIG mode change pending on %s: reset these GPUs (nvidia-smi -r -i ...) or reboot, then run again "
                             "(mig_reset_method is none)." % ", ".join(gpus), changed=bool(result.get("changed")))
    return dict(result, reset=bool(gpus) and reset_method == "command", reboot=bool(gpus) and reset_method == "reboot")


def decide_reset(applied, check_mode, reset_command, run_command):
    """The reset step's result: the command's (always a change), or skipped with the reason."""
    if not applied.get("reset"):
        return {"skipped": True, "changed": False, "skip_reason": "no mode change waits for a reset by mig_reset_command"}
    if check_mode:
        return {"skipped": True, "changed": False,
                "skip_reason": "check mode: %s would reset %s" % (" ".join(reset_command), ", ".join(applied.get("gpus_to_reset") or []))}
    return dict(run_command(reset_command), changed=True)


def decide_reapply(plan, applied, check_mode, wants_device_nodes, restart_device_plugin, run_mig_layout):
    """The re-apply step's result, with ``mig_result`` (the last of re-apply, apply and plan that ran) and ``follow_up``."""
    reset_done = bool(applied.get("reset") or applied.get("reboot")) and not check_mode
    if reset_done:
        result = run_mig_layout()
        if result.get("failed"):
            return result
        if result.get("reset_required"):
            raise GpuhardenError("MIG mode change still pending after the reset on %s" % ", ".join(result.get("gpus_to_reset") or []),
                                 changed=bool(result.get("changed")))
    else:
        result = {"changed": False, "msg": "no reset ran: nothing to apply again"}
    applied_ran = not applied.get("skipped")
    layout_changed = bool(result.get("changed")) or (applied_ran and bool(applied.get("changed")))
    published = dict(result) if reset_done else (applied if applied_ran else plan)
    return dict(result, mig_result=published,
                follow_up={"device_nodes": layout_changed and wants_device_nodes, "restart_device_plugin": layout_changed and restart_device_plugin})


class ActionModule(StageAction):
    NAME = "mig_stage"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def decide_task(self, args, task_vars):
        check_mode = bool(self._task.check_mode)
        if args["step"] == "apply":
            return decide_apply(self.variable("__mig_plan"), self.variable("mig_reset_method"), check_mode, lambda: self._mig_layout(task_vars))
        applied = self.variable("__mig_apply")
        if args["step"] == "reset":
            # mig_reset_command's default names the bus ids (mig_gpus_to_reset): those the apply left pending
            command = self.variable("mig_reset_command", task_vars, mig_gpus_to_reset=applied.get("gpus_to_reset") or []) if applied.get("reset") else []
            return decide_reset(applied, check_mode, [str(word) for word in command], lambda argv: self._command(argv, task_vars))
        skipped_tags = run_tags(task_vars)[1]
        return decide_reapply(self.variable("__mig_plan"), applied, check_mode, "device_permissions" not in skipped_tags,
                              boolean(self.variable("mig_restart_device_plugin"), strict=False), lambda: self._mig_layout(task_vars))

    def _mig_layout(self, task_vars):
        return self.run_module(MIG_LAYOUT, self.variable("__mig_module_options"), task_vars)

    def _command(self, argv, task_vars):
        result = self.run_module(COMMAND, {"argv": argv}, task_vars)
        if result.get("failed") or result.get("rc"):
            why = (result.get("stderr") or result.get("msg") or "").strip()
            raise GpuhardenError("mig_reset_command %s failed (rc %s): %s" % (argv, result.get("rc"), why),
                                 rc=result.get("rc"), stdout=result.get("stdout", ""), stderr=result.get("stderr", ""), changed=True)
        return result
