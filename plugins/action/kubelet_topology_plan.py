# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.kubelet_topology_plan: the kubelet stage's plan, and its admission gate, in one task each.

Read-only (the tasks of roles/kubelet_topology run it in check mode).  Without ``stage``: the plan.  It runs
gpuharden.k8s.kubelet_config on the node in check mode (the module's result is this task's result), or takes
``audited_plan`` (node_audit's kubelet check, which harden read before any stage wrote), and adds what the plan means
for the run (module_utils/cluster/_kubelet_stage.py stage()): ``disruptive``, ``changes``, ``service``, ``switch``
(the Topology Manager policy becomes one that refuses GPU pods it cannot align), and ``write_options``, the options the
role's write takes.  With ``stage`` (the plan task's result) and ``workloads_listed`` (gpu_workloads_info's result for
the batch): the admission gate (_kubelet_stage.admission()).  A node it keeps is planned again without the Topology,
CPU and Memory Manager fields, and the workloads that keep it go to the run's statistics (gpuharden_topology_blocked).

With ``workloads`` (tasks/admission.yml, delegated to the controller): the batch's listing of its GPU workloads and
the nodes' labels and taints (gpuharden.k8s.gpu_workloads_info, outside check mode: it only reads; with
kubelet_topology_controller_kubeconfig, kubelet_topology_gpu_resources and kubelet_topology_controller_python), made
by the batch's first host whose plan is gated (``lister``) and skipped on the others; a listing that fails is no
failure of the task (``listing_failed``): the gate then keeps the node's policy, saying why.  The lister hands its
listing over on its host (LISTED, plugins/plugin_utils/_handover.py), where the gate of every host takes it.

