# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.node_stages: the stage engine, one task per node.

In one task it runs node_audit on the node (one module run: every node-side check, the GPU facts, the node's run
lock), plans the node's stages (module_utils/core/_stage_plan.py: which run, in which order, which are left out and
why), and runs the stages the engine owns through their node modules, in the stages' order, with the task's check mode
and diff.  The stages the play still runs (the containerd restarts' waves across the hosts, the kubelet's and MIG's
plans and drains, the cluster-side stages once for the play) are returned in the plan for the play's includes.

Stage selection by tag: the task carries the tag "always" and the plan leaves out each stage the run's --tags and
--skip-tags would leave out (ansible.context.CLIARGS, Ansible's own rule: _stage_plan.tag_selected), so --tags
device_permissions still runs only that stage.

The result is node_audit's (what playbooks read as gpuharden_node_plan: checks, summary, lock, gpu_operator and the
GPU facts) with the plan, each stage's result, the aggregated diff and ``changed`` when a stage changed something.
"""

from __future__ import annotations

from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpuharden.k8s.plugins.action import node_plan_pods
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _drift_play
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run, _stage_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

display = Display()

ARGUMENT_SPEC = {
    # each None: the play's variable below
    "node_name": {"type": "str"},
    "audit": {"type": "dict", "default": {}},
    # node_audit's options built from the play's variables (the roles' <role>_audit_options, the plan's LIST of the
    # GPU pods, gpuharden_operator_takeover: _stage_plan.audit_options); an option given in audit wins
    "audit_from_play": {"type": "list", "elements": "str", "default": [], "choices": list(_stage_plan.PLAY_AUDIT_OPTIONS)},
    "stages": {"type": "dict", "default": {}},
    "skip_compliant": {"type": "bool"},
    "allow_non_gpu_nodes": {"type": "bool"},
    # false: plan only (drift_check.yml, audit_node.yml: the same audit and plan, no stage runs)
    "run_stages": {"type": "bool", "default": True},
    # the node's run lock, taken by the audit (its lock option, built here: none in check mode); path and timeout
    # default to the play's gpuharden_lock_path and gpuharden_lock_timeout
    # owner (and controller) left out: this harden run's, named by harden_node step=start as facts of the host
    "lock": {"type": "dict", "options": {
        "owner": {"type": "str"},
        "controller": {"type": "dict"},
        "path": {"type": "str"},
        "timeout": {"type": "int"},
        "hold": {"type": "bool", "default": False},
        # give the lock back in the audit's run on a compliant node where nothing cluster-side will touch it either
        # (_stage_plan.nothing_cluster_side, from the play's variables)
        "release_if_nothing_cluster_side": {"type": "bool", "default": False},
    }},
}
# option: (the play's variable it defaults to, that variable's default)
PLAY_DEFAULTS = {
    "node_name": ("gpuharden_k8s_node_name", None),
    "skip_compliant": ("gpuharden_skip_compliant_stages", playbook_default("gpuharden_skip_compliant_stages")),
    "allow_non_gpu_nodes": ("gpuharden_allow_non_gpu_nodes", playbook_default("gpuharden_allow_non_gpu_nodes")),
}
# lock option: (the play's variable it defaults to, that variable's default: module_utils/core/_node_lock.py's path)
# The settings table's defaults; the lock timeout is harden's and bootstrap's (drift_check.yml gives its shorter one).
LOCK_DEFAULTS = {"path": ("gpuharden_lock_path", playbook_default("gpuharden_lock_path")),
                 "timeout": ("gpuharden_lock_timeout", playbook_default("gpuharden_lock_timeout", "harden_gpu_nodes"))}
# the plan's one LIST of the batch (tasks/node_plan_inputs.yml), with its dry run of the device plugin stage: node_plan_pods'
# hand-over (plugins/plugin_utils/_handover.py), this run's only
GPU_PODS = node_plan_pods.LISTED
# the importing task's one mapping (playbooks/tasks/node_stages.yml): {node, facts, lock} are this task's node_name,
# audit.facts and lock where the task leaves them out; {nodes, pods_snapshot, dry_runs} are node_plan_pods'.  Where it
# leaves lock out, the lock drift_play step=start handed over (drift_check.yml; _drift_play.START_HANDOVER) is taken.
PLAN_INPUT = "__node_plan"
PLAN_INPUT_KEYS = ("node", "facts", "lock", "nodes", "pods_snapshot", "dry_runs")
# each engine stage's result keys kept in the task's result (the whole module result stays under result)
STAGE_KEYS = ("changed", "failed", "msg", "refused", "not_checked", "warnings")


def run_tags(task_vars):
    """The run's --tags and --skip-tags: ansible-playbook's CLI arguments, else the play's magic variables."""
    only = context.CLIARGS.get("tags") or task_vars.get("ansible_run_tags") or ("all",)
    skip = context.CLIARGS.get("skip_tags") or task_vars.get("ansible_skip_tags") or ()
    return tuple(only), tuple(skip)


