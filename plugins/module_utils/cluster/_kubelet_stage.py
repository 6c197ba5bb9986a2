# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The kubelet stage's decisions (roles/kubelet_topology), pure: what the plan means for the run, and the admission gate.

The action plugin gpuharden.k8s.kubelet_topology_plan reads the node (kubelet_config in check mode, or the audit's
plan harden hands over) and the cluster (the GPU workloads, listed once for the batch), and asks this module:

* ``stage(plan)``: is the change disruptive (a CPU or Memory Manager policy change, or a stale checkpoint: drain, stop,
  remove the checkpoints), does the kubelet change at all, which service runs it, and does the Topology Manager
  policy become one that can refuse GPU pods (``switch``, from _topology.admission_switch, the drift check's own);
* ``admission(...)``: where it does, which workloads the node could no longer admit (weighed as the drift check
  weighs them, _gpu_workloads.weigh), whether the node keeps its managers, and the line the run prints;
* ``without_managers(options)``: the kubelet_config options of a node the gate keeps (every other field is still
  managed);
* ``maintenance(...)``: who drains the node before a disruptive write, and who makes it schedulable again after;
* ``write_args(...)``, ``ready_wait(...)``: the write of the action gpuharden.k8s.kubelet_topology_apply (kubelet_config's
  options) and its wait for Node Ready (kubectl on the node, with the kubelet's own kubeconfig).
"""

from __future__ import annotations

import json

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _gpu_workloads, _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

MODULE = "kubelet_topology_plan"
# kubelet_config's options behind _topology.KEPT_FIELDS, in the same order: what a node the gate keeps leaves alone.
MANAGER_OPTIONS = ("topology_manager_policy", "topology_manager_scope", "topology_manager_policy_options", "cpu_manager_policy",
                   "reserved_system_cpus", "memory_manager_policy", "reserved_memory")
# The plan keys stage() reads: kubelet_config's result, and node_audit's kubelet check details.plan.
PLAN_KEYS = ("service", "changed", "restart_required", "cpu_manager_policy_changed", "memory_manager_policy_changed", "stale_state_files")


def without_managers(options):
    """kubelet_config's options less the Topology, CPU and Memory Manager fields."""
    return {name: value for name, value in options.items() if name not in MANAGER_OPTIONS}


def stage(plan, admission_check=True):
    """What a kubelet plan means for the run: {service, changes, disruptive, restart, switch}."""
    if not isinstance(plan, dict) or any(key not in plan for key in PLAN_KEYS):
        raise GpuhardenError("%s: the kubelet plan lacks %s (kubelet_config's result or node_audit's checks.kubelet.details.plan)" % (
            MODULE, ", ".join(key for key in PLAN_KEYS if not isinstance(plan, dict) or key not in plan)))
    disruptive = bool(plan["cpu_manager_policy_changed"] or plan["memory_manager_policy_changed"] or plan["stale_state_files"])
    return {"service": plan["service"],
            "changes": bool(plan["changed"] or plan["restart_required"]),
            "disruptive": disruptive,
            # kubelet_config's restart: a disruptive write stopped the kubelet, which starts again whatever changed
            "restart": "always" if disruptive else "if_required",
            "switch": _topology.admission_switch(plan) if admission_check else None}


def admission(switch, node_name, gpus, listed, ignore_unadmittable):
    """The admission gate of a policy switch on one node: {kept, blocked, managers, message}.

    ``listed`` is gpu_workloads_info's result for the batch (``workloads``, ``nodes`` with labels and taints), or its
    failure (``msg``): a node whose workloads could not be listed keeps its policy too, unless ``ignore_unadmittable``.
    ``kept`` is _topology.kept_by_admission's verdict (the drift check's), ``blocked`` the entries the run's statistics
    record (gpuharden_topology_blocked), ``managers`` whether the write still manages the Topology, CPU and Memory
    Manager fields, ``message`` the line the run prints (empty when nothing is in the way)."""
    listed = listed or {}
    error = None if isinstance(listed.get("workloads"), list) else (listed.get("msg") or "not listed")
    weighed = None
    if error is None:
        # gpu_facts' GPUs as they are: every readable GPU carries "error": None, and _topology.check_gpus leaves out
        # those whose error is set (the Jinja gate passed ansible_facts.gpuharden.gpus to topology_check the same way)
        entry = _gpu_workloads.topology_entries(MODULE, {node_name: {
            "gpus": list(gpus or []), "topology_manager_policy": switch["policy"], "topology_manager_scope": switch["scope"]}})[node_name]
        weighed = _gpu_workloads.weigh(MODULE, node_name, entry, listed["workloads"], (listed.get("nodes") or {}).get(node_name))
    kept = _topology.kept_by_admission(switch, weighed, error)
    if kept is None:
        return {"kept": None, "blocked": [], "managers": True, "message": ""}
    if error is not None:
        blocked = [{"workload": "the cluster GPU workloads", "found": error, "fitting_policy": None}]
    else:
        blocked = [entry for entry in weighed["findings"] if entry["id"] == "workload_cannot_fit_numa"]
    return {"kept": None if ignore_unadmittable else kept, "blocked": blocked, "managers": bool(ignore_unadmittable),
            "message": _message(switch, node_name, blocked, ignore_unadmittable)}


def _message(switch, node_name, blocked, ignore_unadmittable):
    head = ("Applying anyway (kubelet_topology_ignore_unadmittable_workloads): " if ignore_unadmittable
            else "Not switching %s to " % node_name)
    reasons = []
    for entry in blocked:
        if isinstance(entry["workload"], dict):
            workload = entry["workload"]
            reasons.append("it could no longer admit %s %s/%s (%s GPUs per container; a policy that admits it: %s)" % (
                workload["kind"], workload.get("namespace"), workload["name"], json.dumps((entry.get("found") or {}).get("gpus")),
                json.dumps(entry.get("fitting_policy"), sort_keys=True)))
        else:
            reasons.append("the GPU workloads could not be listed, so their admission was not checked (%s)" % entry["found"])
    return ("%stopologyManagerPolicy %s: %s. Choose a policy that admits them (kubelet_topology_topology_manager_policy) or set "
            "kubelet_topology_ignore_unadmittable_workloads=true." % (head, switch["policy"], "; ".join(reasons)))


def maintenance(disruptive, check_mode, custom_tasks, through_node_maintenance):
    """Who drains a node before a disruptive write (or makes it schedulable again after): ``"tasks"`` (the user's tasks
    file, kubelet_topology_drain_tasks or kubelet_topology_uncordon_tasks), ``"node_maintenance"`` (the role, where
    kubelet_topology_drain) or ``""``: nobody, as the change is not disruptive or the run only checks (a check run
    drains nothing)."""
    if not disruptive or check_mode:
        return ""
    if custom_tasks:
        return "tasks"
    return "node_maintenance" if through_node_maintenance else ""


# roles/kubelet_topology/tasks files that run role node_maintenance's cordon and drain, or its uncordon, for this role
NODE_MAINTENANCE_TASKS = {"drain": "node_maintenance_drain.yml", "uncordon": "node_maintenance_uncordon.yml"}


def maintenance_tasks(who, custom_tasks, step):
    """The tasks file roles/kubelet_topology/tasks/apply.yml includes for ``who`` (maintenance()) at ``step`` (drain,
    uncordon): the user's (kubelet_topology_drain_tasks, kubelet_topology_uncordon_tasks), the role's own file that runs
    node_maintenance, or "" (nobody)."""
    if who == "tasks":
        return custom_tasks
    return NODE_MAINTENANCE_TASKS[step] if who == "node_maintenance" else ""


def write_args(stage, settings):
    """kubelet_config's options for the write of a planned stage: the plan's write_options (less the manager fields where
    the gate kept them), stopped first and the checkpoints removed where disruptive, restarted as the plan says, polled
    on healthz and rolled back when the kubelet does not come back."""
    return dict(stage["write_options"], stop_first=stage["disruptive"], remove_stale_state=stage["disruptive"], restart=stage["restart"],
                health_url=settings["kubelet_topology_healthz_url"], health_timeout=settings["kubelet_topology_health_timeout"],
                rollback=True, log_file=settings["kubelet_topology_log_file"], log_lines=settings["kubelet_topology_log_lines"])


def ready_wait(written, settings):
    """The argv of the wait for Node Ready after a restart (kubectl on the node, with the role's kubeconfig there, for
    as long as the kubelet's own health wait), or None: the kubelet was not restarted, or no kubeconfig is set."""
    if not written.get("restarted") or not settings["kubelet_topology_kubeconfig"]:
        return None
    return ["kubectl", "--kubeconfig", str(settings["kubelet_topology_kubeconfig"]), "wait", "--for=condition=Ready",
            "node/%s" % settings["kubelet_topology_node_name"], "--timeout=%ss" % settings["kubelet_topology_health_timeout"]]
