# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.postcheck_step: one step of the post-check role (roles/postcheck/tasks/main.yml).

A thin shell over the pure planner plugins/module_utils/core/_postcheck_plan.py: it reads the role's ``postcheck_*``
variables as the role's tasks see them, runs the modules the planner names through ``_execute_module`` (over the
task's connection: the node for ``step=node``, the controller for the other steps, which the role delegates to
localhost, on the controller's Python: postcheck_controller_python), and returns what the planner makes of their
results.  Check mode passes to every module as the task has it, except kubelet_config, which only reads here and always
runs in check mode.

The steps hand their results on by the names the role registers them under (NODE_READ, VERDICT), or, for the cluster
step run once for the batch, as a hand-over of this run to every host of the batch (CLUSTER,
plugins/plugin_utils/_handover.py); the steps after read them themselves: ``cluster`` every node read of the play's
batch, ``verdict`` this host's node read and the batch's cluster result, ``fail`` and ``report`` the verdict: ``fail``
fails the host on the verdict's failure, ``report`` shows a check run's report (as ansible.builtin.debug shows a
message); each is skipped where the verdict says neither.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _postcheck_plan as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import UNDEFINED
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import role_setting

# Keys of a module's result that are Ansible's bookkeeping, not the module's data.
BOOKKEEPING = ("invocation", "changed", "warnings", "deprecations", "_ansible_no_log", "_ansible_verbose_always", "_ansible_parsed")
ARGUMENT_SPEC = {
    "step": {"type": "str", "required": True, "choices": ["preflight", "node", "cluster", "verdict", "fail", "report"]},
    # each left out: read from what the step before registered (roles/postcheck/tasks/main.yml)
    "node_reads": {"type": "list", "elements": "raw"},
    "node_read": {"type": "dict"},
    "cluster": {"type": "dict"},
}
# The names roles/postcheck/tasks/main.yml registers the steps' results under (NODE_READ: harden_gpu_nodes.yml reads its
# lock too; VERDICT: the role's published result, postcheck_result).
NODE_READ = "__postcheck_node_read"
VERDICT = "postcheck_result"
# The cluster step's hand-over to the verdict step of every host of the batch (run_once's facts reach them all).
CLUSTER = "__postcheck_cluster"


