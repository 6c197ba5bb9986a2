# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The post-check's decisions (controller side: the action gpuharden.k8s.postcheck_step, roles/postcheck).

The post-check proves a node is fixed.  It runs in three steps, each one task of the role (tasks/main.yml):

1. ``node`` (per host, on the node): the role's variables are checked (``preflight_problems``); the node is read in
   one node_audit run (``node_audit_args``), or the run's own audit is taken (postcheck_node_audit); what that read
   did not give (``reused``) is read by each module as before (``remaining_reads``); ``node_part`` is what the other
   steps take of this node.
2. ``cluster`` (once for the play's batch, on the controller): the three-state consistency check, or without it the
   GPU workloads' LIST, over every node of the batch (``cluster_call``), and what came out of it (``weighed``).
3. ``verdict`` (per host, on the controller): the topology check of a node the cluster step did not weigh
   (``topology_alone_args``), this node's findings in one list (``node_findings``), what could not be checked (``not_checked``: the
   workloads' LIST failed), and whether the host fails or, in a check run that did not make its changes,
   only reports (``verdict``; the one severity scale of core/_findings.py).
4. ``fail`` and ``report`` (per host, after the role keeps the findings): the verdict's failure fails the host, a check
   run's report is shown (``judged``); a separate task, since a failed task's facts and statistics are not kept
   (ansible-core 2.19 plugins/strategy/__init__.py: ansible_facts and ansible_stats are read from results that did not fail).

``settings`` is a mapping of the role's ``postcheck_*`` variables (roles/postcheck/defaults/main.yml), as the role's
tasks see them.  Everything here is pure: plain values in and out, no I/O.
"""

from __future__ import annotations

import json
import re

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings

# The role's variables each step reads (their defaults: roles/postcheck/defaults/main.yml).
PREFLIGHT_SETTINGS = ("postcheck_nvml", "postcheck_topology", "postcheck_consistency", "postcheck_expected_gpus",
                      "postcheck_expected_mig_devices")
NODE_SETTINGS = PREFLIGHT_SETTINGS + (
    "postcheck_node_name", "postcheck_unprivileged_user", "postcheck_unprivileged_groups", "postcheck_topology_manager_policy",
    "postcheck_topology_manager_scope", "postcheck_cpu_manager_policy", "postcheck_device_audit", "postcheck_cgroup_root",
    "postcheck_audit_devices", "postcheck_audit_accesses", "postcheck_audit_allocations", "postcheck_node_audit", "postcheck_lock",
    "postcheck_advertise_settle_this_node", "postcheck_kubelet_restarted_at")
# What audit_options() reads.
AUDIT_SETTINGS = ("postcheck_nvml", "postcheck_node_name", "postcheck_unprivileged_user", "postcheck_unprivileged_groups",
                  "postcheck_expected_gpus", "postcheck_expected_mig_devices", "postcheck_device_audit", "postcheck_cgroup_root",
                  "postcheck_audit_devices", "postcheck_audit_accesses", "postcheck_audit_allocations")
CLUSTER_SETTINGS = ("postcheck_consistency", "postcheck_topology", "postcheck_collect_workloads", "postcheck_kubeconfig",
                    "postcheck_kube_context", "postcheck_advertise_settle_seconds", "postcheck_gpu_resources")
VERDICT_SETTINGS = ("postcheck_node_name", "postcheck_nvml", "postcheck_topology", "postcheck_fail_severity",
                    "postcheck_fail_in_check_mode")

# The kubelet read of the topology check: against settings that make the read a read (kubelet_config in check mode,
# or node_audit's kubelet check), so that what the configuration sets now is returned.
KUBELET_READ_SETTINGS = {"topologyManagerPolicy": "none", "topologyManagerScope": "container", "cpuManagerPolicy": "none"}
# The kubelet's own default scope (k8s.io/kubelet/config/v1beta1 types.go: TopologyManagerScope "container").
DEFAULT_TOPOLOGY_SCOPE = "container"
# The run's custom statistic that gathers every host's findings (what set_stats with aggregate made before).
FINDINGS_STAT = "gpuharden_postcheck_findings"
# A finding's found/expected in the failure message, at most this many characters each.
SHOWN_VALUE_CHARS = 200
WHOLE_NUMBER = re.compile(r"^[0-9]+$")


def as_bool(value):
    """A variable read as the role's ``| bool`` read it (ansible-core's lenient boolean: yes/on/1/true, any case)."""
    return boolean(value, strict=False)


def _whole_count(value):
    return value is None or (not isinstance(value, bool) and WHOLE_NUMBER.match(str(value)) is not None)


def preflight_problems(settings):
    """Each rule the role's variables break, one sentence each ([] when none): the topology and consistency checks take
    the GPU layout and processes the NVML check reads, and the expected counts are whole numbers."""
    problems = []
    if not as_bool(settings["postcheck_nvml"]) and (as_bool(settings["postcheck_topology"]) or as_bool(settings["postcheck_consistency"])):
        problems.append("postcheck_topology and postcheck_consistency use the GPU layout and processes that the NVML check reads: "
                        "set postcheck_nvml=true or turn them off.")
    gpus, mig = settings["postcheck_expected_gpus"], settings["postcheck_expected_mig_devices"]
    if not (_whole_count(gpus) and _whole_count(mig)):
        problems.append("postcheck_expected_gpus=%s and postcheck_expected_mig_devices=%s must be null or whole numbers of 0 or more."
                        % (gpus, mig))
    return problems


def audit_options(settings):
    """(nvml, device_cgroups): the node-side post-checks as node_audit takes them, {} for a check that is off; the same
    values the role passes to nvml_check and device_cgroup_audit (the lookup gpuharden.k8s.postcheck_audit_options gives
    them to the plan's audit, playbooks/tasks/node_stages.yml, through roles/postcheck/vars/main.yml)."""
    nvml = {} if not as_bool(settings["postcheck_nvml"]) else {
        "node_name": settings["postcheck_node_name"], "unprivileged_user": settings["postcheck_unprivileged_user"],
        "unprivileged_groups": settings["postcheck_unprivileged_groups"], "expected_gpus": settings["postcheck_expected_gpus"],
        "expected_mig_devices": settings["postcheck_expected_mig_devices"]}
    device_cgroups = {} if not as_bool(settings["postcheck_device_audit"]) else {
        "node_name": settings["postcheck_node_name"], "cgroup_root": settings["postcheck_cgroup_root"],
        "devices": settings["postcheck_audit_devices"] or None, "accesses": settings["postcheck_audit_accesses"],
        "allocations": settings["postcheck_audit_allocations"]}
    return nvml, device_cgroups


def kubelet_wanted(settings):
    """The topology check reads the kubelet's policies only where one of the three is not given."""
    return as_bool(settings["postcheck_topology"]) and not (
        settings["postcheck_topology_manager_policy"] and settings["postcheck_topology_manager_scope"] and settings["postcheck_cpu_manager_policy"])


def node_audit_args(settings):
    """node_audit's options for the one run that reads the node, or None: no run (the run's audit is handed over, or
    there is nothing to read and no lock to give back)."""
    if settings["postcheck_node_audit"]:
        return None
    nvml, device_cgroups = audit_options(settings)
    wanted = kubelet_wanted(settings)
    lock = settings["postcheck_lock"]
    if not (nvml or device_cgroups or wanted or isinstance(lock, dict)):
        return None
    args = {"node_name": settings["postcheck_node_name"]}
    if nvml:
        args["nvml"] = nvml
    if device_cgroups:
        args["device_cgroups"] = device_cgroups
    if wanted:
        args["kubelet"] = {"settings": dict(KUBELET_READ_SETTINGS)}
    if lock:
        args["lock"] = lock
    return args


def _check(read, name):
    return ((read or {}).get("checks") or {}).get(name) or {}


def reused(read):
    """What the node audit ``read`` (the run's, or the role's one node_audit run; {} when none ran) already gives:
    the NVML report, the device-cgroup audit, the kubelet's policies.  A check that did not run there, or could not, is
    read again by its own module."""
    kubelet = _check(read, "kubelet")
    return {
        "nvml": (read or {}).get("node_report") is not None,
        "device_cgroups": _check(read, "device_cgroups").get("status") in ("ok", "findings"),
        # drift: the configuration differs from the settings asked for; its policies are still what it sets now
        "kubelet": kubelet.get("status") in ("ok", "drift") and bool((kubelet.get("details") or {}).get("policies")),
    }


def remaining_reads(settings, reuse):
    """{module: options} of the reads the node audit did not make, in the order they run.  kubelet_config runs in
    check mode (a read); process_cgroup_info takes the pids nvml_check returns (its options are completed then)."""
    reads = {}
    if as_bool(settings["postcheck_nvml"]) and not reuse["nvml"]:
        reads["gpuharden.k8s.nvml_check"] = {key: value for key, value in audit_options(settings)[0].items() if value is not None}
    if kubelet_wanted(settings) and not reuse["kubelet"]:
        reads["gpuharden.k8s.kubelet_config"] = {"settings": dict(KUBELET_READ_SETTINGS)}
    if as_bool(settings["postcheck_device_audit"]) and not reuse["device_cgroups"]:
        reads["gpuharden.k8s.device_cgroup_audit"] = {key: value for key, value in audit_options(settings)[1].items() if value is not None}
    if as_bool(settings["postcheck_consistency"]) and not reuse["nvml"]:
        reads["gpuharden.k8s.process_cgroup_info"] = {}
    return reads


def process_cgroup_args(nvml_read):
    return {"pids": [process["pid"] for process in (nvml_read or {}).get("processes") or []]}


def node_part(settings, read, reuse, reads):
    """What the cluster and verdict steps take of this node: its name, NVML result, node-side findings, its entry for the
    topology check, its report for the consistency check, whether the consistency check waits for it, when its kubelet
    restarted.  ``read`` is the node audit's result ({} when none), ``reads`` {module: result} of remaining_reads()."""
    node = settings["postcheck_node_name"]
    nvml_on = as_bool(settings["postcheck_nvml"])
    nvml = None
    if nvml_on:
        nvml = read["node_report"] if reuse["nvml"] else reads.get("gpuharden.k8s.nvml_check")
    if reuse["device_cgroups"]:
        device_findings = [entry for entry in read.get("findings") or [] if entry.get("check") == "device_cgroups"]
    else:
        device_findings = list((reads.get("gpuharden.k8s.device_cgroup_audit") or {}).get("findings") or [])
    if reuse["kubelet"]:
        policies = _check(read, "kubelet")["details"]["policies"]
    else:
        policies = (reads.get("gpuharden.k8s.kubelet_config") or {}).get("policies_set") or {}
    topology_input = None
    if nvml_on and as_bool(settings["postcheck_topology"]):
        topology_input = {
            "gpus": nvml.get("gpus"),
            "topology_manager_policy": settings["postcheck_topology_manager_policy"] or policies.get("topologyManagerPolicy") or None,
            "topology_manager_scope": settings["postcheck_topology_manager_scope"] or policies.get("topologyManagerScope") or DEFAULT_TOPOLOGY_SCOPE,
            "cpu_manager_policy": settings["postcheck_cpu_manager_policy"] or policies.get("cpuManagerPolicy") or None,
        }
    node_report = None
    if nvml_on and as_bool(settings["postcheck_consistency"]):
        cgroups = (reads.get("gpuharden.k8s.process_cgroup_info") or {}).get("cgroups")
        node_report = nvml if reuse["nvml"] else dict(nvml, process_cgroups=cgroups)
    restarted_at = settings["postcheck_kubelet_restarted_at"]
    return {
        "node_name": node,
        "nvml": nvml,
        "nvml_findings": list(nvml.get("findings") or []) if nvml_on else [],
        "device_cgroup_findings": device_findings,
        "topology_input": topology_input,
        "node_report": node_report,
        "settle": as_bool(settings["postcheck_advertise_settle_this_node"]),
        "restarted_at": float(restarted_at) if restarted_at else None,
        "reused": dict(reuse),
    }


def weigh_workloads(settings):
    """The GPU workloads are listed and weighed against the nodes' topology."""
    return as_bool(settings["postcheck_topology"]) and as_bool(settings["postcheck_collect_workloads"])


def cluster_call(settings, parts):
    """(module, options) of the one controller module run for the batch, or (None, None): the consistency check where it
    runs (it lists the workloads in the same run when they are weighed), else gpu_workloads_info where the workloads are
    weighed.  ``parts`` are the batch's node_part() results, in the batch's order."""
    parts = [part for part in parts if part]
    topology = {part["node_name"]: part["topology_input"] for part in parts if part.get("topology_input")}
    auth = {key: value for key, value in (("kubeconfig", settings["postcheck_kubeconfig"]), ("context", settings["postcheck_kube_context"]))
            if value}
    if as_bool(settings["postcheck_consistency"]):
        return "gpuharden.k8s.gpu_consistency", dict(
            auth,
            nodes=[part["node_name"] for part in parts],
            node_reports={part["node_name"]: part.get("node_report") for part in parts},
            settle_seconds=settings["postcheck_advertise_settle_seconds"],
            settle_nodes=[part["node_name"] for part in parts if part.get("settle")],
            restarted_at={part["node_name"]: part["restarted_at"] for part in parts if part.get("restarted_at")},
            topology=topology if weigh_workloads(settings) else {},
            workload_resources=settings["postcheck_gpu_resources"])
    if weigh_workloads(settings):
        return "gpuharden.k8s.gpu_workloads_info", dict(auth, resources=settings["postcheck_gpu_resources"], topology=topology)
    return None, None


def weighed(module, result):
    """What the cluster step's run gives every node: the consistency findings (every node's), the workloads weighed
    against each node's topology, and why the workloads could not be listed (None: they were, or were not asked for)."""
    result = result or {}
    if module == "gpuharden.k8s.gpu_consistency":
        return {"findings": list(result.get("findings") or []), "topology": result.get("topology") or {},
                "workloads_error": result.get("workloads_error")}
    if module == "gpuharden.k8s.gpu_workloads_info":
        # a LIST that failed leaves the node-only topology findings (verdict step), and says why
        error = None if "workloads" in result else (result.get("msg") or "failed")
        return {"findings": [], "topology": result.get("topology") or {}, "workloads_error": error}
    return {"findings": [], "topology": {}, "workloads_error": None}


def topology_alone_args(settings, part, cluster):
    """topology_check's options for a node whose topology the cluster step did not weigh (no workloads, or their LIST
    failed), or None."""
    node = settings["postcheck_node_name"]
    entry = (part or {}).get("topology_input")
    if not as_bool(settings["postcheck_topology"]) or entry is None or node in (cluster or {}).get("topology", {}):
        return None
    args = {"node_name": node, "gpus": entry["gpus"], "topology_manager_scope": entry["topology_manager_scope"]}
    for key in ("topology_manager_policy", "cpu_manager_policy"):
        if entry[key]:
            args[key] = entry[key]
    return args


def not_checked(settings, cluster):
    """What the post-check of this node could not check, each {what, cause, fix}: the GPU workloads' LIST failed, so
    the topology check weighed the node alone (never a finding: a part not checked is neither clean nor drift)."""
    if (cluster or {}).get("workloads_error") is None or not as_bool(settings["postcheck_topology"]):
        return []
    return [{"what": "topology: whether the cluster's GPU workloads fit %s's NUMA nodes" % settings["postcheck_node_name"],
             "cause": "the GPU workloads could not be listed: %s" % cluster["workloads_error"],
             "fix": "give postcheck_kubeconfig an identity that may list pods and their controllers (deploy/rbac/gpuharden-rbac.yaml), or set "
                    "postcheck_collect_workloads=false to check the node alone"}]


def node_topology(settings, cluster, topology_alone):
    """This node's topology result: the cluster step's weighing of it, else topology_check's; None without the check."""
    if not as_bool(settings["postcheck_topology"]):
        return None
    node = settings["postcheck_node_name"]
    return ((cluster or {}).get("topology") or {}).get(node, topology_alone)


def node_findings(settings, part, cluster, topology):
    """This node's findings, in one list: NVML, topology, device cgroups, consistency."""
    node = settings["postcheck_node_name"]
    part, cluster = part or {}, cluster or {}
    found = list(part.get("nvml_findings") or []) + list((topology or {}).get("findings") or []) + list(part.get("device_cgroup_findings") or [])
    found += [entry for entry in cluster.get("findings") or [] if entry.get("node") == node]
    return found


def _shown(value):
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS - 3] + "..."


