# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""What drift_check.yml decides, once, in Python (the gpuharden.k8s.drift_play action calls it; issue 45 items 1 and 7):

- ``start``: each host's Node name, the play's nodes, the run's lock option for node_audit (owner, path, timeout,
  controller) and whether the plan's one LIST of pods is kept for the consistency check (its pods_snapshot);
- ``cluster_plan``: whether the consistency check runs, with which options (the node reports, the kubelet plans that
  drifted for harden's admission check predicted, the pods snapshot, the RuntimeClass dry run folded in where both use
  the same identity and Python), and the RuntimeClass dry run's own options; ``runtime_class_alone`` whether that dry
  run runs by itself (where the consistency run did not check it);
- ``verdict``: a host's run data and why it fails (module_utils/audit/_drift_verdict.py), as the play's settings ask.

The consistency check itself is module_utils/cluster/_consistency_run.py's (the module's and `gpuharden drift`'s).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.audit._drift_verdict import drift_verdict
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import UNSET, playbook_default

PLAYBOOK = "drift_check"
# The start step's hand-over (plugins/plugin_utils/_handover.py: every host, a run_once task's facts): {node_names,
# nodes, lock, pods_snapshot}, which node_plan_pods, node_stages and the cluster step take
START_HANDOVER = "__drift_start"
# The variables each step reads (the roles' options and the play's gpuharden_* variables); one undefined is None here
# and takes the settings table's default for drift_check.yml.
START_SETTINGS = ("gpuharden_run_owner", "gpuharden_lock_path", "gpuharden_lock_timeout", "postcheck_consistency", "postcheck_nvml",
                  "postcheck_kubeconfig", "postcheck_kube_context", "cgroup_limits_kubeconfig", "cgroup_limits_kube_context")
CLUSTER_SETTINGS = ("postcheck_consistency", "postcheck_nvml", "postcheck_kubeconfig", "postcheck_kube_context", "postcheck_controller_python",
                    "runtime_class_kubeconfig", "runtime_class_kube_context", "runtime_class_controller_python", "runtime_class_audit_options",
                    "kubelet_topology_admission_check", "kubelet_topology_ignore_unadmittable_workloads", "gpuharden_drift_cluster_objects",
                    "gpuharden_drift_cluster_in_process")
VERDICT_SETTINGS = ("gpuharden_drift_fail", "gpuharden_drift_fail_severity")
TRUE_WORDS = ("true", "yes", "on", "1", "y", "t")
FALSE_WORDS = ("false", "no", "off", "0", "n", "f", "")


def setting(settings, name):
    """``name``'s value in ``settings``, or the settings table's default for drift_check.yml where it is None."""
    value = settings.get(name)
    if value is None:
        value = playbook_default(name, PLAYBOOK) if name.startswith("gpuharden_") else None
        return None if value is UNSET else value
    return value


def flag(settings, name):
    """A boolean setting, as Jinja's ``bool`` filter reads it; anything else is a GpuhardenError naming it."""
    value = setting(settings, name)
    if isinstance(value, bool) or value is None:
        return bool(value)
    word = str(value).strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise GpuhardenError("%s=%r is not a boolean: give true or false" % (name, value))


def consistency_wanted(settings):
    """The consistency check runs where the post-check's consistency and NVML checks are on."""
    return flag(settings, "postcheck_consistency") and flag(settings, "postcheck_nvml")


def made_up_owner(now_utc, number):
    """The lock owner of a run without gpuharden_run_owner: the time (UTC) and a random number, as harden makes one up."""
    return "drift@%s-%d" % (now_utc.strftime("%Y%m%dT%H%M%S"), number)


def start(settings, play_hosts, named, controller, owner_if_unset):
    """{node_names, nodes, lock, pods_snapshot} of the play: ``named`` maps the hosts that set gpuharden_k8s_node_name to
    it (the others are named by their inventory name), ``controller`` is this run's controller process (the
    controller_run lookup's), ``owner_if_unset`` the owner made up where gpuharden_run_owner is unset."""
    node_names = {host: named.get(host, host) for host in play_hosts}
    timeout = setting(settings, "gpuharden_lock_timeout")
    try:
        timeout = int(timeout)
    except (TypeError, ValueError):
        raise GpuhardenError("gpuharden_lock_timeout=%r is not a number of seconds" % (timeout,)) from None
    owner = settings.get("gpuharden_run_owner")
    lock = {"owner": owner_if_unset if owner is None else owner, "path": setting(settings, "gpuharden_lock_path"), "timeout": timeout,
            "controller": controller}
    # the consistency check takes the plan's LIST of pods instead of listing them again, where both use the same cluster identity
    snapshot = consistency_wanted(settings) and settings.get("cgroup_limits_kubeconfig") == settings.get("postcheck_kubeconfig") \
        and settings.get("cgroup_limits_kube_context") == settings.get("postcheck_kube_context")
    return {"node_names": node_names, "nodes": [node_names[host] for host in play_hosts], "lock": lock, "pods_snapshot": bool(snapshot)}


