# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.unharden_node: the uninstall's steps around the node files, each reading the
play's variables itself (plugins/modules/unharden_node.py documents it), so that playbooks/unharden_gpu_nodes.yml
builds no option in Jinja.

- ``lock``: take the node's run lock (gpuharden.k8s.node_lock on the node) for this run's owner; returns the owner,
  the lock's path and the Node name, and hands them over to the later steps (_unharden_run.HANDOVERS, where a lock
  that was not taken hands nothing over: there is nothing to give back).
- ``cluster``: once for the play, delegated to the controller: gpuharden.k8s.unharden_cluster for the Nodes of the
  play's hosts, or nothing where gpuharden_unharden_cluster is false (``ran``: false, with why).
- ``deferred``: in the rescue of the drained pass's budget: why it was not started (the budget's failure).
- ``failed``: in the rescue of the drained pass: which step failed, and why; the node stays in the play (a host that
  fails in a serial play's batch of one ends the whole run: ansible-core 2.19 executor/playbook_executor.py breaks out
  of the playbook when a batch failed whole), stops the rollout (step ``stopped``) and fails in the report; handed over.
- ``stopped``: once per batch of the drained pass, delegated to the controller: the Nodes of the hosts whose drained
  pass failed (the ``failed`` step's hand-over) and the fleet (unharden_rollout's fact on localhost), as the facts
  node_maintenance_stopped_by and node_maintenance_fleet of the batch's hosts, which the role's budget reads over its
  defaults (as harden_rollout step=stopped does for harden).
- ``release``: give the run lock back; ``then_fail`` fails the node after it: with the step that failed (a rescue),
  or with the report's failure (unharden_report's hand-over).