def _gpu_text(gpu):
    if gpu is None:
        return ""
    return " (gpu %s)" % (gpu.get("index") if isinstance(gpu, dict) and gpu.get("index") is not None else gpu)


def verdict(settings, findings, check_mode, unchecked=()):
    """{failing, failure, report}: the findings at or above postcheck_fail_severity; why the host fails (None: it does
    not); in a check run that only reports (postcheck_fail_in_check_mode false: a harden run in check mode, which did
    not make the changes the post-check would verify), the report instead.  A part the post-check could not check
    (``unchecked``, from not_checked) fails the host as a finding would: a post-check that could not verify the node
    does not pass it (postcheck_fail_severity=never only reports, as for findings)."""
    threshold = settings["postcheck_fail_severity"]
    node = settings["postcheck_node_name"]
    failing = _findings.at_or_above(findings, threshold)
    blind = [] if threshold == "never" else list(unchecked)
    if check_mode and not as_bool(settings["postcheck_fail_in_check_mode"]):
        report = ("check mode: %d finding(s) at or above %s on the node as it is now (%s); a real run verifies the node after its changes"
                  % (len(failing), threshold, ", ".join(entry["id"] for entry in failing)))
        # what could not be checked is said here too: a report that leaves it out would read as checked
        report += "".join("; could not check %s: %s" % (part["what"], part["cause"]) for part in unchecked)
        return {"failing": [entry["id"] for entry in failing], "failure": None, "report": report}
    reasons = []
    if failing:
        reasons.append("%d finding(s) at or above %s on %s: %s (all of them in postcheck_findings)" % (
            len(failing), threshold, node, "; ".join(
                "%s%s found %s, expected %s" % (entry["id"], _gpu_text(entry.get("gpu")), _shown(entry.get("found")), _shown(entry.get("expected")))
                for entry in failing)))
    reasons += ["could not check %s: %s (fix: %s)" % (part["what"], part["cause"], part["fix"]) for part in blind]
    return {"failing": [entry["id"] for entry in failing], "failure": "; ".join(reasons) or None, "report": None}


def judged(decided, step):
    """The result of the step ``fail`` (the verdict's failure fails the host) or ``report`` (a check run's report, shown
    as ansible.builtin.debug shows a message), from ``decided`` (the verdict step's result); skipped, saying why, where
    the verdict holds neither.  A verdict that is missing fails: a post-check without one did not pass the node."""
    if not isinstance(decided, dict) or "failure" not in decided:
        return {"failed": True, "changed": False, "msg": "the post-check's verdict step did not run on this host: its node is not verified"}
    if step == "fail":
        if decided["failure"] is not None:
            return {"failed": True, "changed": False, "msg": decided["failure"], "failing": list(decided.get("failing") or [])}
        return {"skipped": True, "changed": False,
                "skip_reason": "nothing fails the host" if decided.get("report") is None else "check mode: reported, not failed"}
    if decided.get("report") is None:
        return {"skipped": True, "changed": False, "skip_reason": "not a check run that only reports"}
    return {"changed": False, "msg": decided["report"], "_ansible_verbose_always": True}