Both plan results carry ``drain``: who drains the node before the write (_kubelet_stage.maintenance(): the user's tasks file,
node_maintenance, or nobody in a check run or for a change that is not disruptive), which roles/kubelet_topology/tasks/
apply.yml includes.  With ``gate``, the admission inputs not given are the role's variables as its tasks see them
(``__kubelet_topology_stage``, ``kubelet_topology_node_name``, the node's GPUs from gpu_facts, read on the node when no
fact holds them yet, the batch's listing the lister handed over in this run, and ``kubelet_topology_ignore_unadmittable_workloads``),
and its verdict's message, where something is in the way, is the task's warning; the plan builds its options from
the role's variables (``__kubelet_topology_module_options``, core/_role_options.py BUILT_WHERE_READ) and reads
``__kubelet_topology_audited_plan`` and ``kubelet_topology_admission_check`` so where they are not given.

The plan, and the gate after it (which may plan again), hand ``disruptive`` over (DISRUPTIVE,
plugins/plugin_utils/_handover.py) to harden's rollout and stage steps: handed over in this run = the plan ran; the
gate's, later, replaces the plan's.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _kubelet_stage
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import StageAction, run_module_in_mode

KUBELET_CONFIG = "gpuharden.k8s.kubelet_config"
GPU_FACTS = "gpuharden.k8s.gpu_facts"
GPU_WORKLOADS_INFO = "gpuharden.k8s.gpu_workloads_info"
STAGE = "__kubelet_topology_stage"  # what plan.yml and admission.yml register
# the lister's listing, which it hands over on its host (plugins/plugin_utils/_handover.py) to the gate of every host
LISTED = "__kubelet_topology_workloads_listed"
# whether the change drains the node and stops the kubelet, handed over to harden_node step=draining, harden_rollout and
# stage_steps (and read as the plan's disruptive by nobody else)
DISRUPTIVE = _harden_run.DRAINING_PLANS["kubelet_topology"]
# An argument left out is read from the role's variable of this name (the gate's with ``gate``, the plan's always).
PLAN_VARIABLES = {"audited_plan": ("__kubelet_topology_audited_plan", None), "admission_check": ("kubelet_topology_admission_check", True)}
GATE_VARIABLES = {"stage": (STAGE, None), "node_name": ("kubelet_topology_node_name", None),
                  "gpus": ("ansible_facts.gpuharden.gpus", None),
                  "ignore_unadmittable_workloads": ("kubelet_topology_ignore_unadmittable_workloads", False)}
DRAIN_TASKS = ("kubelet_topology_drain_tasks", "")
DRAIN = ("kubelet_topology_drain", True)
ARGUMENT_SPEC = {
    "options": {"type": "dict"},
    "audited_plan": {"type": "raw"},
    "admission_check": {"type": "bool"},
    "gate": {"type": "bool", "default": False},
    "workloads": {"type": "bool", "default": False},
    "stage": {"type": "dict"},
    "node_name": {"type": "str"},
    "gpus": {"type": "list", "elements": "dict"},
    "workloads_listed": {"type": "dict"},
    "ignore_unadmittable_workloads": {"type": "bool"},
}


def lister(batch, hostvars):
    """The batch's host that lists the GPU workloads for the admission check: the first whose plan is gated (its
    registered plan says so), or None."""
    for host in batch:
        stage = hostvars[host].get(STAGE) if host in hostvars else None
        if isinstance(stage, dict) and stage.get("gated"):
            return host
    return None


def decide_listing(host, batch, hostvars, list_workloads):
    """The listing task's result on ``host``: gpu_workloads_info's through ``list_workloads()`` where ``host`` is the
    batch's lister, else skipped with the reason.  A failed listing is no failure here (``listing_failed``): the gate
    weighs it (_kubelet_stage.admission: the node keeps its policy, unless the change is forced)."""
    chosen = lister(batch, hostvars)
    if chosen != host:
        return {"skipped": True, "changed": False, "skip_reason": "the batch's GPU workloads are listed once, by %s" % chosen}
    listed = dict(list_workloads())
    listed.pop("invocation", None)
    return dict(listed, failed=False, changed=False, listing_failed=bool(listed.get("failed")))


def decide_plan(plan, options, admission_check, drainer=None):
    """The plan task's result: the kubelet plan with what it means for the run; the plan's ``changed`` (the write would
    change a file) becomes ``would_change``, as this task changes nothing.  ``drainer(disruptive)`` says who drains
    (_kubelet_stage.maintenance() with the run's check mode and the role's drain variables); none: nobody."""
    decided = _kubelet_stage.stage(plan, admission_check)
    return dict(plan, **decided, gated=decided["switch"] is not None, write_options=options, would_change=bool(plan["changed"]),
                changed=False, drain=drainer(decided["disruptive"]) if drainer else "")


def decide_admission(stage, node_name, gpus, listed, ignore, replan, drainer=None):
    """The admission task's result: the gate's verdict, and the stage again (planned without the managers through
    ``replan(options)`` where the gate keeps them)."""
    if not stage.get("switch"):
        return dict(stage, admission=None)
    verdict = _kubelet_stage.admission(stage["switch"], node_name, gpus, listed, ignore)
    decided = dict(stage, admission=verdict)
    if not verdict["managers"]:
        options = _kubelet_stage.without_managers(stage["write_options"])
        decided = dict(decide_plan(replan(options), options, False, drainer), admission=verdict, switch=stage["switch"],
                       gated=stage["gated"], host=stage.get("host"))
    # only a change the gate blocks: a forced one (ignore_unadmittable_workloads) is no blocked change
    if not verdict["managers"]:
        decided["ansible_stats"] = {"data": {"gpuharden_topology_blocked": {node_name: verdict["blocked"]}}, "per_host": False, "aggregate": True}
    if verdict["message"]:  # the workloads that keep the node on its policy, or that a forced change leaves unadmittable
        decided["warnings"] = list(decided.get("warnings") or []) + [verdict["message"]]
    return decided


def with_handover(decided, facts=None):
    """The plan's (or the gate's) result with its facts (``facts``: gpu_facts', where the gate read them) and the
    hand-over of whether the change is disruptive."""
    return dict(decided, ansible_facts=dict(facts or {}, **_handover.handed_over(DISRUPTIVE, bool(decided["disruptive"]))))


class ActionModule(StageAction):
    NAME = "kubelet_topology_plan"
    ARGUMENT_SPEC = ARGUMENT_SPEC
    READ_ONLY = True

    def decide_task(self, args, task_vars):
        if args["workloads"]:
            listing = decide_listing(task_vars["inventory_hostname"], task_vars.get("ansible_play_batch") or [], task_vars.get("hostvars") or {},
                                     lambda: self._list_workloads(task_vars))
            return listing if listing.get("skipped") else dict(listing, ansible_facts=_handover.handed_over(LISTED, listing))
        drainer = self._drainer(task_vars)
        if args["gate"]:
            args = self.with_role_variables(args, GATE_VARIABLES)
            if args["workloads_listed"] is None:
                hostvars = task_vars.get("hostvars") or {}
                chosen = lister(task_vars.get("ansible_play_batch") or [], hostvars)
                # the listing the lister handed over in this run, read in its hostvars (role_variable takes a
                # variable name, not a subscript)
                args["workloads_listed"] = _handover.taken_over(hostvars[chosen], LISTED) if chosen else None
        if args["stage"] is not None:
            gated = args["stage"].get("switch")
            if gated and not args["node_name"]:
                raise GpuhardenError("kubelet_topology_plan: node_name is required with stage")
            facts = {}
            if gated and args["gpus"] is None:  # the node's GPUs and NUMA nodes, read once (gpu_facts sets them as facts)
                facts = self._gpu_facts(task_vars)
                args["gpus"] = facts["gpuharden"]["gpus"]
            decided = decide_admission(args["stage"], args["node_name"], args["gpus"] or [], args["workloads_listed"],
                                       bool(args["ignore_unadmittable_workloads"]), lambda narrowed: self._kubelet_plan(narrowed, task_vars), drainer)
            return with_handover(self._with_drain_tasks(decided), facts)
        options = args["options"] if args["options"] is not None else self.role_variable("__kubelet_topology_module_options")
        if options is None:
            raise GpuhardenError("kubelet_topology_plan: options (kubelet_config's, by default built from the role's variables) "
                                 "is required without stage")
        args = self.with_role_variables(args, PLAN_VARIABLES)
        audited = args["audited_plan"]
        plan = dict(audited, audited=True) if isinstance(audited, dict) else self._kubelet_plan(options, task_vars)
        # host: the batch's workload listing is made by the first host whose plan needs the admission check
        return with_handover(self._with_drain_tasks(dict(decide_plan(plan, options, boolean(args["admission_check"], strict=False), drainer),
                                                         host=task_vars["inventory_hostname"])))

    def _with_drain_tasks(self, decided):
        """The result with ``drain_tasks``: the file apply.yml includes to drain the node (who: ``drain``), or ""."""
        return dict(decided, drain_tasks=_kubelet_stage.maintenance_tasks(decided.get("drain", ""), self.role_variable(*DRAIN_TASKS), "drain"))

    def _drainer(self, task_vars):
        """Who drains a node whose change is disruptive: the run's check mode (a check run drains nothing, as the
        role's YAML said with ``not ansible_check_mode``) and the role's drain variables."""
        check_mode = bool(task_vars.get("ansible_check_mode"))
        tasks, through_role = self.role_variable(*DRAIN_TASKS), boolean(self.role_variable(*DRAIN), strict=False)
        return lambda disruptive: _kubelet_stage.maintenance(disruptive, check_mode, tasks, through_role)

    def _list_workloads(self, task_vars):
        """gpu_workloads_info's result on the controller, with the role's controller Python, outside check mode (it only
        reads, and the gate needs the listing in a check run too)."""
        args = {"resources": self.variable("kubelet_topology_gpu_resources")}
        kubeconfig = self.role_variable("kubelet_topology_controller_kubeconfig")
        if kubeconfig:
            args["kubeconfig"] = kubeconfig
        python = self.role_variable("kubelet_topology_controller_python")
        return run_module_in_mode(self, GPU_WORKLOADS_INFO, args, on_controller(self._task, task_vars, python), check_mode=False)

    def _gpu_facts(self, task_vars):
        result = self.run_module(GPU_FACTS, {}, task_vars)
        if result.get("failed"):
            raise GpuhardenError("gpu_facts: %s" % result.get("msg", result))
        return result["ansible_facts"]

    def _kubelet_plan(self, options, task_vars):
        result = self.run_module(KUBELET_CONFIG, options, task_vars)
        if result.get("failed"):
            raise GpuhardenError("kubelet_config: %s" % result.get("msg", result))
        result.pop("invocation", None)
        return result