def stage_options(stage, options, audit):
    """A stage module's options: the role's, with the GPU Operator reading the audit took for this node (the role
    templates its options before the plan exists, so only its takeover list is its own)."""
    options = dict(options)
    if "gpu_operator" in options and audit.get("gpu_operator") is not None:
        takeover = (options.get("gpu_operator") or {}).get("takeover", [])
        options["gpu_operator"] = dict(audit["gpu_operator"], takeover=takeover)
    return options


def diffs(result):
    diff = result.get("diff")
    if not diff:
        return []
    return list(diff) if isinstance(diff, list) else [diff]


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def _module(self, name, args, task_vars, check_mode=None):
        """One node module run; check_mode overrides the task's (the audit reads in check mode too, and takes the lock)."""
        saved = self._task.check_mode
        if check_mode is not None:
            self._task.check_mode = check_mode
        try:
            return self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        finally:
            self._task.check_mode = saved

    def _task_args(self, task_vars):
        """The task's arguments, with what it leaves out taken from the importing task's __node_plan, validated."""
        args = dict(self._task.args)
        given = self._templar.template(task_vars[PLAN_INPUT]) if PLAN_INPUT in task_vars else {}
        if not isinstance(given, dict) or not set(given) <= set(PLAN_INPUT_KEYS):
            raise AnsibleActionFail("node_stages: __node_plan must be a mapping of %s, not %r" % (", ".join(PLAN_INPUT_KEYS), given))
        if PLAN_INPUT in task_vars and "lock" not in given and args.get("lock") is None:
            started = _handover.taken_over(task_vars, _drift_play.START_HANDOVER)
            if hasattr(started, "get") and started.get("lock") is not None:
                given = dict(given, lock=started["lock"])
        for option, key in (("node_name", "node"), ("lock", "lock")):
            if args.get(option) is None and given.get(key) is not None:
                args[option] = given[key]
        if given.get("facts") is not None and "facts" not in (args.get("audit") or {}):
            args["audit"] = dict(args.get("audit") or {}, facts=boolean(given["facts"], strict=False))
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(args)
        if validation.error_messages:
            raise AnsibleActionFail("node_stages: %s" % "; ".join(validation.error_messages))
        return validation.validated_parameters

    def _play_variable(self, task_vars, name, default):
        if name not in task_vars:
            return default
        value = self._templar.template(task_vars[name])
        return boolean(value, strict=False) if isinstance(default, bool) else value

    def _audit_lock(self, lock, skip_compliant, task_vars):
        """node_audit's lock option from the task's plain one: none in check mode (it changes nothing that needs
        serialising, and node_lock could not give a lock taken there back)."""
        if lock is None or self._task.check_mode:
            return None
        owner, controller = lock["owner"], lock["controller"]
        if owner is None:
            # harden_gpu_nodes.yml's lock: the run harden_node step=start named on this host (tags always, before the plan)
            owner = self._templar.template(_harden_run.fact(task_vars, _harden_run.OWNER))
            if not owner:
                raise AnsibleActionFail("node_stages: lock.owner is not given and harden_node step=start did not name this run on %s "
                                        "(give lock.owner, or run that step first)" % task_vars.get("inventory_hostname"))
            if controller is None:
                controller = self._templar.template(_harden_run.fact(task_vars, _harden_run.CONTROLLER))
        audit_lock = {"owner": owner, "hold": lock["hold"]}
        for option, (variable, default) in LOCK_DEFAULTS.items():
            value = lock[option] if lock[option] is not None else self._play_variable(task_vars, variable, default)
            audit_lock[option] = int(value) if option == "timeout" else value
        if controller is not None:
            audit_lock["controller"] = controller
        if lock["release_if_nothing_cluster_side"]:
            gpu_pods = _handover.taken_over(task_vars, GPU_PODS) or {}
            audit_lock["release_if_compliant"] = _stage_plan.nothing_cluster_side(
                skip_compliant=skip_compliant, gpu_node_set="gpuharden_gpu_node" in task_vars,
                whole_play=len(task_vars.get("ansible_play_batch", ())) == len(task_vars.get("ansible_play_hosts_all", ())),
                device_plugin_dry_run=gpu_pods.get("device_plugin_check") if hasattr(gpu_pods, "get") else None)
        return audit_lock

    def _play_audit_options(self, wanted, node_name, task_vars):
        """node_audit's options named in wanted, from the roles' variables and the plan's LIST (_stage_plan.audit_options)."""
        names = [_stage_plan.ROLE_AUDIT_OPTIONS[name] for name in wanted if name in _stage_plan.ROLE_AUDIT_OPTIONS]
        if "kubelet" in wanted:
            names.append(_stage_plan.CGROUP_LIMITS_KUBELET_SETTINGS)
        missing = [name for name in names if name not in task_vars]
        if missing:
            raise AnsibleActionFail("node_stages: audit_from_play needs %s, which the play does not define (import the role's "
                                    "tasks/audit_params.yml first, as tasks/node_plan_inputs.yml does)" % ", ".join(missing))
        roles = {name: self._templar.template(task_vars[name]) for name in names}
        return _stage_plan.audit_options(wanted, roles, node_name, _handover.taken_over(task_vars, GPU_PODS),
                                         self._templar.template(task_vars.get("gpuharden_operator_takeover", [])))

    def _role_options(self, task_vars, role):
        """A stage's module options from its role's variables: <role>_audit_options (the options node_audit's check of
        the stage takes, vars/main.yml) and the role's backup option."""
        options = dict(self._templar.template(task_vars["%s_audit_options" % role]))
        if "%s_backup" % role in task_vars:
            options["backup"] = boolean(self._templar.template(task_vars["%s_backup" % role]), strict=False)
        return options

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._task_args(task_vars)
        host = task_vars.get("inventory_hostname")
        for option, (variable, default) in PLAY_DEFAULTS.items():
            if args[option] is None:
                args[option] = self._play_variable(task_vars, variable, host if option == "node_name" else default)
        for stage in _stage_plan.STAGES:
            if stage.engine and stage.name not in args["stages"] and "%s_audit_options" % stage.role in task_vars:
                args["stages"][stage.name] = self._role_options(task_vars, stage.role)

        audit_args = dict(self._play_audit_options(args["audit_from_play"], args["node_name"], task_vars), **args["audit"])
        audit_args["node_name"] = args["node_name"]
        audit_lock = self._audit_lock(args["lock"], args["skip_compliant"], task_vars)
        if audit_lock is not None:
            audit_args["lock"] = audit_lock
        audit = self._module("gpuharden.k8s.node_audit", audit_args, task_vars, check_mode=False)
        if audit.get("failed"):
            return dict(audit, msg="node_audit failed: %s" % audit.get("msg", "failed"))
        # the node's Kubernetes name with its audit: what a reader of the run (gpuharden drift, drift_check.yml) names it by
        result.update(audit, node_name=args["node_name"])
        # the kubelet plan of the audit's kubelet check (the kubelet stage plans from it, without a second read), or None
        kubelet_plan = (((audit.get("checks") or {}).get("kubelet") or {}).get("details") or {}).get("plan")
        result["kubelet_plan"] = kubelet_plan if isinstance(kubelet_plan, dict) else None
        facts = audit.get("ansible_facts", {}).get("gpuharden")
        if not args["run_stages"]:
            only, skip = run_tags(task_vars)
            result["plan"] = _stage_plan.plan_node(audit, only_tags=only, skip_tags=skip, skip_compliant=args["skip_compliant"])
            return result
        if args["audit"].get("facts") and not args["allow_non_gpu_nodes"] and not _stage_plan.is_gpu_node(facts):
            result.update(failed=True, msg=_stage_plan.not_a_gpu_node_message(host, facts))
            return result

        only, skip = run_tags(task_vars)
        plan = _stage_plan.plan_node(audit, only_tags=only, skip_tags=skip, skip_compliant=args["skip_compliant"])
        stages, diff = {}, []
        for entry in plan["stages"]:
            if entry["action"] == _stage_plan.RUN:
                stage = _stage_plan.by_name(entry["stage"])
                if stage.name not in args["stages"]:
                    raise AnsibleActionFail("node_stages: stages.%s is missing: the options of %s for the stage it runs" % (stage.name, stage.module))
                ran = self._module(stage.module, stage_options(stage, args["stages"][stage.name], audit), task_vars)
                stages[stage.name] = dict({key: ran[key] for key in STAGE_KEYS if key in ran}, result=ran)
                diff.extend(diffs(ran))
                for warning in ran.get("warnings") or ():
                    display.warning("%s: %s: %s" % (host, stage.name, warning))
                if ran.get("failed"):
                    result.update(plan=plan, stages=stages, failed=True, msg="%s failed: %s" % (stage.name, ran.get("msg", "failed")))
                    return result
                entry["changed"] = bool(ran.get("changed"))
        for line, entry in zip(_stage_plan.stage_summary(plan), plan["stages"], strict=True):
            if entry["action"] == _stage_plan.LEFT_OUT:
                display.vv("%s | %s" % (host, line))
            else:
                display.display("%s | %s%s" % (host, line, " -> changed" if entry.get("changed") else ""))
        result.update(plan=plan, stages=stages, changed=any(stage.get("changed") for stage in stages.values()))
        if diff:
            result["diff"] = diff
        # the engine stages' reports, as their roles recorded them (set_stats): a host whose running driver still
        # uses other NVreg_DeviceFile* values
        permissions = stages.get("device_permissions", {}).get("result", {})
        if permissions.get("reboot_or_reload_required"):
            result["ansible_stats"] = {"data": {"device_permissions_reload_required": [host]}, "per_host": False, "aggregate": True}
        return result