def _data(result):
    return {key: value for key, value in (result or {}).items() if key not in BOOKKEEPING}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _settings(self, names):
        """The role's variables, templated as a task of the role templates them."""
        settings = {name: role_setting(self._templar, name) for name in names}
        undefined = [name for name, value in settings.items() if value is UNDEFINED]
        if undefined:
            raise AnsibleUndefinedVariable("%s undefined: import the role gpuharden.k8s.postcheck" % ", ".join(undefined))
        return settings

    def _module(self, name, args, task_vars, check_mode=None, python=None):
        """One module run over the task's connection; check_mode overrides the task's (kubelet_config only reads);
        ``python``: the controller's, for a module of a step delegated to localhost."""
        if python is not None:
            task_vars = on_controller(self._task, task_vars, python)
        saved = self._task.check_mode
        if check_mode is not None:
            self._task.check_mode = check_mode
        try:
            result = self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        finally:
            self._task.check_mode = saved
        self._warnings.extend(result.get("warnings") or [])
        return result

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        self._warnings = []
        step = args["step"]
        if step == "preflight":
            problems = plan.preflight_problems(self._settings(plan.PREFLIGHT_SETTINGS))
            if problems:
                raise AnsibleActionFail(" ".join(" ".join(problems).split()))
            result.update(changed=False, msg="the post-check's variables are consistent")
        elif step == "node":
            result.update(self._node(task_vars))
        elif step == "cluster":
            node_reads = args["node_reads"]
            if node_reads is None:
                hostvars = task_vars.get("hostvars") or {}
                node_reads = [hostvars[host].get(NODE_READ) for host in task_vars.get("ansible_play_batch") or [] if host in hostvars]
            cluster = self._cluster(node_reads, task_vars)
            result.update(cluster, ansible_facts=_handover.handed_over(CLUSTER, cluster))
        elif step == "verdict":
            node_read = args["node_read"] if args["node_read"] is not None else task_vars.get(NODE_READ)
            cluster = args["cluster"] if args["cluster"] is not None else _handover.taken_over(task_vars, CLUSTER)
            result.update(self._verdict(node_read, cluster, task_vars))
        else:
            result.update(plan.judged(task_vars.get(VERDICT), step))
        if self._warnings:
            result["warnings"] = result.get("warnings", []) + self._warnings
        return result

    def _node(self, task_vars):
        settings = self._settings(plan.NODE_SETTINGS)  # step=preflight checked them first (tasks/preflight.yml)
        read, ran, lock = settings["postcheck_node_audit"] or {}, [], None
        audit_args = plan.node_audit_args(settings)
        if audit_args is not None:
            audited = self._module("gpuharden.k8s.node_audit", audit_args, task_vars)
            ran.append("gpuharden.k8s.node_audit")
            lock = audited.get("lock")
            if audited.get("failed"):
                return dict(_data(audited), failed=True, lock=lock, modules=ran)
            read = _data(audited)
        reuse = plan.reused(read)
        reads = {}
        for name, options in plan.remaining_reads(settings, reuse).items():
            if name == "gpuharden.k8s.process_cgroup_info":
                options = plan.process_cgroup_args(reads.get("gpuharden.k8s.nvml_check"))
            kubelet = name == "gpuharden.k8s.kubelet_config"
            done = self._module(name, options, task_vars, check_mode=True if kubelet else None)
            ran.append(name)
            if done.get("failed") and not kubelet:  # a kubelet that cannot be read leaves the policies to the kubelet's defaults
                return {"failed": True, "msg": "%s: %s" % (name, done.get("msg", "failed")), "lock": lock, "modules": ran}
            reads[name] = {} if done.get("failed") else _data(done)
        part = plan.node_part(settings, read, reuse, reads)
        outcome = dict(part, changed=False, modules=ran)
        if lock is not None:
            outcome["lock"] = lock
        if not ran:
            # the run's audit read everything: no trip to the node
            outcome.update(skipped=True, skip_reason="this run's node audit (postcheck_node_audit) already read the node")
        return outcome

    def _controller_python(self, task_vars):
        python = self._settings(("postcheck_controller_python",))["postcheck_controller_python"]
        return python or task_vars.get("ansible_playbook_python") or ""

    def _cluster(self, node_reads, task_vars):
        settings = self._settings(plan.CLUSTER_SETTINGS)
        module, options = plan.cluster_call(settings, node_reads)
        if module is None:
            return dict(plan.weighed(None, None), changed=False, ran=None)
        done = self._module(module, options, task_vars, python=self._controller_python(task_vars))
        if done.get("failed") and module == "gpuharden.k8s.gpu_consistency":
            raise AnsibleActionFail("%s: %s" % (module, done.get("msg", "failed")))
        return dict(plan.weighed(module, done), changed=False, ran=module)

    def _verdict(self, node_read, cluster, task_vars):
        settings = self._settings(plan.VERDICT_SETTINGS)
        alone = None
        options = plan.topology_alone_args(settings, node_read, cluster)
        if options is not None:
            done = self._module("gpuharden.k8s.topology_check", options, task_vars, python=self._controller_python(task_vars))
            if done.get("failed"):
                raise AnsibleActionFail("gpuharden.k8s.topology_check: %s" % done.get("msg", "failed"))
            alone = _data(done)
        topology = plan.node_topology(settings, cluster, alone)
        findings = plan.node_findings(settings, node_read, cluster, topology)
        unchecked = plan.not_checked(settings, cluster)
        for part in unchecked:
            self._display.warning("postcheck of %s could not check %s: %s" % (settings["postcheck_node_name"], part["what"], part["cause"]))
        decided = plan.verdict(settings, findings, self._task.check_mode, unchecked)
        return dict(decided, changed=False, findings=findings, not_checked=unchecked, nvml=(node_read or {}).get("nvml"), topology=topology,
                    workloads_error=(cluster or {}).get("workloads_error"),
                    # the run's statistics (what ansible.builtin.set_stats with aggregate does): every host's findings
                    ansible_stats={"data": {plan.FINDINGS_STAT: findings}, "per_host": False, "aggregate": True})
