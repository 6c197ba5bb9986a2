# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The one findings model of every check: node_audit, the post-check modules, gpu_consistency, device_plugin,
runtime_class, drift's JSON, HTML and Prometheus output.

A finding is ``{id, check, stage, severity, expected, found, hint, remediable}`` plus the context its producer
names (``node``, ``gpu``, ``pod``, ``subject``, ``path``, ...; a context key given as None says "none", and stays).

- ``severity`` is one of SEVERITIES, the only scale.
- ``found`` is the observed value (never ``actual``), ``expected`` what the check wants, ``hint`` why it matters
  and what fixes it.
- ``check``, ``stage`` (the harden_gpu_nodes.yml tag that fixes it, or ``postcheck``/None) and ``remediable``
  come from CATALOGUE, the one table that decides them.  An entry whose remediability depends on the plan
  (a MIG layout the planner can reach, a device node the options allow creating) says PLANNED; its producer
  then passes ``planned=`` with what its planner decided.

Node side and controller side both import this file: it imports nothing but the error type and the severity scale
(core/_vocabulary.py, which the CLI shares).
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._vocabulary import SEVERITIES

FAIL_CHOICES = ("never",) + SEVERITIES

# remediable: the stage fixes it whenever it is found
ALWAYS = "always"
# remediable only where the producer's planner has a step for it (planned=True)
PLANNED = "planned"
# no playbook fixes it: hardware, workloads, another installer's object, or a setting to choose
NEVER = "never"

# Kubelet fields that the cgroup_limits stage owns (harden runs kubelet_topology with them merged in).
CGROUP_LIMITS_KUBELET_FIELDS = ("memoryThrottlingFactor", "featureGates", "kubeReserved", "systemReserved",
                                "kubeReservedCgroup", "systemReservedCgroup", "enforceNodeAllocatable")

# node_audit's checks, in the order of harden_gpu_nodes.yml.  A check that cannot run is "not_checked" (its cause and
# fix in the audit's result), never a finding: a finding is drift or attention, and a blind check is neither.
AUDIT_CHECKS = ("device_nodes", "containerd", "kubelet", "mig", "cgroup_memory", "nvml", "device_cgroups")

_GROUPS = (
    # (check, stage, remediable, ids)
    ("device_nodes", "device_permissions", ALWAYS, (
        "device_node_wrong_type", "device_node_permissions", "device_char_link", "device_udev_rules_obsolete",
        "device_permissions_not_persisted")),
    # create_missing: false leaves a missing node missing
    ("device_nodes", "device_permissions", PLANNED, ("device_node_missing",)),
    ("device_nodes", "device_permissions", NEVER, (
        "device_permissions_not_persistable", "device_settings_conflict", "driver_params_stale")),
    ("containerd", "container_runtime", ALWAYS, ("containerd_nvidia_runtime",)),
    ("containerd", "container_runtime", NEVER, ("containerd_runtime_binary_missing",)),
    # kubelet_setting's stage is kubelet_topology or cgroup_limits, by field: stage_of()
    ("kubelet", "kubelet_topology", ALWAYS, ("kubelet_setting", "kubelet_stale_checkpoint", "kubelet_config_file")),
    # settings `kubeadm upgrade node` would revert: the stage moves them to a --config-dir drop-in where it can
    ("kubelet", "kubelet_topology", PLANNED, ("kubelet_reverts_on_kubeadm_upgrade",)),
    ("mig", "mig", PLANNED, ("mig_layout_drift",)),
    ("mig", "mig", NEVER, (
        "mig_strategy_none_hides_slices", "mig_strategy_single_mismatch", "mig_custom_compute_instances", "mig_gpu_busy")),
    ("cgroup_memory", "cgroup_limits", ALWAYS, ("gpu-pod-memory-high-unset",)),
    ("cgroup_memory", "cgroup_limits", NEVER, ("gpu-pod-no-memory-limit",)),
    ("nvml", "postcheck", NEVER, (
        "nvml_init_failed", "nvml_unprivileged_init_failed", "nvml_root_gpu_denied", "nvml_unprivileged_gpu_denied",
        "gpu_count_driver_mismatch", "gpu_count_unexpected", "mig_device_count_unexpected",
        "mig_device_count_driver_mismatch", "ecc_uncorrectable", "remapped_rows_failure", "remapped_rows_pending",
        "pcie_link_degraded", "nvlink_down", "gpu_health_unreadable", "mig_mode_pending", "gpu_lost")),
    ("device_cgroups", "postcheck", NEVER, (
        "isolation_breach", "broken_allocation", "privileged_container", "unauditable_program", "allocation_unmatched",
        "gpu_access")),
    # The kubelet stage owns these settings, but whether a run changes them is the operator's choice (the CPU Manager
    # policy is unmanaged by default) and the admission check's: node_audit's kubelet_setting says what a run changes.
    ("topology", "kubelet_topology", NEVER, ("topology_policy_unknown", "topology_policy_no_alignment", "cpu_policy_not_static")),
    ("topology", "postcheck", NEVER, ("gpu_numa_unknown", "workload_cannot_fit_numa")),
    # The node does not advertise what NVML sees: the device_plugin stage (re)deploys the plugin.
    ("consistency", "device_plugin", ALWAYS, ("gpu_not_advertised", "gpu_partially_advertised", "gpu_over_advertised")),
    # A cordon an ended gpuharden run left (its record, gpuharden.io/cordon): the next harden releases it where the node
    # has nothing left to do, under any tags, or resumes the step that drained it; the kubelet's step is the usual one.
    ("consistency", "kubelet_topology", ALWAYS, ("node_left_cordoned",)),
    # MIG devices not advertised: the plugin's migStrategy is a decision for the operator (device_plugin_mig_strategy).
    ("consistency", "device_plugin", NEVER, ("mig_not_advertised",)),
    ("consistency", "postcheck", NEVER, (
        "kubelet_status_not_posted", "unknown_gpu_resource", "requested_resource_not_advertised", "allocated_exceeds_declared",
        "gpu_process_unattributed", "gpu_process_outside_pods", "gpu_process_unknown_pod", "gpu_process_pod_on_other_node",
        "gpu_process_without_allocation", "gpu_process_exceeds_allocation", "device_used_by_other_container",
        "gpu_process_on_unallocated_device", "visible_devices_without_request", "pod_unreadable", "node_not_found")),
    # The plugin DaemonSet's own configuration: the operator's values or another installer's object.
    ("device_plugin", "device_plugin", NEVER, (
        "plugin_config_unreadable", "plugin_config_missing", "plugin_config_invalid", "plugin_resource_name_invalid",
        "plugin_resource_rename_ignored", "plugin_version_unparseable", "plugin_version_too_old",
        "plugin_device_list_strategy_invalid", "plugin_cdi_driver_root_unmounted", "plugin_mig_strategy_invalid",
        "plugin_mig_privileges_missing", "plugin_dev_root_forced", "plugin_no_nvidia_runtime",
        "plugin_init_gate_without_readiness", "plugin_no_node_selector", "plugin_on_cpu_nodes",
        "plugin_managed_by_other_installer", "plugin_competing", "plugin_operator_unknown",
        "plugin_device_id_strategy_invalid", "plugin_mps_invalid", "plugin_config_unknown_key")),
    ("device_plugin", "runtime_class", ALWAYS, ("plugin_runtime_class_missing",)),
    # RuntimeClass findings: remediable where the planner's repair is one the stage does (not manual, not forced)
    ("runtime_class", "runtime_class", PLANNED, (
        "runtime_class_overhead_gpu", "runtime_class_overhead_extended", "runtime_class_handler_mismatch",
        "runtime_class_managed_by_other_installer")),
    ("runtime_class", "runtime_class", ALWAYS, ("runtime_class_differs",)),
    # a Node whose containerd lacks the handler: the node-side container_runtime stage adds it
    ("runtime_class", "container_runtime", ALWAYS, ("runtime_class_handler_missing_on_node",)),
)

