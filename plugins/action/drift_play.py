# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.drift_play: drift_check.yml's decisions, one task each (issue 45 items 1 and 7).

A thin shell over the pure planner plugins/module_utils/audit/_drift_play.py: it reads the play's variables (the
roles' options, the gpuharden_* settings, the hosts' plans from hostvars), lets the planner decide, and runs the
cluster-side modules it names through ``_execute_module`` with their controller Python.

- ``step=start`` (run once, before the audits): each host's Node name, the play's nodes, node_audit's lock option and
  whether the plan's LIST of pods is kept for the consistency check.  Contacts no host.  Handed over to every host
  (START, a run_once task's facts): node_plan_pods takes the nodes and the snapshot, node_stages the lock (where the
  importing task's __node_plan leaves them out), step cluster the Node names.
- ``step=cluster`` (run once, delegated to localhost, after the audits): the consistency check (gpu_consistency, with
  the RuntimeClass dry run folded in where both use the same identity and Python) and the RuntimeClass dry run by
  itself where that run did not check it.  Under ``gpuharden drift`` (gpuharden_drift_cluster_in_process) the
  consistency check's options and the node reports are handed over instead, and the CLI runs the same check itself.
  The consistency check's result is handed over to each host's verdict (plugins/plugin_utils/_handover.py, CLUSTER).
- ``step=verdict`` (each host, a second play): the host's run data, as the run's stats (gpuharden_drift, aggregated),
  and why it fails (``failure``, handed over to step ``fail``: VERDICT).  It never fails itself: ansible-core records
  stats only from a successful result.
- ``step=fail`` (each host, after the verdict): fails the host with its verdict's ``failure``, where there is one, and
  is skipped where there is none, so the verdict's result (with the run's stats) stays the host's last reported one:
  callbacks that keep one result per host (ansible.builtin.tree, AWX's host summary) read the findings there.
"""

from __future__ import annotations

import datetime
import random

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.action import node_plan_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _drift_play as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _node_lock
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import UNDEFINED
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import role_setting, run_module_in_mode

ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": ["start", "cluster", "verdict", "fail"]}}
NODE_NAME = "gpuharden_k8s_node_name"
# Each host's plan (tasks/node_stages.yml, registered), which step cluster reads.
NODE_PLAN = "gpuharden_node_plan"
# What one step hands over to a later one (plugins/plugin_utils/_handover.py): step start's decisions ({node_names,
# nodes, lock, pods_snapshot}: every host, a run_once task's facts) to node_plan_pods, node_stages and step cluster;
# the plan's LIST of pods, node_plan_pods' (tasks/node_plan_inputs.yml), to step cluster; step cluster's consistency
# check ({consistency}: every host) to step verdict; step verdict's {failure} to step fail.
START = plan.START_HANDOVER
GPU_PODS = node_plan_pods.LISTED
CLUSTER = "__drift_cluster"
VERDICT = "__drift_verdict"
RUN_DATA_STAT = "gpuharden_drift"
BOOKKEEPING = ("invocation", "changed", "_ansible_no_log", "_ansible_verbose_always", "_ansible_parsed")


def _data(result):
    return {key: value for key, value in (result or {}).items() if key not in BOOKKEEPING}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def _settings(self, names, task_vars):
        """The play's variables, templated as a task templates them; one undefined is None."""
        settings = {name: role_setting(self._templar, name, task_vars) for name in names}
        return {name: None if value is UNDEFINED else value for name, value in settings.items()}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            decided = getattr(self, "_" + args["step"])(task_vars)
        except GpuhardenError as error:
            raise AnsibleActionFail("drift_play: %s" % error) from None
        result.update(decided, changed=False)
        return result

    def _fail(self, task_vars):
        verdict = _handover.taken_over(task_vars, VERDICT)
        if verdict is None:
            raise GpuhardenError("step fail runs after step verdict, in the same run (it hands over %s)" % VERDICT)
        failure = verdict.get("failure") or ""
        if failure:
            return {"failed": True, "msg": failure}
        return {"skipped": True, "skip_reason": "no finding at or above the fail severity, every check ran"}

    def _start(self, task_vars):
        hostvars = task_vars.get("hostvars") or {}
        play_hosts = list(task_vars.get("ansible_play_hosts") or [])
        named = {}
        for host in play_hosts:
            # a variable merge per host, once for the play
            name = hostvars[host].get(NODE_NAME)
            if name is not None:
                named[host] = name
        try:
            controller = _node_lock.controller_identity()
        except (OSError, ValueError, IndexError) as error:
            raise AnsibleActionFail("drift_play: cannot read this controller's processes in /proc: %s" % error) from None
        owner = plan.made_up_owner(datetime.datetime.now(datetime.UTC), random.randrange(1000000000))  # noqa: S311 (a name, no secret)
        started = plan.start(self._settings(plan.START_SETTINGS, task_vars), play_hosts, named, controller, owner)
        return dict(started, ansible_facts=_handover.handed_over(START, started))

    def _cluster(self, task_vars):
        settings = self._settings(plan.CLUSTER_SETTINGS, task_vars)
        hostvars = task_vars.get("hostvars") or {}
        play_hosts = list(task_vars.get("ansible_play_hosts") or [])
        names = (_handover.taken_over(task_vars, START) or {}).get("node_names") or {}
        plans = [hostvars[host].get(NODE_PLAN) or {} for host in play_hosts]
        pods = _handover.taken_over(task_vars, GPU_PODS) or {}
        decided = plan.cluster_plan(settings, [names.get(host, host) for host in play_hosts], plans, pods.get("pods_snapshot"))
        outcome, retries = {"consistency": None, "consistency_options": None, "node_reports": None, "runtime_class": None}, 0
        options = decided["consistency"]
        if options is not None:
            # the identity the check used (the drift report's credential), both ways
            outcome["consistency_identity"] = {"kubeconfig": options["kubeconfig"], "context": options["context"]}
            if decided["in_process"]:
                outcome.update(consistency_options=options, node_reports=decided["node_reports"])
            else:
                done = self._module("gpuharden.k8s.gpu_consistency", dict(plan.module_args(options), node_reports=decided["node_reports"]),
                                    task_vars, settings["postcheck_controller_python"])
                retries += done.get("api_retries") or 0
                outcome["consistency"] = _data(done)
        if plan.runtime_class_alone(decided, outcome["consistency"]):
            done = self._module("gpuharden.k8s.runtime_class", decided["runtime_class"], task_vars, settings["runtime_class_controller_python"],
                                check_mode=True)
            retries += done.get("api_retries") or 0
            outcome["runtime_class"] = _data(done)
        outcome["api_retries"] = retries
        outcome["ansible_facts"] = _handover.handed_over(CLUSTER, {"consistency": outcome["consistency"]})
        return outcome

    def _verdict(self, task_vars):
        settings = self._settings(plan.VERDICT_SETTINGS, task_vars)
        cluster = _handover.taken_over(task_vars, CLUSTER) or {}
        decided = plan.verdict(settings, task_vars.get(NODE_PLAN), cluster.get("consistency"))
        host = task_vars["inventory_hostname"]
        return dict(decided, ansible_stats={"data": {RUN_DATA_STAT: {host: decided["run_data"]}}, "per_host": False, "aggregate": True},
                    ansible_facts=_handover.handed_over(VERDICT, {"failure": decided.get("failure") or ""}))

    def _module(self, name, module_args, task_vars, python, check_mode=None):
        """One cluster-side module run on the controller, with ``python`` (the role's controller Python) as its
        interpreter, and ``check_mode`` instead of the task's where given.  A module that fails is its result."""
        # never the play's node Python (vars/node_python.yml): the role's controller Python, else the playbook's
        return run_module_in_mode(self, name, module_args, on_controller(self._task, task_vars, python), check_mode)