"""

from __future__ import annotations

import datetime
import random

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_run
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default, role_settings
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import readable

ARGUMENT_SPEC = {
    "step": {"type": "str", "required": True, "choices": ["lock", "cluster", "deferred", "failed", "stopped", "release"]},
    "then_fail": {"type": "str", "default": "never", "choices": ["never", "failed_step", "report"]},
}
PLAYBOOK = "unharden_gpu_nodes"
LOCK = _unharden_run.HANDOVERS["lock"]
REPORT = _unharden_run.HANDOVERS["report"]
FAILED = _unharden_run.HANDOVERS["failed"]


def setting_default(name):
    """The default of a play variable (unharden_gpu_nodes' where the playbooks differ) or of a role option."""
    if name.startswith("gpuharden_"):
        return playbook_default(name, PLAYBOOK)
    return next(entry["default"] for entry in role_settings() if entry["name"] == name)


def play_setting(templar, task_vars, name, kind=str):
    """A play variable or role option of this host, templated, else its default; a bool one read as Ansible reads one."""
    value = templar.template(task_vars[name]) if name in task_vars else setting_default(name)
    if kind is not bool:
        return value
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise AnsibleActionFail("%s is %r, not a boolean (true or false)" % (name, value)) from None


def lock_of(task_vars, host):
    """What the lock step of this host handed over: {owner, path, node}; a host whose lock step did not run, or did not
    take the lock, has none (its Node name is then the inventory's, and there is no lock to give back).  ``task_vars``:
    the host's task variables or its hostvars."""
    lock = _handover.taken_over(task_vars, LOCK)
    return lock if hasattr(lock, "get") and lock.get("owner") else {"node": _unharden_run.node_name(host, task_vars)}


def lock_outcome(lock):
    """node_lock's result under ``lock`` (None where it did not run); its failure the step's.  node_lock skips in check
    mode (it serialises changes, and there are none): the step does not, so that the run's output shows every step."""
    if lock is None:
        return {"changed": False, "lock": None}
    outcome = {"changed": bool(lock.get("changed")), "lock": readable(lock)}
    if lock.get("failed"):
        outcome.update(failed=True, msg="the node's run lock: %s" % lock.get("msg", "failed"))
    return outcome


class ActionModule(ActionBase):
    """Thin shell: read the play's variables, run the step's module, return its result."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _setting(self, task_vars, name, kind=str):
        return play_setting(self._templar, task_vars, name, kind)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("unharden_node: %s" % "; ".join(validation.error_messages))
        args = validation.validated_parameters
        step = getattr(self, "_" + args["step"])
        result.update(step(task_vars, args))
        return result

    def _lock(self, task_vars, _args):
        host = task_vars["inventory_hostname"]
        given = self._setting(task_vars, "gpuharden_run_owner")
        owner = _unharden_run.run_owner(given, datetime.datetime.now(datetime.UTC), random.randrange(1000000000))
        taken = {"owner": owner, "path": self._setting(task_vars, "gpuharden_lock_path"),
                 "node": self._templar.template(_unharden_run.node_name(host, task_vars))}
        module_args = {"owner": owner, "path": taken["path"], "timeout": int(self._setting(task_vars, "gpuharden_lock_timeout"))}
        lock = self._execute_module(module_name="gpuharden.k8s.node_lock", module_args=module_args, task_vars=task_vars)
        outcome = dict(lock_outcome(lock), **taken)
        if not outcome.get("failed"):
            outcome["ansible_facts"] = _handover.handed_over(LOCK, taken)
        return outcome

    def _cluster(self, task_vars, _args):
        if not self._setting(task_vars, "gpuharden_unharden_cluster", bool):
            return {"changed": False, "ran": False, "why": "gpuharden_unharden_cluster is false: Node labels, taints and cluster objects stay"}
        hostvars = task_vars["hostvars"]
        module_args = {
            "nodes": [lock_of(hostvars[host], host)["node"] for host in task_vars["ansible_play_hosts"]],
            "force": self._setting(task_vars, "gpuharden_unharden_force", bool),
            "remove_objects": self._setting(task_vars, "gpuharden_unharden_cluster_objects", bool),
            "namespace": self._setting(task_vars, "device_plugin_namespace"),
        }
        kubeconfig = self._setting(task_vars, "gpuharden_kubeconfig")
        if kubeconfig:
            module_args["kubeconfig"] = kubeconfig
        # on the controller's Python (the task is delegated to localhost), never the play's node Python
        cluster = self._execute_module(module_name="gpuharden.k8s.unharden_cluster", module_args=module_args,
                                       task_vars=on_controller(self._task, task_vars))
        outcome = dict(cluster, ran=True)
        if not cluster.get("failed"):
            # facts of a run_once task reach every host of the play (one batch): each report reads its Node's conflicts
            outcome["ansible_facts"] = _handover.handed_over(_unharden_run.HANDOVERS["cluster"], {"conflicts": cluster.get("conflicts") or []})
        return outcome

    def _deferred(self, task_vars, _args):
        why = (task_vars.get("ansible_failed_result") or {}).get("msg") or "the disruption budget could not be checked"
        return {"changed": False, "why": why}

    def _failed(self, task_vars, _args):
        node = lock_of(task_vars, task_vars["inventory_hostname"])["node"]
        why = _unharden_run.failure_message(node, task_vars.get("ansible_failed_task"), task_vars.get("ansible_failed_result"))
        return {"changed": False, "node": node, "why": why, "ansible_facts": _handover.handed_over(FAILED, {"node": node, "why": why})}

    def _stopped(self, task_vars, _args):
        hostvars = task_vars["hostvars"]
        stopped_by = []
        for host in task_vars["ansible_play_hosts_all"]:
            failed = _handover.taken_over(hostvars[host], FAILED)
            if failed:
                stopped_by.append(failed["node"])
        localhost = hostvars.get("localhost") or {}
        fleet = (localhost.get(_unharden_run.ROLLOUT) or {}).get("fleet") or []
        return {"changed": False, "stopped_by": stopped_by, "fleet": fleet,
                "ansible_facts": {"node_maintenance_stopped_by": stopped_by, "node_maintenance_fleet": fleet}}

    def _release(self, task_vars, args):
        host = task_vars["inventory_hostname"]
        lock = lock_of(task_vars, host)
        released = None
        if lock.get("owner"):
            released = self._execute_module(module_name="gpuharden.k8s.node_lock", task_vars=task_vars,
                                            module_args={"owner": lock["owner"], "path": lock["path"], "state": "released"})
        outcome = dict(lock_outcome(released), node=lock["node"])
        if outcome.get("failed"):
            return outcome
        failure = None
        if args["then_fail"] == "failed_step":
            failure = _unharden_run.failure_message(lock["node"], task_vars.get("ansible_failed_task"), task_vars.get("ansible_failed_result"))
        elif args["then_fail"] == "report":
            failure = (_handover.taken_over(task_vars, REPORT) or {}).get("failure")
        if failure:
            outcome.update(failed=True, msg=failure)
        return outcome