def _get(value, *path):
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def node_reports(plans):
    """{Node name: node report} of the play's plans (each names its node); a plan without a report has none."""
    return {plan["node_name"]: plan["node_report"] for plan in plans if isinstance(plan, dict) and isinstance(plan.get("node_report"), dict)}


def drifted_kubelet_plans(plans):
    """{Node name: kubelet plan} of the plans whose kubelet check drifted (harden's kubelet stage would change them)."""
    return {plan.get("node_name"): _get(plan, "checks", "kubelet", "details", "plan") for plan in plans
            if _get(plan, "checks", "kubelet", "status") == "drift"}


def cluster_plan(settings, nodes, plans, pods_snapshot):
    """The cluster side of the play: {consistency, node_reports, runtime_class, runtime_class_folded, in_process}.

    ``consistency``: gpu_consistency's options but node_reports (None for an omitted option), or None where the check
    does not run; ``runtime_class``: the RuntimeClass dry run's module options (the role's, on ``nodes``: the play's
    hosts still in the run), or None without gpuharden_drift_cluster_objects; ``runtime_class_folded``: that dry run
    rides in the consistency run (same identity and Python).  ``pods_snapshot``: the path gpu_pods_info left, or None."""
    objects = flag(settings, "gpuharden_drift_cluster_objects")
    audit_options = settings.get("runtime_class_audit_options") or {}
    if not isinstance(audit_options, dict):
        raise GpuhardenError("runtime_class_audit_options=%r is not a dictionary of the runtime_class module's options" % (audit_options,))
    runtime_class = None
    if objects:
        runtime_class = dict(audit_options)
        identity = (("kubeconfig", "runtime_class_kubeconfig"), ("context", "runtime_class_kube_context"))
        runtime_class.update((option, settings[name]) for option, name in identity if settings.get(name))
        runtime_class["nodes"] = list(nodes)
    folded = objects and all(settings.get("runtime_class_" + name) == settings.get("postcheck_" + name)
                             for name in ("kubeconfig", "kube_context", "controller_python"))
    plan = {"consistency": None, "node_reports": None, "runtime_class": runtime_class, "runtime_class_folded": bool(folded),
            "in_process": flag(settings, "gpuharden_drift_cluster_in_process")}
    if not consistency_wanted(settings):
        return plan
    reports = node_reports(plans)
    # harden's admission check, predicted (gpu_consistency's admission): a node it would keep on its policy is reported
    # as kept, not as remediable drift that every --remediate retries
    admission = drifted_kubelet_plans(plans) if flag(settings, "kubelet_topology_admission_check") and not flag(
        settings, "kubelet_topology_ignore_unadmittable_workloads") else {}
    plan["node_reports"] = reports
    plan["consistency"] = {"kubeconfig": settings.get("postcheck_kubeconfig") or None, "context": settings.get("postcheck_kube_context") or None,
                           "nodes": list(reports), "pods_snapshot": pods_snapshot or None,
                           "runtime_class": dict(audit_options, nodes=list(nodes)) if folded else None, "admission": admission}
    return plan


def runtime_class_alone(plan, consistency_result):
    """The RuntimeClass dry run runs by itself where it is asked for and the consistency run did not check it: another
    identity or Python, that run failed or did not run, or (``gpuharden drift`` running that check in its own process)
    it will not."""
    if plan["runtime_class"] is None:
        return False
    if plan["in_process"]:
        return not (plan["consistency"] is not None and plan["runtime_class_folded"])
    return (consistency_result or {}).get("runtime_class_check") is None


def module_args(options):
    """A module's arguments from options where None stands for an omitted one."""
    return {name: value for name, value in options.items() if value is not None}


def verdict(settings, node_plan, consistency):
    """drift_verdict of one host (its gpuharden_node_plan, the play's consistency result), its failure "" where
    gpuharden_drift_fail is off."""
    if not isinstance(node_plan, dict):
        raise GpuhardenError("gpuharden_node_plan is %s, not the stage engine's plan of the node" % type(node_plan).__name__)
    decided = drift_verdict(node_plan, consistency or {}, node_plan.get("node_name"), setting(settings, "gpuharden_drift_fail_severity"))
    if not flag(settings, "gpuharden_drift_fail"):
        decided["failure"] = ""
    return decided