CATALOGUE = {ident: (check, stage, remediable) for check, stage, remediable, ids in _GROUPS for ident in ids}


def stage_of(ident, subject=None):
    """The harden stage that fixes a finding (None: none does)."""
    if ident == "kubelet_setting" and subject and subject.split(".")[0] in CGROUP_LIMITS_KUBELET_FIELDS:
        return "cgroup_limits"
    return _entry(ident)[1]


def _entry(ident):
    try:
        return CATALOGUE[ident]
    except KeyError:
        raise GpuhardenError("internal error: finding id %r is not in the findings catalogue (module_utils/core/_findings.py)" % ident) from None


def finding(ident, severity, expected, found, hint=None, planned=None, **context):
    """The one constructor.  ``planned`` answers a PLANNED entry's question: does the planner have a step for it?"""
    check, _stage, remediable = _entry(ident)
    if severity not in SEVERITIES:
        raise GpuhardenError("internal error: finding %s: severity %r is not one of %s" % (ident, severity, ", ".join(SEVERITIES)))
    entry = {"id": ident, "check": check, "stage": stage_of(ident, context.get("subject")), "severity": severity,
             "expected": expected, "found": found, "hint": hint,
             "remediable": remediable == ALWAYS or (remediable == PLANNED and bool(planned))}
    entry.update(context)
    return entry


def severity_rank(severity):
    return SEVERITIES.index(severity)


def at_or_above(findings, threshold):
    """The findings whose severity is at least ``threshold`` (``never``: none)."""
    if threshold == "never":
        return []
    rank = severity_rank(threshold)
    return [entry for entry in findings if severity_rank(entry["severity"]) >= rank]


def max_severity(findings):
    """The highest severity among the findings, or None."""
    return max((entry["severity"] for entry in findings), key=severity_rank, default=None)


def should_fail(findings, fail_on):
    return bool(at_or_above(findings, fail_on))


def fail_on_message(module_name, findings, fail_on):
    """Why a check module fails the task over its own findings (option ``fail_on``), or None."""
    failing = at_or_above(findings, fail_on)
    if not failing:
        return None
    return "%s: %d finding(s) at or above %s: %s" % (module_name, len(failing), fail_on, ", ".join(sorted({entry["id"] for entry in failing})))


def by_severity(findings):
    counts = {}
    for entry in findings:
        counts[entry["severity"]] = counts.get(entry["severity"], 0) + 1
    return counts


def remediable_stages(findings):
    return sorted({entry["stage"] for entry in findings if entry.get("remediable") and entry.get("stage")})
