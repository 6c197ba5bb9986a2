# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.harden_node: harden_gpu_nodes.yml's steps around the stages, for one node, each reading the
play's variables itself (module_utils/core/_harden_run.py decides; plugins/modules/harden_node.py documents it), so
that the playbook builds no message or condition in Jinja.

- ``start`` (first play): name the run for the node's run lock: its owner (gpuharden_run_owner, else a new name), the
  Node (gpuharden_k8s_node_name, else the inventory name) and this run's ansible-playbook process, as facts of the host.
- ``verdict``: fail the node where the run decided so (``of``: restarts, cordons, failed, deferred).
- ``rescue`` (first play): give the failed node's run lock back, and fail the node with the step that failed.
- ``deferred`` / ``failed`` (second play's rescues): hand over why the node's draining step was not started, or which
  one failed (plugin_utils/_handover.py, stamped with this run: a fact cache's from an earlier run counts for nothing;
  ``failed`` also reports it in the run's stats), without failing the host there.
- ``draining`` (second play): which draining steps run on the node (none where the budget deferred it).
- ``release`` (last play): give the node's run lock back, unless the plan's audit or the post-check's read did.
- ``targeted`` (the run's end): fail a run whose first play matched no host.
"""

from __future__ import annotations

import datetime
import random

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run as run
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _node_lock
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import readable

ARGUMENT_SPEC = {
    "step": {"type": "str", "required": True,
             "choices": ["start", "verdict", "rescue", "deferred", "failed", "draining", "release", "targeted"]},
    "of": {"type": "str", "choices": ["restarts", "cordons", "failed", "deferred"]},
}


class ActionModule(ActionBase):
    """Thin shell: read the play's variables, run node_lock where the step gives the lock back, return the result."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("harden_node: %s" % "; ".join(validation.error_messages))
        args = validation.validated_parameters
        if (args["step"] == "verdict") != (args["of"] is not None):
            raise AnsibleActionFail("harden_node: of is %r: step=verdict needs it (restarts, cordons, failed or deferred), the other steps take none"
                                    % args["of"])
        result["changed"] = False
        result.update(getattr(self, "_" + args["step"])(task_vars, args))
        return result

    def _variable(self, task_vars, name, default=None):
        """A play variable of this host, templated, else ``default``."""
        return self._templar.template(task_vars[name]) if name in task_vars else default

    def _fact(self, task_vars, name):
        """A fact an earlier step set on this host (run.fact: injected as a variable or not), templated."""
        return self._templar.template(run.fact(task_vars, name))

    def _start(self, task_vars, _args):
        host = task_vars["inventory_hostname"]
        owner = run.run_owner(self._variable(task_vars, "gpuharden_run_owner"), datetime.datetime.now(datetime.UTC),
                              random.randrange(1000000000))
        try:
            # recorded in the lock: a later run from this controller takes it over at once once this process has
            # ended (Ctrl-C), instead of waiting for the lock's stale_after (core/_node_lock.py)
            controller = _node_lock.controller_identity()
        except (OSError, ValueError, IndexError) as error:
            raise AnsibleActionFail("harden_node: cannot read this controller's processes in /proc: %s" % error) from None
        facts = {run.NODE: self._variable(task_vars, "gpuharden_k8s_node_name") or host, run.OWNER: owner, run.CONTROLLER: controller}
        return {"ansible_facts": facts, "node": facts[run.NODE], "owner": owner}

    def _verdict(self, task_vars, args):
        host = task_vars["inventory_hostname"]
        localhost = (task_vars.get("hostvars") or {}).get("localhost") or {}
        names = {"failed": (run.DEFERRED, run.FAILED), "deferred": (run.DEFERRED, run.FAILED), "restarts": (run.RESTARTS,)}.get(args["of"], ())
        handed = {name: _handover.taken_over(task_vars, name) for name in names}
        why = run.verdict(args["of"], host, task_vars, localhost, handed)
        return {"failed": True, "msg": why} if why else {}

    def _lock_module_args(self, task_vars):
        return {"owner": self._fact(task_vars, run.OWNER),
                "path": self._variable(task_vars, "gpuharden_lock_path", playbook_default("gpuharden_lock_path")), "state": "released"}

    def _give_back(self, task_vars):
        """node_lock state=released on the node for this run's owner: its result, the failure the step's."""
        module_args = self._lock_module_args(task_vars)
        released = self._execute_module(module_name="gpuharden.k8s.node_lock", module_args=module_args, task_vars=task_vars)
        outcome = {"changed": bool(released.get("changed")), "lock": readable(released)}
        if released.get("failed"):
            outcome.update(failed=True, msg="giving the node's run lock back failed: %s" % released.get("msg", "failed"))
        return outcome

    def _rescue(self, task_vars, _args):
        outcome = self._give_back(task_vars) if self._fact(task_vars, run.OWNER) else {"lock": None}
        if not outcome.get("failed"):
            outcome.update(failed=True, msg=run.failure_message(task_vars.get("ansible_failed_task"), task_vars.get("ansible_failed_result"), "a stage"))
        return outcome

    def _deferred(self, task_vars, _args):
        why = (task_vars.get("ansible_failed_result") or {}).get("msg") or "the disruption budget could not be checked"
        return {"why": why, "ansible_facts": _handover.handed_over(run.DEFERRED, why)}

    def _failed(self, task_vars, _args):
        host = task_vars["inventory_hostname"]
        why = run.failure_message(task_vars.get("ansible_failed_task"), task_vars.get("ansible_failed_result"), "a disruptive step")
        node = self._fact(task_vars, run.NODE) or host
        return {"node": node, "why": why, "ansible_facts": _handover.handed_over(run.FAILED, why),
                "ansible_stats": {"data": {run.ROLLOUT_FAILED_STAT: {host: {"node": node, "reason": why}}}, "per_host": False, "aggregate": True}}

    def _draining(self, task_vars, _args):
        # each plan's hand-over of this run (None: that plan did not run in this run)
        handed = {stage: _handover.taken_over(task_vars, name) for stage, name in run.DRAINING_PLANS.items()}
        planned = {stage: None if value is None else boolean(value, strict=False) for stage, value in handed.items()}
        steps = run.draining_steps(_handover.taken_over(task_vars, run.DEFERRED), planned)
        # every cordon of the rollout records this run (node_maintenance's record, annotation gpuharden.io/cordon): the
        # drift check names one an interrupted run left, and the next harden releases or resumes it
        return dict(steps, ansible_facts={"node_maintenance_owner": self._fact(task_vars, run.OWNER)})

    def _release(self, task_vars, _args):
        if not self._fact(task_vars, run.OWNER) or not run.lock_still_held(
                self._variable(task_vars, "gpuharden_node_plan"), self._variable(task_vars, run.POSTCHECK_READ)):
            return {"skipped": True, "skip_reason": "the plan's audit or the post-check's read gave the node's run lock back"}
        return self._give_back(task_vars)

    def _targeted(self, task_vars, _args):
        hostvars = task_vars.get("hostvars") or {}
        try:
            this_run = run.run_identity(_node_lock.controller_identity())
        except (OSError, ValueError, IndexError) as error:
            raise AnsibleActionFail("harden_node: cannot read this controller's processes in /proc: %s" % error) from None
        # a host of the first play was named by step start in this run; the hosts of this play are every host within --limit
        if any(run.same_run(hostvars[host], this_run) for host in task_vars.get("ansible_play_hosts_all", [])):
            return {"skipped": True, "skip_reason": "the first play had GPU nodes to harden"}
        target = self._variable(task_vars, "gpuharden_target_hosts", playbook_default("gpuharden_target_hosts"))
        return {"failed": True, "msg": run.no_target_message(target, task_vars.get("ansible_limit"))}
